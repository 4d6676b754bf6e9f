#!/usr/bin/env bash
# Load time and peak RSS: a pre-quantized GGUF against a Hugging Face
# checkpoint read in place (bf16) and quantized as it loads, alternating,
# one token generated each time.
#
#   scripts/bench-load.sh GGUF CHECKPOINT_DIR [RUNS]
# (scripts/make-hf-from-gguf.py makes a checkpoint from a Gemma 3 GGUF.)
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=$1 DIR=$2 RUNS=${3:-3}
RLX=target/release/rlx
one() { # label, args...
    local label=$1; shift
    local out
    out=$( { /usr/bin/time -f "RSS %M" "$RLX" run "$@" --raw "Hello" -n 1 --temp 0 -t 2 >/dev/null; } 2>&1 )
    local load rss
    load=$(grep -o 'load [0-9]* ms' <<<"$out" | grep -o '[0-9]*')
    rss=$(grep -o 'RSS [0-9]*' <<<"$out" | grep -o '[0-9]*')
    printf '%-28s load %6s ms  peak RSS %5d MiB\n' "$label" "$load" $((rss / 1024))
}
for _ in $(seq "$RUNS"); do
    one "GGUF (Q4_K_M file)" -m "$GGUF"
    one "checkpoint, bf16 in place" -m "$DIR"
    one "checkpoint --quantize Q4_K_M" -m "$DIR" --quantize Q4_K_M
    one "checkpoint --quantize Q8_0" -m "$DIR" --quantize Q8_0
done
