#!/usr/bin/env python3
"""A stand-in for `rlx serve` to develop the chat page (web/) against.

    python3 tests/webui_mock.py [--port 8077] [--delay 0.02]

Serves web/index.html, app.js and style.css, GET /v1/models, POST /api/show
and POST /v1/chat/completions. A chat reply streams one word per chunk
(`--delay` seconds apart) after a reasoning chunk, honours max_tokens as a
word count (finish_reason "length"), ends with rlx's `timings` on the last
choice and a `usage` chunk, and stops when the client goes away. A prompt
holding "error" gets a 400; one holding "weather" gets a tool call.
"""

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WEB = Path(__file__).resolve().parent.parent / "web"
FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
MODEL = "mock-model"
CONTEXT = 8192

REPLIES = [
    "Hello! I am a **mock** model. Here is some *Markdown*:\n\n"
    "## A list\n\n- one with `code`\n- two\n  1. nested\n  2. items\n\n"
    "```python\nprint('hi <b>not bold</b>')\n```\n\n"
    "| name | value |\n|:-----|------:|\n| a | 1 |\n| b | 22 |\n\n"
    "See [the docs](https://example.com/docs?a=1&b=2) or javascript:alert(1).",
    "Hi there! This is another reply, so a regenerated answer differs.\n\n"
    "> A quote, and a link: https://example.org/page.",
]
served = 0
lock = threading.Lock()


def words(text):
    """The reply's pieces, one per chunk, spaces kept."""
    return re.findall(r"\s*\S+", text)


class Handler(BaseHTTPRequestHandler):
    args = None

    def log_message(self, fmt, *a):
        sys.stderr.write("mock: " + fmt % a + "\n")

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message):
        self.send_json(status, {"error": {"message": message, "type": "invalid_request_error",
                                          "param": None, "code": None}})

    def do_GET(self):
        if self.path in FILES:
            name, ctype = FILES[self.path]
            body = (WEB / name).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{
                "id": MODEL, "object": "model", "created": 0, "owned_by": "rlx",
                "meta": {"n_ctx": CONTEXT, "n_vocab": 1000}}]})
        elif self.path == "/health":
            self.send_json(200, {"status": "ok"})
        else:
            self.error(404, f"no route {self.path}")

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(n) or b"{}")
        except ValueError as e:
            self.error(400, f"bad JSON: {e}")
            return None

    def do_POST(self):
        if self.path == "/api/show":
            if self.body() is not None:
                self.send_json(200, {"model_info": {"general.architecture": "mock",
                                                    "mock.context_length": CONTEXT},
                                     "capabilities": ["completion", "thinking"]})
        elif self.path == "/v1/chat/completions":
            req = self.body()
            if req is not None:
                self.chat(req)
        else:
            self.error(404, f"no route {self.path}")

    def chat(self, req):
        global served
        msgs = req.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return self.error(400, "messages: must not be empty")
        for k in ("temperature", "top_p", "top_k", "max_tokens", "seed"):
            if k in req and not isinstance(req[k], (int, float)):
                return self.error(400, f"{k}: expected a number")
        prompt = str(msgs[-1].get("content", ""))
        if "error" in prompt.lower():
            return self.error(400, "the mock refuses prompts that say error")
        tool = "weather" in prompt.lower()
        if m := re.search(r"count from 1 to (\d+)", prompt, re.I):
            text = ", ".join(str(i) for i in range(1, int(m.group(1)) + 1)) + "."
        else:
            with lock:
                text = REPLIES[served % len(REPLIES)]
                served += 1
        pieces = [] if tool else words(text)
        limit = req.get("max_tokens")
        reason = "tool_calls" if tool else "stop"
        if isinstance(limit, int) and len(pieces) > limit:
            pieces, reason = pieces[:limit], "length"
        prompt_tokens = sum(len(words(str(m.get("content", "")))) + 4 for m in msgs)

        if not req.get("stream"):
            return self.send_json(200, {"object": "chat.completion", "model": MODEL, "choices": [{
                "index": 0, "message": {"role": "assistant", "content": "".join(pieces)},
                "finish_reason": reason}], "usage": {
                "prompt_tokens": prompt_tokens, "completion_tokens": len(pieces),
                "total_tokens": prompt_tokens + len(pieces)}})

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        started = time.monotonic()

        def chunk(delta, finish=None, **extra):
            c = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": int(time.time()),
                 "model": MODEL, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                              "finish_reason": finish, **extra}]}
            return c

        def send(obj):
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        sent = 0
        try:
            for r in ["The user ", "greets me; ", "I should answer."]:
                send(chunk({"reasoning_content": r}))
                time.sleep(self.args.delay)
            if tool:
                send(chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                            "function": {"name": "get_weather", "arguments": ""}}]}))
                for part in ['{"city": ', '"Paris", ', '"unit": "C"}']:
                    send(chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}))
                    time.sleep(self.args.delay)
            for p in pieces:
                send(chunk({"content": p}))
                sent += 1
                time.sleep(self.args.delay)
            secs = time.monotonic() - started
            n = len(pieces) + 3
            send(chunk({}, reason, timings={
                "cache_n": 0, "prompt_n": prompt_tokens, "prompt_ms": 12.5,
                "prompt_per_second": prompt_tokens / 0.0125, "predicted_n": n,
                "predicted_ms": secs * 1e3, "predicted_per_second": n / secs}))
            if (req.get("stream_options") or {}).get("include_usage"):
                send({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": MODEL,
                      "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                               "total_tokens": prompt_tokens + n}})
            send("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            sys.stderr.write(f"mock: client went away after {sent} of {len(pieces)} words\n")
        self.close_connection = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=8077)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--delay", type=float, default=0.02, help="seconds between chunks")
    Handler.args = ap.parse_args()
    server = ThreadingHTTPServer((Handler.args.host, Handler.args.port), Handler)
    server.daemon_threads = True
    print(f"mock: listening on http://{Handler.args.host}:{server.server_port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
