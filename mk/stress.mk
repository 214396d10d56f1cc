# The stress suite and the sanitizers.
#
#   make stress   the C core's racing tests and Tests/PromiseStressTests (release build)
#                 with long knobs: STRESS_ITERATIONS rounds per test, capped at
#                 STRESS_SECONDS each (make stress STRESS_SECONDS=600 for a soak)
#   make tsan     swift test --sanitize=thread over PromiseTests, PromiseStressTests and
#                 PromiseNIOTests (SwiftNIO built under the sanitizer too), plus the two C
#                 tests built with clang -fsanitize=thread
#   make asan     the same with --sanitize=address (LeakSanitizer on), and the C tests
#                 with -fsanitize=address,undefined; without the SwiftNIO trait (PromiseNIO
#                 is glue over NIO's own memory management, and TSan already runs its
#                 tests): building SwiftNIO under ASan would cost CI a minute and a half
#
# The sanitizer targets run short knobs (SAN_ITERATIONS: the default 2000 rounds, capped
# at SAN_SECONDS = 3 s per test: sanitized code is slow, and `make stress` is where rounds
# pile up; the million-level tests build SAN_DEEP_LEVELS = 200,000; the tests that run in
# a child process for crash isolation run in the test process, which a crash fails too),
# run the stress suite beside the other tests (Scripts/test-in-two-shards.sh), and fail
# on any sanitizer report in their output even when the exit status is 0: each run is
# tee'd to a log under its scratch directory and grepped. Sanitizer builds use their own scratch paths
# (.build-tsan, .build-asan) so they never clobber the normal build. Every run prints a
# summary: rounds per test, the invariants checked, what the races hit.

STRESS_ITERATIONS ?= 100000
STRESS_SECONDS    ?= 60
SAN_ITERATIONS    ?= 2000
SAN_SECONDS       ?= 3
SAN_DEEP_LEVELS   ?= 200000
# The memory churn test's resident-set bound under sanitizers: ASan's quarantine
# (256 MiB by default) and TSan's shadow memory grow with the churn before they level off.
SAN_RSS_GROWTH_MIB ?= 512

SAN_CC     ?= clang
comma := ,
TSAN_BUILD ?= .build-tsan
ASAN_BUILD ?= .build-asan

TSAN_CFLAGS := -O1 -g -fsanitize=thread -fno-omit-frame-pointer
# The Swift toolchain's TSan runtime carries libdispatch interceptors, so even a plain C
# program links libdispatch and the blocks runtime from the toolchain (next to clang).
SAN_CC_LIBDIR := $(shell d=$$(dirname "$$(readlink -f "$$(command -v $(SAN_CC))")")/../lib/swift/linux; \
                   [ -e "$$d/libdispatch.so" ] && cd "$$d" && pwd)
TSAN_LDFLAGS := $(if $(SAN_CC_LIBDIR),-L$(SAN_CC_LIBDIR) -Wl$(comma)-rpath$(comma)$(SAN_CC_LIBDIR) -ldispatch -lBlocksRuntime)
ASAN_CFLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

# halt_on_error=0: report every race of a run, not just the first; the log grep fails it.
TSAN_ENV := TSAN_OPTIONS='halt_on_error=0 second_deadlock_stack=1'
# detect_leaks=1: LeakSanitizer at exit, where the platform has it (Linux; ASan on
# Apple platforms refuses the option, so it stays off there).
DETECT_LEAKS := $(if $(filter Linux,$(shell uname -s)),1,0)
ASAN_ENV := ASAN_OPTIONS='detect_leaks=$(DETECT_LEAKS)' UBSAN_OPTIONS='print_stacktrace=1 halt_on_error=1'

# LeakSanitizer suppressions for the Swift test process only (the C tests need none).
# With `swift test --sanitize=address` on Linux, LSan reports at exit what the test
# harness itself never frees: swift-corelibs-xctest builds every XCTestCase, test run and
# suite in XCTMain and exits without releasing them, its expectation machinery leaves
# weak-reference side tables behind, and Foundation's Process.run (the behaviour suite's
# crash isolation) does too. Each pattern names the harness function that allocates
# directly (top of the allocation stack), none of which is on the path of library code, so
# a leaked promise, continuation, observer box or aggregator is still reported.
define LSAN_SUPPRESSIONS
# XCTest harness objects, alive until exit by design (see mk/stress.mk)
leak:6XCTest11XCTMainMisc_9arguments9observers
leak:6XCTest0A4CaseC4name11testClosure
leak:4name11testClosureACSS_y6XCTest
leak:6XCTest0A7CaseRunC4test
leak:6XCTest0A8SuiteRunC4test
leak:6XCTest0A8SuiteRunC07addTest
leak:6XCTest0A4CaseC4wait3for7timeout12enforceOrder
leak:6XCTest21awaitUsingExpectation
leak:6XCTest0A4CaseC14addExpectation
# Foundation.Process.run: a weak reference's side table
leak:10Foundation7ProcessC3run
endef
LSAN_SUPPRESSIONS_FILE := $(ASAN_BUILD)/lsan-suppressions.txt

