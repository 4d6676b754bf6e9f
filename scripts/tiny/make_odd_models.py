#!/usr/bin/env python3
"""Tiny models whose sizes are not multiples of 32, as Hugging Face checkpoints.

The other tiny models have widths of 32 and up in powers of two, which hides
every kernel that assumes whole 32-element units or 16-byte rows. These have
odd widths everywhere a weight row can be: hidden 40, FFN 72, per-layer input
12 (a per-layer table row of 3 x 12 = 36), head sizes 20 and 40. Written with
save_pretrained (rlx reads checkpoints in place, so no converter is needed),
with the tiny tokenizer of gemma4-ple and transformers' f32 logits of the
shared prompts:

    tests/fixtures/tiny/<name>/hf/            config, model.safetensors, tokenizer files
    tests/fixtures/tiny/<name>/hf-f32/promptN.npy
    tests/fixtures/tiny/<name>/prompts.json

    python3 scripts/tiny/make_odd_models.py

Needs torch, transformers (with Gemma 4), safetensors and numpy. Seeded; the
weights come from make_tiny_models.init_weights.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_tiny_models as M  # noqa: E402
import specs as S  # noqa: E402

FIXTURES = M.REPO / "tests/fixtures/tiny"
TOKENIZER_FROM = FIXTURES / "gemma4-ple/hf"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json"]

ODD = [
    dict(
        name="gemma4-odd",
        about="Gemma 4 with per-layer embeddings and odd sizes: hidden 40, FFN 72, "
              "per-layer input 12, head sizes 20 (sliding) and 40 (global), KV sharing "
              "on layer 2 (<- 0).",
        arch="gemma4",
        seed=601,
        hf=dict(S._common, hidden_size=40, intermediate_size=72, num_hidden_layers=3,
                num_attention_heads=2, num_key_value_heads=1, head_dim=20, global_head_dim=40,
                sliding_window=S.WINDOW,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "proportional",
                                                    "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1000000.0}},
                final_logit_softcapping=30.0,
                vocab_size_per_layer_input=S.VOCAB, hidden_size_per_layer_input=12,
                num_kv_shared_layers=1, use_double_wide_mlp=False,
                attention_k_eq_v=False, enable_moe_block=False,
                hidden_activation="gelu_pytorch_tanh"),
        init=dict(final_gain=8.0, qk_norm_gain=0.6),
    ),
    dict(
        name="gemma3-odd",
        about="Gemma 3 with odd sizes: hidden 40, FFN 72, head size 20, GQA 4/2, layers "
              "S,S,G.",
        arch="gemma3",
        seed=602,
        hf=dict(S._common, hidden_size=40, intermediate_size=72, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=20,
                query_pre_attn_scalar=20, sliding_window=S.WINDOW,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
                hidden_activation="gelu_pytorch_tanh"),
        init=dict(),
    ),
]


def main() -> int:
    prompts = json.loads((FIXTURES / "prompts.json").read_text())
    for spec in ODD:
        out = FIXTURES / spec["name"]
        hf = out / "hf"
        if out.exists():
            shutil.rmtree(out)
        hf.mkdir(parents=True)
        cfg = M.make_config(spec)
        model = M.new_model(cfg, spec["arch"])
        M.init_weights(model, spec["arch"], spec["seed"], spec["init"])
        model.save_pretrained(hf)
        for f in TOKENIZER_FILES:
            shutil.copy(TOKENIZER_FROM / f, hf / f)
        (out / "prompts.json").write_text((FIXTURES / "prompts.json").read_text())
        logits = M.hf_logits(model, prompts)
        (out / "hf-f32").mkdir()
        for k, v in logits.items():
            np.save(out / "hf-f32" / f"{k}.npy", v.astype(np.float32))
        (out / "about.txt").write_text(spec["about"] + "\n")
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"{spec['name']}: {size / 1e6:.2f} MB, logits std "
              f"{float(np.std(np.concatenate([v.ravel() for v in logits.values()]))):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
