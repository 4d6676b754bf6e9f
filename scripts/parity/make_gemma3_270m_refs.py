#!/usr/bin/env python3
"""References for the real Gemma 3 270M Q4_K_M file.

Two references on the same GGUF:
  * transformers loading the GGUF (it dequantizes the weights and runs float32
    eager attention): the exact math of this quantized model;
  * llama.cpp (its ggml-base/llama libraries through llama-cpp-python's ctypes
    bindings), which quantizes activations to 8 bits in its dot products.

Full logits are [positions, 262144], too large to commit, so per position we
keep the top 16 (ids and logits) and the logits at a fixed sample of 1,024
vocabulary ids. llama.cpp's own agreement with transformers is computed here on
the full vectors and recorded, so tests can require rlx to be at least as close.

Run (needs torch, transformers, accelerate, gguf and a llama.cpp build):
  PYTHONPATH=~/.cache/llama.cpp-ref/llama_cpp_python-0.3.36 \
  LLAMA_CPP_LIB_PATH=~/.cache/llama.cpp-ref/src/build/bin \
  python3 scripts/parity/make_gemma3_270m_refs.py MODEL.gguf tests/fixtures/gemma3-270m
"""
import json
import os
import sys

import numpy as np

MODEL, OUT = sys.argv[1], sys.argv[2]
TOP = 16
SAMPLE = 1024
GREEDY = 32
MARGIN = 0.05

TEXTS = {
    "capital": "The capital of France is",
    "prose": (
        "In the early morning the harbour was quiet. Fishing boats rocked against the pier, "
        "and a thin mist hung over the water while the town slowly woke up. Somewhere a radio "
        "played an old song, and the baker opened his shutters to the smell of fresh bread."
    ),
    "code": (
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
        "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
        "if __name__ == \"__main__\":\n    print([fibonacci(i) for i in range(10)])\n"
    ),
}
# Longer than the 512-token sliding window, so the window is exercised.
TEXTS["long"] = " ".join(
    f"Chapter {i}: the travellers reached village number {i * 7 % 31}, where they rested, "
    f"traded {i + 2} bags of salt for bread, and wrote in their journal about the weather."
    for i in range(1, 24)
)


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    import llama_cpp
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    llm = llama_cpp.Llama(model_path=MODEL, logits_all=True, verbose=False, n_ctx=2048, n_threads=2)
    d, f = os.path.split(os.path.abspath(MODEL))
    hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32,
                                              attn_implementation="eager").eval()

    rng = np.random.default_rng(0)
    vocab = llm.n_vocab()
    sample = np.sort(rng.choice(vocab, SAMPLE, replace=False)).astype(np.int64)
    os.makedirs(OUT, exist_ok=True)
    np.save(os.path.join(OUT, "sample_ids.npy"), sample.astype(np.int32))
    manifest = {"model_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                "top": TOP, "sample": SAMPLE, "margin": MARGIN, "prompts": {}}

    for name, text in TEXTS.items():
        toks = llm.tokenize(text.encode(), add_bos=True)
        with torch.no_grad():
            ref = hf(torch.tensor([toks])).logits[0].float().numpy()
        llm.reset()
        llm.eval(toks)
        lc = np.array(llm.scores[: len(toks)], dtype=np.float32)
        top_ids = np.argsort(-ref, axis=1, kind="stable")[:, :TOP]
        np.save(os.path.join(OUT, f"{name}.hf_top_ids.npy"), top_ids.astype(np.int32))
        np.save(os.path.join(OUT, f"{name}.hf_top_logits.npy"), np.ascontiguousarray(np.take_along_axis(ref, top_ids, 1)))
        np.save(os.path.join(OUT, f"{name}.hf_sample.npy"), np.ascontiguousarray(ref[:, sample]))
        entry = {
            "tokens": [int(t) for t in toks],
            "llama_vs_hf": {
                "rel_l2_full": rel_l2(lc, ref),
                "rel_l2_sample": rel_l2(lc[:, sample], ref[:, sample]),
                "top1_agreement": float((lc.argmax(1) == ref.argmax(1)).mean()),
            },
        }
        if name in ("capital", "prose", "code"):
            # Greedy continuations and the reference's top-2 margin at each step.
            with torch.no_grad():
                ids = torch.tensor([toks])
                hf_next, margins = [], []
                for _ in range(GREEDY):
                    logits = hf(ids).logits[0, -1]
                    top2 = torch.topk(logits, 2).values
                    margins.append(float(top2[0] - top2[1]))
                    nxt = int(logits.argmax())
                    hf_next.append(nxt)
                    ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
            llm.reset()
            llm.eval(toks)
            lc_next = []
            for _ in range(GREEDY):
                nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                lc_next.append(nxt)
                llm.eval([nxt])
            clear = next((i for i, m in enumerate(margins) if m < MARGIN), GREEDY)
            agree = next((i for i, (a, b) in enumerate(zip(lc_next, hf_next)) if a != b), GREEDY)
            entry["hf_greedy"] = hf_next
            entry["hf_margins"] = margins
            entry["llama_greedy"] = lc_next
            entry["llama_vs_hf"]["greedy_agree"] = agree
            entry["llama_vs_hf"]["greedy_clear_steps"] = clear
        manifest["prompts"][name] = entry
        print(name, len(toks), entry["llama_vs_hf"])
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)


if __name__ == "__main__":
    main()
