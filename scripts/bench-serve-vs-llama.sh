#!/usr/bin/env bash
# `rlx serve` and `llama-server` under the same load, one after the other, on
# the same GGUF and cores, over loopback: CLIENTS concurrent clients, each
# sending REQUESTS streaming completions of NTOK greedy tokens
# (scripts/serve_load.py). Prints a table of aggregate generated tokens/s,
# time to first token and latency (median / 90th percentile), then a shared
# system prompt run (16 clients whose prompts start with the same ~1,000
# ~900 tokens) with the prompt tokens each server reports as cached.
#
#   scripts/bench-serve-vs-llama.sh [MODEL.gguf] [THREADS]
#
# Environment (all optional):
#   CLIENTS="1 4 16"   concurrency levels; REQUESTS=2 per client; NTOK=64
#   CTX=16384 NP=16    total K/V tokens and sequences at once, for both servers
#   RLX=path/to/rlx    instead of building rlx-cli
#   LLAMA_SERVER=path  by default from ~/.cache/llama.cpp-ref
#   RLX_ARGS, LLAMA_ARGS  extra flags for each server
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-$(bash scripts/fetch-model.sh)}
THREADS=${2:-${THREADS:-2}}
read -r -d '' -a CLIENT_LIST <<<"${CLIENTS:-1 4 16}" || true
REQUESTS=${REQUESTS:-2}
NTOK=${NTOK:-64}
CTX=${CTX:-16384}
NP=${NP:-16}
LLAMA_SERVER=${LLAMA_SERVER:-$HOME/.cache/llama.cpp-ref/src/build/bin/llama-server}
[ -x "$LLAMA_SERVER" ] || { echo "llama-server not found (set LLAMA_SERVER)" >&2; exit 1; }
if [ -z "${RLX:-}" ]; then
  cargo build --release -q -p rlx-cli
  RLX=./target/release/rlx
fi
PORT=${PORT:-18931}
TMP=$(mktemp -d)
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

wait_ready() {
  for _ in $(seq 600); do
    if python3 - "$PORT" <<'EOF' 2>/dev/null; then return 0; fi
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=2)
c.request("GET", "/health")
sys.exit(0 if c.getresponse().status == 200 else 1)
EOF
    sleep 0.2
  done
  echo "server did not become ready" >&2
  exit 1
}

# A ~900-token system prompt (a repeated sentence; with the question it
# still fits the 1,024 tokens a sequence holds at -c 16384 -np 16).
SYSTEM=$(python3 -c 'print("You are a patient assistant who answers in plain words and checks every step. " * 60, end="")')

run_server() { # name, command...
  local name=$1
  shift
  "$@" >"$TMP/$name.log" 2>&1 &
  PID=$!
  wait_ready
  for c in "${CLIENT_LIST[@]}"; do
    python3 scripts/serve_load.py --port "$PORT" --clients "$c" --requests "$REQUESTS" \
      --max-tokens "$NTOK" >"$TMP/$name-$c.json"
  done
  python3 scripts/serve_load.py --port "$PORT" --clients 16 --requests 1 --max-tokens 16 \
    --system "$SYSTEM" >"$TMP/$name-system.json"
  kill "$PID"
  wait "$PID" 2>/dev/null || true
  PID=""
}

# shellcheck disable=SC2086
run_server rlx "$RLX" serve -m "$MODEL" -t "$THREADS" --port "$PORT" -c "$CTX" --parallel "$NP" ${RLX_ARGS:-}
# shellcheck disable=SC2086
run_server llama "$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" --port "$PORT" -c "$CTX" -np "$NP" ${LLAMA_ARGS:-}

echo "## $(basename "$MODEL"): $REQUESTS streaming completions of $NTOK tokens per client, greedy"
echo
echo "| clients | server | tokens/s | TTFT p50 / p90 s | latency p50 / p90 s | errors |"
echo "| ---: | --- | ---: | ---: | ---: | ---: |"
for c in "${CLIENT_LIST[@]}"; do
  for name in rlx llama; do
    python3 - "$TMP/$name-$c.json" "$name" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
f = lambda v: "-" if v is None else f"{v:.2f}"
print(f"| {d['clients']} | {sys.argv[2]} | {d['tokens_per_second']:.1f} | "
      f"{f(d['ttft_p50'])} / {f(d['ttft_p90'])} | {f(d['latency_p50'])} / {f(d['latency_p90'])} | "
      f"{len(d['errors'])} |")
EOF
  done
done
echo
echo "Shared system prompt (16 clients at once, ~900 common tokens, 16 tokens each):"
echo
echo "| server | prompt tokens | cached | TTFT p50 / p90 s | wall s | |"
echo "| --- | ---: | ---: | ---: | ---: | --- |"
for name in rlx llama; do
  python3 - "$TMP/$name-system.json" "$name" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
f = lambda v: "-" if v is None else f"{v:.2f}"
print(f"| {sys.argv[2]} | {d['prompt_tokens']} | {d['cached_tokens']} | "
      f"{f(d['ttft_p50'])} / {f(d['ttft_p90'])} | {d['wall_s']:.2f} | {len(d['errors'])} errors |")
EOF
done
echo
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); threads $THREADS; -c $CTX, $NP sequences; $(date -u '+%Y-%m-%d %H:%M UTC')"
