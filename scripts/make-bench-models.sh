#!/usr/bin/env bash
# Writes the benchmark models with rlx-gguf's own writer and quantizers
# (crates/rlx-gguf/examples/make_gguf.rs): Gemma 3 1B and 4B shapes with
# random weights, and the real Gemma 3 270M requantized to Q8_0 and Q4_0.
# Existing files are kept unless FORCE=1. Prints the paths written.
#
#   scripts/make-bench-models.sh [DIR]       (default /tmp/rlx-models)
#
# Environment (all optional):
#   SHAPES="1b 4b"            random-weight shapes (270m, 1b, 4b)
#   RANDOM_TYPES="q4_k_m"     their types (q8_0, q4_0, q4_k_m)
#   REQUANT_TYPES="q8_0 q4_0" types the real 270M file is requantized to
#   THREADS=N                 threads for quantization (default: all cores)
# An empty list skips that kind, e.g. SHAPES="" for the requantized files only.
#
# Then: MODELS="$(scripts/make-bench-models.sh | xargs)" scripts/bench-vs-llama.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/rlx-models}
read -r -a SHAPE_LIST <<<"${SHAPES-1b 4b}"
read -r -a RANDOM_LIST <<<"${RANDOM_TYPES-q4_k_m}"
read -r -a REQUANT_LIST <<<"${REQUANT_TYPES-q8_0 q4_0}"
THREAD_ARGS=()
[ -n "${THREADS:-}" ] && THREAD_ARGS=(-t "$THREADS")
REAL=$(bash scripts/fetch-model.sh)
cargo build --release -q -p rlx-gguf --example make_gguf >&2
MAKE=./target/release/examples/make_gguf
mkdir -p "$DIR"

# write_model OUT ARGS...: runs make_gguf unless OUT exists, through a temporary
# name so that an interrupted run leaves no truncated file behind.
write_model() {
  local out=$1
  shift
  if [ -f "$out" ] && [ "${FORCE:-0}" != 1 ]; then
    echo "kept $out" >&2
  else
    "$MAKE" "$@" "${THREAD_ARGS[@]}" -o "$out.partial" >&2
    mv "$out.partial" "$out"
  fi
  echo "$out"
}

for t in "${REQUANT_LIST[@]}"; do
  write_model "$DIR/gemma-3-270m-requant-$t.gguf" requant --from "$REAL" --type "$t"
done
for s in "${SHAPE_LIST[@]}"; do
  for t in "${RANDOM_LIST[@]}"; do
    write_model "$DIR/gemma-3-$s-random-$t.gguf" random --shape "$s" --type "$t" --tokenizer-from "$REAL"
  done
done
