#!/usr/bin/env bash
# Runs llama-bench and `rlx bench` alternately on the same GGUF and thread
# count and prints one table per model with both figures and the ratio per
# test.
#
#   scripts/bench-vs-llama.sh [MODEL.gguf] [THREADS] [REPS]
#
# Environment (all optional):
#   MODELS="a.gguf b.gguf"   several models in one go, separated by blanks or
#                            newlines (instead of MODEL)
#   TESTS="pp512 pp2048 tg128 tg128@d1024 tg128@d4096"
#                            ppN: prompt of N tokens; tgN: N generated tokens;
#                            @dM: M tokens already in the context
#                            (default: "pp512 tg128 tg128@d1024")
#   THREADS, REPS            defaults for the positional arguments (2, 5)
#   PRECISIONS="exact q8"    which rlx precisions to run (default both)
#   RLX=path/to/rlx          use this binary instead of building rlx-cli
#   RLX_ARGS="--isa avx2"    more flags for `rlx bench` (an instruction-set
#                            cap to match a llama.cpp built without AVX-512)
#   LLAMA_BENCH=path         llama-bench, by default from ~/.cache/llama.cpp-ref
#                            (built by ../shared/scripts/build-llama.sh or by
#                            hand from the llama-cpp-python sdist)
#
# Generated test models: scripts/make-bench-models.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MODELS:-}" ]; then
  read -r -d '' -a MODEL_LIST <<<"$MODELS" || true
else
  MODEL_LIST=("${1:-$(bash scripts/fetch-model.sh)}")
fi
THREADS=${2:-${THREADS:-2}}
REPS=${3:-${REPS:-5}}
read -r -d '' -a TEST_LIST <<<"${TESTS:-pp512 tg128 tg128@d1024}" || true
PRECISIONS=${PRECISIONS:-exact q8}
LLAMA_BENCH=${LLAMA_BENCH:-$HOME/.cache/llama.cpp-ref/src/build/bin/llama-bench}
[ -x "$LLAMA_BENCH" ] || { echo "llama-bench not found (set LLAMA_BENCH)" >&2; exit 1; }
if [ -z "${RLX:-}" ]; then
  cargo build --release -q -p rlx-cli
  RLX=./target/release/rlx
fi
for m in "${MODEL_LIST[@]}"; do
  [ -f "$m" ] || { echo "no such model: $m" >&2; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# "tg128@d1024" -> "-p 0 -n 128 -d 1024" (the same flags for both engines).
test_args() {
  local t=$1 depth=0 kind n
  if [[ $t == *@d* ]]; then
    depth=${t#*@d}
    t=${t%@d*}
  fi
  kind=${t:0:2}
  n=${t:2}
  [[ $n =~ ^[0-9]+$ && $depth =~ ^[0-9]+$ ]] || { echo "bad test name: $1" >&2; return 1; }
  case $kind in
    pp) echo "-p $n -n 0 -d $depth" ;;
    tg) echo "-p 0 -n $n -d $depth" ;;
    *) echo "bad test name: $1 (ppN or tgN, optionally @dM)" >&2; return 1 ;;
  esac
}
for t in "${TEST_LIST[@]}"; do test_args "$t" >/dev/null; done

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
for MODEL in "${MODEL_LIST[@]}"; do
  SIZE=$(( $(stat -c %s "$MODEL") / 1048576 ))
  echo "### $(basename "$MODEL") (${SIZE} MiB)"
  echo
  python3 - "$PRECISIONS" <<'PY'
import sys
ps = sys.argv[1].split()
cols = ["test", "llama.cpp t/s"] + [f"rlx {p} t/s" for p in ps] + [f"{p} / llama" for p in ps]
cols += ["q8 roofline"] if "q8" in ps else []
print("| " + " | ".join(cols) + " |")
print("| --- |" + " ---: |" * (len(cols) - 1))
PY
  for t in "${TEST_LIST[@]}"; do
    args=$(test_args "$t")
    # Alternate the engines so drift on a shared machine hits both.
    # shellcheck disable=SC2086
    "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -r "$REPS" $args -o json >"$TMP/l.json" 2>/dev/null
    for p in $PRECISIONS; do
      # shellcheck disable=SC2086
      "$RLX" bench -m "$MODEL" -t "$THREADS" -r "$REPS" $args ${RLX_ARGS:-} --json --precision "$p" >"$TMP/$p.json"
    done
    python3 - "$t" "$TMP" "$PRECISIONS" <<'PY'
import json, statistics, sys
name, tmp, ps = sys.argv[1], sys.argv[2], sys.argv[3].split()
# Medians of the repetitions: a shared machine has outliers.
l = statistics.median(json.load(open(f"{tmp}/l.json"))[0]["samples_ts"])
r = {p: json.load(open(f"{tmp}/{p}.json"))[0] for p in ps}
med = {p: statistics.median(r[p]["samples"]) for p in ps}
cells = [name, f"{l:.1f}"] + [f"{med[p]:.1f}" for p in ps] + [f"{med[p] / l:.2f}" for p in ps]
if "q8" in ps:
    q = r["q8"]
    # Each repetition against the bandwidth probed right after it; median.
    fr = [t * q["bytes_per_token"] / bw
          for t, bw in zip(q["samples"], q.get("memory_bandwidth_samples") or [])]
    cells.append(f"{statistics.median(fr) * 100:.0f} %" if fr else "")
print("| " + " | ".join(cells) + " |")
PY
  done
  echo
  echo "CPU: $CPU; threads $THREADS; medians of $REPS repetitions; $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
done
