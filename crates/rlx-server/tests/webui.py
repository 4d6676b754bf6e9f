#!/usr/bin/env python3
"""Drives the chat page of a running `rlx serve` in headless Chromium.

    python3 tests/webui.py BASE_URL [--chromium PATH] [--screenshots DIR] [--api-key KEY]

Standard library only: a minimal Chrome DevTools Protocol client over a
hand-written WebSocket. It loads BASE_URL/, chats, reloads, regenerates,
stops, edits and checks the phone layout; exits 1 at the first failed check.
Against the mock: python3 tests/webui_mock.py --port 8077 & python3 tests/webui.py http://127.0.0.1:8077
"""

import argparse
import base64
import hashlib
import json
import os
import queue
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Failure(Exception):
    pass


class CDPError(Exception):
    pass


# ------------------------------------------------------------------ WebSocket

class WebSocket:
    """A client WebSocket (RFC 6455): text frames out, masked; messages in."""

    def __init__(self, url, timeout=60):
        u = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        path = u.path + ("?" + u.query if u.query else "")
        # No Origin header: Chromium refuses DevTools connections that send
        # one unless started with --remote-allow-origins.
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        self.buf = bytearray()
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        end = self.buf.index(b"\r\n\r\n")
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[:end + 4]
        if " 101 " not in head[0] + " ":
            raise ConnectionError(f"WebSocket handshake refused: {head[0]}")
        fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        if fields.get("sec-websocket-accept") != accept:
            raise ConnectionError("WebSocket handshake: wrong Sec-WebSocket-Accept")

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("WebSocket closed by the browser")
        self.buf += data

    def _read(self, n):
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _frame(self, opcode, payload):
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        mask = os.urandom(4)
        # XOR the payload with the repeated mask in one big-integer step.
        m = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "little") ^ int.from_bytes(m, "little")).to_bytes(n, "little")
        self.sock.sendall(head + mask + masked)

    def send(self, text):
        self._frame(0x1, text.encode())

    def recv(self):
        parts = []
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
            if opcode == 0x8:
                raise ConnectionError("WebSocket closed by the browser")
            if opcode == 0x9:
                self._frame(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            parts.append(payload)
            if b0 & 0x80:
                return b"".join(parts).decode()

    def close(self):
        try:
            self._frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()


# ------------------------------------------------------------------ CDP

class Browser:
    """Chromium with one page, driven over DevTools."""

    def __init__(self, chromium, timeout=60):
        self.ws = self.proc = None
        self.tmp = tempfile.mkdtemp(prefix="rlx-webui-")
        try:
            self._start(chromium, timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, chromium, timeout):
        if not shutil.which(chromium):
            raise Failure(f"no Chromium at {chromium!r}: apt-get install chromium, or pass --chromium")
        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
             f"--user-data-dir={self.tmp}", "--remote-debugging-port=0", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--mute-audio", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        lines = queue.Queue()

        def drain():  # keep reading so Chromium never blocks on a full pipe
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                lines.put(line)
            lines.put(None)
        threading.Thread(target=drain, daemon=True).start()
        end = time.monotonic() + 30
        url = None
        while url is None:
            try:
                line = lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise Failure("Chromium did not print 'DevTools listening on ws://…':\n"
                              + "\n".join(self.log[-20:]))
            if "DevTools listening on " in line:
                url = line.split("DevTools listening on ", 1)[1].strip()
        self.ws = WebSocket(url, timeout)
        self.next_id = 0
        self.errors = []  # uncaught exceptions and console errors of the page
        self.urls = []  # every URL the page requested
        self.chat_bodies = []  # the chat requests' bodies, in order
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        for m in ("Page.enable", "Runtime.enable", "Network.enable"):
            self.call(m, page=True)

    def call(self, method, params=None, page=False):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if page:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            r = json.loads(self.ws.recv())
            if r.get("id") == self.next_id:
                if "error" in r:
                    raise CDPError(f"{method}: {r['error'].get('message')}")
                return r.get("result", {})
            self.event(r)

    def event(self, r):
        p = r.get("params", {})
        if r.get("method") == "Network.requestWillBeSent":
            req = p.get("request", {})
            self.urls.append(req.get("url", ""))
            if req.get("url", "").endswith("/v1/chat/completions") and req.get("postData"):
                self.chat_bodies.append(json.loads(req["postData"]))
        elif r.get("method") == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.errors.append((d.get("exception") or {}).get("description") or d.get("text"))
        elif r.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif r.get("method") == "Inspector.targetCrashed":
            raise Failure("the page crashed")

    def js(self, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "awaitPromise": True,
                                           "returnByValue": True}, page=True)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CDPError((d.get("exception") or {}).get("description") or d.get("text"))
        return r["result"].get("value")

    def wait(self, expr, what, timeout=30):
        """Polls expr until it is truthy; returns its value."""
        end = time.monotonic() + timeout
        while True:
            try:
                v = self.js(expr)
                if v:
                    return v
            except CDPError:  # the document is being replaced (reload, navigation)
                pass
            if time.monotonic() > end:
                raise Failure(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)

    def viewport(self, width, height, mobile):
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 2 if mobile else 1,
                   "mobile": mobile}, page=True)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png"}, page=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        if self.ws is not None:
            try:
                self.call("Browser.close")
                self.ws.close()
            except Exception:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


