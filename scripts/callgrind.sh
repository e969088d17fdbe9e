#!/usr/bin/env bash
# Instructions per call of a release gateway, counted by valgrind's callgrind: the same number for the same
# binary and load whatever else the machine is doing, so two builds compare on a busy machine where
# scripts/bench.sh's wall-clock rows would not.
#
#   scripts/callgrind.sh [GATEWAY_BINARY] [CALLS] [CONTEXT]
#
# GATEWAY_BINARY defaults to target/release/sealgate; CALLS to 2000; CONTEXT to bench-off (`claim: off`), or
# bench-claim (durable claims). The load is `sealgate bench soak` from this checkout's release build: 200 calls
# to warm up, uncounted, then CALLS calls over 20 sessions, one at a time (so no count depends on how calls
# happened to share a batch). Prints
# `instructions_per_call=N profile=FILE`; `callgrind_annotate --inclusive=yes FILE` shows where they went.
# SHA-256 counts high here: valgrind does not run the SHA extensions that the real CPU uses.
set -euo pipefail
cd "$(dirname "$0")/.."
GATEWAY=${1:-target/release/sealgate}
CALLS=${2:-2000}
CONTEXT=${3:-bench-off}
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

"$TOOLS" bench upstream >"$WORK/upstream.out" 2>&1 &
PIDS+=($!)
upstream=$(wait_line "$WORK/upstream.out" 'bench upstream on ')
"$TOOLS" bench setup --dir "$WORK/gw" --upstream "$upstream/rpc" >/dev/null
SEALGATE_LOG__LEVEL=warn SEALGATE_DATA_DIR="$WORK/gw/data" valgrind --tool=callgrind \
    --callgrind-out-file="$WORK/callgrind.out" "$GATEWAY" serve --config "$WORK/gw/sealgate.yaml" \
    >"$WORK/gateway.out" 2>"$WORK/gateway.err" &
gateway_pid=$!
PIDS+=("$gateway_pid")
gateway=$(wait_line "$WORK/gateway.out" 'sealgate ready on ')

soak() { "$TOOLS" bench soak --dir "$WORK/gw" --gateway "$gateway" --context "$CONTEXT" --sessions "$SESSIONS" --calls "$1" --concurrency 1 >/dev/null; }
soak "$WARM_UP"
callgrind_control --zero "$gateway_pid" >/dev/null 2>&1
soak "$CALLS"
callgrind_control --dump "$gateway_pid" >/dev/null 2>&1
profile=$(ls "$WORK"/callgrind.out.* | head -1)
total=$(callgrind_annotate "$profile" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
# The counted part also registers the sessions: one call each, so they count as calls.
echo "instructions_per_call=$((total / (CALLS + SESSIONS))) profile=$profile"
