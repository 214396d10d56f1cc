#!/usr/bin/env bash
# The example server's two engines under the same load: --engine promise (OrderService)
# against --engine nio (FutureOrderService, NIO futures only). Both servers run at once,
# each on its own free port; wrk loads one at a time, interleaved (promise, nio, promise,
# nio, ...) so that both see the machine's good and bad moments alike, and orders.lua
# checks every response. Prints each engine's median over the rounds of requests/s, p50
# and p99 latency, the ratios promise/nio, and a PASS or MISS line against the target
# (promise >= 1.0 x NIO's requests/s and <= 1.0 x its p99).
#
# Fails only if a server does not start or stop cleanly, or on a wrong response or any
# error; never on the ratios, which are wall clock on whatever machine this is.
#
#   server-compare.sh SERVER_BINARY
#
# Environment: COMPARE_ROUNDS (3), COMPARE_SECONDS (5), LOAD_THREADS (2),
# LOAD_CONNECTIONS (32), WRK (wrk), SERVER_CONFIG (release; debug: a check that both
# engines answer right under load, whose ratios say nothing of speed, so no verdict).
set -euo pipefail

server=${1:?usage: server-compare.sh SERVER_BINARY}
rounds=${COMPARE_ROUNDS:-3}
seconds=${COMPARE_SECONDS:-5}
threads=${LOAD_THREADS:-2}
connections=${LOAD_CONNECTIONS:-32}
engines="promise nio"
prefix=server-compare
source "$(dirname "$0")/server-lib.sh"

load_setup
for engine in $engines; do
    server_start "$engine" "$server" --engine "$engine"
    # One second unrecorded, checked like the rest: connections, caches and the
    # allocator warmed up before the first round counts.
    load_run "$engine" 1 "$threads" "$connections" "$work/wrk.log" >/dev/null ||
        { cat "$work/wrk.log"; exit 1; }
done

for round in $(seq "$rounds"); do
    for engine in $engines; do
        echo "==> round $round of $rounds: $engine"
        # The whole report only if something was wrong; else the two lines that count.
        load_run "$engine" "$seconds" "$threads" "$connections" "$work/wrk.log" >/dev/null ||
            { cat "$work/wrk.log"; exit 1; }
        grep -E 'requests/s|latency' "$work/wrk.log"
        # "N requests in S s: R requests/s" and "latency ... p50 X ms, p90 ..., p99 Y ms"
        rps=$(sed -n 's/^server-load: .* \([0-9.]*\) requests\/s$/\1/p' "$work/wrk.log")
        p50=$(sed -n 's/^server-load: latency.* p50 \([0-9.]*\) ms.*/\1/p' "$work/wrk.log")
        p99=$(sed -n 's/^server-load: latency.* p99 \([0-9.]*\) ms.*/\1/p' "$work/wrk.log")
        echo "$rps $p50 $p99" >>"$work/$engine.rounds"
    done
done

for engine in $engines; do
    server_stop "$engine"
done

# median COLUMN FILE [FORMAT]: the median of a column (the mean of the middle two for an
# even count), printed with FORMAT (%.2f).
median() {
    sort -g -k"$1,$1" "$2" | awk -v c="$1" -v f="${3:-%.2f}\n" '{ v[NR] = $c } END {
        printf f, (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

for engine in $engines; do
    if [ ! -s "$work/$engine.rounds" ] || grep -qvE '^[0-9.]+ [0-9.]+ [0-9.]+$' "$work/$engine.rounds"; then
        echo "$prefix: FAILED: could not read wrk's figures for $engine (has its report changed?)" >&2
        exit 1
    fi
done
echo "==> server-compare: median over $rounds rounds of ${seconds}s each (wrk -t$threads -c$connections, every response checked)"
printf '    %-8s %12s %10s %10s\n' engine requests/s "p50 ms" "p99 ms"
for engine in $engines; do
    printf '    %-8s %12s %10s %10s\n' "$engine" \
        "$(median 1 "$work/$engine.rounds" %.0f)" "$(median 2 "$work/$engine.rounds")" "$(median 3 "$work/$engine.rounds")"
done
if [ "${SERVER_CONFIG:-release}" != release ]; then
    echo "server-compare: a $SERVER_CONFIG build: both engines answered every request right; no ratio verdict (make server-compare builds for release)"
    exit 0
fi
awk -v pr="$(median 1 "$work/promise.rounds")" -v nr="$(median 1 "$work/nio.rounds")" \
    -v p99p="$(median 3 "$work/promise.rounds")" -v p99n="$(median 3 "$work/nio.rounds")" 'BEGIN {
    rps = pr / nr; p99 = p99p / p99n
    printf "    promise/nio: requests/s %.2f x (target >= 1.00), p99 %.2f x (target <= 1.00)\n", rps, p99
    verdict = (rps >= 1.0 && p99 <= 1.0) ? "PASS" : "MISS"
    printf "server-compare: %s: promise at %.2f x NIO'"'"'s requests/s and %.2f x its p99 (wall clock: noisy on a shared machine; not a failure)\n", verdict, rps, p99
}'
