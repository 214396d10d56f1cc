#!/usr/bin/env bash
# test-in-two-shards.sh: runs an already built test bundle as two processes at once, the
# stress suite (PromiseStressTests) beside everything else, for the sanitizer targets
# (mk/stress.mk).
#
#   test-in-two-shards.sh LOG BIN_PATH swift test --skip-build <flags...>
#
# Why: most unit tests run on one thread, so a sanitized run kept about one core of two
# busy; the stress tests, capped in wall-clock time per test, fill the other. The stress
# shard runs the test bundle in BIN_PATH directly, with its classes as the bundle's test
# specifiers: a second `swift test` would wait for the first, which locks the build
# folder. The unit shard's output is shown as it runs; the stress shard's goes to
# LOG.stress and is shown when both have finished. Exits non-zero if either shard failed.
set -uo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 LOG BIN_PATH swift test --skip-build <flags...>" >&2
    exit 2
fi
log=$1
bin_path=$2
shift 2

bundle=$(ls -d "$bin_path"/*.xctest 2>/dev/null | head -n 1)
if [ -z "$bundle" ]; then
    echo "test-in-two-shards: no test bundle in $bin_path (build with --build-tests first)" >&2
    exit 1
fi
stress_classes=$("$bundle" --list-tests | sed -n 's|^\(PromiseStressTests\.[A-Za-z0-9_]*\)/.*|\1|p' | sort -u | paste -sd, -)
if [ -z "$stress_classes" ]; then
    echo "test-in-two-shards: $bundle lists no PromiseStressTests" >&2
    exit 1
fi

"$bundle" "$stress_classes" > "$log.stress" 2>&1 &
stress_pid=$!
"$@" --skip PromiseStressTests
unit_status=$?
wait "$stress_pid"
stress_status=$?

echo "==> the stress shard (PromiseStressTests), run beside the tests above:"
cat "$log.stress"
echo "==> shards: the tests exited with $unit_status, the stress tests with $stress_status"
[ "$unit_status" = 0 ] && [ "$stress_status" = 0 ]
