#!/usr/bin/env bash
# Builds and runs the policy fuzz target for a while (default 60 s).
# Only stable Rust is installed: RUSTC_BOOTSTRAP=1 lets cargo fuzz use the nightly flags it needs.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

mkdir -p fuzz/corpus/policy_decide
RUSTC_BOOTSTRAP=1 cargo fuzz run policy_decide -- -max_total_time="$seconds" -max_len=4096