SAN_REPORTS := WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|SUMMARY: [A-Za-z]*Sanitizer|: runtime error: 

SAN_KNOBS := PROMISE_STRESS_ITERATIONS=$(SAN_ITERATIONS) PROMISE_STRESS_SECONDS=$(SAN_SECONDS) \
             PROMISE_STRESS_RSS_GROWTH_MIB=$(SAN_RSS_GROWTH_MIB) PROMISE_DEEP_LEVELS=$(SAN_DEEP_LEVELS) \
             PROMISE_TESTS_IN_PROCESS=1
# The C test: its own round counts (20000 / 50000) unless SAN_CORE_ITERATIONS is set,
# capped at SAN_SECONDS per racing test.
SAN_CORE_ITERATIONS ?=
SAN_CORE_KNOBS := $(if $(SAN_CORE_ITERATIONS),PROMISE_STRESS_ITERATIONS=$(SAN_CORE_ITERATIONS)) \
                  PROMISE_STRESS_SECONDS=$(SAN_SECONDS)
LONG_KNOBS := PROMISE_STRESS_ITERATIONS=$(STRESS_ITERATIONS) PROMISE_STRESS_SECONDS=$(STRESS_SECONDS)
# The core's race program multiplies its rounds by this under make stress (1 elsewhere).
CORE_RACE_ROUNDS ?= 40

# What the summary shows: the C tests' per-test lines and round counts, the Swift stress
# lines (rounds, invariants, what the rounds hit), XCTest's totals.
SUMMARY_LINES := ^(ok|not ok) - |^\# .*rounds in|^[0-9]+ passed, [0-9]+ failed|^stress: |Executed [0-9]+ tests?, with

# $(call logged,<log file>,<command>): runs the command with its output shown and saved,
# prints the summary lines, and fails if the command failed or if the log holds a
# sanitizer report. POSIX sh: no pipefail, so the status goes through a file.
define logged
	@mkdir -p $(dir $(1))
	@{ $(2) 2>&1; echo $$? > $(1).status; } | tee $(1); \
	status=$$(cat $(1).status); \
	echo "==> summary of $(1)"; \
	grep -E '$(SUMMARY_LINES)' $(1) | sed 's/^/    /'; \
	if grep -Eq '$(SAN_REPORTS)' $(1); then \
		echo "==> sanitizer reports in $(1):"; \
		grep -E '$(SAN_REPORTS)' $(1) | sort | uniq -c | head -40; \
		exit 1; \
	fi; \
	if [ "$$status" != 0 ]; then echo "==> failed with exit status $$status (log: $(1))"; exit 1; fi

endef

.PHONY: stress stress-core stress-swift tsan tsan-core tsan-swift asan asan-core asan-swift

stress: stress-core stress-swift
	@echo "==> stress: passed ($(LONG_KNOBS))"

stress-core: deps $(BUILD_DIR)/core_test $(BUILD_DIR)/core_race_test
	@echo "==> stress-core: the C core's racing tests, $(LONG_KNOBS), races x$(CORE_RACE_ROUNDS)"
	$(call logged,$(BUILD_DIR)/stress-core.log,env $(LONG_KNOBS) $(BUILD_DIR)/core_test)
	$(call logged,$(BUILD_DIR)/stress-core-races.log,$(BUILD_DIR)/core_race_test $(CORE_RACE_ROUNDS))

stress-swift: deps
	@echo "==> stress-swift: PromiseStressTests in release, $(LONG_KNOBS)"
	$(call logged,$(BUILD_DIR)/stress-swift.log,env $(LONG_KNOBS) $(SWIFT) test -c release $(SWIFT_FLAGS) --filter PromiseStressTests)

# ---- ThreadSanitizer -------------------------------------------------------------------

