# Examples and documentation. Examples/ is a package of its own that uses the library's
# PromiseNIO product (SwiftNIO is a dependency of PromiseNIO, behind the package trait
# SwiftNIO, never of Promise); Examples/Docs is a docs-only package that holds the
# swift-docc-plugin.
#
#   make demo            (main Makefile) the guided tour, Examples/Sources/demo
#   make examples-test   builds every example with warnings as errors, and runs
#                        Examples/Tests (the server's two engines answer alike; its
#                        options, connection pipeline and stop)
#   make server          builds the example HTTP server (SERVER_CONFIG: release, or debug
#                        for a quicker first build of SwiftNIO and a slower server)
#   make server-load     starts it on 127.0.0.1, loads it with wrk for LOAD_SECONDS,
#                        checks every response, stops it; fails on any wrong response,
#                        non-2xx status or socket error; prints requests/s and latency
#   make server-compare  the server's two engines, --engine promise (OrderService) and
#                        --engine nio (FutureOrderService, NIO futures only), loaded in
#                        turn for COMPARE_ROUNDS rounds of COMPARE_SECONDS each, every
#                        response checked; prints the medians (requests/s, p50, p99),
#                        the ratios promise/nio and PASS or MISS against the target
#                        (>= 1.0 x NIO's requests/s, <= 1.0 x its p99). Fails only on
#                        wrong responses, errors or a server that does not start or
#                        stop: the ratios are wall clock, never gated
#   make docs            the DocC archives of Promise and PromiseNIO (into $(DOCS_OUT)),
#                        built by the swift-docc-plugin; fails on any DocC warning and
#                        on any public symbol without a doc comment and an example
#
# Builds go to Examples/.build and Examples/Docs/.build (both ignored by git).

EXAMPLES_DIR     := Examples
DOCS_PACKAGE     := $(EXAMPLES_DIR)/Docs
DOCS_OUT         ?= $(EXAMPLES_DIR)/.build/docs
DOCS_MODULES     := Promise PromiseNIO
# Our own Swift code's warnings are errors; C flags stay off here, as they would also
# reach SwiftNIO's C shims.
EXAMPLES_FLAGS   := -Xswiftc -warnings-as-errors
WRK              ?= wrk
PYTHON           ?= python3
SERVER_CONFIG    ?= release
LOAD_SECONDS     ?= 5
LOAD_THREADS     ?= 2
LOAD_CONNECTIONS ?= 32
COMPARE_ROUNDS   ?= 3
COMPARE_SECONDS  ?= 5

.PHONY: examples-test server server-load server-compare wrk-deps docs docs-module

examples-test: deps
	@echo "==> examples-test: Examples/ (demo, server, serverTests) with warnings as errors, then its tests"
	cd $(EXAMPLES_DIR) && $(SWIFT) build --build-tests $(EXAMPLES_FLAGS)
	cd $(EXAMPLES_DIR) && $(SWIFT) test --skip-build

server: deps
	@echo "==> server: Examples/ HTTP server on SwiftNIO ($(SERVER_CONFIG))"
	cd $(EXAMPLES_DIR) && $(SWIFT) build -c $(SERVER_CONFIG) --product server $(EXAMPLES_FLAGS)

wrk-deps:
	@echo "==> wrk-deps: looking for wrk"
	@if command -v $(WRK) >/dev/null 2>&1; then \
		echo "    found: $$(command -v $(WRK))"; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "    missing: installing wrk with apt-get"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q wrk; \
	elif command -v brew >/dev/null 2>&1; then \
		echo "    missing: installing wrk with Homebrew"; \
		brew install wrk; \
	else \
		echo "    missing, and no apt-get or brew here: install wrk by hand" >&2; exit 1; \
	fi

server-load: server wrk-deps
	@echo "==> server-load: the example server on 127.0.0.1 under wrk ($(LOAD_THREADS) threads, $(LOAD_CONNECTIONS) connections, $(LOAD_SECONDS) s), every response checked"
	@bin="$$(cd $(EXAMPLES_DIR) && $(SWIFT) build -c $(SERVER_CONFIG) --product server $(EXAMPLES_FLAGS) --show-bin-path)" && \
		LOAD_SECONDS=$(LOAD_SECONDS) LOAD_THREADS=$(LOAD_THREADS) LOAD_CONNECTIONS=$(LOAD_CONNECTIONS) WRK=$(WRK) \
		bash $(EXAMPLES_DIR)/LoadTest/server-load.sh "$$bin/server"

server-compare: server wrk-deps
	@echo "==> server-compare: --engine promise against --engine nio on 127.0.0.1 under wrk ($(COMPARE_ROUNDS) rounds of $(COMPARE_SECONDS) s each, $(LOAD_THREADS) threads, $(LOAD_CONNECTIONS) connections), every response checked"
	@bin="$$(cd $(EXAMPLES_DIR) && $(SWIFT) build -c $(SERVER_CONFIG) --product server $(EXAMPLES_FLAGS) --show-bin-path)" && \
		COMPARE_ROUNDS=$(COMPARE_ROUNDS) COMPARE_SECONDS=$(COMPARE_SECONDS) SERVER_CONFIG=$(SERVER_CONFIG) \
		LOAD_THREADS=$(LOAD_THREADS) LOAD_CONNECTIONS=$(LOAD_CONNECTIONS) WRK=$(WRK) \
		bash $(EXAMPLES_DIR)/LoadTest/server-compare.sh "$$bin/server"

docs: deps
	@for module in $(DOCS_MODULES); do \
		$(MAKE) --no-print-directory docs-module DOCS_MODULE=$$module || exit 1; \
	done

# One module's archive, its warnings and its coverage (docs runs it for each module).
docs-module:
	@echo "==> docs: DocC archive of the $(DOCS_MODULE) module (swift-docc-plugin in $(DOCS_PACKAGE)), warnings are errors"
	@rm -rf $(DOCS_OUT)/$(DOCS_MODULE).doccarchive && mkdir -p $(DOCS_OUT)
	@{ $(SWIFT) package --package-path $(DOCS_PACKAGE) \
		--allow-writing-to-directory "$(abspath $(DOCS_OUT))" \
		generate-documentation --target $(DOCS_MODULE) \
		--output-path "$(abspath $(DOCS_OUT)/$(DOCS_MODULE).doccarchive)" \
		--warnings-as-errors \
		--experimental-documentation-coverage --coverage-summary-level brief 2>&1; \
		echo $$? > $(DOCS_OUT)/$(DOCS_MODULE).log.status; } | tee $(DOCS_OUT)/$(DOCS_MODULE).log
	@status=$$(cat $(DOCS_OUT)/$(DOCS_MODULE).log.status); \
	warnings=$$(grep -ciE '(^|[^[:alnum:]])(warning|error):' $(DOCS_OUT)/$(DOCS_MODULE).log || true); \
	echo "==> docs: $(DOCS_MODULE): DocC warnings and errors: $$warnings"; \
	if [ "$$status" != 0 ] || [ "$$warnings" != 0 ]; then \
		echo "==> docs: failed (exit status $$status; log: $(DOCS_OUT)/$(DOCS_MODULE).log)" >&2; exit 1; \
	fi
	@$(PYTHON) $(DOCS_PACKAGE)/check-coverage.py $(DOCS_OUT)/$(DOCS_MODULE).doccarchive/documentation-coverage.json
	@echo "==> docs: $(DOCS_OUT)/$(DOCS_MODULE).doccarchive (open it in Xcode, or serve the folder: it is laid out for static hosting)"
