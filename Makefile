# The front door. Every target says what it does; everything that compiles depends on
# `deps`, which installs the one system requirement (libatomic_ops) when it is missing.

SWIFT      ?= swift
CC         ?= cc
BUILD_DIR  ?= .build
CORE_SRC   := Sources/CPromiseCore/CPromiseCore.c
CORE_INC   := Sources/CPromiseCore/include
CORE_TEST  := Tests/CoreTests/core_test.c
# A second program: adversarial races of the core's calls (its argument multiplies its
# rounds: 1 in the tests, CORE_RACE_ROUNDS in make stress).
CORE_RACE  := Tests/CoreTests/core_race_test.c
CORE_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -pthread -I $(CORE_INC)
# The Swift toolchain's clang++ checks the headers as C++ (the system's c++ without it;
# either rejects a C-only keyword under -pedantic-errors).
CLANGXX    ?= $(shell command -v clang++ 2>/dev/null || echo c++)
# Swift warnings are errors. The C core's warnings (-Wall -Wextra) are errors in
# test-core and test-core-32, which compile it with gcc and clang. No C flags here: they
# would reach SwiftNIO's C shims too, and SwiftPM rejects `-Xcc -Werror` once a remote
# package is in the build.
# SWIFT_TRAITS builds PromiseNIO (the package trait SwiftNIO, off for consumers by
# default) with everything else, so that every target here builds and tests it, and keeps
# the default trait Foundation on (naming a trait drops the defaults otherwise). The
# build with no trait at all, as a server makes it, is `make integration`'s.
SWIFT_TRAITS := --traits default,SwiftNIO
SWIFT_WARN  := -Xswiftc -warnings-as-errors
SWIFT_FLAGS := $(SWIFT_TRAITS) $(SWIFT_WARN)

.PHONY: all deps build test test-core test-core-32 test-swift demo clean help

all: build

# Each area's extra targets (verification, stress, benchmarks...) live in mk/*.mk.
include $(sort $(wildcard mk/*.mk))

help:
	@echo "make deps       install libatomic-ops-dev if atomic_ops.h is missing"
	@echo "make build      build the library (warnings are errors)"
	@echo "make test       C core tests + swift test + public API check"
	@echo "make test-core-32  the C core and its tests as a 32-bit program (installs libc6-dev-i386)"
	@echo "make integration  build and run IntegrationTests/ (Promise alone: no SwiftNIO fetched; PromiseNIO) by path and by git URL; a static server build: no Foundation, size gated"
	@echo "make api-check  compare the public API of Promise and PromiseNIO with Scripts/public-api*.txt (make api-update rewrites them)"
	@echo "make demo       run the demo program (Examples/)"
	@echo "make docs       build the DocC archives of Promise and PromiseNIO (Examples/Docs, swift-docc-plugin; warnings fail)"
	@echo "make server-load  run the Examples/ SwiftNIO server under wrk on 127.0.0.1, checking every response"
	@echo "make server-compare  the server's promise handler against the same on NIO futures, under wrk: medians, ratios"
	@echo "make examples-test  build Examples/ with warnings as errors and run its tests"
	@echo "make verify     model-check the core's protocol with spin (make verify-broken: the checks bite)"
	@echo "make stress     C racing tests + the Swift stress suite in release with long knobs"
	@echo "make tsan       ThreadSanitizer over both test targets and the C test"
	@echo "make asan       AddressSanitizer (+ LeakSanitizer, UBSan for C) over the same"
	@echo "make bench      release benchmarks and memory cases vs SwiftNIO, a mutex promise, continuations: one table"
	@echo "make bench-check  fail if our mallocs per operation or bytes per held promise rose above Benchmarks/Thresholds/"
	@echo "make clean      remove build outputs"

deps:
	@echo "==> deps: looking for atomic_ops.h (libatomic_ops)"
	@if echo '#include <atomic_ops.h>' | $(CC) -E -x c - >/dev/null 2>&1; then \
		echo "    found"; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "    missing: installing libatomic-ops-dev with apt-get"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q libatomic-ops-dev; \
	elif command -v brew >/dev/null 2>&1; then \
		echo "    missing: installing libatomic_ops with Homebrew"; \
		brew install libatomic_ops; \
	else \
		echo "    missing, and no apt-get or brew here: install libatomic_ops by hand" >&2; exit 1; \
	fi

build: deps
	@echo "==> build: swift build (warnings as errors)"
	$(SWIFT) build $(SWIFT_FLAGS)

$(BUILD_DIR)/core_test: $(CORE_SRC) $(CORE_TEST) $(wildcard $(CORE_INC)/*.h Tests/CoreTests/*.h) | deps
	@mkdir -p $(BUILD_DIR)
	$(CC) $(CORE_CFLAGS) $(CORE_SRC) $(CORE_TEST) -o $@

$(BUILD_DIR)/core_race_test: $(CORE_SRC) $(CORE_RACE) $(wildcard $(CORE_INC)/*.h Tests/CoreTests/*.h) | deps
	@mkdir -p $(BUILD_DIR)
	$(CC) $(CORE_CFLAGS) $(CORE_SRC) $(CORE_RACE) -o $@

test-core: deps $(BUILD_DIR)/core_test $(BUILD_DIR)/core_race_test
	@echo "==> test-core: the C core alone, from C with pthreads; its headers from C++ too"
	$(BUILD_DIR)/core_test
	$(BUILD_DIR)/core_race_test 1
	$(CLANGXX) -std=c++11 -pedantic-errors -Wno-nullability-extension -Wall -Wextra -Werror \
		-fsyntax-only -I $(CORE_INC) Tests/CoreTests/header_cxx.cpp

test-swift: deps
	@echo "==> test-swift: swift test (warnings as errors)"
	$(SWIFT) test $(SWIFT_FLAGS)

test: test-core test-swift api-check
	@echo "==> test: all passed"

demo: deps
	@echo "==> demo: Examples/ demo program (its own package, depends on this one by path)"
	cd Examples && $(SWIFT) run -c release demo

clean:
	@echo "==> clean"
	rm -rf $(BUILD_DIR) Examples/.build Examples/Docs/.build IntegrationTests/Consumer/.build IntegrationTests/NIOConsumer/.build IntegrationTests/ServerConsumer/.build IntegrationTests/Misuse/.build .build-api

# ---- 32-bit targets (watchOS's arm64_32 among them) ---------------------------------------

CLANG ?= clang

test-core-32: deps
	@echo "==> test-core-32: the C core and its tests built and run as a 32-bit (i386) program"
	@if ! echo '#include <stdint.h>' | $(CLANG) -m32 -E -x c - >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1; then \
			echo "    no 32-bit C library headers: installing libc6-dev-i386 with apt-get"; \
			SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
			$$SUDO apt-get update -q && $$SUDO apt-get install -y -q libc6-dev-i386; \
		else \
			echo "    no 32-bit C library headers, and no apt-get: install them by hand" >&2; exit 1; \
		fi; \
	fi
	@mkdir -p $(BUILD_DIR)
	$(CLANG) -m32 $(CORE_CFLAGS) $(CORE_SRC) $(CORE_TEST) -o $(BUILD_DIR)/core_test_32
	$(BUILD_DIR)/core_test_32
	$(CLANG) -m32 $(CORE_CFLAGS) $(CORE_SRC) $(CORE_RACE) -o $(BUILD_DIR)/core_race_test_32
	$(BUILD_DIR)/core_race_test_32 1