# ------------------------------------------------------------------ the checks

# Helpers in the page, installed before its own scripts on every load.
HELPERS = r"""
window.T = {
  q: (id) => document.querySelector(`[data-testid="${id}"]`),
  msgs: () => [...document.querySelectorAll('[data-testid="message"]')].map((m) => ({
    role: m.dataset.role, id: m.dataset.id, state: m.dataset.state,
    text: (m.querySelector('.content') || {}).textContent || '',
    thinking: (m.querySelector('.thinking-body') || {}).textContent || '',
    note: (m.querySelector('.note') || {}).textContent || '' })),
  last: () => T.msgs().pop(),
  idle: () => !T.q('send').disabled && T.q('stop').hidden,
  set: (el, text) => {
    el.focus();
    el.value = text;
    el.dispatchEvent(new Event('input', { bubbles: true }));
  },
  // Records the lengths a streaming reply's text (thinking and answer) has.
  watch: () => {
    window.__seen = new Set();
    new MutationObserver(() => {
      const m = [...document.querySelectorAll('[data-role="assistant"]')].pop();
      if (m && m.dataset.state === 'streaming') {
        __seen.add(m.querySelector('.content').textContent.length
          + m.querySelector('.thinking-body').textContent.length);
      }
    }).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
  },
  visible: (el) => {
    const r = el.getBoundingClientRect();
    const s = getComputedStyle(el);
    return { ok: r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'
      && r.left >= 0 && r.top >= 0 && r.right <= innerWidth + 0.5 && r.bottom <= innerHeight + 0.5,
      rect: [r.left, r.top, r.right, r.bottom].map(Math.round), vw: innerWidth, vh: innerHeight };
  },
};
"""

REPLY_TIMEOUT = 45
STEP = [0]  # the check under way, for the failure message


def wait_reply(b, what):
    """Waits for the reply just started to finish; returns the messages."""
    b.wait("T.idle() && T.last() && T.last().role === 'assistant' && T.last().state === 'done'",
           f"{what} to finish (send button enabled again)", REPLY_TIMEOUT)
    return b.js("T.msgs()")


def expect(cond, message):
    if not cond:
        raise Failure(message)


