#!/usr/bin/env bash
# The whole test suite: lint, then every crate's tests, including those that
# need the real Gemma 3 270M file (fetched into the cache on first use) and
# the server tests with the `openai`, `ollama` and `anthropic` Python
# packages and Chromium for the chat page (installed if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
export RLX_TEST_MODEL=${RLX_TEST_MODEL:-$(bash scripts/fetch-model.sh)}
# Property tests draw the same cases on every machine and run (set another
# seed to explore).
export PROPTEST_RNG_SEED=${PROPTEST_RNG_SEED:-20261204}
# The server's tests drive it with the official Python clients too: `openai`
# (1.66 or later: the tests use its Responses API and read
# usage.prompt_tokens_details), `ollama` and `anthropic`.
pip_install() {
  python3 -m pip install -q "$1" 2>/dev/null ||
    python3 -m pip install -q --user "$1" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "$1" ||
    echo "warning: no $1 package; its server test will say skipped" >&2
}
python3 -c 'import openai, sys; sys.exit(tuple(map(int, openai.__version__.split(".")[:2])) < (1, 66))' 2>/dev/null ||
  pip_install 'openai>=1.66'
python3 -c 'import ollama' 2>/dev/null || pip_install ollama
python3 -c 'import anthropic' 2>/dev/null || pip_install anthropic
# The chat page's test drives headless Chromium (Debian's `chromium`).
if ! command -v chromium >/dev/null 2>&1 && [ -z "${CHROMIUM:-}" ]; then
  sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get install -y -qq chromium >/dev/null 2>&1 ||
    { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq chromium >/dev/null; } ||
    echo "warning: no chromium; the chat page's test will say skipped" >&2
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
# ARM kernels and parity under emulation.
bash scripts/test-arm.sh
