#!/usr/bin/env bash
# Many sequences at once: runs llama-batched-bench and `rlx bench --batch`
# alternately on the same GGUF, thread count and shapes (B sequences, each
# its own -npp-token prompt, then -ntg decode steps of B tokens) and prints
# the aggregate decode speed of both, their ratio, and rlx's speed-up over
# its own single sequence.
#
#   scripts/bench-batched-vs-llama.sh [MODEL.gguf] [THREADS] [REPS]
#
# Environment (all optional):
#   BATCHES="1 4 16"        sequence counts (default)
#   NPP=128 NTG=64          prompt and generated tokens per sequence
#   THREADS, REPS           defaults for the positional arguments (2, 3)
#   PRECISION=q8            rlx --precision
#   RLX=path/to/rlx         use this binary instead of building rlx-cli
#   LLAMA_BATCHED=path      llama-batched-bench, by default from
#                           ~/.cache/llama.cpp-ref (built by
#                           ../shared/scripts/build-llama.sh or by hand from
#                           the llama-cpp-python sdist)
#   RLX_ARGS, LLAMA_ARGS    extra flags (e.g. RLX_ARGS="--device cuda",
#                           LLAMA_ARGS="-ngl 99 -fa 1")
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-$(bash scripts/fetch-model.sh)}
THREADS=${2:-${THREADS:-2}}
REPS=${3:-${REPS:-3}}
read -r -d '' -a BATCH_LIST <<<"${BATCHES:-1 4 16}" || true
NPP=${NPP:-128}
NTG=${NTG:-64}
PRECISION=${PRECISION:-q8}
LLAMA_BATCHED=${LLAMA_BATCHED:-$HOME/.cache/llama.cpp-ref/src/build/bin/llama-batched-bench}
[ -x "$LLAMA_BATCHED" ] || { echo "llama-batched-bench not found (set LLAMA_BATCHED)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "no such model: $MODEL" >&2; exit 1; }
if [ -z "${RLX:-}" ]; then
  cargo build --release -q -p rlx-cli
  RLX=./target/release/rlx
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

median() { sort -g | awk '{v[NR]=$1} END {if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

for b in "${BATCH_LIST[@]}"; do
  ctx=$(( b * (NPP + NTG) + 256 ))
  for r in $(seq "$REPS"); do
    # shellcheck disable=SC2086
    "$LLAMA_BATCHED" -m "$MODEL" -t "$THREADS" -npp "$NPP" -ntg "$NTG" -npl "$b" -c "$ctx" \
      --output-format jsonl ${LLAMA_ARGS:-} 2>/dev/null |
      grep '^{' | python3 -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["speed_tg"])' \
      >>"$TMP/llama-$b"
    # shellcheck disable=SC2086
    "$RLX" bench -m "$MODEL" -t "$THREADS" --precision "$PRECISION" --batch "$b" -p "$NPP" -n "$NTG" \
      -r 1 --json ${RLX_ARGS:-} |
      python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tokens_per_second"])' >>"$TMP/rlx-$b"
  done
done

echo "## $(basename "$MODEL"): aggregate decode, ${NPP}-token prompts, ${NTG} tokens per sequence"
echo
echo "| B | llama.cpp t/s | rlx $PRECISION t/s | rlx / llama | rlx B / rlx 1 |"
echo "| ---: | ---: | ---: | ---: | ---: |"
single=""
for b in "${BATCH_LIST[@]}"; do
  l=$(median <"$TMP/llama-$b")
  x=$(median <"$TMP/rlx-$b")
  [ "$b" = 1 ] && single=$x
  awk -v b="$b" -v l="$l" -v x="$x" -v s="$single" 'BEGIN {
    printf "| %d | %.1f | %.1f | %.2f | %s |\n", b, l, x, x / l, (s == "" ? "" : sprintf("%.2f", x / s))
  }'
done
echo
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); threads $THREADS; medians of $REPS repetitions, alternating; $(date -u '+%Y-%m-%d %H:%M UTC')"
