# Benchmarks: Benchmarks/ is a package of its own (package-benchmark + SwiftNIO), so the
# library's Package.swift stays dependency-free. See Benchmarks/README.md.
#
#   make bench             release build, every case for our promise and each baseline, and the
#                          memory cases (bytes per held promise beside NIO): one table
#   make bench-check       our promise's mallocs/op and bytes per held item against
#                          Benchmarks/Thresholds/ (fails on a rise); deterministic, so CI runs it,
#                          and a few iterations per case give the same counts
#   make bench-thresholds  rewrite Benchmarks/Thresholds/ from a run (after an intended change)
#   make bench-instructions  instructions per operation under callgrind, ours vs baselines
#                          (stable on a loaded machine, unlike wall clock; ~5 minutes)
#   make bench-profile CASE=settle-one/promise   callgrind: where one case's instructions go
#   make bench-clean       remove Benchmarks/.build
#
# BENCH_FILTER (a regex on "<case>/<impl>", e.g. 'settle-one/.*') narrows bench to some cases.
# BENCH_RUNS=3 runs the suite three times and reports each benchmark's best median: steadier
# on a shared machine (about 75 s per run on 2 cores, once built).

BENCH_DIR      := Benchmarks
BENCH_OUT      := .build/bench-results
BENCH_CHECKOUT := .build/bench-check
BENCH_FILTER   ?=
BENCH_RUNS     ?= 1
PYTHON         ?= python3
# package-benchmark's plugin; writes only under Benchmarks/.build.
BENCH_RUN       = $(SWIFT) package $(BENCH_PACKAGE_FLAGS) --allow-writing-to-directory .build benchmark --no-progress --format jmh
# The memory cases: bytes per held promise, ours and NIO's, in one process (JSON for bench.py).
BENCH_MEMORY    = $(SWIFT) build $(BENCH_PACKAGE_FLAGS) -c release --product PromiseMemory && \
                  "$$($(SWIFT) build $(BENCH_PACKAGE_FLAGS) -c release --show-bin-path)/PromiseMemory" --json
# bench-check and bench-thresholds read our promise's figures alone: built without the trait
# NIOBaselines (so without SwiftNIO), in a build folder of their own, so that they and
# `make bench` do not rebuild each other's.
BENCH_PACKAGE_FLAGS :=
bench-check bench-thresholds: BENCH_PACKAGE_FLAGS := --scratch-path .build/gates --disable-default-traits
CASE           ?= settle-one/promise
# valgrind 3.19 gives up on the DWARF 5 that Swift 6.3 emits: callgrind runs a copy of the
# release binary without debug info (function names come from the symbol table).
PROFILE_BIN    := .build/PromiseProfile.callgrind

.PHONY: bench bench-check bench-thresholds bench-instructions bench-profile bench-clean bench-profile-binary

bench: deps
	@echo "==> bench: release build, then every case for our promise and each baseline ($(BENCH_RUNS) run(s))"
	@cd $(BENCH_DIR) && rm -rf $(BENCH_OUT) && mkdir -p $(BENCH_OUT) && \
		for run in $$(seq 1 $(BENCH_RUNS)); do \
			mkdir -p $(BENCH_OUT)/run-$$run && \
			$(BENCH_RUN) --path $(BENCH_OUT)/run-$$run $(if $(BENCH_FILTER),--filter '$(BENCH_FILTER)') || exit 1; \
		done && \
		$(BENCH_MEMORY) > $(BENCH_OUT)/memory.json && \
		$(PYTHON) bench.py report $(BENCH_OUT)/run-*/Current_run.jmh.json --memory $(BENCH_OUT)/memory.json \
			--markdown $(BENCH_OUT)/table.md

bench-check: deps
	@echo "==> bench-check: our promise's mallocs per operation and bytes per held item against Benchmarks/Thresholds/"
	@cd $(BENCH_DIR) && rm -rf $(BENCH_CHECKOUT) && mkdir -p $(BENCH_CHECKOUT) && \
		PROMISE_BENCH_MAX_ITERATIONS=20 $(BENCH_RUN) --path $(BENCH_CHECKOUT) --filter '.*/promise' && \
		$(BENCH_MEMORY) > $(BENCH_CHECKOUT)/memory.json && \
		$(PYTHON) bench.py check $(BENCH_CHECKOUT)/Current_run.jmh.json --memory $(BENCH_CHECKOUT)/memory.json

bench-thresholds: deps
	@echo "==> bench-thresholds: rewriting Benchmarks/Thresholds/ from a run of our promise's cases"
	@cd $(BENCH_DIR) && rm -rf $(BENCH_CHECKOUT) && mkdir -p $(BENCH_CHECKOUT) && \
		$(BENCH_RUN) --path $(BENCH_CHECKOUT) --filter '.*/promise' && \
		$(BENCH_MEMORY) > $(BENCH_CHECKOUT)/memory.json && \
		$(PYTHON) bench.py update-thresholds $(BENCH_CHECKOUT)/Current_run.jmh.json --memory $(BENCH_CHECKOUT)/memory.json

bench-profile-binary: deps
	@cd $(BENCH_DIR) && $(SWIFT) build -c release --product PromiseProfile && \
		cp .build/release/PromiseProfile $(PROFILE_BIN) && strip -g $(PROFILE_BIN)

bench-instructions: bench-profile-binary
	@echo "==> bench-instructions: instructions per operation under callgrind (not time; see Benchmarks/README.md)"
	@cd $(BENCH_DIR) && $(PYTHON) Tools/callgrind_ops.py $(PROFILE_BIN) --table '$(BENCH_FILTER)'

bench-profile: bench-profile-binary
	@echo "==> bench-profile: where the instructions of $(CASE) go, per operation"
	@cd $(BENCH_DIR) && $(PYTHON) Tools/callgrind_ops.py $(PROFILE_BIN) '$(CASE)' --top 30

bench-clean:
	rm -rf $(BENCH_DIR)/.build
