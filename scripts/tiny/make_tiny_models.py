#!/usr/bin/env python3
"""Build tiny random-weight Gemma models (gemma, gemma2, gemma3, gemma3n, gemma4) and their
reference logits, into tests/fixtures/tiny/.

Usage:
    python3 scripts/tiny/make_tiny_models.py [--only NAME,...] [--out DIR] [--work DIR]

Needs torch, transformers (with gemma..gemma4), sentencepiece, tokenizers, numpy, and the
llama.cpp reference checkout in ~/.cache/llama.cpp-ref (override with $LLAMA_CPP_REF):
src/convert_hf_to_gguf.py, src/build/bin/llama-quantize and libllama, src/gguf-py, and the
llama-cpp-python sources in llama_cpp_python-0.3.36 (used without building, through
LLAMA_CPP_LIB_PATH).

For every model in specs.py, written to <out>/<name>/:
  model-f32.gguf (+ f16/bf16)         convert_hf_to_gguf.py --outtype ...
  model-<Q>.gguf                      llama-quantize --pure model-f32.gguf ... <Q>
  prompts.json                        the token ids (BOS = 2 first)
  hf-f32/<prompt>.npy                 transformers float32 logits, eager attention  [n_tok, vocab]
  hf-dequant-<Q>/<prompt>.npy         transformers with the exact dequantized weights of model-<Q>
  llama-<T>/<prompt>.npy              llama.cpp logits of model-<T>.gguf (f32 KV cache, no flash attn)
  manifest.json                       config, files (sha256, bytes, tensor types), errors
Everything is seeded; re-running gives byte-identical outputs on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LLAMA_REF = Path(os.environ.get("LLAMA_CPP_REF", Path.home() / ".cache/llama.cpp-ref"))
LLAMA_SRC = LLAMA_REF / "src"
LLAMA_BIN = LLAMA_SRC / "build/bin"
LLAMA_PY = LLAMA_REF / "llama_cpp_python-0.3.36"

sys.path.insert(0, str(HERE))
sys.path.insert(0, str(LLAMA_SRC / "gguf-py"))  # the converter's own gguf-py
os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(LLAMA_BIN))

import gguf  # noqa: E402
import gguf.quants  # noqa: E402

import readme  # noqa: E402
import specs as S  # noqa: E402
import tiny_tokenizer as T  # noqa: E402

torch = None  # imported lazily (after the env vars above)


def _torch():
    global torch
    if torch is None:
        import torch as _t
        _t.set_num_threads(1)
        _t.use_deterministic_algorithms(True)
        torch = _t
    return torch


# --------------------------------------------------------------------------------------------
# HF side

def hf_classes(arch: str):
    import transformers as tr
    return {
        "gemma": (tr.GemmaConfig, tr.GemmaForCausalLM),
        "gemma2": (tr.Gemma2Config, tr.Gemma2ForCausalLM),
        "gemma3": (tr.Gemma3TextConfig, tr.Gemma3ForCausalLM),
        "gemma3n": (tr.Gemma3nTextConfig, tr.Gemma3nForCausalLM),
        "gemma4": (tr.Gemma4TextConfig, tr.Gemma4ForCausalLM),
    }[arch]


NORM_SHIFT_ARCHS = ("gemma", "gemma2", "gemma3")  # HF computes x*(1+w); GGUF stores 1+w


def make_config(spec):
    cfg_cls, _ = hf_classes(spec["arch"])
    cfg = cfg_cls(**copy.deepcopy(spec["hf"]))
    cfg._attn_implementation = "eager"
    try:
        cfg.dtype = "float32"
    except Exception:
        pass
    return cfg


def new_model(cfg, arch):
    t = _torch()
    _, model_cls = hf_classes(arch)
    t.manual_seed(0)
    m = model_cls(cfg)
    _eager(m)
    return m.float().eval()


def _eager(m):
    """Plain eager attention and (gemma4 MoE) eager per-expert loops rather than grouped_mm."""
    for mod in m.modules():
        c = getattr(mod, "config", None)
        if c is not None:
            c._attn_implementation = "eager"
            c._experts_implementation = "eager"
    return m


INIT_DEFAULTS = dict(
    emb_gain=1.0,      # token embedding std = emb_gain / sqrt(hidden): the residual starts at rms ~1
    branch_gain=3.0,   # post-attention / post-FFN norm multipliers (gemma 1: o_proj, down_proj) x this,
                       # so that the layers, not the tied input embedding, dominate the logits
    final_gain=3.0,    # final norm multipliers x this: logits std ~3
    q_gain=1.0,        # q_proj x this (attention-score scale, to exercise the attention softcap)
    qk_norm_gain=1.0,  # q_norm / k_norm multipliers x this (gemma3/3n/4 attention-score scale)
)


def init_weights(model, arch: str, seed: int, knobs: dict | None = None) -> None:
    """Overwrite every parameter (and gemma4's layer_scalar buffers) with seeded random values.

    2-D and larger weights: N(0, 1/fan_in); token embedding: N(0, emb_gain^2/hidden); per-layer
    embedding tables: N(0, 1/P); every norm weight is a random multiplier m = U(0.5, 1.5) (times
    a gain for post-norms, the final norm and q/k norms), stored as w = m - 1 for gemma/gemma2/
    gemma3, whose HF norm computes x*(1+w); other 1-D tensors (scales, scalars): U(0.5, 1.5).
    """
    t = _torch()
    k = dict(INIT_DEFAULTS, **(knobs or {}))
    g = t.Generator().manual_seed(seed)
    shift = arch in NORM_SHIFT_ARCHS
    d = model.config.hidden_size
    post_norms = ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm")
    if arch == "gemma":
        post_norms = ()  # gemma 1's post_attention_layernorm is the pre-FFN norm
    tensors = list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar")]
    with t.no_grad():
        for name, p in tensors:
            shape = tuple(p.shape)
            if p.ndim <= 1:
                v = t.rand(shape, generator=g, dtype=t.float32) + 0.5
                if "norm" in name:
                    if name.startswith("model.norm."):
                        v = v * k["final_gain"]
                    elif any(f".{pn}." in name for pn in post_norms):
                        v = v * k["branch_gain"]
                    elif ".q_norm." in name or ".k_norm." in name:
                        v = v * k["qk_norm_gain"]
                    if shift:
                        v = v - 1.0
            elif "embed_tokens_per_layer" in name:
                v = t.randn(shape, generator=g) / math.sqrt(model.config.hidden_size_per_layer_input)
            elif "embed_tokens" in name:
                v = t.randn(shape, generator=g) * (k["emb_gain"] / math.sqrt(d))
            else:
                v = t.randn(shape, generator=g) / math.sqrt(shape[-1])
                if arch == "gemma" and (".o_proj." in name or ".down_proj." in name):
                    v = v * k["branch_gain"]
                if ".q_proj." in name:
                    v = v * k["q_gain"]
            p.copy_(v.to(p.dtype))


def add_unused_shared_kv(hf_dir: Path, model, seed: int) -> None:
    """transformers' Gemma3n builds no k_proj/v_proj/k_norm on KV-shared layers, but the real
    checkpoints carry them (unused) and llama.cpp's gemma3n loader requires them: add random ones
    to the safetensors file (HF ignores them on load)."""
    from safetensors.torch import load_file, save_file
    t = _torch()
    c = model.config
    g = t.Generator().manual_seed(seed)
    f = hf_dir / "model.safetensors"
    sd = load_file(f)
    kv = c.num_key_value_heads * c.head_dim
    for i in range(c.num_hidden_layers - c.num_kv_shared_layers, c.num_hidden_layers):
        p = f"model.layers.{i}.self_attn."
        assert p + "k_proj.weight" not in sd
        sd[p + "k_proj.weight"] = t.randn((kv, c.hidden_size), generator=g) / math.sqrt(c.hidden_size)
        sd[p + "v_proj.weight"] = t.randn((kv, c.hidden_size), generator=g) / math.sqrt(c.hidden_size)
        sd[p + "k_norm.weight"] = t.rand((c.head_dim,), generator=g) + 0.5
    save_file(dict(sorted(sd.items())), f, metadata={"format": "pt"})


def hf_logits(model, prompts: dict[str, list[int]]) -> dict[str, np.ndarray]:
    t = _torch()
    out = {}
    with t.no_grad():
        for k, ids in prompts.items():
            r = model(input_ids=t.tensor([ids], dtype=t.long), use_cache=False)
            out[k] = r.logits[0].to(t.float32).numpy().copy()
    return out


def variant_model(model, arch, cfg_overrides=None, sd_edit=None):
    """The same weights under a modified config or with some weights edited (for sensitivity)."""
    cfg_cls, _ = hf_classes(arch)
    d = model.config.to_dict()
    for k, v in (cfg_overrides or {}).items():
        d[k] = v
    cfg = cfg_cls.from_dict(d)
    cfg._attn_implementation = "eager"
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    if sd_edit:
        sd_edit(sd)
    return load_state(model, cfg, arch, sd)


def sensitivity(model, arch, prompts, ref) -> dict:
    """How much the logits move (rel L2 over all prompts) when a feature is switched off: a
    fixture check that every tested feature actually shows in the logits."""
    t = _torch()
    cat = lambda x: np.concatenate([x[k] for k in prompts])  # noqa: E731
    R = cat(ref)
    ids = np.concatenate([prompts[k] for k in prompts])
    out = {"self_token_top1": float(np.mean(np.argmax(R, -1) == ids)),
           "logit_std": float(R.std()),
           "top1_top2_margin_median": float(np.median(np.diff(np.sort(R, -1)[:, -2:], axis=-1)))}
    L = model.config.num_hidden_layers
    c = model.config

    def zero(sub):
        def f(sd):
            for k in sd:
                if sub in k:
                    sd[k].zero_()
        return f

    cases = {
        "zero_layer0_o_proj": (None, zero("layers.0.self_attn.o_proj.")),
        f"zero_layer{L-1}_mlp_down": (None, zero(f"layers.{L-1}.mlp.down_proj.")),
    }
    if getattr(c, "sliding_window", None):
        cases["no_sliding_window"] = ({"sliding_window": 100000}, None)
    if getattr(c, "attn_logit_softcapping", None):
        cases["no_attn_softcap"] = ({"attn_logit_softcapping": None}, None)
    if getattr(c, "final_logit_softcapping", None):
        cases["no_final_softcap"] = ({"final_logit_softcapping": 1e6}, None)
    rp = getattr(c, "rope_parameters", None) or {}
    if isinstance(rp, dict) and rp.get("full_attention", {}).get("rope_type") == "linear":
        rp2 = copy.deepcopy(rp)
        rp2["full_attention"] = {"rope_type": "default", "rope_theta": rp["full_attention"]["rope_theta"]}
        cases["no_rope_linear_scaling"] = ({"rope_parameters": rp2}, None)
    if arch in ("gemma3", "gemma3n", "gemma4") and isinstance(rp, dict) and "full_attention" in rp:
        rp3 = copy.deepcopy(rp)
        rp3["full_attention"]["rope_theta"] = rp["sliding_attention"]["rope_theta"]
        if any(lt == "full_attention" for lt in c.layer_types):
            cases["global_theta_as_local"] = ({"rope_parameters": rp3}, None)
    if arch == "gemma3n":
        cases["no_activation_sparsity"] = ({"activation_sparsity_pattern": [0.0] * L}, None)
        cases["zero_laurel"] = (None, zero("laurel.linear_right"))
        cases["zero_per_layer_inputs"] = (None, zero("per_layer_projection.weight"))
    if arch == "gemma4" and getattr(c, "hidden_size_per_layer_input", 0):
        cases["zero_per_layer_inputs"] = (None, zero("per_layer_projection.weight"))
    if arch == "gemma4" and getattr(c, "enable_moe_block", False):
        cases["zero_experts"] = (None, zero("experts.down_proj"))
    for name, (ov, ed) in cases.items():
        try:
            v = hf_logits(variant_model(model, arch, ov, ed), prompts)
            out[name] = rel_l2(cat(v), R)
        except Exception as e:  # noqa: BLE001
            out[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
    return out


def gemma3n_as_llama_cpp(hf_dir: Path, model, prompts) -> dict[str, np.ndarray]:
    """HF Gemma3n run with the constants llama.cpp's gemma3n graph hardcodes instead of reading the
    GGUF: layers < 20 own a KV cache (so no KV sharing here; shared layers use their unused K/V
    weights), layers < 10 use activation sparsity 0.95, and the std in the sparsity cutoff divides
    by N-1. Explains llama.cpp's deviation from the true (HF) logits on this tiny model."""
    from safetensors.torch import load_file
    from transformers.models.gemma3n import modeling_gemma3n as G
    t = _torch()
    L = model.config.num_hidden_layers
    cfg_cls, _ = hf_classes("gemma3n")
    d = model.config.to_dict()
    d["num_kv_shared_layers"] = 0
    d["activation_sparsity_pattern"] = [0.95 if i < 10 else 0.0 for i in range(L)]
    cfg = cfg_cls.from_dict(d)
    cfg._attn_implementation = "eager"
    m = new_model(cfg, "gemma3n")
    sd = load_file(hf_dir / "model.safetensors")
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    m.load_state_dict(sd, strict=True)
    m.tie_weights()

    def topk_unbiased(self, x):
        mult = t.distributions.normal.Normal(0, 1).icdf(t.tensor(self.activation_sparsity, dtype=t.float32)).to(x.dtype)
        cut = x.mean(-1, keepdim=True) + x.std(-1, keepdim=True, unbiased=True) * mult
        return t.nn.functional.relu(x - cut)

    orig = G.Gemma3nTextMLP._gaussian_topk
    G.Gemma3nTextMLP._gaussian_topk = topk_unbiased
    try:
        return hf_logits(m.eval(), prompts)
    finally:
        G.Gemma3nTextMLP._gaussian_topk = orig


@contextlib.contextmanager
def ggml_gelu():
    """transformers with ggml's CPU GELU emulated: for -10 < x < 10 the input is rounded to f16 and
    the result read from an f16 table (GGML_GELU_FP16); x <= -10 gives 0, x >= 10 gives x."""
    from transformers.activations import ACT2FN
    t = _torch()
    cls = type(ACT2FN["gelu_pytorch_tanh"])
    orig = cls.forward

    def f16_gelu(self, x):
        y = t.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return t.where(x <= -10, t.zeros_like(x), t.where(x >= 10, x, y))

    cls.forward = f16_gelu
    try:
        yield
    finally:
        cls.forward = orig


def hf_logits_f16_gelu(model, prompts) -> dict[str, np.ndarray]:
    """HF logits with ggml's CPU GELU (`ggml_gelu`)."""
    with ggml_gelu():
        return hf_logits(model, prompts)


# --------------------------------------------------------------------------------------------
# GGUF -> HF state dict (for the dequantized references)

GGUF_ARCH = {
    "gemma": gguf.MODEL_ARCH.GEMMA,
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3": gguf.MODEL_ARCH.GEMMA3,
    "gemma3n": gguf.MODEL_ARCH.GEMMA3N,
    "gemma4": gguf.MODEL_ARCH.GEMMA4,
}


def read_gguf_tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    r = gguf.GGUFReader(path)
    arrs, types = {}, {}
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        arrs[t.name] = np.asarray(a, dtype=np.float32).reshape(list(reversed(ne)))
        types[t.name] = t.tensor_type.name
    return arrs, types


def hf_to_gguf_name(hf_name: str, arch: str, tmap) -> tuple[str, int | None]:
    """The GGUF tensor (and index into a stacked tensor) that holds HF parameter hf_name."""
    import re
    n = hf_name
    m = re.match(r"model\.(altup_projections|altup_unembed_projections)\.(\d)\.weight$", n)
    if m:
        base = "altup_proj.weight" if m.group(1) == "altup_projections" else "altup_unembd_proj.weight"
        return base, int(m.group(2))
    m = re.match(r"model\.layers\.(\d+)\.router\.(scale|per_expert_scale)$", n)
    if m:
        suffix = "ffn_gate_inp.scale" if m.group(2) == "scale" else "ffn_down_exps.scale"
        return f"blk.{m.group(1)}.{suffix}", None
    if n.endswith("_scale") or n.endswith("layer_scalar") or n.endswith("per_dim_scale"):
        n = n + ".weight"
    if ".experts." in n and not n.endswith(".weight"):
        n = n + ".weight"
    g = tmap.get_name(n, try_suffixes=(".weight", ".bias"))
    if g is None:
        raise KeyError(f"no GGUF name for {hf_name}")
    return g, None


def gguf_state_dict(path: Path, model, arch: str) -> dict:
    """HF state dict holding exactly the (dequantized) weights of the GGUF file."""
    t = _torch()
    arrs, _ = read_gguf_tensors(path)
    tmap = gguf.get_tensor_name_map(GGUF_ARCH[arch], model.config.num_hidden_layers)
    sd = model.state_dict()
    used = set()
    new = {}
    for k, v in sd.items():
        if k == "lm_head.weight":
            continue
        g, idx = hf_to_gguf_name(k, arch, tmap)
        a = arrs[g]
        used.add(g)
        if idx is not None:
            a = a[idx]
        if arch in NORM_SHIFT_ARCHS and k.endswith("norm.weight"):
            a = (a - np.float32(1.0)).astype(np.float32)
        if tuple(a.shape) != tuple(v.shape):
            # the converter drops (gemma3) or pads (gemma3n) vocabulary rows; ours match exactly
            raise ValueError(f"{k}: GGUF {g} shape {a.shape} != HF {tuple(v.shape)}")
        new[k] = t.from_numpy(np.ascontiguousarray(a)).to(v.dtype)
    if "lm_head.weight" in sd:
        new["lm_head.weight"] = new["model.embed_tokens.weight"]
    unused = set(arrs) - used - {"rope_freqs.weight"}
    if arch == "gemma3n":  # the unused K/V weights of KV-shared layers (see add_unused_shared_kv)
        c = model.config
        for i in range(c.num_hidden_layers - c.num_kv_shared_layers, c.num_hidden_layers):
            unused -= {f"blk.{i}.attn_k.weight", f"blk.{i}.attn_v.weight", f"blk.{i}.attn_k_norm.weight"}
    if unused:
        raise ValueError(f"GGUF tensors not mapped back to HF: {sorted(unused)}")
    return new


def load_state(model_template, cfg, arch, sd):
    m = new_model(cfg, arch)
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing} unexpected {unexpected}")
    m.tie_weights()
    return _eager(m).eval()