def run(b, base, args):
    shots = args.screenshots
    if shots:
        os.makedirs(shots, exist_ok=True)
    req = urllib.request.Request(base + "/v1/models")
    if args.api_key:
        req.add_header("Authorization", f"Bearer {args.api_key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            model = json.load(r)["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise Failure(f"GET {base}/v1/models failed: {e}") from e
    helpers = HELPERS
    if args.api_key:
        helpers += f"localStorage.setItem('rlx.chat.apiKey', {json.dumps(args.api_key)});"
    b.call("Page.addScriptToEvaluateOnNewDocument", {"source": helpers}, page=True)
    b.viewport(1280, 800, False)

    def check(n, title):
        print(f"ok  {n}. {title}", flush=True)

    STEP[0] = 1
    # 1. The page loads and names the model.
    b.call("Page.navigate", {"url": base + "/"}, page=True)
    shown = b.wait(f"window.T && T.q('model') && T.q('model').textContent === {json.dumps(model)}"
                   " && T.q('model').textContent", f"the model name {model!r} in [data-testid=model]")
    check(1, f"/ loads and shows the model name {shown!r} from /v1/models")

    STEP[0] = 2
    # 2. A reply streams in and finishes, with stats.
    b.js("T.watch(); T.set(T.q('input'), 'Say hello.'); T.q('send').click(); true")
    b.wait("T.msgs().length === 2 && T.msgs()[0].role === 'user' && T.msgs()[1].role === 'assistant'",
           "a user and an assistant message", 10)
    msgs = wait_reply(b, "the reply to 'Say hello.'")
    expect(len(msgs) == 2, f"expected 2 messages, got {len(msgs)}: {msgs}")
    expect(msgs[0]["text"] == "Say hello.", f"user message reads {msgs[0]['text']!r}")
    reply = msgs[1]
    expect(reply["text"].strip(), f"the reply has no text (note: {reply['note']!r}, "
                                  f"thinking: {reply['thinking'][:80]!r})")
    seen = set(b.js("[...__seen]")) | {len(reply["text"]) + len(reply["thinking"])}
    seen.discard(0)
    expect(len(seen) >= 2, "the reply's text did not grow while streaming "
                           f"(lengths seen: {sorted(seen)})")
    stats = b.js("T.q('stats').textContent")
    expect(re.search(r"\d+(\.\d+)? tok/s", stats), f"the stats line shows no tokens/s: {stats!r}")
    expect(re.search(r"context \d+ / \d+", stats),
           f"the stats line shows no context use (N / context length): {stats!r}")
    check(2, f"reply streamed ({len(seen)} lengths, {len(reply['text'])} chars); stats: {stats}")
    if shots:
        b.screenshot(os.path.join(shots, "desktop.png"))

    STEP[0] = 3
    # 3. The conversation survives a reload.
    b.js("window.__old = 1")
    b.call("Page.reload", page=True)
    b.wait("!window.__old && document.readyState === 'complete' && T.msgs().length === 2",
           "the conversation after a reload", 15)
    again = b.js("T.msgs()")
    expect([m["text"] for m in again] == [m["text"] for m in msgs],
           f"after a reload the messages differ: {again}")
    check(3, "reload keeps the conversation (localStorage)")

    STEP[0] = 4
    # 4. Regenerate replaces the last reply.
    old = again[1]["id"]
    b.wait("!!T.q('regenerate')", "the regenerate button", 5)
    b.js("T.q('regenerate').click(); true")
    msgs = wait_reply(b, "the regenerated reply")
    roles = [m["role"] for m in msgs]
    expect(roles == ["user", "assistant"], f"after regenerate the roles are {roles}")
    expect(msgs[1]["id"] != old, "regenerate did not make a new assistant message")
    expect(msgs[1]["text"].strip(), "the regenerated reply has no text")
    check(4, "regenerate replaces the last assistant message (one assistant message)")

    STEP[0] = 5
    # 5. Stop keeps the partial reply.
    b.js("T.q('settings').click(); true")
    b.wait("!document.getElementById('settings').hidden", "the settings panel to open", 5)
    b.js(f"T.set(document.querySelector('#settings [name=max_tokens]'), '{args.long_reply}'); "
         "T.q('settings').click(); true")
    b.js("T.set(T.q('input'), 'Count from 1 to 300.'); true")
    # Enter in the textarea sends.
    for kind in ("keyDown", "keyUp"):
        b.call("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                          "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13,
                                          **({"text": "\r"} if kind == "keyDown" else {})}, page=True)
    b.wait("T.msgs().length === 4 && !T.q('stop').hidden", "Enter to send the message (stop button shown)", 10)
    b.wait("(T.last().text || T.last().thinking) && true", "text of the long reply to arrive", REPLY_TIMEOUT)
    time.sleep(0.15)
    expect(b.js("T.last().state") == "streaming", "the long reply finished before Stop could be clicked")
    b.js("T.q('stop').click(); true")
    b.wait("T.idle()", "the page to be ready after Stop", 10)
    part = b.js("T.last()")
    expect(part["role"] == "assistant" and part["state"] == "done", f"after Stop the last message is {part}")
    expect(part["text"] or part["thinking"], "Stop lost the partial text")
    expect("stop" in part["note"].lower(), f"the stopped reply does not say so: {part['note']!r}")
    time.sleep(0.5)
    expect(b.js("T.last().text") == part["text"], "the reply kept growing after Stop")
    expect(not b.js("T.q('send').disabled"), "send is still disabled after Stop")
    check(5, f"stop keeps the partial reply ({len(part['text'] or part['thinking'])} chars) and the UI is ready")

    STEP[0] = 6
    # 6. Editing the first user message replaces what followed.
    b.js("T.q('edit').click(); true")
    b.wait("!!T.q('edit-input')", "the edit box", 5)
    b.js("T.set(T.q('edit-input'), 'Say goodbye.'); T.q('edit-save').click(); true")
    msgs = wait_reply(b, "the reply to the edited message")
    expect([m["role"] for m in msgs] == ["user", "assistant"],
           f"after the edit the roles are {[m['role'] for m in msgs]}")
    expect(msgs[0]["text"] == "Say goodbye.", f"the edited message reads {msgs[0]['text']!r}")
    expect(msgs[1]["text"].strip() or msgs[1]["thinking"], "the reply to the edit is empty")
    check(6, "editing the first user message replaces the rest with one new reply")

    STEP[0] = 7
    # 7. "Think first" asks the template to think, and the reply still comes.
    b.js("T.q('settings').click(); true")
    b.wait("!document.getElementById('settings').hidden", "the settings panel to open", 5)
    b.js("T.q('thinking').click(); "
         "T.set(document.querySelector('#settings [name=max_tokens]'), '64'); "
         "T.q('settings').click(); true")
    b.js("T.set(T.q('input'), 'Why is the sky blue?'); T.q('send').click(); true")
    msgs = wait_reply(b, "the reply with thinking on")
    sent = b.chat_bodies[-1] if b.chat_bodies else {}
    expect(sent.get("chat_template_kwargs") == {"enable_thinking": True},
           f"thinking on sent {sent.get('chat_template_kwargs')!r}")
    expect(msgs[-1]["text"].strip() or msgs[-1]["thinking"], "the reply with thinking on is empty")
    check(7, "'Think first' sends enable_thinking and the reply arrives")

    STEP[0] = 8
    # 8. A phone-sized screen.
    b.viewport(360, 640, True)
    time.sleep(0.3)
    for tid in ("input", "send"):
        v = b.js(f"T.visible(T.q('{tid}'))")
        expect(v["ok"], f"at 360x640 [data-testid={tid}] is not inside the viewport: {v}")
    width = b.js("[document.documentElement.scrollWidth, innerWidth]")
    expect(width[0] <= width[1], f"at 360x640 the page scrolls sideways: {width}")
    if shots:
        b.screenshot(os.path.join(shots, "phone.png"))
        b.js("document.getElementById('menu').click(); true")
        time.sleep(0.4)
        b.screenshot(os.path.join(shots, "phone-sidebar.png"))
        b.js("document.getElementById('scrim').click(); true")
    check(8, "at 360x640 the input and send button are inside the viewport")

    if shots:
        check(9, f"screenshots saved in {shots}: desktop.png, phone.png, phone-sidebar.png")
    expect(not b.errors, "the page logged errors:\n  " + "\n  ".join(map(str, b.errors)))
    # Nothing beyond the server: no CDN, fonts or analytics.
    b.js("true")  # collect the last events
    outside = sorted({u for u in b.urls if not u.startswith(base + "/") and u.split(":")[0]
                      not in ("data", "blob", "about")})
    expect(b.urls and not outside, f"the page requested other origins: {outside}")
    print(f"ok  the page requested only {base} ({len(b.urls)} requests)", flush=True)


