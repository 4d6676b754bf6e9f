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
# e.g. "--draft-max 4"), DRAFT (a draft model: rows for `--draft-model`
# too), LLAMA_BIN (a llama.cpp build's bin/ with llama-lookup and, for
# DRAFT, llama-speculative: the same prompts through llama.cpp's prompt
# lookup and draft model, each against its own plain decoding — llama-lookup
# with no draft — in the same round, each engine with its default draft
# lengths).
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
# llama.cpp's generation t/s and drafted and kept counts of one run of
# $1 (llama-lookup or llama-speculative) on prompt $2.
llama() {
  local tool=$1 text=$2
  shift 2
  "$LLAMA_BIN/$tool" -m "$MODEL" -p "$text" -n "$N" --temp 0 -t "$THREADS" "$@" 2>&1 |
    python3 -c '
import re, sys
t = sys.stdin.read()
speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+)", t)
drafted = re.search(r"n_drafted\s*=\s*(\d+)", t)
kept = re.search(r"n_accept\s*=\s*(\d+)", t)
if not speed:
    sys.exit("no timing in the llama.cpp output:\n" + t[-2000:])
print(speed.group(1), drafted.group(1) if drafted else 0, kept.group(1) if kept else 0)'
}
ratio() { python3 -c "print('%.2f' % ($2 / $1))"; }
echo "| prompt | round | engine | plain t/s | speculative t/s | ratio | drafted | kept |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
for name in code prose; do
  text=${!name}
  for r in $(seq "$ROUNDS"); do
    read -r plain _ < <(one "$text")
    # shellcheck disable=SC2086
    read -r spec drafted kept _ < <(one "$text" --spec ngram ${SPEC_ARGS:-})
    echo "| $name | $r | rlx ngram | $plain | $spec | $(ratio "$plain" "$spec") | $drafted | $kept |"
    if [ -n "${DRAFT:-}" ]; then
      read -r spec drafted kept _ < <(one "$text" --draft-model "$DRAFT")
      echo "| $name | $r | rlx draft model | $plain | $spec | $(ratio "$plain" "$spec") | $drafted | $kept |"
    fi
    if [ -n "${LLAMA_BIN:-}" ]; then
      read -r lplain _ < <(llama llama-lookup "$text" --spec-draft-n-max 0)
      read -r lspec drafted kept < <(llama llama-lookup "$text")
      echo "| $name | $r | llama-lookup | $lplain | $lspec | $(ratio "$lplain" "$lspec") | $drafted | $kept |"
      if [ -n "${DRAFT:-}" ]; then
        read -r lspec drafted kept < <(llama llama-speculative "$text" -md "$DRAFT")
        echo "| $name | $r | llama-speculative | $lplain | $lspec | $(ratio "$lplain" "$lspec") | $drafted | $kept |"
      fi
    fi
  done
done
