"""Tool calls on the real Gemma 3 270M file through `rlx serve`: sampled
replies at temperature 1 with `tool_choice` required and auto, checked
against the functions' schemas; prints the rates and decode speeds.

    python3 scripts/tool-calls-270m.py [RLX_BINARY] [MODEL] [SAMPLES]
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

rlx = sys.argv[1] if len(sys.argv) > 1 else "target/release/rlx"
model = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser(
    "~/.cache/rlx/models/gemma-3-270m-q4_k_m.gguf")
samples = int(sys.argv[3]) if len(sys.argv) > 3 else 20

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email.",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string"}, "subject": {"type": "string"},
            "urgent": {"type": "boolean"}},
            "required": ["to", "subject"]}}},
]
QUESTIONS = ["What's the weather in Paris?", "Email bob@example.com that I am late.",
             "Will it rain in Tokyo this week?", "Tell me a joke."]


def valid(name, args):
    tool = next((t for t in TOOLS if t["function"]["name"] == name), None)
    if tool is None or not isinstance(args, dict):
        return False
    p = tool["function"]["parameters"]
    if any(k not in args for k in p["required"]) or any(k not in p["properties"] for k in args):
        return False
    for k, v in args.items():
        s = p["properties"][k]
        ok = {"string": isinstance(v, str), "boolean": isinstance(v, bool),
              "integer": isinstance(v, int) and not isinstance(v, bool)}[s["type"]]
        if not ok or ("enum" in s and v not in s["enum"]):
            return False
        if s["type"] == "integer" and not s["minimum"] <= v <= s["maximum"]:
            return False
    return True


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def main():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = subprocess.Popen([rlx, "serve", "-m", model, "--port", str(port), "-t", "2",
                               "--parallel", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.2)
        for choice in ["required", "auto", None]:
            calls = valid_calls = answers = length = 0
            tokens = secs = 0.0
            for i in range(samples):
                body = {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                        "temperature": 1.0, "seed": i, "max_tokens": 200,
                        "parallel_tool_calls": False}
                if choice:
                    body["tools"] = TOOLS
                    body["tool_choice"] = choice
                r = post(port, body)
                c = r["choices"][0]
                tokens += r["timings"]["predicted_n"] - 1
                secs += r["timings"]["predicted_ms"] / 1e3
                if c["finish_reason"] == "length":
                    length += 1
                for tc in c["message"].get("tool_calls") or []:
                    calls += 1
                    args = json.loads(tc["function"]["arguments"])
                    valid_calls += valid(tc["function"]["name"], args)
                if not c["message"].get("tool_calls"):
                    answers += 1
            label = f"tool_choice={choice}" if choice else "no tools"
            print(f"{label}: {samples} replies, {calls} calls ({valid_calls} valid), "
                  f"{answers} answers, {length} cut by max_tokens; "
                  f"decode {tokens / secs:.1f} tokens/s")
    finally:
        server.terminate()
        server.wait()


main()
