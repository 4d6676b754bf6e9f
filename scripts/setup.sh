#!/usr/bin/env bash
# Fresh-machine setup: build rlx, fetch the default model, and generate text.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p rlx-cli
bash scripts/fetch-model.sh >/dev/null
# The 270M file is a small base model: a story opening, greedy with a
# repetition penalty, shows it at its best.
./target/release/rlx run --raw "Once upon a time, in a small village by the sea," -n 64 --temp 0 --repeat-penalty 1.3
