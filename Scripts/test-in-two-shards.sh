#!/usr/bin/env bash
# test-in-two-shards.sh: runs an already built test bundle as two processes at once, the
# stress suite (PromiseStressTests) beside everything else, for the sanitizer targets
# (mk/stress.mk).
#
#   test-in-two-shards.sh LOG swift test --skip-build <flags...>
#
# Why: most unit tests run on one thread, so a sanitized run kept about one core of two
# busy; the stress tests, capped in wall-clock time per test, fill the other. The unit
# shard's output is shown as it runs; the stress shard's goes to LOG.stress and is shown
# when both have finished. Exits non-zero if either shard failed.
set -uo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 LOG swift test --skip-build <flags...>" >&2
    exit 2
fi
log=$1
shift

"$@" --filter PromiseStressTests > "$log.stress" 2>&1 &
stress_pid=$!
"$@" --skip PromiseStressTests
unit_status=$?
wait "$stress_pid"
stress_status=$?

echo "==> the stress shard (PromiseStressTests), run beside the tests above:"
cat "$log.stress"
echo "==> shards: the tests exited with $unit_status, the stress tests with $stress_status"
[ "$unit_status" = 0 ] && [ "$stress_status" = 0 ]
