#!/usr/bin/env bash
# Builds each target of IntegrationTests/Misuse, which must fail to compile, and checks
# that it failed for the expected reason (a message of the compiler's), not another.
#
# Environment: SWIFT (default swift).
set -euo pipefail
cd "$(dirname "$0")/Misuse"
swift=${SWIFT:-swift}

# target, then a message its build must print
expect_rejected() {
    local target=$1 expected=$2 log
    echo "==> IntegrationTests/Misuse: $target must not compile"
    if log=$("$swift" build --target "$target" 2>&1); then
        echo "FAIL: $target compiled; the compiler should have rejected it ($expected)" >&2
        exit 1
    fi
    if ! grep -qF "$expected" <<< "$log"; then
        echo "FAIL: $target failed to compile, but not with \"$expected\":" >&2
        echo "$log" | tail -n 30 >&2
        exit 1
    fi
    echo "    ok: rejected with \"$expected\" ($(grep -cF "$expected" <<< "$log") times)"
}

# The dependency alone must build, so that a failure above is the misuse's.
"$swift" build --target Promise >/dev/null
expect_rejected wait-in-async "is unavailable from asynchronous contexts"
expect_rejected void-then-several-statements "missing return in closure expected to return 'Promise<Void>'"
expect_rejected void-recover-several-statements "ambiguous use of 'recover"
expect_rejected recover-returning-nothing "failed to produce diagnostic for expression"
expect_rejected non-awaiting-closure-untyped "does not conform to the 'Sendable' protocol"
