#!/usr/bin/env bash
# The benchmark of issue 9: the release gateway against nginx as a plain pass-through proxy, both in front of
# the same one-thread JSON-RPC upstream and driven by the same client (wrk) with unique pre-signed envelopes;
# plus fixed-rate and one-at-a-time latency, the disk's own fsync time, memory with many sessions, and the
# standalone /claim API against SafeAgent's own server. Prints one table. Everything listens on 127.0.0.1
# at ports chosen at run time, and every process started here is stopped on exit.
#
# Knobs (environment):
#   BENCH_SECS=10          seconds per throughput row (at most 20: envelopes are signed just before a row,
#                          and signing and row together must fit the gateway's ±30 s clock window)
#   BENCH_THREADS=2 BENCH_CONNECTIONS=32   wrk threads and connections
#   BENCH_SESSIONS=1000    sessions the envelopes are spread over (issue 20 measures with 1,000)
#   BENCH_MAX_RPS=25000    envelopes signed per second of the claim: off row; later rows sign twice the rate
#                          that row reached (a row that runs out is marked "≥", since it stopped early)
#   BENCH_RATE             the fixed open-loop rate, for BENCH_SECS (default: half of what the floor row served,
#                          as issue 36 measures the p99)
#   BENCH_SERIAL_SECS=5    seconds of one-call-at-a-time latency
#   BENCH_FSYNCS=300       fdatasync probes on the gateway's data folder
#   BENCH_LIVE_SESSIONS=1000 BENCH_CALLS=50000   the memory and disk row (issue 20's target is BENCH_CALLS=1000000)
#   BENCH_DISK_CALLS=2000  claimed calls with random idempotency keys on a fresh store, for disk per call (issue 36)
#   BENCH_POSTGRES=postgres://postgres@127.0.0.1:5432   server for the PostgreSQL rows (a database is created
#                          and dropped); the rows are skipped when it does not answer
#   BENCH_ONLY=postgres    only the PostgreSQL rows (and the Ed25519 measurement they are read against)
#   BENCH_GATEWAY_BIN      another build's binary to serve the gateway rows, for a back-to-back comparison with
#                          the build before (the floor, the upstream and the clients still come from this build)
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${BENCH_SECS:-10}
THREADS=${BENCH_THREADS:-2}
CONNECTIONS=${BENCH_CONNECTIONS:-32}
SESSIONS=${BENCH_SESSIONS:-1000}
MAX_RPS=${BENCH_MAX_RPS:-25000}
RATE=${BENCH_RATE:-}
SERIAL_SECS=${BENCH_SERIAL_SECS:-5}
FSYNCS=${BENCH_FSYNCS:-300}
LIVE_SESSIONS=${BENCH_LIVE_SESSIONS:-1000}
CALLS=${BENCH_CALLS:-50000}
DISK_CALLS=${BENCH_DISK_CALLS:-2000}
POSTGRES=${BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432}
ONLY=${BENCH_ONLY:-}
SAFEAGENT_VERSION=0.1.25
VENV=target/bench-venv
BIN=target/release/sealgate
GATEWAY_BIN=${BENCH_GATEWAY_BIN:-$BIN}

if [[ -n $ONLY && $ONLY != postgres ]]; then
    echo "BENCH_ONLY must be empty (every row) or postgres, not '$ONLY'" >&2
    exit 2
fi
if ((SECS > 20 || SERIAL_SECS > 20)); then
    echo "BENCH_SECS and BENCH_SERIAL_SECS must be at most 20 (the 30 s clock window of signed envelopes)" >&2
    exit 2
fi

say() { echo "bench: $*" >&2; }
label() { if [[ $1 == off ]]; then echo "\`claim: off\`"; else echo "durable claims"; fi; }

# ---- tools: Debian's nginx and wrk, SafeAgent from PyPI in a venv, the release build ----
as_root() { if ((EUID == 0)); then "$@"; else sudo "$@"; fi; }

