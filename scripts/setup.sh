#!/usr/bin/env bash
# Fresh-machine setup: build rlx, fetch the default model, and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p rlx-cli
MODEL=$(bash scripts/fetch-model.sh)
./target/release/rlx info "$MODEL"
