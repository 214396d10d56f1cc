#!/usr/bin/env bash
# Starts the example server on 127.0.0.1 (a free port), loads it with wrk for a bounded
# time, checks every response (orders.lua), and stops it, whatever happens (trap).
# Fails if the server does not come up, any response is wrong, any error occurs, or the
# server does not stop cleanly.
#
#   server-load.sh SERVER_BINARY [SERVER_ARGS...]
#
# Environment: LOAD_SECONDS (5), LOAD_THREADS (2), LOAD_CONNECTIONS (32), WRK (wrk).
set -euo pipefail

server=${1:?usage: server-load.sh SERVER_BINARY [SERVER_ARGS...]}
shift
prefix=server-load
source "$(dirname "$0")/server-lib.sh"

load_setup
server_start server "$server" "$@"
load_run server "${LOAD_SECONDS:-5}" "${LOAD_THREADS:-2}" "${LOAD_CONNECTIONS:-32}" "$work/wrk.log"
server_stop server
echo "server-load: passed"