def main():
    ap = argparse.ArgumentParser(description="Checks the rlx chat page in headless Chromium.")
    ap.add_argument("base_url")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser")
                    or shutil.which("google-chrome") or "chromium")
    ap.add_argument("--screenshots", metavar="DIR")
    ap.add_argument("--api-key")
    ap.add_argument("--long-reply", type=int, default=400, metavar="TOKENS",
                    help="max_tokens of the reply that Stop cuts (more for a fast model)")
    args = ap.parse_args()
    base = args.base_url.rstrip("/")
    started = time.monotonic()
    b = None
    try:
        b = Browser(args.chromium)
        run(b, base, args)
    except (Failure, CDPError, OSError) as e:
        where = f"check {STEP[0]}: " if STEP[0] else ""
        print(f"FAIL {where}{e}", file=sys.stderr)
        if b is not None:
            try:
                print("messages: " + json.dumps(b.js("window.T ? T.msgs() : null"))[:2000], file=sys.stderr)
                if args.screenshots:
                    os.makedirs(args.screenshots, exist_ok=True)
                    b.screenshot(os.path.join(args.screenshots, "failure.png"))
            except Exception:
                pass
            if b.errors:
                print("page errors:\n  " + "\n  ".join(map(str, b.errors)), file=sys.stderr)
        return 1
    finally:
        if b is not None:
            b.close()
    print(f"all checks passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
