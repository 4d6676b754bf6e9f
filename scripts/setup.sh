#!/usr/bin/env bash
# Fresh-machine setup: build rlx, fetch the default model, and generate.
# (Text prompts arrive with the tokenizer; until then the prompt is the token
# ids of "<bos>The capital of France is".)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p rlx-cli
MODEL=$(bash scripts/fetch-model.sh)
./target/release/rlx info "$MODEL" | head -8
./target/release/rlx generate -m "$MODEL" --tokens 2,818,5279,529,7001,563 -n 32 --temp 0
