#!/usr/bin/env bash
# The whole test suite: lint, then every crate's tests, including those that
# need the real Gemma 3 270M file (fetched into the cache on first use) and
# the server test with the `openai` Python package (installed if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
export RLX_TEST_MODEL=${RLX_TEST_MODEL:-$(bash scripts/fetch-model.sh)}
# Property tests draw the same cases on every machine and run (set another
# seed to explore).
export PROPTEST_RNG_SEED=${PROPTEST_RNG_SEED:-20261204}
# The server's tests drive it with the official `openai` Python client too
# (1.55 or later: the test reads usage.prompt_tokens_details).
OPENAI='openai>=1.55'
python3 -c 'import openai, sys; sys.exit(tuple(map(int, openai.__version__.split(".")[:2])) < (1, 55))' 2>/dev/null ||
  python3 -m pip install -q "$OPENAI" 2>/dev/null ||
  python3 -m pip install -q --user "$OPENAI" 2>/dev/null ||
  python3 -m pip install -q --break-system-packages "$OPENAI" ||
  echo "warning: no openai package; its server test will say skipped" >&2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
# ARM kernels and parity under emulation.
bash scripts/test-arm.sh
