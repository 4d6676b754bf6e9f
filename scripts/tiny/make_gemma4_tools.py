"""The tiny Gemma 4 model with Gemma 4's chat and tool tokens added.

tests/fixtures/tiny/gemma4-dense/model-f32.gguf with the turn, thinking,
tool, tool-call, tool-response, quote and channel tokens appended to its
vocabulary (their types as in real Gemma 4 files), random embedding rows for
them, and the Gemma 4 31B chat template, so tool declarations render and the
model can write calls in Gemma 4's syntax. Its weights are random: it tests
syntax, not answers.

    python3 scripts/tiny/make_gemma4_tools.py
"""

from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "tests/fixtures/tiny/gemma4-dense/model-f32.gguf"
DST = ROOT / "tests/fixtures/tiny/gemma4-tools/model-f32.gguf"
TEMPLATE = ROOT / "tests/fixtures/tokenizer/templates/gemma4-31b-it.jinja"

CONTROL, USER_DEFINED = 3, 4
ADDED = [
    ("<|turn>", CONTROL),
    ("<turn|>", CONTROL),
    ("<|think|>", CONTROL),
    ("<|tool>", CONTROL),
    ("<tool|>", CONTROL),
    ("<|tool_call>", USER_DEFINED),
    ("<tool_call|>", USER_DEFINED),
    ("<|tool_response>", USER_DEFINED),
    ("<tool_response|>", USER_DEFINED),
    ('<|"|>', USER_DEFINED),
    ("<|channel>", USER_DEFINED),
    ("<channel|>", USER_DEFINED),
]


def main():
    r = gguf.GGUFReader(SRC)
    arch = "gemma4"
    w = gguf.GGUFWriter(DST, arch)
    skip = {"general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for name, field in r.fields.items():
        if name in skip or name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        if name == "tokenizer.ggml.tokens":
            toks = [bytes(field.parts[i]).decode() for i in field.data]
            w.add_array(name, toks + [t for t, _ in ADDED])
        elif name == "tokenizer.ggml.token_type":
            types = [int(field.parts[i][0]) for i in field.data]
            w.add_array(name, types + [k for _, k in ADDED])
        elif name == "tokenizer.ggml.scores":
            scores = [float(field.parts[i][0]) for i in field.data]
            w.add_array(name, scores + [-1000.0] * len(ADDED))
        elif name == "tokenizer.chat_template":
            w.add_string(name, TEMPLATE.read_text())
        elif vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(field.parts[i]).decode() for i in field.data])
            else:
                w.add_array(name, [field.parts[i].tolist()[0] for i in field.data])
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode())
        else:
            w.add_key_value(name, field.parts[field.data[0]].tolist()[0], vtype)
    rng = np.random.default_rng(4)
    for t in r.tensors:
        data = np.array(t.data)
        if t.name == "token_embd.weight":
            extra = rng.normal(0, 0.5, size=(len(ADDED), data.shape[1])).astype(np.float32)
            data = np.concatenate([data, extra])
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(DST)


if __name__ == "__main__":
    main()
