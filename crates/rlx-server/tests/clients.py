"""The official `ollama` and `anthropic` Python clients and the `openai`
package's Responses API against a running `rlx serve`, each answer compared
with the same request through the OpenAI chat (or completions) endpoint.

Usage: python3 clients.py BASE_URL

Run by `crates/rlx-server/tests/api.rs` on the tiny Gemma 3 model (greedy);
exits non-zero with a message on the first check that fails.
"""

import json
import sys

import anthropic
import ollama
import openai

base = sys.argv[1]
oai = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
oll = ollama.Client(host=base)
ant = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=60)
N = 12
GREEDY = {"temperature": 0}
TOOLS = [{"name": "add", "description": "Adds one to a number",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}},
                         "required": ["a"]}}]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def check(what, got, want):
    if got != want:
        sys.exit(f"{what}: got {got!r}, want {want!r}")
    print(f"ok: {what}")


def chat(messages, n=N, **kw):
    r = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=n,
                                    temperature=0, **kw)
    return r.choices[0].message


turns = [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Name a colour."}]
want = chat(turns).content

# Ollama: chat whole and streamed, generate, format, tools, list and show.
r = oll.chat(model="tiny", messages=turns, options={"temperature": 0, "num_predict": N})
check("ollama chat", r.message.content, want)
parts = [p.message.content for p in oll.chat(model="tiny", messages=turns, stream=True,
                                             options={"temperature": 0, "num_predict": N})]
check("ollama chat streamed", "".join(parts), want)
r = oll.generate(model="tiny", prompt="one two three", raw=True,
                 options={"temperature": 0, "num_predict": N})
c = oai.completions.create(model="tiny", prompt="one two three", max_tokens=N, temperature=0)
check("ollama generate (raw)", r.response, c.choices[0].text)
r = oll.chat(model="tiny", messages=[{"role": "user", "content": "A number"}], format=SCHEMA,
             options={"temperature": 0, "num_predict": 24})
w = chat([{"role": "user", "content": "A number"}], n=24, response_format={
    "type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}})
check("ollama format", json.loads(r.message.content), json.loads(w.content))
ask = [{"role": "user", "content": "Add one to 4."}]
r = oll.chat(model="tiny", messages=ask, tools=[{"type": "function", "function": TOOLS[0]}],
             options={"temperature": 0, "num_predict": 64})
w = chat(ask, n=64, tools=[{"type": "function", "function": TOOLS[0]}])
got = [(t.function.name, dict(t.function.arguments)) for t in (r.message.tool_calls or [])]
exp = [(t.function.name, json.loads(t.function.arguments)) for t in (w.tool_calls or [])]
check("ollama tools", got, exp)
if not exp:
    check("ollama tools (content)", r.message.content, w.content)
check("ollama list", [m.model for m in oll.list().models], ["tiny"])
check("ollama show", "completion" in oll.show("tiny").capabilities, True)

# Anthropic: messages whole and streamed with a system prompt, a tool round trip.
m = ant.messages.create(model="tiny", max_tokens=N, system="You are terse.",
                        messages=[{"role": "user", "content": "Name a colour."}],
                        extra_body=GREEDY)
check("anthropic message", m.content[0].text, want)
with ant.messages.stream(model="tiny", max_tokens=N, system="You are terse.",
                         messages=[{"role": "user", "content": "Name a colour."}],
                         extra_body=GREEDY) as s:
    text = "".join(s.text_stream)
check("anthropic streamed", text, want)
tool = {"name": "add", "description": TOOLS[0]["description"],
        "input_schema": TOOLS[0]["parameters"]}
m = ant.messages.create(model="tiny", max_tokens=128, tools=[tool], tool_choice={"type": "any"},
                        messages=ask, extra_body=GREEDY)
use = [b for b in m.content if b.type == "tool_use"]
w = chat(ask, n=128, tools=[{"type": "function", "function": TOOLS[0]}], tool_choice="required")
check("anthropic tool_use", [(u.name, u.input) for u in use],
      [(t.function.name, json.loads(t.function.arguments)) for t in w.tool_calls])
history = ask + [{"role": "assistant", "content": [{"type": "tool_use", "id": use[0].id,
                                                     "name": use[0].name, "input": use[0].input}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                               "content": "5"}]}]
m = ant.messages.create(model="tiny", max_tokens=N, tools=[tool], messages=history,
                        extra_body=GREEDY)
w = chat(ask + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": use[0].id, "type": "function",
     "function": {"name": use[0].name, "arguments": json.dumps(use[0].input)}}]},
    {"role": "tool", "tool_call_id": use[0].id, "content": "5"}],
    tools=[{"type": "function", "function": TOOLS[0]}])
check("anthropic tool_result", "".join(b.text for b in m.content if b.type == "text"),
      w.content or "")

# OpenAI's Responses API: whole, streamed, previous_response_id, a function call.
r = oai.responses.create(model="tiny", instructions="You are terse.", input="Name a colour.",
                         max_output_tokens=N, temperature=0)
check("responses", r.output_text, want)
s = oai.responses.create(model="tiny", instructions="You are terse.", input="Name a colour.",
                         max_output_tokens=N, temperature=0, stream=True)
check("responses streamed",
      "".join(e.delta for e in s if e.type == "response.output_text.delta"), want)
r2 = oai.responses.create(model="tiny", instructions="You are terse.", input="Another.",
                          previous_response_id=r.id, max_output_tokens=N, temperature=0)
w = chat(turns + [{"role": "assistant", "content": want},
                  {"role": "user", "content": "Another."}])
check("responses previous_response_id", r2.output_text, w.content)
r = oai.responses.create(model="tiny", input="Add one to 4.", tool_choice="required",
                         tools=[{"type": "function", **TOOLS[0]}], max_output_tokens=128,
                         temperature=0)
w = chat(ask, n=128, tools=[{"type": "function", "function": TOOLS[0]}], tool_choice="required")
check("responses function_call",
      [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"],
      [(t.function.name, json.loads(t.function.arguments)) for t in w.tool_calls])
print("all checks passed")
