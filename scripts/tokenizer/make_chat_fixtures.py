#!/usr/bin/env python3
"""Renders chat conversations with Python jinja2, set up as transformers' apply_chat_template
sets it up, into tests/fixtures/tokenizer/chat.jsonl. The Rust tests render the same templates
with minijinja (and the built-in formats) and must produce the same text.

Templates (tests/fixtures/tokenizer/templates/):
  gemma-builtin.jinja  the built-in Gemma format written as a template (rlx_tokenizer::GEMMA_TEMPLATE)
  gemma3-it.jinja      written after Google's Gemma 3 instruction template
  gemma2-2b-it.jinja   google/gemma-2-2b-it, from llama.cpp's models/templates
  gemma4-31b-it.jinja  google/gemma-4-31B-it, from llama.cpp's models/templates

Each line: {"name", "template", "bos_token", "eos_token", "messages_json", "tools_json",
"add_generation_prompt", "enable_thinking" (only when set), "builtin" (the built-in format that
must give the same text, or null), and "expected" or "error" (the exception message).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "tokenizer"


def hf_env() -> jinja2.Environment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


BASIC = [{"role": "user", "content": "Hello!"}]
MULTI = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Germany?"},
]
PADDED = [
    {"role": "system", "content": "  Be terse.\n"},
    {"role": "user", "content": "\n  Spaces around me   \n\n"},
    {"role": "assistant", "content": "\tOK\t"},
    {"role": "user", "content": " Next "},
]
UNICODE = [
    {"role": "user", "content": "Traduis: « où est la gare ? » 🚉 — 駅はどこですか"},
    {"role": "assistant", "content": "Où est la gare ? = Where is the station?\n\n```\ncode block\n```"},
    {"role": "user", "content": "Literal <start_of_turn> and <bos> text in content."},
]
NO_SYSTEM_MULTI = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
    {"role": "assistant", "content": "Why did the scarecrow win an award? Because he was outstanding in his field."},
]
TWO_SYSTEMS = [
    {"role": "system", "content": "First rule."},
    {"role": "system", "content": "Second rule."},
    {"role": "user", "content": "Go."},
]
NOT_ALTERNATING = [
    {"role": "user", "content": "one"},
    {"role": "user", "content": "two"},
]
WEATHER_TOOL = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}]
TOOL_CONV = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}"},
    {"role": "assistant", "content": "It is 18 °C and cloudy in Paris."},
    {"role": "user", "content": "Thanks!"},
]
THINKING_HISTORY = [
    {"role": "user", "content": "What is 17 * 3?"},
    {"role": "assistant", "content": "<|channel>thought\n17*3 = 51<channel|>The answer is 51."},
    {"role": "user", "content": "And 17 * 4?"},
]
CONTENT_PARTS = [
    {"role": "user", "content": [
        {"type": "image"},
        {"type": "text", "text": "  Describe this picture.  "},
    ]},
]
CONSECUTIVE_ASSISTANT = [
    {"role": "user", "content": "Count to two."},
    {"role": "assistant", "content": "One."},
    {"role": "assistant", "content": "Two."},
    {"role": "user", "content": "Good."},
]


def cases():
    g = dict(bos_token="<bos>", eos_token="<eos>")
    for tmpl, builtin in [("gemma-builtin.jinja", "gemma"), ("gemma3-it.jinja", None)]:
        for name, msgs in [("basic", BASIC), ("multi", MULTI), ("padded", PADDED), ("unicode", UNICODE),
                           ("no_system_multi", NO_SYSTEM_MULTI)]:
            for gen in (True, False):
                yield dict(name=f"{tmpl.split('.')[0]}-{name}-{'gen' if gen else 'nogen'}", template=tmpl,
                           messages=msgs, add_generation_prompt=gen, builtin=builtin, **g)
    yield dict(name="gemma-builtin-two_systems", template="gemma-builtin.jinja", messages=TWO_SYSTEMS,
               add_generation_prompt=True, builtin="gemma", **g)
    yield dict(name="gemma3-it-not_alternating", template="gemma3-it.jinja", messages=NOT_ALTERNATING,
               add_generation_prompt=True, builtin=None, **g)
    yield dict(name="gemma3-it-content_parts", template="gemma3-it.jinja", messages=CONTENT_PARTS,
               add_generation_prompt=True, builtin=None, **g)
    yield dict(name="gemma2-multi", template="gemma2-2b-it.jinja", messages=NO_SYSTEM_MULTI,
               add_generation_prompt=True, builtin="gemma", **g)
    yield dict(name="gemma2-system_rejected", template="gemma2-2b-it.jinja", messages=MULTI,
               add_generation_prompt=True, builtin=None, **g)

    t4 = "gemma4-31b-it.jinja"
    for name, msgs in [("basic", BASIC), ("multi", MULTI), ("padded", PADDED), ("unicode", UNICODE),
                       ("no_system_multi", NO_SYSTEM_MULTI), ("thinking_history", THINKING_HISTORY),
                       ("consecutive_assistant", CONSECUTIVE_ASSISTANT)]:
        for gen in (True, False):
            yield dict(name=f"gemma4-{name}-{'gen' if gen else 'nogen'}", template=t4, messages=msgs,
                       add_generation_prompt=gen, builtin="gemma4", **g)
        yield dict(name=f"gemma4-{name}-thinking", template=t4, messages=msgs, add_generation_prompt=True,
                   enable_thinking=True, builtin="gemma4", **g)
    yield dict(name="gemma4-tools", template=t4, messages=TOOL_CONV, tools=WEATHER_TOOL,
               add_generation_prompt=True, builtin=None, **g)
    yield dict(name="gemma4-tool_call_pending", template=t4, messages=TOOL_CONV[:4], tools=WEATHER_TOOL,
               add_generation_prompt=True, builtin=None, **g)
    yield dict(name="gemma4-content_parts", template=t4, messages=CONTENT_PARTS,
               add_generation_prompt=True, builtin=None, **g)


def main() -> None:
    env = hf_env()
    out = FIX / "chat.jsonl"
    n = 0
    with out.open("w", encoding="utf-8") as f:
        for c in cases():
            source = (FIX / "templates" / c["template"]).read_text(encoding="utf-8")
            tmpl = env.from_string(source)
            kwargs = dict(messages=c["messages"], tools=c.get("tools"), documents=None,
                          add_generation_prompt=c["add_generation_prompt"],
                          bos_token=c["bos_token"], eos_token=c["eos_token"])
            if "enable_thinking" in c:
                kwargs["enable_thinking"] = c["enable_thinking"]
            rec = {
                "name": c["name"], "template": c["template"],
                "bos_token": c["bos_token"], "eos_token": c["eos_token"],
                "messages_json": json.dumps(c["messages"], ensure_ascii=False),
                "tools_json": json.dumps(c["tools"], ensure_ascii=False) if c.get("tools") else None,
                "add_generation_prompt": c["add_generation_prompt"],
                "builtin": c["builtin"],
            }
            if "enable_thinking" in c:
                rec["enable_thinking"] = c["enable_thinking"]
            try:
                rec["expected"] = tmpl.render(**kwargs)
            except jinja2.exceptions.TemplateError as e:
                rec["error"] = str(e)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    print(f"wrote {n} chat cases to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