# --------------------------------------------------------------------------------------------
# llama.cpp side

def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def convert(hf_dir: Path, outtype: str, out: Path) -> None:
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)
    run([sys.executable, LLAMA_SRC / "convert_hf_to_gguf.py", hf_dir, "--outtype", outtype, "--outfile", out], env=env)


def quantize(src: Path, out: Path, qtype: str) -> None:
    run([LLAMA_BIN / "llama-quantize", "--pure", src, out, qtype, "2"])


_llama_mod = None
PROBE = False


def _llama():
    global _llama_mod
    if _llama_mod is None:
        sys.path.insert(0, str(LLAMA_PY))
        import llama_cpp
        _llama_mod = llama_cpp
    return _llama_mod


def llama_logits(path: Path, prompts: dict[str, list[int]], f32_kv: bool = True) -> dict[str, np.ndarray]:
    lc = _llama()
    kw = dict(type_k=lc.GGML_TYPE_F32, type_v=lc.GGML_TYPE_F32) if f32_kv else {}
    m = lc.Llama(model_path=str(path), logits_all=True, verbose=False, n_ctx=128, n_batch=128, n_ubatch=128,
                 n_threads=2, n_threads_batch=2, flash_attn=False, seed=0, **kw)
    out = {}
    for k, ids in prompts.items():
        m.reset()
        m.eval(ids)
        out[k] = np.array(m.scores[: len(ids)], dtype=np.float32).copy()
    m.close() if hasattr(m, "close") else None
    del m
    return out


