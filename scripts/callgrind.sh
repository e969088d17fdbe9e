#!/usr/bin/env bash
# Instructions per call of a release gateway, counted by valgrind's callgrind: the same number for the same
# binary and load whatever else the machine is doing, so two builds compare on a busy machine where
# scripts/bench.sh's wall-clock rows would not.
#
#   scripts/callgrind.sh [GATEWAY_BINARY] [CALLS] [CONTEXT]
#   scripts/callgrind.sh floor [SECONDS]
#
# GATEWAY_BINARY defaults to target/release/sealgate; CALLS to 2000; CONTEXT to bench-off (`claim: off`), or
# bench-claim (durable claims). The load is `sealgate bench soak` from this checkout's release build: 200 calls
# to warm up, uncounted, then CALLS calls over 20 sessions, one at a time (so no count depends on how calls
# happened to share a batch). `floor` counts `sealgate bench floor` (issue 36's yardstick) instead: bench-off
# envelopes sent by wrk over one connection, 3 s to warm up, then SECONDS (default 10) counted. Prints
# `instructions_per_call=N profile=FILE`; `callgrind_annotate --inclusive=yes FILE` shows where they went.
# SHA-256 counts high here: valgrind does not run the SHA extensions that the real CPU uses.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=target/release/sealgate
WARM_UP=200
SESSIONS=20

command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
[[ -x $TOOLS ]] || cargo build --release --locked -q
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sealgate-callgrind.XXXXXX")
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT

# wait_line FILE PREFIX: the rest of the first line of FILE that starts with PREFIX, once it is there.
wait_line() {
    local i
    for ((i = 0; i < 600; i++)); do
        if grep -q "^$2" "$1"; then sed -n "s/^$2//p" "$1" | head -1; return; fi
        sleep 0.1
    done
    echo "callgrind.sh: no '$2' line in $1" >&2
    exit 1
}

# serve_gateway BINARY [valgrind …]: starts a gateway of the bench setup and sets GATEWAY_URL and GATEWAY_PID.
serve_gateway() {
    local binary=$1
    shift
    SEALGATE_LOG__LEVEL=warn SEALGATE_DATA_DIR="$WORK/gw/data" "$@" "$binary" serve --config "$WORK/gw/sealgate.yaml" \
        >"$WORK/gateway.out" 2>"$WORK/gateway.err" &
    GATEWAY_PID=$!
    PIDS+=("$GATEWAY_PID")
    GATEWAY_URL=$(wait_line "$WORK/gateway.out" 'sealgate ready on ')
}

# total PID: dumps the counts of the process under callgrind and sets PROFILE (that dump) and INSTRUCTIONS
# (counted since the zeroing).
total() {
    callgrind_control --dump "$1" >/dev/null 2>&1
    PROFILE=$(ls "$WORK"/callgrind.out.* | head -1)
    INSTRUCTIONS=$(callgrind_annotate "$PROFILE" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
}

count_gateway() {
    local calls=${2:-2000} context=${3:-bench-off}
    serve_gateway "${1:-target/release/sealgate}" valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out"
    soak() { "$TOOLS" bench soak --dir "$WORK/gw" --gateway "$GATEWAY_URL" --context "$context" --sessions "$SESSIONS" --calls "$1" --concurrency 1 >/dev/null; }
    soak "$WARM_UP"
    callgrind_control --zero "$GATEWAY_PID" >/dev/null 2>&1
    soak "$calls"
    total "$GATEWAY_PID"
    # The counted part also registers the sessions: one call each, so they count as calls.
    echo "instructions_per_call=$((INSTRUCTIONS / (calls + SESSIONS))) profile=$PROFILE"
}

count_floor() {
    local secs=${1:-10} floor_pid floor line requests
    command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
    # A gateway (not counted) registers the sessions that sign the envelopes; the floor checks none of it.
    serve_gateway "$TOOLS"
    "$TOOLS" bench envelopes --dir "$WORK/gw" --gateway "$GATEWAY_URL" --context bench-off --sessions "$SESSIONS" \
        --count 5000 --files 1 --out "$WORK/envelopes" --secs 600 >/dev/null
    valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" "$TOOLS" bench floor --upstream "$UPSTREAM/rpc" \
        >"$WORK/floor.out" 2>"$WORK/floor.err" &
    floor_pid=$!
    PIDS+=("$floor_pid")
    floor=$(wait_line "$WORK/floor.out" 'bench floor on ')
    send() { wrk -t1 -c1 -d"$1s" -s scripts/bench.lua "$floor/v1/invoke" -- cycle "$WORK/envelopes" | grep '^requests='; }
    send 3 >/dev/null
    callgrind_control --zero "$floor_pid" >/dev/null 2>&1
    line=$(send "$secs")
    total "$floor_pid"
    requests=$(sed 's/^requests=\([0-9]*\).*/\1/' <<<"$line")
    echo "instructions_per_call=$((INSTRUCTIONS / requests)) profile=$PROFILE"
}

"$TOOLS" bench upstream >"$WORK/upstream.out" 2>&1 &
PIDS+=($!)
UPSTREAM=$(wait_line "$WORK/upstream.out" 'bench upstream on ')
"$TOOLS" bench setup --dir "$WORK/gw" --upstream "$UPSTREAM/rpc" >/dev/null
if [[ ${1:-} == floor ]]; then
    count_floor "${2:-10}"
else
    count_gateway "$@"
fi
