# Helpers shared by server-load.sh and server-compare.sh (sourced, not run): start the
# example server on 127.0.0.1 and wait until it listens, load it with wrk through the
# response checker orders.lua, and stop it, whatever happens (an EXIT trap).
#
# A caller sets `prefix` (its name, for messages) and calls `load_setup` first. Servers
# are named, so that several can run at once; each keeps its pid, port and log in $work.
# Environment: WRK (wrk).

wrk=${WRK:-wrk}
load_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Makes the work directory and arms the cleanup.
load_setup() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/$prefix.XXXXXX")
    trap load_cleanup EXIT
    trap 'exit 130' INT TERM
}

# Stops every server still running (TERM, then KILL after 5 s) and removes $work.
load_cleanup() {
    local pidfile pid
    for pidfile in "$work"/*.pid; do
        [ -e "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$work"
}

# server_start NAME BINARY [ARGS...]: starts the server on a free port and waits (up to
# 10 s) until it listens; then `server_port NAME` prints the port. Exits on failure.
server_start() {
    local name=$1 binary=$2 pid
    shift 2
    "$binary" --port 0 --port-file "$work/$name.port" "$@" >"$work/$name.log" 2>&1 &
    pid=$!
    echo "$pid" >"$work/$name.pid"
    for _ in $(seq 100); do
        [ -s "$work/$name.port" ] && break
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$prefix: the server ($name) exited before listening:" >&2
            cat "$work/$name.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    if [ ! -s "$work/$name.port" ]; then
        echo "$prefix: the server ($name) did not start listening within 10 s" >&2
        cat "$work/$name.log" >&2
        exit 1
    fi
    sed 's/^/    /' "$work/$name.log"
}

server_port() {
    cat "$work/$1.port"
}

# server_stop NAME: stops the server ourselves (TERM), so that a crash on shutdown fails
# the caller too, and prints its closing lines. Exits if it does not exit with status 0,
# had already died, or takes over 10 s to stop (then it is killed).
server_stop() {
    local name=$1 pid status=0 tries=0
    pid=$(cat "$work/$name.pid")
    if ! kill -TERM "$pid" 2>/dev/null; then
        echo "$prefix: FAILED: the server ($name) had died before it was stopped" >&2
        sed 's/^/    /' "$work/$name.log" >&2
        wait "$pid" || true
        exit 1
    fi
    while kill -0 "$pid" 2>/dev/null && [ "$tries" -lt 100 ]; do
        sleep 0.1
        tries=$((tries + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        echo "$prefix: FAILED: the server ($name) did not stop within 10 s of SIGTERM" >&2
        wait "$pid" || true
        sed 's/^/    /' "$work/$name.log" >&2
        exit 1
    fi
    wait "$pid" || status=$?
    rm -f "$work/$name.pid"
    sed 's/^/    /' "$work/$name.log" | tail -n +2
    if [ "$status" -ne 0 ]; then
        echo "$prefix: FAILED: the server ($name) exited with status $status" >&2
        exit 1
    fi
}

# load_run NAME SECONDS THREADS CONNECTIONS LOG: wrk against server NAME, every response
# checked by orders.lua; its report goes to stdout and to LOG. Fails (status 1) on a
# wrong response, an error, or a failure of wrk itself.
load_run() {
    local name=$1 seconds=$2 threads=$3 connections=$4 log=$5 status=0 port
    port=$(server_port "$name")
    echo "==> wrk -t$threads -c$connections -d${seconds}s against http://127.0.0.1:$port/order/<random id> ($name)"
    "$wrk" -t"$threads" -c"$connections" -d"${seconds}s" --timeout 5s \
        -s "$load_dir/orders.lua" "http://127.0.0.1:$port/" | tee "$log" || status=$?
    if [ "$status" -ne 0 ]; then
        echo "$prefix: FAILED: wrk exited with status $status ($name)" >&2
        return 1
    fi
    if ! grep -q '^server-load: PASS$' "$log"; then
        echo "$prefix: FAILED: wrong responses or errors from $name (see wrk's report)" >&2
        return 1
    fi
}