# --------------------------------------------------------------------------------------------
# metrics / io

def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def top1(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))


def compare(a: dict, b: dict) -> dict:
    per = {k: {"rel_l2": rel_l2(a[k], b[k]), "top1": top1(a[k], b[k]),
               "max_abs": float(np.max(np.abs(a[k].astype(np.float64) - b[k])))} for k in b}
    cat_a = np.concatenate([a[k] for k in b])
    cat_b = np.concatenate([b[k] for k in b])
    per["all"] = {"rel_l2": rel_l2(cat_a, cat_b), "top1": top1(cat_a, cat_b),
                  "max_abs": float(np.max(np.abs(cat_a.astype(np.float64) - cat_b)))}
    return per


def save_logits(d: Path, logits: dict[str, np.ndarray]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for k, v in logits.items():
        assert v.dtype == np.float32
        np.save(d / f"{k}.npy", v)


def dump_json(obj) -> str:
    """json with lists of numbers kept on one line."""
    import re
    txt = json.dumps(obj, indent=1, ensure_ascii=False)
    return re.sub(r"\[\s*((?:-?[0-9][0-9.eE+-]*|true|false|-?Infinity|NaN)(?:,\s*(?:-?[0-9][0-9.eE+-]*|true|false|-?Infinity|NaN))*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", txt) + "\n"


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tensor_type_counts(path: Path) -> dict[str, int]:
    r = gguf.GGUFReader(path)
    return dict(sorted(Counter(t.tensor_type.name for t in r.tensors).items()))


def make_prompts() -> dict[str, list[int]]:
    rng = np.random.default_rng(20240607)
    prompts = {}
    for i, n in enumerate(S.PROMPT_LENS):
        ids = [2] + [int(x) for x in rng.integers(T.FIRST_BYTE, S.VOCAB, size=n - 1)]
        prompts[f"prompt{i}"] = ids
    # make sure the extremes of the vocabulary are exercised (row gather and LM-head edges)
    last = f"prompt{len(S.PROMPT_LENS) - 1}"
    prompts[last][3] = S.VOCAB - 1
    prompts[last][4] = T.FIRST_BYTE
    prompts[last][5] = 3  # <unk>
    return prompts


# --------------------------------------------------------------------------------------------

def build_one(spec: dict, out_root: Path, work: Path, spm_path: Path, prompts: dict, log) -> dict:
    name, arch = spec["name"], spec["arch"]
    t0 = time.time()
    out = out_root / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    wdir = work / name
    if wdir.exists():
        shutil.rmtree(wdir)
    hf_dir = wdir / name
    hf_dir.mkdir(parents=True)

    cfg = make_config(spec)
    model = new_model(cfg, arch)
    init_weights(model, arch, spec["seed"], spec.get("init"))
    model.save_pretrained(hf_dir, safe_serialization=True)
    if arch == "gemma3n":
        add_unused_shared_kv(hf_dir, model, spec["seed"] + 1)
    T.write_tokenizer_files(hf_dir, spm_path, S.VOCAB, with_json=(arch == "gemma4"))
    # reload from disk: the reference is the saved checkpoint
    _, model_cls = hf_classes(arch)
    model = _eager(model_cls.from_pretrained(hf_dir, dtype=_torch().float32, attn_implementation="eager")).eval()
    cfg = model.config

    (out / "prompts.json").write_text(dump_json(prompts))
    ref = hf_logits(model, prompts)
    save_logits(out / "hf-f32", ref)

    # the float32 round-off floor: the same HF model in float64
    t = _torch()
    m64 = copy.deepcopy(model).to(t.float64)
    with t.no_grad():
        ref64 = {k: m64(input_ids=t.tensor([ids]), use_cache=False).logits[0].numpy().astype(np.float64)
                 for k, ids in prompts.items()}
    del m64
    f64_floor = compare(ref, ref64)
    log(f"[{name}] hf f32 vs f64: rel_l2 {f64_floor['all']['rel_l2']:.2e}")
    sens = sensitivity(model, arch, prompts, ref)
    log(f"[{name}] sensitivity: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in sens.items()))
    if PROBE:
        return {"name": name, "files": {}}
    files = {}
    refs_used = {}
    f32 = wdir / "model-f32.gguf"
    convert(hf_dir, "f32", f32)

    # the dequantization path must reproduce the f32 checkpoint exactly
    sd = gguf_state_dict(f32, model, arch)
    orig = model.state_dict()
    for k, v in sd.items():
        if not _torch().equal(v, orig[k]):
            raise AssertionError(f"[{name}] f32 GGUF round trip differs at {k}: "
                                 f"max {float((v - orig[k]).abs().max())}")
    chk = hf_logits(load_state(model, cfg, arch, sd), prompts)
    rt = compare(chk, ref)["all"]
    log(f"[{name}] f32 GGUF -> HF round trip: rel_l2 {rt['rel_l2']:.2e} max_abs {rt['max_abs']:.2e}")
    assert rt["max_abs"] == 0.0, rt

    variants = [("f32", f32, "hf-f32", None)]
    for ot in spec.get("outtypes", []):
        p = wdir / f"model-{ot}.gguf"
        convert(hf_dir, ot, p)
        variants.append((ot, p, "hf-f32", None))
    failed = {}
    for q in spec.get("quants", []):
        p = wdir / f"model-{q}.gguf"
        try:
            quantize(f32, p, q)
        except Exception as e:  # noqa: BLE001
            failed[q] = str(e)[-500:]
            log(f"[{name}] quantize {q} FAILED: {str(e)[-300:]}")
            continue
        variants.append((q, p, f"hf-dequant-{q}", q))

    keep_f32 = spec.get("keep_f32", True)
    for label, path, refname, q in variants:
        if q is not None:
            dq = hf_logits(load_state(model, cfg, arch, gguf_state_dict(path, model, arch)), prompts)
            save_logits(out / refname, dq)
            refs_used[refname] = dq
            qerr = compare(dq, ref)
        else:
            dq, qerr = ref, None
        ll = llama_logits(path, prompts, f32_kv=True)
        ll16 = llama_logits(path, prompts, f32_kv=False)
        committed = keep_f32 or label != "f32"
        if committed:
            shutil.copyfile(path, out / path.name)
            save_logits(out / f"llama-{label}", ll)
        entry = {
            "committed": committed,
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
            "tensor_types": tensor_type_counts(path),
            "made_by": (f"convert_hf_to_gguf.py --outtype {label}" if q is None
                        else f"llama-quantize --pure model-f32.gguf {path.name} {q}"),
            "reference": refname,
            "llama_vs_reference": compare(ll, dq),
            "llama_f16_kv_vs_reference": compare(ll16, dq),
        }
        if committed:
            entry["llama_logits"] = f"llama-{label}"
        if label == "f32" and arch != "gemma3n":
            entry["llama_vs_hf_with_ggml_f16_gelu"] = compare(ll, hf_logits_f16_gelu(model, prompts))
            log(f"[{name}] llama f32 vs HF with ggml's f16-table GELU: "
                f"{entry['llama_vs_hf_with_ggml_f16_gelu']['all']['rel_l2']:.3e}")
        if arch == "gemma3n" and label == "f32":
            entry["llama_vs_hf_with_llama_cpp_gemma3n_constants"] = compare(ll, gemma3n_as_llama_cpp(hf_dir, model, prompts))
            log(f"[{name}] llama f32 vs HF with llama.cpp's gemma3n constants: "
                f"{entry['llama_vs_hf_with_llama_cpp_gemma3n_constants']['all']['rel_l2']:.3e}")
        if q is None and label != "f32":
            # not stored: how much of llama.cpp's error is the f16/bf16 rounding of the weights
            dq16 = hf_logits(load_state(model, cfg, arch, gguf_state_dict(path, model, arch)), prompts)
            entry["llama_vs_hf_dequant"] = compare(ll, dq16)
            entry["hf_dequant_vs_hf_f32"] = compare(dq16, ref)
        if qerr is not None:
            entry["reference_vs_hf_f32"] = qerr
            entry["llama_vs_hf_f32"] = compare(ll, ref)
        files[path.name] = entry
        a = entry["llama_vs_reference"]["all"]
        log(f"[{name}] {label:7s} {path.stat().st_size/1e6:7.3f} MB  llama vs {refname}: "
            f"rel_l2 {a['rel_l2']:.3e} top1 {a['top1']:.3f}  (f16 KV: {entry['llama_f16_kv_vs_reference']['all']['rel_l2']:.3e})")

    cfg_dict = json.loads((hf_dir / "config.json").read_text())
    manifest = {
        "name": name,
        "arch": arch,
        "hf_class": type(model).__name__,
        "seed": spec["seed"],
        "hf_config": cfg_dict,
        "prompts": prompts,
        "logits_shape": {k: [len(v), S.VOCAB] for k, v in prompts.items()},
        "references": ["hf-f32"] + sorted(refs_used),
        "files": files,
        "failed": failed,
        "sensitivity_rel_l2": sens,
        "hf_f32_vs_hf_f64": f64_floor,
        "notes": spec.get("notes", []),
    }
    (out / "manifest.json").write_text(dump_json(manifest))
    log(f"[{name}] done in {time.time() - t0:.1f}s")
    return manifest


TOKENIZE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "    indented  two  spaces\nnew line\n\n",
    "Numbers 12345 and 3.14!",
    "Caf\u00e9 na\u00efve \u4e2d\u6587 \U0001f642",
    "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    " leading space",
]


def tokenizer_fixture(out_root: Path, spm_path: Path, log) -> None:
    """tokenizer/tokenize.json: ids of a few strings from SentencePiece, the HF tokenizer.json and
    llama.cpp (SPM vocab of gemma3/model-f32.gguf, BPE vocab of gemma4-dense/model-f32.gguf),
    without BOS, special tokens parsed."""
    import sentencepiece as spm
    from tokenizers import Tokenizer
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    tk = Tokenizer.from_file(str(out_root / "tokenizer/tokenizer.json"))
    rows = []
    llamas = {}
    for key, f in (("llama_spm_gemma3", "gemma3"), ("llama_bpe_gemma4", "gemma4-dense")):
        p = out_root / f / "model-f32.gguf"
        if p.exists():
            llamas[key] = _llama().Llama(model_path=str(p), vocab_only=True, verbose=False)
    for text in TOKENIZE_TEXTS:
        r = {"text": text, "sentencepiece": [int(i) for i in sp.encode(text)],
             "hf_tokenizer_json": tk.encode(text, add_special_tokens=False).ids}
        for key, m in llamas.items():
            r[key] = list(m.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        r["all_agree"] = all(r[k] == r["sentencepiece"] for k in r if k not in ("text",))
        if not r["all_agree"]:
            log(f"tokenizer disagreement on {text!r}: {r}")
        rows.append(r)
    (out_root / "tokenizer/tokenize.json").write_text(dump_json(rows))


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/tiny")
    ap.add_argument("--work", type=Path, default=Path("/tmp/rlx-tiny-build"))
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--probe", action="store_true", help="only build the HF models and print sensitivities")
    args = ap.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    logf = open(args.work / "build.log", "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    tokdir = args.out / "tokenizer"
    spm_path = T.train_spm(args.work / "tokenizer", S.VOCAB)
    T.write_tokenizer_files(tokdir, spm_path, S.VOCAB, with_json=True)
    prompts = make_prompts()
    (args.out / "prompts.json").write_text(dump_json(prompts))

    global PROBE
    PROBE = args.probe
    only = [x for x in args.only.split(",") if x]
    manifests = []
    for spec in S.SPECS:
        if only and spec["name"] not in only:
            continue
        manifests.append(build_one(spec, args.out, args.work, spm_path, prompts, log))

    if not PROBE:
        tokenizer_fixture(args.out, spm_path, log)

    log("\nmodel            file                     MB     ref               relL2(llama)   top1   relL2(f16 KV)")
    for m in manifests:
        for fn, e in m["files"].items():
            a = e["llama_vs_reference"]["all"]
            b = e["llama_f16_kv_vs_reference"]["all"]
            log(f"{m['name']:16s} {fn:22s} {e['bytes']/1e6:7.3f} {e['reference']:17s} {a['rel_l2']:.3e}  "
                f"{a['top1']:.3f}  {b['rel_l2']:.3e}{'' if e['committed'] else '  (not committed)'}")
    if not PROBE:
        readme.write(args.out, readme.tool_versions(LLAMA_SRC, LLAMA_PY))
    log(f"total size of {args.out}: {dir_size(args.out)/1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
