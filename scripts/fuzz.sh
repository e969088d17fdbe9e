#!/usr/bin/env bash
# Runs every cargo fuzz target for SECONDS each (default 60), starting from the committed seeds, and
# prints how many inputs each one executed. New corpus entries go to fuzz/corpus/<target>, full logs to
# fuzz/logs/<target>.log (both git-ignored); a crash leaves its input in fuzz/artifacts/<target>/ and
# stops the script. The target bodies live in src/fuzzing.rs (tests/fuzz_targets.rs runs them on
# stable in CI).
# Only stable Rust is installed: RUSTC_BOOTSTRAP=1 lets cargo fuzz use the nightly flags it needs.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]     (e.g. scripts/fuzz.sh 20 jwt envelope)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

# One build for all targets, so the timed runs below are spent fuzzing.
cargo fuzz build

mkdir -p fuzz/logs
summary=()
for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target"
    log="fuzz/logs/$target.log"
    echo "== $target: ${seconds}s"
    # The first folder receives new inputs; the seeds folder is only read.
    if ! cargo fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "fuzz target $target failed; its input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
    corpus="$(find "fuzz/corpus/$target" -type f | wc -l)"
    summary+=("$(printf '%-14s %12s runs in %ss, corpus %s' "$target" "${runs:-?}" "$seconds" "$corpus")")
done

printf '%s\n' "${summary[@]}"