$(BUILD_DIR)/core_test_tsan: $(CORE_SRC) $(CORE_TEST) $(wildcard $(CORE_INC)/*.h Tests/CoreTests/*.h) | deps
	@mkdir -p $(BUILD_DIR)
	$(SAN_CC) $(CORE_CFLAGS) $(TSAN_CFLAGS) $(CORE_SRC) $(CORE_TEST) -o $@ $(TSAN_LDFLAGS)

$(BUILD_DIR)/core_race_test_tsan: $(CORE_SRC) $(CORE_RACE) $(wildcard $(CORE_INC)/*.h Tests/CoreTests/*.h) | deps
	@mkdir -p $(BUILD_DIR)
	$(SAN_CC) $(CORE_CFLAGS) $(TSAN_CFLAGS) $(CORE_SRC) $(CORE_RACE) -o $@ $(TSAN_LDFLAGS)

tsan-core: deps $(BUILD_DIR)/core_test_tsan $(BUILD_DIR)/core_race_test_tsan
	@echo "==> tsan-core: the C core tests under ThreadSanitizer, $(strip $(SAN_CORE_KNOBS))"
	$(call logged,$(TSAN_BUILD)/tsan-core.log,env $(SAN_CORE_KNOBS) $(TSAN_ENV) $(BUILD_DIR)/core_test_tsan)
	$(call logged,$(TSAN_BUILD)/tsan-core-races.log,env $(TSAN_ENV) $(BUILD_DIR)/core_race_test_tsan 1)

tsan-swift: deps
	@echo "==> tsan-swift: swift test --sanitize=thread (PromiseTests and PromiseStressTests), $(SAN_KNOBS)"
	$(call logged,$(TSAN_BUILD)/tsan-swift.log,$(SWIFT) build --build-tests --sanitize=thread --scratch-path $(TSAN_BUILD) $(SWIFT_FLAGS) && \
		env $(SAN_KNOBS) $(TSAN_ENV) bash Scripts/test-in-two-shards.sh $(TSAN_BUILD)/tsan-swift \
		"$$($(SWIFT) build --sanitize=thread --scratch-path $(TSAN_BUILD) $(SWIFT_FLAGS) --show-bin-path)" \
		$(SWIFT) test --skip-build --sanitize=thread --scratch-path $(TSAN_BUILD) $(SWIFT_FLAGS))

tsan: tsan-core tsan-swift
	@echo "==> tsan: passed, no ThreadSanitizer reports"

# ---- AddressSanitizer (+ LeakSanitizer; UndefinedBehaviorSanitizer for C) -------------

$(BUILD_DIR)/core_test_asan: $(CORE_SRC) $(CORE_TEST) $(wildcard $(CORE_INC)/*.h Tests/CoreTests/*.h) | deps
	@mkdir -p $(BUILD_DIR)
	$(SAN_CC) $(CORE_CFLAGS) $(ASAN_CFLAGS) $(CORE_SRC) $(CORE_TEST) -o $@

$(BUILD_DIR)/core_race_test_asan: $(CORE_SRC) $(CORE_RACE) $(wildcard $(CORE_INC)/*.h Tests/CoreTests/*.h) | deps
	@mkdir -p $(BUILD_DIR)
	$(SAN_CC) $(CORE_CFLAGS) $(ASAN_CFLAGS) $(CORE_SRC) $(CORE_RACE) -o $@

asan-core: deps $(BUILD_DIR)/core_test_asan $(BUILD_DIR)/core_race_test_asan
	@echo "==> asan-core: the C core tests under AddressSanitizer, LeakSanitizer and UBSan, $(strip $(SAN_CORE_KNOBS))"
	$(call logged,$(ASAN_BUILD)/asan-core.log,env $(SAN_CORE_KNOBS) $(ASAN_ENV) $(BUILD_DIR)/core_test_asan)
	$(call logged,$(ASAN_BUILD)/asan-core-races.log,env $(ASAN_ENV) $(BUILD_DIR)/core_race_test_asan 1)

$(LSAN_SUPPRESSIONS_FILE): export LSAN_SUPPRESSIONS_TEXT = $(LSAN_SUPPRESSIONS)
$(LSAN_SUPPRESSIONS_FILE): mk/stress.mk
	@mkdir -p $(dir $@)
	@printf '%s\n' "$$LSAN_SUPPRESSIONS_TEXT" > $@

asan-swift: deps $(LSAN_SUPPRESSIONS_FILE)
	@echo "==> asan-swift: swift test --sanitize=address with leak detection (PromiseTests and PromiseStressTests), $(SAN_KNOBS)"
	$(call logged,$(ASAN_BUILD)/asan-swift.log,$(SWIFT) build --build-tests --sanitize=address --scratch-path $(ASAN_BUILD) $(SWIFT_WARN) && \
		env $(SAN_KNOBS) $(ASAN_ENV) LSAN_OPTIONS='suppressions=$(abspath $(LSAN_SUPPRESSIONS_FILE)) print_suppressions=1' \
		bash Scripts/test-in-two-shards.sh $(ASAN_BUILD)/asan-swift \
		"$$($(SWIFT) build --sanitize=address --scratch-path $(ASAN_BUILD) $(SWIFT_WARN) --show-bin-path)" \
		$(SWIFT) test --skip-build --sanitize=address --scratch-path $(ASAN_BUILD) $(SWIFT_WARN))

asan: asan-core asan-swift
	@echo "==> asan: passed, no AddressSanitizer / LeakSanitizer / UBSan reports"
