#!/usr/bin/env bash
# rlx quantize against llama-quantize, byte for byte: every file type on the
# tiny models (f32) and on the real 270M file (requantized from Q4_K_M), and
# llama-completion loading each file rlx wrote.
#
#   scripts/quantize-vs-llama.sh [LLAMA_BIN_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA=${1:-$HOME/.cache/llama.cpp-ref/src/build/bin}
RLX=target/release/rlx
MODEL=${RLX_TEST_MODEL:-$HOME/.cache/rlx/models/gemma-3-270m-q4_k_m.gguf}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
TYPES="F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K"
same=0; differ=0
compare() { # name input type [extra llama-quantize flags]
    local name=$1 in=$2 ty=$3; shift 3
    local mine=$OUT/$name-$ty-rlx.gguf theirs=$OUT/$name-$ty-llama.gguf
    "$RLX" quantize "$in" "$mine" --type "$ty" -t 2 2>/dev/null
    "$LLAMA/llama-quantize" "$@" "$in" "$theirs" "$ty" 2 >/dev/null 2>&1
    if cmp -s "$mine" "$theirs"; then
        same=$((same + 1)); echo "$name $ty: identical"
    else
        differ=$((differ + 1)); echo "$name $ty: DIFFERENT"
    fi
    if [ "$name" = 270m ]; then
        "$LLAMA/llama-completion" -m "$mine" -p "The sea is" -n 8 -no-cnv --temp 0 \
            >"$OUT/run.txt" 2>&1 || { echo "  llama-completion failed on $ty"; tail -3 "$OUT/run.txt"; }
    fi
    rm -f "$mine" "$theirs"
}
for m in gemma gemma2 gemma3 gemma3n gemma4-dense gemma4-ple gemma4-moe; do
    for ty in $TYPES; do compare "$m" "tests/fixtures/tiny/$m/model-f32.gguf" "$ty"; done
done
for ty in $TYPES; do compare 270m "$MODEL" "$ty" --allow-requantize; done
echo "identical: $same, different: $differ"
