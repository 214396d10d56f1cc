# Embeddable: the library as an outside package sees it, and its public surface.
#
#   make integration  IntegrationTests/Consumer, a package of its own that depends on this
#                     one by path: builds it and its tests with warnings as errors (Swift 6
#                     and Swift 5 language modes), runs its XCTests and both programs
#   make api-check    compares the Promise module's public symbols with Scripts/public-api.txt
#   make api-update   rewrites Scripts/public-api.txt after an intended API change

CONSUMER_DIR := IntegrationTests/Consumer
PYTHON       ?= python3

.PHONY: integration api-check api-update clean-integration

integration: deps
	@echo "==> integration: $(CONSUMER_DIR), depending on Promise by path (warnings as errors)"
	$(SWIFT) build --package-path $(CONSUMER_DIR) --build-tests $(SWIFT_FLAGS)
	$(SWIFT) test --package-path $(CONSUMER_DIR) --skip-build --disable-swift-testing $(SWIFT_FLAGS)
	@bin="$$($(SWIFT) build --package-path $(CONSUMER_DIR) --show-bin-path $(SWIFT_FLAGS))" && \
		echo "$$bin/consumer-swift5" && "$$bin/consumer-swift5" && \
		echo "$$bin/consumer" && "$$bin/consumer"

api-check: deps
	@echo "==> api-check: public symbols of Promise vs Scripts/public-api.txt"
	@SWIFT="$(SWIFT)" $(PYTHON) Scripts/check-public-api.py

api-update: deps
	@echo "==> api-update: rewriting Scripts/public-api.txt"
	@SWIFT="$(SWIFT)" $(PYTHON) Scripts/check-public-api.py --update

clean-integration:
	rm -rf $(CONSUMER_DIR)/.build .build-api
