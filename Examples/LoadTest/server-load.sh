#!/usr/bin/env bash
# Starts the example server on 127.0.0.1 (a free port), loads it with wrk for a bounded
# time, checks every response (orders.lua), and stops it, whatever happens (trap).
# Fails if the server does not come up, any response is wrong, any error occurs, or the
# server does not stop cleanly.
#
#   server-load.sh SERVER_BINARY
#
# Environment: LOAD_SECONDS (5), LOAD_THREADS (2), LOAD_CONNECTIONS (32), WRK (wrk).
set -euo pipefail

server=${1:?usage: server-load.sh SERVER_BINARY}
seconds=${LOAD_SECONDS:-5}
threads=${LOAD_THREADS:-2}
connections=${LOAD_CONNECTIONS:-32}
wrk=${WRK:-wrk}
here=$(cd "$(dirname "$0")" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/server-load.XXXXXX")
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$server" --port 0 --port-file "$work/port" >"$work/server.log" 2>&1 &
pid=$!

for _ in $(seq 100); do
    [ -s "$work/port" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "server-load: the server exited before listening:" >&2
        cat "$work/server.log" >&2
        exit 1
    fi
    sleep 0.1
done
if [ ! -s "$work/port" ]; then
    echo "server-load: the server did not start listening within 10 s" >&2
    cat "$work/server.log" >&2
    exit 1
fi
port=$(cat "$work/port")
sed 's/^/    /' "$work/server.log"

echo "==> wrk -t$threads -c$connections -d${seconds}s against http://127.0.0.1:$port/order/<random id>"
status=0
"$wrk" -t"$threads" -c"$connections" -d"${seconds}s" --timeout 5s \
    -s "$here/orders.lua" "http://127.0.0.1:$port/" | tee "$work/wrk.log" || status=$?

# Stop the server ourselves, so that a crash on shutdown fails the target too.
kill -TERM "$pid"
server_status=0
wait "$pid" || server_status=$?
pid=
sed 's/^/    /' "$work/server.log" | tail -n +2

if [ "$status" -ne 0 ]; then
    echo "server-load: FAILED: wrk exited with status $status" >&2
    exit 1
fi
if ! grep -q '^server-load: PASS$' "$work/wrk.log"; then
    echo "server-load: FAILED: wrong responses or errors (see above)" >&2
    exit 1
fi
if [ "$server_status" -ne 0 ]; then
    echo "server-load: FAILED: the server exited with status $server_status" >&2
    exit 1
fi
echo "server-load: passed"
