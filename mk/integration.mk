# Embeddable: the library as an outside package sees it, and its public surface.
#
#   make integration  the two packages of IntegrationTests/, each built with warnings as
#                     errors and run, first by path to this repository, then by a git URL
#                     (a bare clone of the committed HEAD, tagged 1.0.0):
#                       Consumer     Promise alone (Swift 6 and Swift 5 language modes, its
#                                    XCTests, both programs); fails if SwiftNIO was
#                                    fetched, pinned or built for it
#                       NIOConsumer  PromiseNIO, with the SwiftNIO package trait
#                     then the server way (check-server-size.sh): ServerConsumer, Promise
#                     with no trait, linked statically: no Foundation module in it, and
#                     its size beside a Dispatch-only program (gated: SERVER_SIZE_LIMIT_KB);
#                     and Misuse (check-misuse.sh): code the compiler must reject, such as
#                     wait() from async code, and the closures the rules say Swift reads
#                     otherwise than they say
#   make api-check    compares the public symbols of Promise and PromiseNIO with
#                     Scripts/public-api.txt and Scripts/public-api-PromiseNIO.txt
#   make api-update   rewrites both lists after an intended API change

CONSUMER_DIR := IntegrationTests/Consumer
PYTHON       ?= python3

.PHONY: integration api-check api-update clean-integration

integration: deps
	@echo "==> integration: IntegrationTests/ by path, then by git URL (warnings as errors)"
	SWIFT="$(SWIFT)" SWIFT_WARN="$(SWIFT_WARN)" BUILD_DIR="$(BUILD_DIR)" bash IntegrationTests/check-consumers.sh path
	SWIFT="$(SWIFT)" SWIFT_WARN="$(SWIFT_WARN)" BUILD_DIR="$(BUILD_DIR)" bash IntegrationTests/check-consumers.sh git
	SWIFT="$(SWIFT)" SWIFT_WARN="$(SWIFT_WARN)" BUILD_DIR="$(BUILD_DIR)" bash IntegrationTests/check-server-size.sh
	SWIFT="$(SWIFT)" bash IntegrationTests/check-misuse.sh

api-check: deps
	@echo "==> api-check: public symbols of Promise and PromiseNIO vs Scripts/public-api*.txt"
	@SWIFT="$(SWIFT)" API_MODULE=Promise $(PYTHON) Scripts/check-public-api.py
	@SWIFT="$(SWIFT)" API_MODULE=PromiseNIO $(PYTHON) Scripts/check-public-api.py

api-update: deps
	@echo "==> api-update: rewriting Scripts/public-api*.txt"
	@SWIFT="$(SWIFT)" API_MODULE=Promise $(PYTHON) Scripts/check-public-api.py --update
	@SWIFT="$(SWIFT)" API_MODULE=PromiseNIO $(PYTHON) Scripts/check-public-api.py --update

clean-integration:
	rm -rf $(CONSUMER_DIR)/.build IntegrationTests/NIOConsumer/.build IntegrationTests/ServerConsumer/.build IntegrationTests/Misuse/.build $(BUILD_DIR)/integration-git .build-api
