#!/usr/bin/env bash
# Perplexity with each K/V cache type, rlx against llama-perplexity on the
# same file, text, context and cache types (alternating), and what each
# type costs against the f32 cache of the same engine.
#
#   scripts/kv-types-vs-llama.sh [MODEL.gguf] [TEXT] [CTX]
#
# Environment (all optional):
#   TYPES="f32 f16 q8_0 q4_0 q8_0/q4_0"   K or K/V types to run
#   THREADS=2                              threads for both
#   RLX=path/to/rlx                        instead of building rlx-cli
#   LLAMA_PERPLEXITY=path                  by default from ~/.cache/llama.cpp-ref
#
# llama.cpp needs flash attention for a quantized V cache, so every run
# of it uses `-fa on`; rlx's attention is the same code for every type.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-$(bash scripts/fetch-model.sh)}
TEXT=${2:-tests/fixtures/text/ppl.txt}
CTX=${3:-128}
THREADS=${THREADS:-2}
read -r -d '' -a TYPE_LIST <<<"${TYPES:-f32 f16 q8_0 q4_0 q8_0/q4_0}" || true
LLAMA_PERPLEXITY=${LLAMA_PERPLEXITY:-$HOME/.cache/llama.cpp-ref/src/build/bin/llama-perplexity}
[ -x "$LLAMA_PERPLEXITY" ] || { echo "llama-perplexity not found (set LLAMA_PERPLEXITY)" >&2; exit 1; }
if [ -z "${RLX:-}" ]; then
  cargo build --release -q -p rlx-cli
  RLX=./target/release/rlx
fi
final() { grep -o 'Final estimate: PPL = [0-9.]*' | grep -o '[0-9.]*$'; }
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $THREADS threads; $MODEL; $TEXT, -c $CTX"
declare -A R L
for t in "${TYPE_LIST[@]}"; do
  k=${t%/*} v=${t#*/}
  R[$t]=$("$RLX" perplexity -m "$MODEL" -f "$TEXT" -c "$CTX" -t "$THREADS" \
    --cache-type-k "$k" --cache-type-v "$v" 2>&1 | final)
  L[$t]=$("$LLAMA_PERPLEXITY" -m "$MODEL" -f "$TEXT" -c "$CTX" -t "$THREADS" -fa on \
    -ctk "$k" -ctv "$v" 2>&1 | final)
done
base=${TYPE_LIST[0]}
printf '| K/V | rlx PPL | llama.cpp PPL | rlx vs its %s | llama.cpp vs its %s |\n' "$base" "$base"
echo '|---|--:|--:|--:|--:|'
for t in "${TYPE_LIST[@]}"; do
  awk -v t="$t" -v r="${R[$t]}" -v l="${L[$t]}" -v rb="${R[$base]}" -v lb="${L[$base]}" \
    'BEGIN { printf "| %s | %.4f | %.4f | %+.3f %% | %+.3f %% |\n", t, r, l, 100 * (r / rb - 1), 100 * (l / lb - 1) }'
done
