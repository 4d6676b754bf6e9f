#!/usr/bin/env bash
# Runs llama-bench and `rlx bench` alternately on the same GGUF and thread
# count and prints one table with both figures and the ratio per test.
#
#   scripts/bench-vs-llama.sh [MODEL.gguf] [THREADS] [REPS]
#
# llama-bench comes from $LLAMA_BENCH, or ~/.cache/llama.cpp-ref (built by
# ../shared/scripts/build-llama.sh or by hand from the llama-cpp-python sdist).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-$(bash scripts/fetch-model.sh)}
THREADS=${2:-2}
REPS=${3:-5}
LLAMA_BENCH=${LLAMA_BENCH:-$HOME/.cache/llama.cpp-ref/src/build/bin/llama-bench}
[ -x "$LLAMA_BENCH" ] || { echo "llama-bench not found (set LLAMA_BENCH)" >&2; exit 1; }
cargo build --release -q -p rlx-cli
RLX=./target/release/rlx
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# test name, llama-bench args, rlx args
TESTS=(
  "pp512|-p 512 -n 0|-p 512 -n 0"
  "tg128|-p 0 -n 128|-p 0 -n 128"
  "tg128@d1024|-p 0 -n 128 -d 1024|-p 0 -n 128 -d 1024"
)
printf "| test | llama.cpp t/s | rlx exact t/s | rlx q8 t/s | exact / llama | q8 / llama |\n"
printf "| --- | ---: | ---: | ---: | ---: | ---: |\n"
for t in "${TESTS[@]}"; do
  IFS='|' read -r name largs rargs <<<"$t"
  # Alternate the engines so drift on a shared machine hits both.
  "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -r "$REPS" $largs -o json >"$TMP/l.json" 2>/dev/null
  $RLX bench -m "$MODEL" -t "$THREADS" -r "$REPS" $rargs --json >"$TMP/e.json"
  $RLX bench -m "$MODEL" -t "$THREADS" -r "$REPS" $rargs --json --precision q8 >"$TMP/q.json"
  python3 - "$name" "$TMP" <<'PY'
import json, sys
name, tmp = sys.argv[1], sys.argv[2]
l = json.load(open(f"{tmp}/l.json"))[0]["avg_ts"]
e = json.load(open(f"{tmp}/e.json"))[0]["tokens_per_second"]
q = json.load(open(f"{tmp}/q.json"))[0]["tokens_per_second"]
print(f"| {name} | {l:.1f} | {e:.1f} | {q:.1f} | {e / l:.2f} | {q / l:.2f} |")
PY
done
echo
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); threads $THREADS; reps $REPS; $(date -u +%Y-%m-%d)"
