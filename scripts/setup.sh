#!/usr/bin/env bash
# Fresh-machine setup: build rlx, fetch the default model, and generate text.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p rlx-cli
bash scripts/fetch-model.sh >/dev/null
./target/release/rlx run "The capital of France is" -n 48 --temp 0.7 --seed 1
