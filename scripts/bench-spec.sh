#!/usr/bin/env bash
# Prompt-lookup speculation (`rlx run --spec ngram`) against plain decoding
# on the same file, alternating, greedy: decode tokens/s of each, the
# ratio, and the drafted and kept counts, for a prompt whose continuation
# repeats it (code with repeated identifiers) and one where drafts rarely
# hold (prose).
#
#   scripts/bench-spec.sh [MODEL.gguf] [THREADS] [ROUNDS]
#
# Environment: N (tokens to generate, default 128), RLX (a built rlx;
# default: build rlx-cli), SPEC_ARGS (more flags for the speculative runs,
# e.g. "--draft-max 4").
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-$(bash scripts/fetch-model.sh)}
THREADS=${2:-2}
ROUNDS=${3:-3}
N=${N:-128}
if [ -z "${RLX:-}" ]; then
  cargo build --release -q -p rlx-cli
  RLX=target/release/rlx
fi
grep -m1 "model name" /proc/cpuinfo 2>/dev/null | sed 's/^.*: /cpu: /' || true
code='def area(shape):
    if shape.kind == "circle":
        return 3.14159 * shape.radius * shape.radius
    if shape.kind == "square":
        return shape.side * shape.side
    if shape.kind == "rectangle":
        return shape.width * shape.height
    raise ValueError(shape.kind)


def perimeter(shape):
    if shape.kind == "circle":
        return 2 * 3.14159 * shape.radius
    if shape.kind == "square":
        return 4 * shape.side
    if shape.kind == "rectangle":
        return 2 * (shape.width + shape.height)
    raise ValueError(shape.kind)


def scale(shape, factor):
    if shape.kind == "circle":'
prose='The old lighthouse keeper climbed the stairs each evening as the sun went down over the grey water. He had done it for forty years, and'
# decode t/s and speculation counts of one run.
one() {
  "$RLX" run -m "$MODEL" --raw -n "$N" --temp 0 -t "$THREADS" --json "$@" 2>/dev/null |
    python3 -c 'import json,sys; v=json.load(sys.stdin); s=v["speculation"]; print("%.2f %d %d %d" % (v["timings"]["decode_tokens_per_s"], s["drafted"], s["accepted"], s["verify_steps"]))'
}
echo "| prompt | round | plain t/s | ngram t/s | ratio | drafted | kept | verify steps |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for name in code prose; do
  text=${!name}
  for r in $(seq "$ROUNDS"); do
    read -r plain _ < <(one "$text")
    # shellcheck disable=SC2086
    read -r spec drafted kept steps < <(one "$text" --spec ngram ${SPEC_ARGS:-})
    ratio=$(python3 -c "print('%.2f' % ($spec / $plain))")
    echo "| $name | $r | $plain | $spec | $ratio | $drafted | $kept | $steps |"
  done
done
