"""The official `openai` Python client against a running `rlx serve`.

Usage: python3 openai_client.py BASE_URL MODEL [TOOLS_BASE_URL]

Run by `crates/rlx-server/tests/api.rs` (which starts the server on the tiny
Gemma 3 model, and a second one on the tiny Gemma 4 model with Gemma 4's tool
tokens for the tool-call checks); exits non-zero with a message on the first
check that fails.
"""

import sys

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
messages = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


ids = [m.id for m in client.models.list().data]
check(model in ids, f"models.list names {model!r} ({ids})")

# Chat, whole and streamed: greedy, so both are the same text.
whole = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0
)
text = whole.choices[0].message.content
check(isinstance(text, str) and text, "chat answer has content")
check(whole.choices[0].finish_reason in ("stop", "length"), "chat finish_reason")
check(whole.usage.completion_tokens > 0, "chat usage counts tokens")
check(whole.choices[0].message.role == "assistant", "chat role")

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0, stream=True
)
parts, finish = [], None
for chunk in stream:
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        finish = c.finish_reason or finish
check("".join(parts) == text, "streamed deltas add up to the whole answer")
check(finish == whole.choices[0].finish_reason, "streamed finish_reason")

# The same conversation again reuses its computed prefix.
again = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0
)
check(again.choices[0].message.content == text, "greedy repeats")
cached = again.usage.prompt_tokens_details.cached_tokens
check(cached and cached > 0, f"usage reports {cached} cached prompt tokens")

# n choices with a seed, repeatable.
def sampled():
    r = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, n=2, seed=7,
        temperature=1.0,
    )
    return [c.text for c in sorted(r.choices, key=lambda c: c.index)]


first = sampled()
check(len(first) == 2, "n = 2 gives two choices")
check(sampled() == first, "the same seed gives the same choices")

# Log-probabilities, completions and chat.
r = client.completions.create(
    model=model, prompt="The sky is", max_tokens=4, temperature=0, logprobs=2
)
lp = r.choices[0].logprobs
check(len(lp.tokens) == len(lp.token_logprobs) > 0, "completion logprobs per token")
check(all(v <= 0 for v in lp.token_logprobs), "log-probabilities are <= 0")
check(all(len(t) >= 1 for t in lp.top_logprobs), "completion top_logprobs")

r = client.chat.completions.create(
    model=model, messages=messages, max_tokens=4, temperature=0,
    logprobs=True, top_logprobs=3,
)
content = r.choices[0].logprobs.content
check(len(content) > 0, "chat logprobs per token")
check(all(len(t.top_logprobs) == 3 for t in content), "chat top_logprobs = 3")
check(
    all(abs(t.logprob - max(a.logprob for a in t.top_logprobs)) < 1e-4 for t in content),
    "greedy tokens are the most likely of their alternatives",
)

# A stop string ends the answer before it.
full = client.completions.create(
    model=model, prompt="1, 2, 3,", max_tokens=12, temperature=0
).choices[0].text
if len(full) > 2:
    stop = full[1:3]
    cut = client.completions.create(
        model=model, prompt="1, 2, 3,", max_tokens=12, temperature=0, stop=[stop]
    ).choices[0]
    check(cut.text == full[: full.index(stop)], f"stop {stop!r} cuts the text")
    check(cut.finish_reason == "stop", "a stop string finishes with 'stop'")

# Structured output through response_format.
import json

schema = {"type": "object",
          "properties": {"color": {"enum": ["red", "green", "blue"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["color", "count"], "additionalProperties": False}
r = client.chat.completions.create(
    model=model, messages=messages, max_tokens=48, temperature=1.0, n=2,
    response_format={"type": "json_schema",
                     "json_schema": {"name": "pick", "schema": schema, "strict": True}},
)
for c in r.choices:
    v = json.loads(c.message.content)
    check(set(v) == {"color", "count"} and v["color"] in ("red", "green", "blue")
          and 0 <= v["count"] <= 9, f"response_format json_schema: {v}")
try:
    client.chat.completions.create(
        model=model, messages=messages, max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
    )
    check(False, "a bad schema is refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "response_format" in str(e), f"400 naming response_format: {e}")

# Errors are OpenAI errors the client raises as such.
try:
    client.chat.completions.create(model=model, messages=[], max_tokens=4)
    check(False, "empty messages are refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "messages" in str(e), f"400 naming messages: {e}")
try:
    client.completions.create(model=model, prompt="x", max_tokens=4, n=99)
    check(False, "n = 99 is refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "n" in str(e), f"400 naming n: {e}")
# Tools: a required call, whole and streamed, then its result sent back.
if len(sys.argv) > 3:
    tools_client = openai.OpenAI(base_url=sys.argv[3], api_key="unused", max_retries=0,
                                 timeout=60)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"]}}}]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    r = tools_client.chat.completions.create(
        model=model, messages=ask, tools=tools, tool_choice="required",
        parallel_tool_calls=False, temperature=1.0, seed=3, max_tokens=64)
    msg = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls", "finish_reason tool_calls")
    check(msg.tool_calls and len(msg.tool_calls) == 1, f"one tool call: {msg}")
    call = msg.tool_calls[0]
    args = json.loads(call.function.arguments)
    check(call.function.name == "get_weather" and args["city"] in ("Paris", "Tokyo")
          and 1 <= args["days"] <= 7, f"the call's arguments follow the schema: {args}")
    stream = tools_client.chat.completions.create(
        model=model, messages=ask, tools=tools, tool_choice="required",
        parallel_tool_calls=False, temperature=1.0, seed=3, max_tokens=64, stream=True)
    streamed, finish = {}, None
    for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = streamed.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    check(finish == "tool_calls" and streamed == {0: {"name": call.function.name,
                                                      "arguments": call.function.arguments}},
          f"streamed tool-call deltas add up to the same call: {streamed}")
    follow = tools_client.chat.completions.create(
        model=model, tools=tools, max_tokens=4, temperature=0,
        messages=ask + [msg.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}])
    check(follow.choices[0].message.role == "assistant", "a tool result is taken back")
print("all checks passed")
