#!/usr/bin/env bash
# Trains the zstd dictionary that the embedded store packs audit events and claim records with
# (src/store/sqlite/records.zdict; see src/store/sqlite/packed.rs), on the records a bench soak leaves:
# CALLS claimed calls over 1,000 sessions, every tenth event and claim taken as a sample.
#
# Rows packed with a dictionary are read with it for as long as a store keeps them. A retrained dictionary
# therefore needs a new DICT_ID, and packed.rs must go on reading the old one beside it.
#
#   scripts/train-store-dictionary.sh [OUT]      OUT defaults to src/store/sqlite/records.zdict
#
# Knobs: GATEWAY_BIN (default: the release build, built here), DICT_ID, DICT_BYTES, CALLS.
# Needs the sqlite3 and zstd command-line tools.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-src/store/sqlite/records.zdict}
DICT_ID=${DICT_ID:-1587609601} # 0x5EA10001, DICTIONARY_ID in packed.rs
DICT_BYTES=${DICT_BYTES:-16384}
CALLS=${CALLS:-20000}
if [[ -z ${GATEWAY_BIN:-} ]]; then
    cargo build --release --locked -q
    GATEWAY_BIN=target/release/sealgate
fi

WORK=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait; rm -rf "$WORK"' EXIT

# first_line FILE PATTERN PID: waits for the first line of FILE matching PATTERN, while PID lives.
first_line() {
    local line
    while kill -0 "$3" 2>/dev/null; do
        line=$(grep -m1 -E "$2" "$1" || true)
        if [[ -n $line ]]; then echo "$line"; return; fi
        sleep 0.1
    done
    echo "the process writing $1 stopped:" >&2
    cat "$1" >&2
    exit 1
}

"$GATEWAY_BIN" bench upstream >"$WORK/upstream.out" 2>&1 &
PIDS+=($!)
upstream=$(first_line "$WORK/upstream.out" '^bench upstream on ' $!)
"$GATEWAY_BIN" bench setup --dir "$WORK/gw" --upstream "${upstream#bench upstream on }/rpc" >/dev/null

SEALGATE_LOG__LEVEL=warn SEALGATE_DATA_DIR="$WORK/data" \
    "$GATEWAY_BIN" serve --config "$WORK/gw/sealgate.yaml" >"$WORK/gateway.out" 2>&1 &
gateway_pid=$!
PIDS+=("$gateway_pid")
gateway=$(first_line "$WORK/gateway.out" '^sealgate ready on ' "$gateway_pid")
"$GATEWAY_BIN" bench soak --dir "$WORK/gw" --gateway "${gateway#sealgate ready on }" \
    --context bench-claim --sessions 1000 --calls "$CALLS" >/dev/null
kill "$gateway_pid"
wait "$gateway_pid" || true

# One file per sampled row; a row that a dictionary packed already is unpacked with it first.
mkdir "$WORK/samples"
sqlite3 "$WORK/data/sealgate.db" >/dev/null <<SQL
SELECT writefile('$WORK/samples/event-' || seq || iif(typeof(event) = 'blob', '.zst', ''), event)
  FROM audit_events WHERE seq % 10 = 0;
SELECT writefile('$WORK/samples/claim-' || id || iif(typeof(record) = 'blob', '.zst', ''), record)
  FROM claims WHERE id % 10 = 0;
SQL
find "$WORK/samples" -name '*.zst' -print0 | xargs -0 -r zstd -q -d --rm -D "$OUT"

zstd -q -f --train -r "$WORK/samples" --maxdict="$DICT_BYTES" --dictID="$DICT_ID" -o "$OUT"
echo "trained $OUT ($(stat -c %s "$OUT") bytes) on $(find "$WORK/samples" -type f | wc -l) records"
