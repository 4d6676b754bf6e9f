#!/usr/bin/env bash
# The whole test suite: lint, then every crate's tests, including those that
# need the real Gemma 3 270M file (fetched into the cache on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
export RLX_TEST_MODEL=${RLX_TEST_MODEL:-$(bash scripts/fetch-model.sh)}
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