install_tools() {
    local missing=()
    command -v nginx >/dev/null || missing+=(nginx)
    command -v wrk >/dev/null || missing+=(wrk)
    command -v sqlite3 >/dev/null || missing+=(sqlite3)
    # Debian's python3 makes venvs only with python3-venv (which brings ensurepip).
    python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
    if ((${#missing[@]})); then
        say "installing ${missing[*]} (apt)"
        as_root apt-get update -qq
        # Debian starts a package's service on install unless policy-rc.d refuses; this benchmark runs
        # its own nginx, so refuse for the duration of the install when nothing refuses already.
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            POLICY_RC=/usr/sbin/policy-rc.d
            printf '#!/bin/sh\nexit 101\n' | as_root tee "$POLICY_RC" >/dev/null
            as_root chmod +x "$POLICY_RC"
        fi
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        remove_policy_rc
    fi
    if ! "$VENV/bin/python" -c 'import sys, fastapi, uvicorn, importlib.metadata as m
assert m.version("safeagent-exec-guard") == sys.argv[1]' "$SAFEAGENT_VERSION" 2>/dev/null; then
        say "installing safeagent-exec-guard $SAFEAGENT_VERSION, fastapi and uvicorn (pip, into $VENV)"
        python3 -m venv "$VENV"
        # payment_server imports fastapi, which the package does not declare.
        "$VENV/bin/pip" install -q "safeagent-exec-guard==$SAFEAGENT_VERSION" fastapi uvicorn
    fi
    say "building the release gateway"
    cargo build --release --locked -q
}

remove_policy_rc() {
    [[ -z $POLICY_RC ]] || as_root rm -f "$POLICY_RC"
    POLICY_RC=""
}

# ---- processes ----
WORK="" LOAD="" PIDS=() POLICY_RC="" PG_DROP=""
cleanup() {
    local pid
    remove_policy_rc
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    [[ -z $PG_DROP ]] || psql "$POSTGRES/postgres" -qc "drop database if exists $PG_DROP" >/dev/null 2>&1 || true
    [[ -z $WORK ]] || rm -rf "$WORK"
    [[ -z $LOAD ]] || rm -rf "$LOAD"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_line NAME PATTERN PID: the first line matching PATTERN that the process started as NAME prints.
wait_line() {
    local i line
    for ((i = 0; i < 300; i++)); do
        line=$(grep -m1 -E "$2" "$WORK/$1.out" || true)
        if [[ -n $line ]]; then echo "$line"; return; fi
        kill -0 "$3" 2>/dev/null || break
        sleep 0.1
    done
    say "$1 did not start; its output:"; cat "$WORK/$1.out" "$WORK/$1.err" >&2
    exit 1
}

wait_port() {
    local i
    for ((i = 0; i < 300; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
        sleep 0.1
    done
    say "nothing listens on 127.0.0.1:$1"; exit 1
}

# start NAME CMD…: runs CMD in the background with its output in $WORK/NAME.out / .err; sets STARTED.
start() {
    local name=$1; shift
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    STARTED=$!
    PIDS+=("$STARTED")
}

start_gateway() { # NAME DATA_DIR: sets GW_URL and GW_PID (SEALGATE_LIMITS__MAX_CONCURRENT_CALLS, _STORE,
                  # _REPLICA_ID and _SIGNING__KEY_FILE pass on)
    start "$1" env SEALGATE_LOG__LEVEL=warn SEALGATE_DATA_DIR="$2" \
        ${SEALGATE_LIMITS__MAX_CONCURRENT_CALLS:+SEALGATE_LIMITS__MAX_CONCURRENT_CALLS=$SEALGATE_LIMITS__MAX_CONCURRENT_CALLS} \
        ${SEALGATE_STORE:+SEALGATE_STORE=$SEALGATE_STORE} ${SEALGATE_REPLICA_ID:+SEALGATE_REPLICA_ID=$SEALGATE_REPLICA_ID} \
        ${SEALGATE_SIGNING__KEY_FILE:+SEALGATE_SIGNING__KEY_FILE=$SEALGATE_SIGNING__KEY_FILE} \
        "$GATEWAY_BIN" serve --config "$WORK/gw/sealgate.yaml"
    GW_PID=$STARTED
    GW_URL=$(wait_line "$1" '^sealgate ready on ' "$GW_PID")
    GW_URL=${GW_URL#sealgate ready on }
}

start_nginx() { # NAME PORT WORKERS SERVER…: nginx in the foreground, proxying 127.0.0.1:PORT to the servers
    local name=$1 port=$2 workers=$3 dir=$WORK/$1 servers="" server
    shift 3
    for server in "$@"; do servers+="server $server; "; done
    mkdir -p "$dir/logs"
    cat >"$dir/nginx.conf" <<EOF
worker_processes $workers;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    upstream backends { ${servers}keepalive 64; }
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
    start "$name" nginx -p "$dir" -e "$dir/logs/error.log" -c "$dir/nginx.conf"
    wait_port "$port"
}

cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
# PostgreSQL's CPU, counted with the gateway's on its rows (issue 20): every server process's time, and the
# time of the server's children that exited, which the postmaster (the oldest process) has reaped.
pg_ticks() {
    local pid total=0 postmaster
    postmaster=$(pgrep -o -x postgres) || { echo 0; return; }
    for pid in $(pgrep -x postgres); do
        total=$(( total + $(cpu_ticks "$pid" 2>/dev/null || echo 0) ))
    done
    echo $(( total + $(sed 's/^.*) //' "/proc/$postmaster/stat" | awk '{print $14 + $15}') ))
}
# CPU ticks spent over ROW, in microseconds per call it answered.
us_per_call() { echo $(( $1 * 1000000 / $(getconf CLK_TCK) / ${R[$2.requests]} )); } # TICKS ROW
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# ---- results: R[row.key]=value, read from the `key=value …` lines that wrk and `sealgate bench` print ----
declare -A R
record() { # ROW LINE
    local pair
    for pair in $2; do R[$1.${pair%%=*}]=${pair#*=}; done
}

envelopes() { # CONTEXT COUNT FILES OUT SECS
    "$BIN" bench envelopes --dir "$WORK/gw" --gateway "$GW_URL" --context "$1" --sessions "$SESSIONS" \
        --count "$2" --files "$3" --out "$4" --secs "$5" >/dev/null
}

# Envelopes for SECS seconds of a row: twice the claim: off row's rate (nothing else is faster), at most
# BENCH_MAX_RPS.
budget() { # SECS
    local rps=$MAX_RPS
    [[ -z ${R[off.requests]:-} ]] || rps=$(( 2 * ${R[off.requests]} * 1000000 / ${R[off.duration_us]} ))
    echo $(( (rps < MAX_RPS ? rps : MAX_RPS) * $1 + 1000 ))
}

wrk_row() { # ROW THREADS CONNECTIONS SECS URL LUA-ARGS…; ROW_PID (or empty): the server whose CPU and RSS count
    local row=$1 threads=$2 connections=$3 secs=$4 url=$5 before=0 line
    shift 5
    [[ -z ${ROW_PID:-} ]] || before=$(cpu_ticks "$ROW_PID")
    line=$(wrk -t"$threads" -c"$connections" -d"${secs}s" -s scripts/bench.lua "$url" -- "$@" | grep '^requests=')
    record "$row" "$line"
    if [[ -n ${ROW_PID:-} ]]; then
        R[$row.cpu_us]=$(us_per_call $(( $(cpu_ticks "$ROW_PID") - before )) "$row")
        R[$row.rss_kib]=$(rss_kib "$ROW_PID")
    fi
    if ((${R[$row.exhausted_threads]:-0})); then
        say "$row ran out of envelopes and stopped early: its req/s is a lower bound; raise BENCH_MAX_RPS"
    fi
}

# Issue 11: durable claims on PostgreSQL, one replica, then two behind nginx (round robin). Skipped when
# no PostgreSQL answers at BENCH_POSTGRES. Needs the main gateway (GW_URL), which registers the sessions.
postgres_rows() {
    local main_url=$GW_URL
    if psql "$POSTGRES/postgres" -qAtc 'select 1' >/dev/null 2>&1; then
        local db=sealgate_bench_$$ store
        psql "$POSTGRES/postgres" -qc "create database $db" >/dev/null
        PG_DROP="$db"
        store="$POSTGRES/$db"
        say "sealgate on PostgreSQL, durable claims, one replica, ${SECS}s"
        # On PostgreSQL each replica is given its signing key (SPEC 14).
        "$BIN" keygen --out "$WORK/gw" --name signing-pg-a >/dev/null
        "$BIN" keygen --out "$WORK/gw" --name signing-pg-b >/dev/null
        SEALGATE_STORE=$store SEALGATE_REPLICA_ID=pg-a SEALGATE_SIGNING__KEY_FILE="$WORK/gw/signing-pg-a.key" \
            start_gateway pg-a "$WORK/gw/data-pg-a"
        local pg_a=$GW_PID pg_a_url=$GW_URL
        envelopes bench-claim "$(budget "$SECS")" "$THREADS" "$LOAD/pg1" "$SECS"
        local pg_before; pg_before=$(pg_ticks)
        ROW_PID=$pg_a wrk_row pg1 "$THREADS" "$CONNECTIONS" "$SECS" "$pg_a_url/v1/invoke" once "$LOAD/pg1"
        R[pg1.server_cpu_us]=$(us_per_call $(( $(pg_ticks) - pg_before )) pg1)
        rm -f "$LOAD/pg1".*
        say "sealgate on PostgreSQL, durable claims, two replicas behind nginx, ${SECS}s"
        SEALGATE_STORE=$store SEALGATE_REPLICA_ID=pg-b SEALGATE_SIGNING__KEY_FILE="$WORK/gw/signing-pg-b.key" \
            start_gateway pg-b "$WORK/gw/data-pg-b"
        local pg_b=$GW_PID pg_b_url=$GW_URL lb_port
        lb_port=$(free_port)
        start_nginx balancer "$lb_port" 1 "${pg_a_url#http://}" "${pg_b_url#http://}"
        GW_URL="http://127.0.0.1:$lb_port"
        envelopes bench-claim "$(budget "$SECS")" "$THREADS" "$LOAD/pg2" "$SECS"
        local before_b; before_b=$(cpu_ticks "$pg_b") pg_before=$(pg_ticks)
        ROW_PID=$pg_a wrk_row pg2 "$THREADS" "$CONNECTIONS" "$SECS" "$GW_URL/v1/invoke" once "$LOAD/pg2"
        R[pg2.server_cpu_us]=$(us_per_call $(( $(pg_ticks) - pg_before )) pg2)
        # Both replicas' CPU counts for the row.
        R[pg2.cpu_us]=$(( ${R[pg2.cpu_us]} + $(us_per_call $(( $(cpu_ticks "$pg_b") - before_b )) pg2) ))
        rm -f "$LOAD/pg2".*
        GW_URL=$main_url
    else
        say "no PostgreSQL at $POSTGRES: the PostgreSQL rows are skipped"
    fi
}

# Issue 36: disk per claimed call with random idempotency keys, on a fresh store. The gateway stops first,
# and its write-ahead log is folded into the file, so that the file holds every byte the calls left.
disk_row() {
    say "disk: $DISK_CALLS calls with durable claims and random idempotency keys on a fresh gateway"
    local data=$WORK/gw/data-disk
    start_gateway disk-gateway "$data"
    record disk "$("$BIN" bench soak --dir "$WORK/gw" --gateway "$GW_URL" --context bench-claim \
        --sessions 10 --calls "$DISK_CALLS" --keyed)"
    kill "$GW_PID"
    wait "$GW_PID" 2>/dev/null || true
    sqlite3 "$data/sealgate.db" 'PRAGMA wal_checkpoint(TRUNCATE);' >/dev/null
    R[disk.db_bytes]=$(stat -c %s "$data/sealgate.db")
}

main() {
    install_tools
    # Other work on the machine skews every number: say how much there was.
    LOAD_AVERAGE=$(cut -d' ' -f1 /proc/loadavg)
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/sealgate-bench.XXXXXX")
    # Envelope files live in memory when possible, so that writing them puts no load on the disk that the
    # gateway fsyncs to.
    LOAD=$(mktemp -d /dev/shm/sealgate-bench.XXXXXX 2>/dev/null || mktemp -d "$WORK/load.XXXXXX")

    start upstream "$BIN" bench upstream
    local upstream_pid=$STARTED up
    up=$(wait_line upstream '^bench upstream on ' "$upstream_pid")
    up=${up#bench upstream on }
    "$BIN" bench setup --dir "$WORK/gw" --upstream "$up/rpc"
    start_gateway gateway "$WORK/gw/data"
    local gw_pid=$GW_PID

    local nginx_port; nginx_port=$(free_port)
    start_nginx nginx "$nginx_port" auto "${up#http://}"

    say "fsync probe on the gateway's data folder"
    record fsync "$("$BIN" bench fsync --dir "$WORK/gw/data" --count "$FSYNCS")"
    # Machines here differ threefold in speed, so CPU per call is also given in Ed25519 verifications
    # measured now, on this machine (issue 20).
    say "openssl speed ed25519"
    R[ed.verify_ns]=$(openssl speed -seconds 3 ed25519 2>/dev/null |
        awk '/Ed25519/ { printf "%.0f", 1e9 / $NF }')
    if [[ $ONLY == postgres ]]; then
        postgres_rows
        print_postgres
        return
    fi
    say "the cost of a signed receipt (SPEC 14)"
    record sign "$("$BIN" bench sign --count 20000)"
    say "the answer guard on a 64 KiB text answer (SPEC 18)"
    record guard "$("$BIN" bench guard --count 2000)"

    say "nginx pass-through, ${SECS}s"
    envelopes bench-off 20000 "$THREADS" "$LOAD/nginx" "$SECS"
    ROW_PID="" wrk_row nginx "$THREADS" "$CONNECTIONS" "$SECS" "http://127.0.0.1:$nginx_port/rpc" cycle "$LOAD/nginx"

    # What this stack costs before the gateway does its own work: its HTTP server and client, one Ed25519
    # verification and one signature a call, nothing else (the same envelopes as nginx's, which it does not
    # check for replay).
    say "floor: HTTP server and client with one verification and one signature, ${SECS}s"
    start floor "$BIN" bench floor --upstream "$up/rpc"
    local floor_pid=$STARTED floor_url
    floor_url=$(wait_line floor '^bench floor on ' "$floor_pid")
    floor_url=${floor_url#bench floor on }
    ROW_PID=$floor_pid wrk_row floor "$THREADS" "$CONNECTIONS" "$SECS" "$floor_url/v1/invoke" cycle "$LOAD/nginx"
    [[ -n $RATE ]] || RATE=$(( $(rps floor) / 2 ))
    # One call at a time through nginx and the floor: the latency the stack has before the gateway's own
    # work, beside the gateway's one-call-at-a-time rows below.
    say "nginx and the floor, one call at a time, ${SERIAL_SECS}s each"
    ROW_PID="" wrk_row serial_nginx 1 1 "$SERIAL_SECS" "http://127.0.0.1:$nginx_port/rpc" cycle "$LOAD/nginx"
    ROW_PID="" wrk_row serial_floor 1 1 "$SERIAL_SECS" "$floor_url/v1/invoke" cycle "$LOAD/nginx"
    kill "$floor_pid"

    local mode
    for mode in off claim; do
        say "sealgate, $(label $mode), ${SECS}s"
        envelopes "bench-$mode" "$(budget "$SECS")" "$THREADS" "$LOAD/$mode" "$SECS"
        ROW_PID=$gw_pid wrk_row "$mode" "$THREADS" "$CONNECTIONS" "$SECS" "$GW_URL/v1/invoke" once "$LOAD/$mode"
        rm -f "$LOAD/$mode".*
    done
    # The MCP endpoint (SPEC 17): the same calls from a host with a bearer token instead of a signature,
    # under the `claim: off` context (issue 33's target: at most 1.2 × the envelope row's CPU per call).
    say "sealgate MCP endpoint, tools/call with a bearer token, $(label off), ${SECS}s"
    local mcp; mcp=$("$BIN" bench mcp-session --dir "$WORK/gw" --gateway "$GW_URL")
    local mcp_token=${mcp#token=}; mcp_token=${mcp_token%% *}
    ROW_PID=$gw_pid wrk_row mcp "$THREADS" "$CONNECTIONS" "$SECS" "$GW_URL/mcp" mcp "$mcp_token" "${mcp##*session=}"
    for mode in off claim; do
        say "sealgate, $(label $mode), at a fixed $RATE req/s, ${SECS}s"
        record "rate_$mode" "$("$BIN" bench rate --dir "$WORK/gw" --gateway "$GW_URL" --context "bench-$mode" \
            --sessions "$SESSIONS" --rate "$RATE" --secs "$SECS")"
    done
    for mode in off claim; do
        say "sealgate, $(label $mode), one call at a time, ${SERIAL_SECS}s"
        envelopes "bench-$mode" "$(budget "$SERIAL_SECS")" 1 "$LOAD/serial" "$SERIAL_SECS"
        ROW_PID="" wrk_row "serial_$mode" 1 1 "$SERIAL_SECS" "$GW_URL/v1/invoke" once "$LOAD/serial"
        rm -f "$LOAD/serial".*
    done

    # Overload (issue 9): four times as many connections as the gateway admits calls at once. The calls it
    # admits should go on at the speed of the claim: off row; the rest are shed at once with 5006. wrk
    # resends a shed call at once; the second row's callers wait out Retry-After, as SPEC 11 asks.
    say "overload: $((4 * CONNECTIONS)) connections against max_concurrent_calls $CONNECTIONS, ${SECS}s"
    local main_url=$GW_URL
    SEALGATE_LIMITS__MAX_CONCURRENT_CALLS=$CONNECTIONS start_gateway capped-gateway "$WORK/gw/data-capped"
    envelopes bench-off $((4 * $(budget "$SECS"))) "$THREADS" "$LOAD/overload" "$SECS"
    ROW_PID=$GW_PID wrk_row overload "$THREADS" $((4 * CONNECTIONS)) "$SECS" "$GW_URL/v1/invoke" once "$LOAD/overload"
    rm -f "$LOAD/overload".*
    say "overload again, callers honouring Retry-After, ${SECS}s"
    record polite "$("$BIN" bench overload --dir "$WORK/gw" --gateway "$GW_URL" --context bench-off \
        --sessions "$SESSIONS" --secs "$SECS" --concurrency $((4 * CONNECTIONS)))"
    GW_URL=$main_url

    postgres_rows

    say "standalone POST /claim: sealgate, then SafeAgent under uvicorn, ${SECS}s each"
    local operator; operator=$("$BIN" bench operator-token --dir "$WORK/gw")
    ROW_PID=$gw_pid wrk_row claim_api "$THREADS" "$CONNECTIONS" "$SECS" "$GW_URL/claim" claim "run$$" "$operator"
    local sa_port; sa_port=$(free_port)
    mkdir -p "$WORK/safeagent"
    # Its claim route needs a settlement secret (32+ characters) to answer; no payment address: no x402 gate.
    start safeagent env SAFEAGENT_DB_PATH="$WORK/safeagent/claims.db" \
        SAFEAGENT_SETTLEMENT_SECRET="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
        "$VENV/bin/uvicorn" safeagent_exec_guard.payment_server:app --host 127.0.0.1 --port "$sa_port" \
        --log-level warning --no-access-log
    local sa_pid=$STARTED
    wait_port "$sa_port"
    ROW_PID=$sa_pid wrk_row safeagent "$THREADS" "$CONNECTIONS" "$SECS" "http://127.0.0.1:$sa_port/claim" claim "run$$"

    say "memory: $LIVE_SESSIONS live sessions, $CALLS calls with durable claims on a fresh gateway"
    start_gateway soak-gateway "$WORK/gw/data-soak"
    record soak "$("$BIN" bench soak --dir "$WORK/gw" --gateway "$GW_URL" --context bench-claim \
        --sessions "$LIVE_SESSIONS" --calls "$CALLS")"
    R[soak.rss_kib]=$(rss_kib "$GW_PID")
    # What the claimed calls left on disk: the database file and its write-ahead log (retention off).
    R[soak.db_bytes]=$(stat -c %s "$WORK/gw/data-soak/sealgate.db")
    R[soak.wal_bytes]=$(stat -c %s "$WORK/gw/data-soak/sealgate.db-wal" 2>/dev/null || echo 0)
    kill "$GW_PID"
    disk_row

    print_table
}

# ---- the table ----
us_of_ns() { awk -v ns="$1" 'BEGIN { printf "%.1f µs", ns / 1000 }'; }
ms() {
    awk -v us="$1" 'BEGIN {
        if (us < 10000) printf "%.2f ms", us / 1000; else if (us < 1e7) printf "%.0f ms", us / 1000
        else printf "%.1f s", us / 1e6 }'
}
mib() { awk -v kib="$1" 'BEGIN { printf "%.0f MiB", kib / 1024 }'; }
num() { printf '%d' "$1" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta'; }
rps() { awk -v n="${R[$1.requests]}" -v us="${R[$1.duration_us]}" 'BEGIN { printf "%.0f", n / (us / 1e6) }'; }
# A row that ran out of envelopes stopped early, but wrk divides by the whole duration.
at_least() { ((${R[$1.exhausted_threads]:-0} == 0)) || printf '≥ '; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf (a / b < 0.1 ? "%.3f" : "%.2f"), a / b }'; }
# CPU microseconds as a multiple of one Ed25519 verification of this run.
verifications() { awk -v us="$1" -v ns="${R[ed.verify_ns]}" 'BEGIN { printf "%.1f× Ed25519", us * 1000 / ns }'; }
verifications_ns() { awk -v t="$1" -v ns="${R[ed.verify_ns]}" 'BEGIN { printf "%.2f× Ed25519", t / ns }'; }
kb_per_call() { awk -v b="$1" -v n="$2" 'BEGIN { printf "%.2f KB", b / n / 1000 }'; }
errors() { echo $(( ${R[$1.status_errors]} + ${R[$1.socket_errors]} )); }

# One row of the table; the ratio columns are against nginx's req/s and the floor's req/s and CPU per call
# (issue 36 sets its targets against the floor), or "—" where a run has none.
table_row() { # ROW NGINX_RPS FLOOR_RPS FLOOR_CPU_US
    local row=$1 name cpu="—" rss="—" nginx_col="—" floor_col="—" floor_cpu="—"
    case $row in
        nginx) name="nginx pass-through" ;;
        floor) name="floor: the same HTTP server and client, one Ed25519 verification and one signature a call, nothing else (\`sealgate bench floor\`)" ;;
        pg1) name="sealgate on PostgreSQL, durable claims, 1 replica" ;;
        pg2) name="sealgate on PostgreSQL, durable claims, 2 replicas (CPU of both; RSS of one)" ;;
        *) name="sealgate, $(label $row)" ;;
    esac
    if [[ $row != nginx ]]; then
        cpu="$(num "${R[$row.cpu_us]}") µs ($(verifications "${R[$row.cpu_us]}"))"; rss=$(mib "${R[$row.rss_kib]}")
        [[ -z $4 ]] || floor_cpu="$(ratio "${R[$row.cpu_us]}" "$4")×"
    fi
    [[ -z $2 ]] || nginx_col=$(ratio "$(rps $row)" "$2")
    [[ -z $3 || $row == nginx ]] || floor_col=$(ratio "$(rps $row)" "$3")
    echo "| $name | $(at_least $row)$(num "$(rps $row)") | $nginx_col | $floor_col | $(ms "${R[$row.p50_us]}") | $(ms "${R[$row.p99_us]}") | $cpu | $floor_cpu | $rss | $(errors $row) |"
}

TABLE_HEAD="| path | req/s | × nginx | × floor | p50 | p99 | gateway CPU per call | CPU × floor | RSS | errors |
|---|---|---|---|---|---|---|---|---|---|"

# PostgreSQL's CPU beside the gateway's, for the PostgreSQL rows.
postgres_cpu() {
    local row both
    for row in pg1 pg2; do
        both=$(( ${R[$row.cpu_us]} + ${R[$row.server_cpu_us]} ))
        echo "- PostgreSQL's own CPU per call (its server processes), ${row#pg} replica(s): $(num "${R[$row.server_cpu_us]}") µs; with the gateway's, $(num "$both") µs ($(verifications "$both"))"
    done
    echo "  target: two replicas cost no more CPU per call, gateway and PostgreSQL together, than one"
}

# BENCH_ONLY=postgres: the PostgreSQL rows alone.
print_postgres() {
    echo
    echo "sealgate bench, PostgreSQL rows only: $(nproc) cores (load average $LOAD_AVERAGE before the run); wrk $THREADS threads, $CONNECTIONS connections, ${SECS} s a row; one run"
    if [[ -z ${R[pg1.requests]:-} ]]; then
        echo "no PostgreSQL answered at $POSTGRES"
        return
    fi
    echo
    echo "$TABLE_HEAD"
    table_row pg1 "" "" ""
    table_row pg2 "" "" ""
    echo
    echo "- one Ed25519 verification (openssl speed ed25519, this run): $(us_of_ns "${R[ed.verify_ns]}")"
    postgres_cpu
}

print_table() {
    local nginx_rps row
    nginx_rps=$(rps nginx)
    echo
    echo "sealgate bench: $(nproc) cores (load average $LOAD_AVERAGE before the run); wrk $THREADS threads, $CONNECTIONS connections, ${SECS} s a row; unique envelopes over $SESSIONS sessions; one run"
    [[ $GATEWAY_BIN == "$BIN" ]] || echo "the gateway rows served by $GATEWAY_BIN"
    echo
    echo "$TABLE_HEAD"
    local rows="nginx floor off claim"
    [[ -z ${R[pg1.requests]:-} ]] || rows="$rows pg1 pg2"
    for row in $rows; do
        table_row "$row" "$nginx_rps" "$(rps floor)" "${R[floor.cpu_us]}"
    done
    local claim_rps sa_rps
    claim_rps=$(rps claim_api) sa_rps=$(rps safeagent)
    echo "| sealgate \`POST /claim\` (× SafeAgent in the nginx column) | $(num "$claim_rps") | $(ratio "$claim_rps" "$sa_rps") | — | $(ms "${R[claim_api.p50_us]}") | $(ms "${R[claim_api.p99_us]}") | $(num "${R[claim_api.cpu_us]}") µs | — | $(mib "${R[claim_api.rss_kib]}") | $(errors claim_api) |"
    echo "| SafeAgent $SAFEAGENT_VERSION \`POST /claim\` (uvicorn, one process) | $(num "$sa_rps") | — | — | $(ms "${R[safeagent.p50_us]}") | $(ms "${R[safeagent.p99_us]}") | $(num "${R[safeagent.cpu_us]}") µs | — | $(mib "${R[safeagent.rss_kib]}") | $(errors safeagent) |"
    echo
    echo "targets (issue 36, against the floor): claim: off ≥ 0.8 × the floor's req/s and ≤ 1.3 × its CPU per call; durable claims ≥ 0.6 × and ≤ 1.7 ×; \`POST /claim\` ≥ 20 × SafeAgent (issue 20)"
    echo
    echo "- one Ed25519 verification (openssl speed ed25519, this run): $(us_of_ns "${R[ed.verify_ns]}")"
    [[ -z ${R[pg1.requests]:-} ]] || postgres_cpu
    echo
    local f50=${R[fsync.p50_us]} f99=${R[fsync.p99_us]}
    echo "- disk fsync (fdatasync after a 64-byte append, ${R[fsync.fsyncs]} times, gateway data folder): p50 $(ms "$f50"), p99 $(ms "$f99")"
    echo "- MCP endpoint (SPEC 17), \`tools/call\` with a bearer token, $(label off): $(num "$(rps mcp)") req/s, p50 $(ms "${R[mcp.p50_us]}"), p99 $(ms "${R[mcp.p99_us]}"), gateway CPU per call $(num "${R[mcp.cpu_us]}") µs = $(ratio "${R[mcp.cpu_us]}" "${R[off.cpu_us]}") × the envelope row's ($(errors mcp) errors; target ≤ 1.2 ×)"
    echo "- signing (SPEC 14): a call's signed receipt costs $(us_of_ns "${R[sign.receipt_ns]}") of CPU, of which its one Ed25519 signature $(us_of_ns "${R[sign.signature_ns]}") (mean of ${R[sign.receipts]}, in the request's own task); checkpoints add one signature per \`audit.checkpoint_every\` events. Every row above includes it."
    echo "- answer guard (SPEC 18) on the benchmark upstream's short answer: $(us_of_ns "${R[guard.short_ns]}") = $(awk -v ns="${R[guard.short_ns]}" -v us="${R[off.cpu_us]}" 'BEGIN { printf "%.1f%%", ns / 10 / us }') of a \`claim: off\` call's CPU (target < 5%; every row above includes it)"
    echo "- answer guard (SPEC 18), one $(num "${R[guard.answer_bytes]}")-byte text answer (\`sealgate bench guard\`, mean of ${R[guard.answers]}): $(us_of_ns "${R[guard.clean_ns]}") ($(verifications_ns "${R[guard.clean_ns]}")) with nothing to find; $(us_of_ns "${R[guard.near_ns]}") ($(verifications_ns "${R[guard.near_ns]}")) with near-matches in every line; $(us_of_ns "${R[guard.matched_ns]}") ($(verifications_ns "${R[guard.matched_ns]}")) with ${R[guard.matches]} findings rewritten. Target: ≤ 1 × Ed25519"
    for row in off claim; do
        local r=rate_$row
        echo "- fixed $(num "$RATE") req/s open loop (at most 64 in flight), $(label $row): p99 $(ms "${R[$r.p99_us]}") (p50 $(ms "${R[$r.p50_us]}"), max $(ms "${R[$r.max_us]}"); $(num "${R[$r.rps]}") req/s achieved, $(num "${R[$r.unsent]}") calls unsent when time was up, ${R[$r.non2xx]} errors)"
    done
    echo "  target: p99 ≤ 5 ms with claim: off at half the floor's req/s (issue 36)"
    for row in nginx floor off claim; do
        local r=serial_$row name
        case $row in
            nginx) name="nginx pass-through" ;;
            floor) name="the floor" ;;
            *) name="sealgate, $(label $row)" ;;
        esac
        echo "- one call at a time, $name: p50 $(ms "${R[$r.p50_us]}") (p99 $(ms "${R[$r.p99_us]}"), $(num "${R[$r.requests]}") calls, $(errors $r) errors)"
    done
    local floor50=${R[serial_floor.p50_us]}
    echo "  target (issue 36): p50 ≤ the floor's + 1 × fsync p50 + 0.15 ms = $(ms $((floor50 + f50 + 150))) with claim: off; the floor's + 2 × fsync p50 + 0.2 ms = $(ms $((floor50 + 2 * f50 + 200))) with claims"
    local answered
    answered=$(awk -v n="${R[overload.requests]}" -v e="${R[overload.status_errors]}" -v us="${R[overload.duration_us]}" \
        'BEGIN { printf "%.0f", (n - e) / (us / 1e6) }')
    echo "- overload, $((4 * CONNECTIONS)) connections against \`max_concurrent_calls: $CONNECTIONS\` (\`claim: off\`): $(num "$answered") calls/s answered ($(ratio "$answered" "$(rps off)") × the \`claim: off\` row), $(num "${R[overload.status_errors]}") shed with 5006 at once, $(num "${R[overload.socket_errors]}") socket errors, all answers p50 $(ms "${R[overload.p50_us]}") p99 $(ms "${R[overload.p99_us]}"), RSS $(mib "${R[overload.rss_kib]}") after"
    echo "- the same overload from callers that wait out \`Retry-After\`: $(num "${R[polite.admitted_rps]}") calls/s admitted ($(ratio "${R[polite.admitted_rps]}" "$(rps off)") × the \`claim: off\` row), $(num "${R[polite.shed]}") shed, admitted and shed p99 $(ms "${R[polite.p99_us]}")"
    echo "- RSS with $(num "$LIVE_SESSIONS") live sessions after $(num "${R[soak.requests]}") calls with durable claims (fresh gateway): $(mib "${R[soak.rss_kib]}") (${R[soak.non2xx]} errors; target < 50 MiB after 1,000,000)"
    echo "- disk per claimed call, before retention: $(kb_per_call "${R[soak.db_bytes]}" "${R[soak.requests]}") in sealgate.db ($(num "${R[soak.db_bytes]}") bytes), and a write-ahead log of $(num "${R[soak.wal_bytes]}") bytes that checkpoints reuse"
    echo "- disk per claimed call with random idempotency keys, $(num "${R[disk.requests]}") calls on a fresh store (${R[disk.non2xx]} errors), its write-ahead log folded in: $(kb_per_call "${R[disk.db_bytes]}" "${R[disk.requests]}") ($(num "${R[disk.db_bytes]}") bytes; target ≤ 1.5 KB)"
    echo "- errors: HTTP status ≥ 400 or no answer (neither server answers 1xx or 3xx)"
}

main "$@"
