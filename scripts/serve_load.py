#!/usr/bin/env python3
"""Load on an OpenAI-compatible server over loopback: N clients, each sending
R streaming text completions one after the other (greedy, a fixed number of
tokens). Prints one JSON object: aggregate generated tokens/s over the wall
time, time to first token and request latency (median and 90th percentile,
seconds), and the server's reported prompt tokens and cached tokens.

Standard library only; bounded by --clients x --requests and --timeout.
"""

import argparse
import http.client
import json
import statistics
import threading
import time


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def one_request(host, port, prompt, max_tokens, timeout):
    body = json.dumps({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    })
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    start = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    first = None
    pieces = 0
    usage = None
    timings = None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        msg = json.loads(data)
        if msg.get("usage"):
            usage = msg["usage"]
        if msg.get("timings"):
            timings = msg["timings"]
        for c in msg.get("choices", []):
            if c.get("text"):
                pieces += 1
                if first is None:
                    first = time.monotonic()
    end = time.monotonic()
    conn.close()
    if usage and usage.get("completion_tokens") is not None:
        generated = usage["completion_tokens"]
    elif timings and timings.get("predicted_n") is not None:
        generated = timings["predicted_n"]
    else:
        generated = pieces
    cached = 0
    prompt_tokens = 0
    if usage:
        prompt_tokens = usage.get("prompt_tokens", 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    elif timings:
        cached = timings.get("cache_n", 0)
        prompt_tokens = cached + timings.get("prompt_n", 0)
    return {
        "ttft": (first or end) - start, "latency": end - start, "generated": generated,
        "prompt_tokens": prompt_tokens, "cached": cached,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=2, help="per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--system", default="", help="text every prompt starts with")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    results, errors = [], []
    lock = threading.Lock()

    def client(i):
        for r in range(args.requests):
            prompt = (f"{args.system}Question {i}.{r}: write a short story about "
                      f"a {['cat', 'ship', 'tree', 'clock'][(i + r) % 4]} number {i * 7 + r}.")
            try:
                res = one_request(args.host, args.port, prompt, args.max_tokens, args.timeout)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                with lock:
                    errors.append(str(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    gen = sum(r["generated"] for r in results)
    ttft = [r["ttft"] for r in results]
    lat = [r["latency"] for r in results]
    print(json.dumps({
        "clients": args.clients, "requests": len(results), "errors": errors,
        "generated_tokens": gen, "wall_s": wall,
        "tokens_per_second": gen / wall if wall > 0 else 0,
        "ttft_p50": statistics.median(ttft) if ttft else None, "ttft_p90": pct(ttft, 0.9),
        "latency_p50": statistics.median(lat) if lat else None, "latency_p90": pct(lat, 0.9),
        "prompt_tokens": sum(r["prompt_tokens"] for r in results),
        "cached_tokens": sum(r["cached"] for r in results),
    }))


if __name__ == "__main__":
    main()
