#!/usr/bin/env python3
"""A tiny Gemma 4 assistant (MTP drafter) for the tiny gemma4-dense target, with reference drafts.

The target is the committed tests/fixtures/tiny/gemma4-dense/hf checkpoint (read only). This
builds a Gemma4AssistantForCausalLM whose geometry fits it (target hidden 32, target sliding
layers 2 KV heads x 32, full layer 1 KV head x 64; window 8; vocab 384), seeded random weights
briefly distilled (Adam, a few hundred steps, on the target's greedy continuations of random
prompts) so that some drafts are accepted, and writes to tests/fixtures/tiny/gemma4-assistant/:

  hf/                    config.json, generation_config.json (num_assistant_tokens 4),
                         model.safetensors (f32), the target's tokenizer files
  model-f32.gguf         llama.cpp's convert_hf_to_gguf.py --outtype f32 (arch gemma4-assistant)
  chains.json            index of the draft-chain references (a), see README.md
  chain-logits.npy       float32 [n_chains, 4, 384]  assistant logits of each draft step
  chain-h.npy            float32 [n_chains, 5, 32]   row 0: the target's h fed to step 0,
                                                    row s+1: h_next of step s
  loops.json             greedy speculative loops (b, c): transformers' assisted generate,
                         the same loop with clean inputs, llama.cpp's draft-mtp loop
  assistant.json         config, seeds, distillation log, checks, tool versions, sha256
  README.md              what all this is (written by this script)

    python3 scripts/tiny/make_gemma4_assistant.py            # build everything (~2 min)
    python3 scripts/tiny/make_gemma4_assistant.py --check    # NumPy draft step vs chain-logits.npy
    python3 scripts/tiny/make_gemma4_assistant.py [--check] --speculative-simple BINARY
                                   # also replay llama-speculative-simple --spec-type draft-mtp

Needs torch, transformers >= 5.24 (5.23 cannot build an assistant), safetensors, numpy, and the
llama.cpp reference checkout of make_tiny_models.py (~/.cache/llama.cpp-ref, or $LLAMA_CPP_REF):
convert_hf_to_gguf.py and gguf-py, and build/bin/libllama.so, driven through the ctypes bindings
of llama_cpp_python-0.3.36 (loaded without the package's __init__, so no extra dependencies).
Everything is seeded and single-threaded; two runs give byte-identical files on one machine.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import importlib.util
import json
import math
import os
import shutil
import sys
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_tiny_models as M  # noqa: E402  (sets the thread/env defaults, gguf-py path)

import numpy as np  # noqa: E402

FIXTURES = M.REPO / "tests/fixtures/tiny"
TARGET_HF = FIXTURES / "gemma4-dense/hf"
OUT = FIXTURES / "gemma4-assistant"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"]

SEED = 4701
K_DRAFT = 4                 # draft steps per round (num_assistant_tokens; llama.cpp --spec-draft-n-max)
ASSISTANT = dict(           # the assistant's own sizes; the attention geometry comes from the target
    hidden_size=48,         # must differ from the target's hidden (llama.cpp checks it)
    intermediate_size=96,
    num_attention_heads=4,  # a multiple of both KV-head counts (2 sliding, 1 full)
    layer_types=["sliding_attention", "full_attention"],
)
DISTILL = dict(n_seq=1024, n_heldout=64, prompt_len=3, seq_len=44, steps=500, batch=512, lr=3e-3,
               weight_decay=0.0, seed=SEED + 1)
GEN_NEW_TOKENS = 24         # max_new_tokens of the speculative loops
# (prompt, P): chains drafted at position P of prompt + the target's greedy continuation.
# P <= W-1 = 7: transformers' window (last W+1 rows) and llama.cpp's (W-1 rows) both see all of 0..P-1.
SHORT_CASES = [("prompt0", 1), ("prompt0", 4), ("prompt0", 7), ("prompt1", 2), ("prompt1", 5), ("prompt1", 7)]
# P > W-1: the two windows differ; each gets a chain with llama.cpp's rule and one with transformers'.
LONG_CASES = [("prompt2", 12), ("prompt2", 20)]

torch = None


def _t():
    global torch
    if torch is None:
        torch = M._torch()
    return torch


# --------------------------------------------------------------------------------------------
# models

def load_target():
    from transformers import Gemma4ForCausalLM
    t = _t()
    T = Gemma4ForCausalLM.from_pretrained(TARGET_HF, dtype=t.float32, attn_implementation="eager")
    return M._eager(T).eval()


def assistant_config(target_cfg: dict):
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig
    tc = target_cfg
    full = max(i for i, k in enumerate(tc["layer_types"]) if k == "full_attention")
    fl = tc.get("per_layer_config", {}).get(str(full), {})
    txt = Gemma4TextConfig(
        vocab_size=tc["vocab_size"],
        num_hidden_layers=len(ASSISTANT["layer_types"]),
        hidden_size=ASSISTANT["hidden_size"], intermediate_size=ASSISTANT["intermediate_size"],
        num_attention_heads=ASSISTANT["num_attention_heads"], layer_types=ASSISTANT["layer_types"],
        # the attention geometry of the target layers whose K/V the assistant reads
        head_dim=tc["head_dim"], num_key_value_heads=tc["num_key_value_heads"],
        global_head_dim=fl.get("head_dim", tc.get("global_head_dim")),
        num_global_key_value_heads=fl.get("num_key_value_heads", tc.get("num_global_key_value_heads")),
        attention_k_eq_v=tc["attention_k_eq_v"],
        sliding_window=tc["sliding_window"], max_position_embeddings=tc["max_position_embeddings"],
        rope_parameters=copy.deepcopy(tc["rope_parameters"]), rms_norm_eps=tc["rms_norm_eps"],
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, enable_moe_block=False,
        use_double_wide_mlp=False, num_kv_shared_layers=len(ASSISTANT["layer_types"]),
        hidden_activation=tc["hidden_activation"], final_logit_softcapping=None,
        pad_token_id=tc["pad_token_id"], eos_token_id=tc["eos_token_id"], bos_token_id=tc["bos_token_id"],
    )
    cfg = Gemma4AssistantConfig(text_config=txt, backbone_hidden_size=tc["hidden_size"])
    cfg.architectures = ["Gemma4AssistantForCausalLM"]
    return cfg


def new_assistant(cfg):
    from transformers import Gemma4AssistantForCausalLM
    t = _t()
    t.manual_seed(SEED)
    A = Gemma4AssistantForCausalLM(cfg)
    return M._eager(A).float().eval()


def init_assistant(A) -> None:
    """Seeded values in the style of make_tiny_models.init_weights: matrices N(0, 1/fan_in),
    the (tied) embedding N(0, 1/hidden), norm weights U(0.5, 1.5) (final norm x3), layer_scalar
    U(0.5, 1.5)."""
    t = _t()
    g = t.Generator().manual_seed(SEED)
    d = A.config.get_text_config().hidden_size
    tensors = list(A.named_parameters()) + [(n, b) for n, b in A.named_buffers() if n.endswith("layer_scalar")]
    with t.no_grad():
        for name, p in tensors:
            if p.ndim <= 1:
                v = t.rand(tuple(p.shape), generator=g) + 0.5
                if name.startswith("model.norm."):
                    v = v * 3.0
            elif "embed_tokens" in name:
                v = t.randn(tuple(p.shape), generator=g) / math.sqrt(d)
            else:
                v = t.randn(tuple(p.shape), generator=g) / math.sqrt(p.shape[-1])
            p.copy_(v)


# --------------------------------------------------------------------------------------------
# the target side: post-final-norm hidden rows and the K/V of the layers the assistant reads

def producer_layers(T) -> dict:
    """{layer type: target layer index} of the layers whose K/V the assistant reads: per type,
    the last layer that stores its K/V for sharing (transformers' kv_sharing_modes "store")."""
    c = T.config
    modes = c.kv_sharing_modes
    out = {}
    for i, (kind, m) in enumerate(zip(c.layer_types, modes)):
        if m == "store":
            out[kind] = i
    return out


def target_states(T, ids: list[int]):
    """One transformers forward over ids (no cache): logits [n, V], h [n, H_t] (the post-final-norm
    hidden state, the LM head's input), kv {type: (K [kvh, n, d], V [kvh, n, d])} (as stored:
    k-normed, v-normed, K RoPE'd)."""
    t = _t()
    with t.no_grad():
        o = T(input_ids=t.tensor([ids]), use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
    kv = {k: (v[0][0].clone(), v[1][0].clone()) for k, v in o.shared_kv_states.items()}
    return o.logits[0].float(), o.hidden_states[-1][0].float(), kv


def kv_for(kv_full: dict, P: int, W: int, rule: str) -> dict:
    """The K/V rows the assistant is given at position P (kv_full covers rows 0..>=P-1).
    rule "llama":        full rows 0..P-1, sliding rows max(0, P-W+1)..P-1 (W-1 keys; what
                         llama.cpp's mask lets through). transformers' module keeps the last W+1
                         rows of what it is given, so this slice makes it compute llama.cpp's rule.
    rule "transformers": full rows 0..P-1, sliding rows 0..P-1 (the module keeps P-W-1..P-1)."""
    out = {}
    for kind, (K, V) in kv_full.items():
        lo = max(0, P - W + 1) if (kind == "sliding_attention" and rule == "llama") else 0
        out[kind] = (K[:, lo:P], V[:, lo:P])
    return out


def hf_step(A, T, tok: int, h, P: int, kv: dict):
    """One draft step with transformers' own module, called as its candidate generator calls it."""
    t = _t()
    with t.no_grad():
        e = T.get_input_embeddings()(t.tensor([[tok]]))
        r = A(inputs_embeds=t.cat([e, h.view(1, 1, -1)], -1), position_ids=t.tensor([[P]]),
              attention_mask=t.ones(1, P + 1, dtype=t.long),
              shared_kv_states={k: (K[None], V[None]) for k, (K, V) in kv.items()}, use_cache=False)
    return r.logits[0, 0].float(), r.last_hidden_state[0, 0].float()


# transformers with ggml's CPU GELU: explains llama.cpp's last digits.
ggml_gelu = M.ggml_gelu


def hf_chain(A, T, tok: int, h, P: int, kv: dict, k: int = K_DRAFT):
    logits, hs, drafts = [], [h], []
    for _ in range(k):
        lg, h = hf_step(A, T, tok, h, P, kv)
        tok = int(lg.argmax())
        logits.append(lg)
        hs.append(h)
        drafts.append(tok)
    return drafts, logits, hs


# --------------------------------------------------------------------------------------------
# a batched torch draft step (llama.cpp's masks) for the distillation

def _rms(x, w=None, eps=1e-6):
    y = x * (x.pow(2).mean(-1, keepdim=True) + eps).pow(-0.5)
    return y if w is None else y * w


def inv_freq_t(rp: dict, d: int):
    t = _t()
    theta = rp["rope_theta"]
    n = d // 2 if rp.get("rope_type", "default") != "proportional" else int(rp["partial_rotary_factor"] * d // 2)
    f = 1.0 / theta ** (t.arange(0, 2 * n, 2, dtype=t.int64).float() / d)
    return t.cat([f, t.zeros(d // 2 - n)])


def torch_step(A, E_t, tok, h, P, kv, masks):
    """tok [N], h [N, H_t], P [N]; kv[type] = (K [N, kvh, S, d], V); masks[type] [N, S] bool."""
    t = _t()
    F = t.nn.functional
    c = A.config.get_text_config()
    sd = dict(A.named_parameters())
    sd.update({n: b for n, b in A.named_buffers() if n.endswith("layer_scalar")})
    N = tok.shape[0]
    x = t.cat([E_t[tok] * math.sqrt(E_t.shape[1]), h], -1) @ sd["pre_projection.weight"].T
    for i, kind in enumerate(c.layer_types):
        p = f"model.layers.{i}."
        K, V = kv[kind]
        d = K.shape[-1]
        a = _rms(x, sd[p + "input_layernorm.weight"])
        q = _rms((a @ sd[p + "self_attn.q_proj.weight"].T).view(N, c.num_attention_heads, d),
                 sd[p + "self_attn.q_norm.weight"])
        ang = P.float()[:, None] * inv_freq_t(c.rope_parameters[kind], d)[None]
        cos, sin = t.cat([ang, ang], -1).cos()[:, None], t.cat([ang, ang], -1).sin()[:, None]
        q = q * cos + t.cat([-q[..., d // 2:], q[..., : d // 2]], -1) * sin
        g = c.num_attention_heads // K.shape[1]
        Kh, Vh = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)
        sc = t.einsum("nhd,nhsd->nhs", q, Kh).masked_fill(~masks[kind][:, None, :], float("-inf"))
        o = t.einsum("nhs,nhsd->nhd", sc.softmax(-1), Vh).reshape(N, -1)
        x = x + _rms(o @ sd[p + "self_attn.o_proj.weight"].T, sd[p + "post_attention_layernorm.weight"])
        m = _rms(x, sd[p + "pre_feedforward_layernorm.weight"])
        m = (F.gelu(m @ sd[p + "mlp.gate_proj.weight"].T, approximate="tanh") * (m @ sd[p + "mlp.up_proj.weight"].T)) \
            @ sd[p + "mlp.down_proj.weight"].T
        x = (x + _rms(m, sd[p + "post_feedforward_layernorm.weight"])) * sd[p + "layer_scalar"]
    y = _rms(x, sd["model.norm.weight"])
    return y @ sd["model.embed_tokens.weight"].T, y @ sd["post_projection.weight"].T


def distill_data(T, n_seq: int, g):
    """n_seq random prompts (BOS + prompt_len-1 tokens) continued greedily by the target to seq_len
    tokens, and one target forward over them: the tokens, h rows, greedy labels, K/V."""
    t = _t()
    D = DISTILL
    V = T.config.vocab_size
    prompts = t.cat([t.full((n_seq, 1), T.config.bos_token_id),
                     t.randint(7, V, (n_seq, D["prompt_len"] - 1), generator=g)], 1)
    n_new = D["seq_len"] - D["prompt_len"]
    with t.no_grad():
        seqs = T.generate(prompts, attention_mask=t.ones_like(prompts), max_new_tokens=n_new,
                          min_new_tokens=n_new, do_sample=False, pad_token_id=0)
        o = T(input_ids=seqs, use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
    kv = {k: (v[0].float(), v[1].float()) for k, v in o.shared_kv_states.items()}
    return seqs, o.hidden_states[-1].float(), o.logits.argmax(-1), kv


def distill(A, T, log) -> dict:
    """Trains the assistant for a few hundred Adam steps to predict the target's greedy tokens
    (k teacher-forced chain steps from (token at P, target h at P-1, target K/V 0..P-1), llama.cpp's
    window), so that the speculative loops accept some drafts. Seeded and deterministic."""
    t = _t()
    D = DISTILL
    W = T.config.sliding_window
    g = t.Generator().manual_seed(D["seed"])
    train = distill_data(T, D["n_seq"], g)
    held = distill_data(T, D["n_heldout"], g)
    E_t = T.get_input_embeddings().weight.detach()

    def samples(data):
        seqs = data[0]
        S = seqs.shape[1]
        P = t.arange(D["prompt_len"] - 1, S - K_DRAFT)
        b = t.arange(seqs.shape[0])[:, None].expand(-1, len(P)).reshape(-1)
        return b, P.repeat(seqs.shape[0])

    def chain_loss(data, b, P):
        seqs, H, labels, kv = data
        rows = t.arange(seqs.shape[1])[None]
        kvs = {k: (K[b], Vv[b]) for k, (K, Vv) in kv.items()}
        masks = {"full_attention": rows < P[:, None],
                 "sliding_attention": (rows < P[:, None]) & (P[:, None] - rows < W)}
        h = H[b, P - 1]
        loss, hits = 0.0, []
        for s in range(K_DRAFT):
            lg, h = torch_step(A, E_t, seqs[b, P + s], h, P, kvs, masks)   # teacher forcing
            y = labels[b, P + s]
            loss = loss + t.nn.functional.cross_entropy(lg, y)
            hits.append(lg.argmax(-1) == y)
        return loss / K_DRAFT, hits

    def stats(data):
        b, P = samples(data)
        with t.no_grad():
            _, hits = chain_loss(data, b, P)
        prefix, mean_acc = t.ones(len(b), dtype=t.bool), 0.0
        for h in hits:
            prefix = prefix & h
            mean_acc += float(prefix.float().mean())
        return [round(float(h.float().mean()), 4) for h in hits], round(mean_acc, 4), len(b)

    params = list(A.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = t.optim.Adam(params, lr=D["lr"], weight_decay=D["weight_decay"])
    b_all, P_all = samples(train)
    pick = t.Generator().manual_seed(D["seed"] + 1)
    hist = []
    for step in range(D["steps"]):
        sel = t.randint(0, len(b_all), (D["batch"],), generator=pick)
        opt.zero_grad()
        loss, _ = chain_loss(train, b_all[sel], P_all[sel])
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == D["steps"] - 1:
            hist.append([step, round(loss.item(), 4)])
    for p in params:
        p.requires_grad_(False)
    tr, tr_acc, n_tr = stats(train)
    he, he_acc, n_he = stats(held)
    res = {"loss_history": hist, "samples": n_tr, "train_step_accuracy": tr, "train_mean_accepted": tr_acc,
           "heldout_samples": n_he, "heldout_step_accuracy": he, "heldout_mean_accepted": he_acc}
    log(f"distill: {res}")
    return res


# --------------------------------------------------------------------------------------------
# a NumPy draft step (notes section 4), for --check

def numpy_step(asst: dict, E_t: np.ndarray, cfg: dict, tok: int, h: np.ndarray, P: int, kv: dict) -> tuple:
    """One draft step in float64 from the safetensors. kv[type] = (K [kvh, S, d], V) already cut to
    the visible rows (kv_for). Returns (logits [V], h_next [H_t])."""
    c = cfg["text_config"]
    f = lambda n: asst[n].astype(np.float64)  # noqa: E731

    def rms(x, w=None):
        y = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + c["rms_norm_eps"])
        return y if w is None else y * w

    def gelu_tanh(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    x = np.concatenate([E_t[tok].astype(np.float64) * math.sqrt(E_t.shape[1]), h.astype(np.float64)])
    x = f("pre_projection.weight") @ x
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        K, V = (a.astype(np.float64) for a in kv[kind])
        d = K.shape[-1]
        q = (f(p + "self_attn.q_proj.weight") @ rms(x, f(p + "input_layernorm.weight"))).reshape(-1, d)
        q = rms(q, f(p + "self_attn.q_norm.weight"))
        rp = c["rope_parameters"][kind]
        n = d // 2 if rp["rope_type"] != "proportional" else int(rp["partial_rotary_factor"] * d // 2)
        inv = np.concatenate([rp["rope_theta"] ** (-np.arange(0, 2 * n, 2) / d), np.zeros(d // 2 - n)])
        cs, sn = np.cos(P * inv), np.sin(P * inv)
        q1, q2 = q[:, : d // 2], q[:, d // 2:]
        q = np.concatenate([q1 * cs - q2 * sn, q2 * cs + q1 * sn], -1)
        g = q.shape[0] // K.shape[0]
        o = []
        for j in range(q.shape[0]):
            s = K[j // g] @ q[j]                      # scale 1.0, no softcap
            w = np.exp(s - s.max())
            o.append((w / w.sum()) @ V[j // g])
        x = x + rms(f(p + "self_attn.o_proj.weight") @ np.concatenate(o), f(p + "post_attention_layernorm.weight"))
        m = rms(x, f(p + "pre_feedforward_layernorm.weight"))
        m = f(p + "mlp.down_proj.weight") @ (gelu_tanh(f(p + "mlp.gate_proj.weight") @ m) * (f(p + "mlp.up_proj.weight") @ m))
        x = (x + rms(m, f(p + "post_feedforward_layernorm.weight"))) * f(p + "layer_scalar")
    y = rms(x, f("model.norm.weight"))
    return f("model.embed_tokens.weight") @ y, f("post_projection.weight") @ y


def check(out: Path = OUT, log=print) -> dict:
    """Recomputes every stored chain step with numpy_step (assistant and target weights read from
    the safetensors; the target's K/V from transformers) and compares with chain-logits.npy and
    chain-h.npy. Returns the worst relative L2 errors; raises if one exceeds 1e-5."""
    from safetensors.numpy import load_file
    asst = load_file(out / "hf/model.safetensors")
    E_t = load_file(TARGET_HF / "model.safetensors")["model.embed_tokens.weight"]
    cfg = json.loads((out / "hf/config.json").read_text())
    W = cfg["text_config"]["sliding_window"]
    idx = json.loads((out / "chains.json").read_text())
    L = np.load(out / "chain-logits.npy")
    Hs = np.load(out / "chain-h.npy")
    T = load_target()
    worst = {"logits_rel_l2": 0.0, "h_next_rel_l2": 0.0}
    for ci, case in enumerate(idx["chains"]):
        P = case["P"]
        _, _, kv_full = target_states(T, case["tokens"][:P])
        kv = {k: (K.numpy(), V.numpy()) for k, (K, V) in kv_for(kv_full, P, W, case["rule"]).items()}
        if case["rule"] == "transformers":  # transformers' module keeps the last W+1 sliding rows
            K, V = kv["sliding_attention"]
            kv["sliding_attention"] = (K[:, -(W + 1):], V[:, -(W + 1):])
        toks = case["step_inputs"]
        for s in range(len(toks)):
            lg, hn = numpy_step(asst, E_t, cfg, toks[s], Hs[ci, s], P, kv)
            e1, e2 = M.rel_l2(L[ci, s], lg), M.rel_l2(Hs[ci, s + 1], hn)
            worst["logits_rel_l2"] = max(worst["logits_rel_l2"], e1)
            worst["h_next_rel_l2"] = max(worst["h_next_rel_l2"], e2)
            if int(np.argmax(lg)) != case["drafts"][s]:
                raise AssertionError(f"chain {ci} step {s}: NumPy argmax {int(np.argmax(lg))} != {case['drafts'][s]}")
    log(f"check: NumPy draft step vs stored references over {len(idx['chains'])} chains x {K_DRAFT} steps: "
        f"worst rel L2 logits {worst['logits_rel_l2']:.2e}, h_next {worst['h_next_rel_l2']:.2e}")
    if max(worst.values()) > 1e-5:
        raise AssertionError(f"NumPy step disagrees with the references: {worst}")
    return {k: float(f"{v:.1e}") for k, v in worst.items()}


# --------------------------------------------------------------------------------------------
# llama.cpp through ctypes (the draft-mtp loop of common/speculative.cpp, server style)

class Llama:
    """libllama driven like common_speculative_impl_draft_mtp with a shared-memory (Gemma 4
    assistant) draft context: ctx_dft = MTP context with ctx_other = ctx_tgt, nextn embeddings on
    both, one draft row per step at the constant position pos0 with (token, h) set through
    llama_batch_ext_set_embd_token. F32 K/V cache, no flash attention, 2 threads."""

    def __init__(self, target_gguf: Path, assistant_gguf: Path):
        pkgdir = M.LLAMA_PY / "llama_cpp"
        if "llama_cpp.llama_cpp" in sys.modules:
            L = sys.modules["llama_cpp.llama_cpp"]
        else:
            pkg = types.ModuleType("llama_cpp")
            pkg.__path__ = [str(pkgdir)]
            sys.modules["llama_cpp"] = pkg
            spec = importlib.util.spec_from_file_location("llama_cpp.llama_cpp", pkgdir / "llama_cpp.py")
            L = importlib.util.module_from_spec(spec)
            sys.modules["llama_cpp.llama_cpp"] = L
            spec.loader.exec_module(L)
        self.L = L
        lib = L._lib
        # llama-ext.h is C++ without extern "C": bind the mangled names
        self.set_nextn = getattr(lib, "_Z26llama_set_embeddings_nextnP13llama_contextbb")
        self.set_nextn.argtypes, self.set_nextn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
        self.get_nextn = getattr(lib, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti")
        self.get_nextn.argtypes, self.get_nextn.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)
        L.llama_backend_init()
        self._cb = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda lvl, txt, ud: None)
        L.llama_log_set(self._cb, None)
        mp = L.llama_model_default_params()
        self.mt = L.llama_model_load_from_file(str(target_gguf).encode(), mp)
        self.md = L.llama_model_load_from_file(str(assistant_gguf).encode(), mp)
        assert self.mt and self.md
        self.ct = L.llama_init_from_model(self.mt, self._cparams())
        c = self._cparams()
        c.ctx_type = 1  # LLAMA_CONTEXT_TYPE_MTP
        c.ctx_other = self.ct
        self.cd = L.llama_init_from_model(self.md, c)
        assert self.ct and self.cd
        self.set_nextn(self.ct, True, False)
        self.set_nextn(self.cd, True, True)
        self.nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.mt))
        self.ht = L.llama_model_n_embd_out(self.mt)
        self.mem = L.llama_get_memory(self.ct)

    def _cparams(self):
        c = self.L.llama_context_default_params()
        c.n_ctx, c.n_batch, c.n_ubatch, c.n_threads, c.n_threads_batch = 256, 256, 256, 2, 2
        c.type_k = c.type_v = 0       # F32 KV cache
        c.flash_attn_type = 0         # off
        return c

    def _process(self, ctx, toks, pos0, h=None):
        L = self.L
        b = L.llama_batch_ext_init(ctx)
        keep = []
        for i, tok in enumerate(toks):
            idx = L.llama_batch_ext_add_token(b, 0, int(tok))
            assert idx == i
            L.llama_batch_ext_set_pos(b, idx, (L.llama_pos * 1)(pos0 + i))
            if h is not None:
                arr = np.ascontiguousarray(h, dtype=np.float32)
                keep.append(arr)
                e = L.llama_embd(arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, arr.shape[0])
                assert L.llama_batch_ext_set_embd_token(b, idx, e)
            L.llama_batch_ext_set_output_logits(b, idx, True)
        rc = L.llama_process(ctx, 1, b)  # LLAMA_PROCESS_TYPE_DECODE
        L.llama_batch_ext_free(b)
        if rc != 0:
            raise RuntimeError(f"llama_process returned {rc}")

    def _row(self, ptr, n):
        return np.ctypeslib.as_array(ptr, (n,)).astype(np.float32).copy()

    def target(self, toks, pos0):
        """Decodes toks at pos0.. on the target; returns (logits [n, V], h [n, H_t])."""
        self._process(self.ct, toks, pos0)
        lg = np.stack([self._row(self.L.llama_get_logits_ith(self.ct, i), self.nv) for i in range(len(toks))])
        h = np.stack([self._row(self.get_nextn(self.ct, i), self.ht) for i in range(len(toks))])
        return lg, h

    def draft_step(self, tok, h, pos0):
        self._process(self.cd, [tok], pos0, h=h)
        return self._row(self.L.llama_get_logits_ith(self.cd, 0), self.nv), self._row(self.get_nextn(self.cd, 0), self.ht)

    def reset(self):
        self.L.llama_memory_clear(self.mem, True)

    def seq_rm(self, p0):
        self.L.llama_memory_seq_rm(self.mem, 0, p0, -1)

    def close(self):
        L = self.L
        L.llama_free(self.cd)
        L.llama_free(self.ct)
        L.llama_model_free(self.md)
        L.llama_model_free(self.mt)


# --------------------------------------------------------------------------------------------
# speculative loops

def greedy_loop(prompt, n_new, eos, target_fn, draft_fn, k=K_DRAFT):
    """Greedy speculative decoding as transformers' assisted generate structures it (and as
    llama.cpp's server does): prefill, the target's first token, then rounds of (draft up to k at
    the constant position P = len(tokens)-1, verify [id_last, d1..dk] at P..P+k, keep the matching
    prefix and the target's next token). Drafts per round: min(k, max_len - len - 1) (0: a plain
    step). Kept tokens are cut at max_len and at the first EOS, as transformers does.
    target_fn(tokens, P, rows) -> (argmax tokens of rows P.., h rows); draft_fn(tokens, h, P, n) drafts
    n tokens from id_last = tokens[-1] (tokens[:P] are in the target's cache)."""
    max_len = len(prompt) + n_new
    toks = list(prompt)
    sel, hrows = target_fn(toks, 0, len(toks))
    toks.append(sel[-1])
    h = hrows[-1]
    rounds = []
    while len(toks) < max_len and toks[-1] != eos:
        P = len(toks) - 1
        nd = min(k, max_len - len(toks) - 1)
        drafts = draft_fn(toks, h, P, nd) if nd > 0 else []
        sel, hrows = target_fn(toks + drafts, P, 1 + len(drafts))
        n = 0
        while n < len(drafts) and drafts[n] == sel[n]:
            n += 1
        keep = sel[: n + 1]
        keep = keep[: max_len - len(toks)]
        if eos in keep:
            keep = keep[: keep.index(eos) + 1]
        rounds.append({"P": P, "id_last": toks[-1], "drafts": drafts, "accepted": len(keep) - 1})
        toks += keep
        h = hrows[len(keep) - 1]
    return toks[len(prompt):], rounds


def clean_loop(T, A, prompt, n_new):
    """greedy_loop with transformers' modules and clean inputs: every round recomputes the target
    without cache over the committed tokens, so the assistant gets h of row P-1 and exactly the
    K/V rows 0..P-1 (sliding: llama.cpp's W-1 rows)."""
    W = T.config.sliding_window

    def target_fn(toks, P, rows):
        lg, h, _ = target_states(T, toks)
        return [int(x) for x in lg[P:P + rows].argmax(-1)], [h[i] for i in range(P, P + rows)] if P else list(h)

    def draft_fn(toks, h, P, n):
        _, _, kv = target_states(T, toks[:P])
        return hf_chain(A, T, toks[-1], h, P, kv_for(kv, P, W, "llama"), n)[0]

    return greedy_loop(prompt, n_new, T.config.eos_token_id, target_fn, draft_fn)


def llama_loop(ll: Llama, prompt, n_new, eos):
    """greedy_loop on llama.cpp: the target's cache grows by decode and loses the rejected
    drafts' cells (seq_rm), the assistant reads it through the shared memory."""
    ll.reset()

    def target_fn(toks, P, rows):
        if P:
            ll.seq_rm(P)
        lg, h = ll.target(toks[P:P + rows] if P else toks, P)
        return [int(x) for x in lg.argmax(-1)], list(h)

    def draft_fn(toks, h, P, n):
        ll.seq_rm(P)  # the server removes the rejected drafts' cells before drafting
        out, tok = [], toks[-1]
        for _ in range(n):
            lg, h = ll.draft_step(tok, h, P)
            tok = int(lg.argmax())
            out.append(tok)
        return out

    return greedy_loop(prompt, n_new, eos, target_fn, draft_fn)


def hf_generate(T, A, prompt, n_new):
    """transformers' assisted generate (greedy), with its candidate generator wrapped to record
    each round: P, id_last, the drafts, the accepted count (update_candidate_strategy's
    num_matches) and how many K/V rows the assistant was handed (full, sliding)."""
    from transformers.generation import candidate_generator as CG
    t = _t()
    cls = CG.SinglePositionMultiTokenCandidateGenerator
    orig_get, orig_upd = cls.get_candidates, cls.update_candidate_strategy
    rounds = []

    def get_candidates(self, input_ids, model_kwargs, model_outputs, is_first_iteration, n_last_matches, **kw):
        prefill = self.is_main_model_prefill
        ids, logits = orig_get(self, input_ids, model_kwargs, model_outputs, is_first_iteration, n_last_matches, **kw)
        if logits is not None:
            n = input_ids.shape[1]
            hs = model_outputs.hidden_states[-1]
            h = hs[0, -1] if prefill else hs[0, n_last_matches]
            kvl = {k: min(n, v[0].shape[2]) for k, v in model_outputs.shared_kv_states.items()}
            rounds.append({"P": n - 1, "id_last": int(input_ids[0, -1]), "drafts": ids[0, n:].tolist(),
                           "kv_rows": {"full": kvl["full_attention"], "sliding": kvl["sliding_attention"]},
                           "_h": h.float().clone()})
        elif not is_first_iteration:
            rounds.append({"P": input_ids.shape[1] - 1, "id_last": int(input_ids[0, -1]), "drafts": [],
                           "kv_rows": None, "_h": None})
        return ids, logits

    def update(self, input_ids, scores, num_matches):
        if rounds and "accepted" not in rounds[-1]:
            rounds[-1]["accepted"] = int(num_matches)
        return orig_upd(self, input_ids, scores, num_matches)

    cls.get_candidates, cls.update_candidate_strategy = get_candidates, update
    try:
        with t.no_grad():
            ids = t.tensor([prompt])
            plain = T.generate(ids, attention_mask=t.ones_like(ids), max_new_tokens=n_new, do_sample=False)
            asst = T.generate(ids, attention_mask=t.ones_like(ids), max_new_tokens=n_new, do_sample=False,
                              assistant_model=A)
    finally:
        cls.get_candidates, cls.update_candidate_strategy = orig_get, orig_upd
    return plain[0, len(prompt):].tolist(), asst[0, len(prompt):].tolist(), rounds


def speculative_simple_check(binary: Path, out: Path, texts=("hello world",
                             "the quick brown fox jumps over the lazy dog and then runs far away into the night"),
                             n_predict: int = 24, log=print) -> list:
    """Runs llama.cpp's own llama-speculative-simple (--spec-type draft-mtp) on the fixture and
    replays its loop with the Llama driver: speculative-simple decodes the prompt without its last
    token, which is the first id_last, and caps each draft at n_predict - generated - 1 (none at
    0). Compares every round's drafts and accepted count with the binary's debug log; returns a
    record per text."""
    import re
    import subprocess
    tgt = TARGET_HF.parent / "model-f32.gguf"
    ll = Llama(tgt, out / "model-f32.gguf")
    L = ll.L
    vocab = L.llama_model_get_vocab(ll.mt)
    eos = {int(L.llama_vocab_eos(vocab))}
    res = []
    for text in texts:
        # llama.cpp's logger is asynchronous and may lose the tail of the log at exit: run until the
        # closing statistics are there
        for _ in range(8):
            r = subprocess.run([str(binary), "-m", str(tgt), "-md", str(out / "model-f32.gguf"), "--spec-type",
                                "draft-mtp", "--spec-draft-n-max", str(K_DRAFT), "-p", text, "-n", str(n_predict),
                                "--temp", "0", "-c", "256", "-t", "2", "-tb", "2", "-ctk", "f32", "-ctv", "f32",
                                "-ctkd", "f32", "-ctvd", "f32", "-fa", "off", "-v"], capture_output=True, check=True)
            txt = r.stderr.decode("utf-8", "replace")
            stats = re.search(r"n_drafted += (\d+).*?n_accept += (\d+)", txt, re.S)
            if stats:
                break
        else:
            raise RuntimeError("llama-speculative-simple's log never came back whole")
        bin_rounds, cur = [], []
        for line in txt.splitlines():
            m = re.search(r"draft candidate +0, pos +(\d+): +(\d+)", line)
            if m:
                cur.append(int(m.group(2)))
            m = re.search(r"accepted (\d+)/(\d+) draft tokens", line)
            if m:
                bin_rounds.append({"drafts": cur[: int(m.group(2))], "accepted": int(m.group(1))})
                cur = []
        buf = (L.llama_token * 512)()
        n = L.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, True, True)
        inp = list(buf[:n])
        ll.reset()
        _, h = ll.target(inp[:-1], 0)
        pend, id_last, n_past, n_pred, rounds = h[-1], inp[-1], len(inp) - 1, 0, []
        while True:
            n_max = max(0, min(256 - n_past - 2, n_predict - n_pred - 1))
            drafts, tok, hh = [], id_last, pend
            for _ in range(K_DRAFT):
                lg, hh = ll.draft_step(tok, hh, n_past)
                tok = int(lg.argmax())
                drafts.append(tok)
            if n_max > 0:
                drafts = drafts[:n_max]
            lg, hrows = ll.target([id_last] + drafts, n_past)
            sel = [int(x) for x in lg.argmax(-1)]
            ids = []
            for i, d in enumerate(drafts):
                ids.append(sel[i])
                if sel[i] != d:
                    break
            else:
                ids.append(sel[len(drafts)])
            rounds.append({"drafts": drafts, "accepted": len(ids) - 1})
            pend = hrows[len(ids) - 1]
            n_past += len(ids)
            n_pred += len(ids)
            ll.seq_rm(n_past)
            id_last = ids[-1]
            if n_pred > n_predict or any(i in eos for i in ids):
                break
        same = rounds == bin_rounds and int(stats.group(1)) == sum(len(r["drafts"]) for r in rounds) \
            and int(stats.group(2)) == sum(r["accepted"] for r in rounds)
        res.append({"text": text, "prompt_ids": inp, "rounds": len(bin_rounds),
                    "accepted": [r["accepted"] for r in bin_rounds], "driver_replay_identical": same})
        log(f"speculative-simple {text[:30]!r}: {len(bin_rounds)} rounds, accepted "
            f"{[r['accepted'] for r in bin_rounds]}; replay with the driver identical: {same}")
        if not same:
            log(f"  binary: {bin_rounds}\n  driver: {rounds}")
    ll.close()
    return res


# --------------------------------------------------------------------------------------------
# checks of the conversion

def gguf_roundtrip(gguf_path: Path, hf_dir: Path) -> dict:
    """Every GGUF tensor equals its HF tensor (names per gguf-py's map for gemma4-assistant);
    rope_freqs is 1 for the rotated pairs of the full layers, 1e30 for the rest."""
    from safetensors.numpy import load_file
    sd = load_file(hf_dir / "model.safetensors")
    arrs, types_ = M.read_gguf_tensors(gguf_path)
    n_layer = json.loads((hf_dir / "config.json").read_text())["text_config"]["num_hidden_layers"]
    tmap = M.gguf.get_tensor_name_map(M.gguf.MODEL_ARCH.GEMMA4_ASSISTANT, n_layer)
    names = {}
    for k, v in sd.items():
        g, _ = M.hf_to_gguf_name(k, "gemma4", tmap)
        if not np.array_equal(arrs[g].reshape(v.shape), v):
            raise AssertionError(f"GGUF {g} != HF {k}")
        names[k] = g
    extra = sorted(set(arrs) - set(names.values()))
    if extra != ["rope_freqs.weight"]:
        raise AssertionError(f"unexpected GGUF tensors {extra}")
    return {"tensors": len(arrs), "hf_to_gguf": names, "types": sorted(set(types_.values())),
            "rope_freqs": [float(np.float32(x)) if x < 1e29 else "1e30" for x in arrs["rope_freqs.weight"]]}


def gguf_metadata(path: Path) -> dict:
    r = M.gguf.GGUFReader(path)
    out = {}
    for name, f in r.fields.items():
        if not name.startswith("gemma4-assistant.") and name != "general.architecture":
            continue
        v = f.contents()
        out[name] = v
    return out


# --------------------------------------------------------------------------------------------

def build(args, log) -> None:
    t = _t()
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    (out / "hf").mkdir(parents=True)
    T = load_target()
    tcfg = json.loads((TARGET_HF / "config.json").read_text())
    W, eos = tcfg["sliding_window"], tcfg["eos_token_id"]
    producers = producer_layers(T)

    A = new_assistant(assistant_config(tcfg))
    init_assistant(A)
    dist = distill(A, T, log)
    A.generation_config.num_assistant_tokens = K_DRAFT
    A.generation_config.num_assistant_tokens_schedule = "constant"
    A.save_pretrained(out / "hf", safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(TARGET_HF / f, out / "hf" / f)
    from transformers import Gemma4AssistantForCausalLM
    A = M._eager(Gemma4AssistantForCausalLM.from_pretrained(out / "hf", dtype=t.float32,
                                                             attn_implementation="eager")).eval()
    acfg = json.loads((out / "hf/config.json").read_text())

    gguf_path = out / "model-f32.gguf"
    M.convert(out / "hf", "f32", gguf_path)
    rt = gguf_roundtrip(gguf_path, out / "hf")
    log(f"GGUF: {rt['tensors']} tensors, all equal to the safetensors")
    ll = Llama(TARGET_HF.parent / "model-f32.gguf", gguf_path)

    prompts = json.loads((FIXTURES / "prompts.json").read_text())
    seqs = {}
    for name, ids in prompts.items():
        with t.no_grad():
            g = T.generate(t.tensor([ids]), attention_mask=t.ones(1, len(ids), dtype=t.long),
                           max_new_tokens=GEN_NEW_TOKENS, do_sample=False)
        seqs[name] = g[0].tolist()

    # (a) draft chains
    chains, L_all, H_all = [], [], []
    cases = [(p, P, "both") for p, P in SHORT_CASES] + \
            [(p, P, rule) for p, P in LONG_CASES for rule in ("llama", "transformers")]
    for name, P, label in cases:
        seq = seqs[name]
        _, h_all, kv_full = target_states(T, seq[:P])
        rule = "transformers" if label == "transformers" else "llama"
        kv = kv_for(kv_full, P, W, rule)
        drafts, logits, hs = hf_chain(A, T, seq[P], h_all[P - 1], P, kv)
        entry = {"prompt": name, "P": P, "rule": rule, "rules_agree": label == "both", "tokens": seq[:P + 1],
                 "id_last": seq[P], "step_inputs": [seq[P]] + drafts[:-1], "drafts": drafts,
                 "visible_rows": {"full_attention": [0, P - 1],
                                  "sliding_attention": [P - kv["sliding_attention"][0].shape[1], P - 1]
                                  if label != "transformers" else [max(0, P - W - 1), P - 1]},
                 "top2_margin": [round(float(np.diff(np.sort(lg.numpy())[-2:])[0]), 4) for lg in logits]}
        if label == "both":  # the same chain with the full sliding tensor (transformers' own rule)
            d2, l2, _ = hf_chain(A, T, seq[P], h_all[P - 1], P, kv_for(kv_full, P, W, "transformers"))
            assert d2 == drafts and all(t.equal(a, b) for a, b in zip(l2, logits)), (name, P)
        # llama.cpp: its own target run over the same tokens, its own h and K/V
        ll.reset()
        _, lh = ll.target(seq[:P], 0)
        tok, h = seq[P], lh[P - 1]
        ldr, lerr, herr, llog = [], [], [], []
        for s in range(K_DRAFT):
            lg, h = ll.draft_step(tok, h, P)
            tok = int(lg.argmax())
            ldr.append(tok)
            llog.append(lg)
            lerr.append(float(f"{M.rel_l2(lg, logits[s].numpy()):.2e}"))
            herr.append(float(f"{M.rel_l2(h, hs[s + 1].numpy()):.2e}"))
        entry["llama_cpp"] = {"drafts": ldr, "same_drafts": ldr == drafts,
                              "h_in_rel_l2": float(f"{M.rel_l2(lh[P - 1], h_all[P - 1].numpy()):.2e}"),
                              "logits_rel_l2": lerr, "h_next_rel_l2": herr}
        if rule == "llama":  # the same chain in transformers with ggml's GELU (target and assistant)
            with ggml_gelu():
                _, gh, gkv = target_states(T, seq[:P])
                _, glog, _ = hf_chain(A, T, seq[P], gh[P - 1], P, kv_for(gkv, P, W, "llama"))
            entry["llama_cpp"]["logits_rel_l2_vs_transformers_with_ggml_gelu"] = [
                float(f"{M.rel_l2(a, b.numpy()):.2e}") for a, b in zip(llog, glog)]
        chains.append(entry)
        L_all.append(t.stack(logits).numpy().astype(np.float32))
        H_all.append(t.stack(hs).numpy().astype(np.float32))
        log(f"chain {name} P={P:2d} {label:12s} drafts {drafts}  llama.cpp {ldr}  "
            f"logits rel L2 {max(lerr):.1e}")
    np.save(out / "chain-logits.npy", np.stack(L_all))
    np.save(out / "chain-h.npy", np.stack(H_all))
    chains_doc = {
        "about": "Draft chains of k=4 steps from transformers' Gemma4AssistantForCausalLM; see README.md.",
        "k": K_DRAFT, "sliding_window": W, "vocab": tcfg["vocab_size"], "target_hidden": tcfg["hidden_size"],
        "kv_sources": {str(i): {"type": kind, "target_layer": producers[kind]}
                       for i, kind in enumerate(acfg["text_config"]["layer_types"])},
        "arrays": {"chain-logits.npy": "float32 [n_chains, k, vocab]: logits of step s (tied head, no softcap)",
                   "chain-h.npy": "float32 [n_chains, k+1, target_hidden]: row 0 = the target's post-final-norm "
                                  "h at row P-1 (step 0's input), row s+1 = h_next of step s (step s+1's input)"},
        "chains": chains,
    }
    (out / "chains.json").write_text(M.dump_json(chains_doc))

    # (b, c) loops
    loops = []
    for name, ids in prompts.items():
        plain, asst, hrounds = hf_generate(T, A, ids, GEN_NEW_TOKENS)
        ctoks, crounds = clean_loop(T, A, ids, GEN_NEW_TOKENS)
        ltoks, lrounds = llama_loop(ll, ids, GEN_NEW_TOKENS, eos)
        # the clean drafts for each of transformers' rounds (same P, id_last; clean h and K/V)
        for r in hrounds:
            h_hf = r.pop("_h")
            if not r["drafts"]:
                continue
            seq = (ids + asst)[: r["P"]]
            _, h_all, kv_full = target_states(T, seq)
            cd = hf_chain(A, T, r["id_last"], h_all[-1], r["P"], kv_for(kv_full, r["P"], W, "llama"),
                          len(r["drafts"]))[0]
            r["clean_drafts"] = cd
            r["h_rel_l2_vs_clean"] = float(f"{M.rel_l2(h_hf.numpy(), h_all[-1].numpy()):.1e}")
            r["same_as_clean"] = cd == r["drafts"]
            r["input_differences"] = (["stale"] if r["kv_rows"]["full"] > r["P"] else []) + \
                (["window"] if r["P"] > W - 1 else [])
            if not r["input_differences"] and not r["same_as_clean"]:
                raise AssertionError(f"{name} P={r['P']}: transformers' drafts differ from clean ones unexplained")
        entry = {
            "prompt": name, "prompt_ids": ids, "max_new_tokens": GEN_NEW_TOKENS, "greedy": plain,
            "transformers_generate": {"tokens": asst, "equals_greedy": asst == plain, "rounds": hrounds},
            "clean": {"tokens": ctoks, "equals_greedy": ctoks == plain, "rounds": crounds},
            "llama_cpp": {"tokens": ltoks, "equals_greedy": ltoks == plain, "rounds": lrounds,
                          "rounds_equal_clean": lrounds == crounds},
        }
        loops.append(entry)
        acc = lambda rs: sum(r["accepted"] for r in rs)  # noqa: E731
        log(f"loop {name}: greedy==transformers {asst == plain}, ==clean {ctoks == plain}, ==llama {ltoks == plain}; "
            f"rounds {len(hrounds)}/{len(crounds)}/{len(lrounds)}, accepted {acc(hrounds)}/{acc(crounds)}/{acc(lrounds)}"
            f" (transformers/clean/llama.cpp); llama.cpp rounds == clean: {lrounds == crounds}")
        if not (asst == plain and ctoks == plain):
            raise AssertionError(f"{name}: speculative output differs from greedy")
    (out / "loops.json").write_text(M.dump_json({"about": "Greedy speculative loops, k=4; see README.md.",
                                                 "k": K_DRAFT, "loops": loops}))

    ll.close()
    checks = {"numpy_step": check(out, log), "gguf_roundtrip": {k: v for k, v in rt.items() if k != "hf_to_gguf"}}
    if args.speculative_simple:
        checks["speculative_simple"] = speculative_simple_check(args.speculative_simple, out, log=log)
    tools = M.readme.tool_versions(M.LLAMA_SRC, M.LLAMA_PY)
    import safetensors
    tools["safetensors"] = safetensors.__version__
    for f in ("src/models/gemma4-assistant.cpp", "common/speculative.cpp", "src/llama-kv-cache.cpp",
              "gguf-py/gguf/tensor_mapping.py"):
        p = M.LLAMA_SRC / f
        if p.exists():
            tools[f"sha256 {f}"] = M.sha256(p)
    files = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name not in ("assistant.json", "README.md"):
            files[str(p.relative_to(out))] = {"bytes": p.stat().st_size, "sha256": M.sha256(p)}
    meta = {
        "name": "gemma4-assistant", "target": "gemma4-dense/hf", "hf_class": type(A).__name__, "seed": SEED,
        "assistant_sizes": ASSISTANT, "distillation": dict(DISTILL, **dist), "hf_config": acfg,
        "gguf_metadata": gguf_metadata(gguf_path), "hf_to_gguf": rt["hf_to_gguf"],
        "kv_sources": chains_doc["kv_sources"], "checks": checks, "files": files, "tools": tools,
    }
    (out / "assistant.json").write_text(M.dump_json(meta))
    write_readme(out, meta, chains_doc, loops)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"total size of {out}: {size / 1e6:.3f} MB")


def write_readme(out: Path, meta: dict, chains_doc: dict, loops: list) -> None:
    """README.md of the fixture, from the numbers this run produced."""
    c = meta["hf_config"]["text_config"]
    ch = chains_doc["chains"]
    W = c["sliding_window"]
    full_hd = c["per_layer_config"][str(c["layer_types"].index("full_attention"))]["head_dim"]
    dist = meta["distillation"]
    Lw = []
    w = Lw.append
    w("# gemma4-assistant")
    w("")
    w("A tiny Gemma 4 **assistant** (the MTP drafter of Gemma 4: transformers `Gemma4AssistantForCausalLM`,")
    w("llama.cpp architecture `gemma4-assistant`) whose target is `../gemma4-dense` (`hf/` and `model-f32.gguf`),")
    w("with reference drafts from transformers and from llama.cpp. Written by")
    w("`python3 scripts/tiny/make_gemma4_assistant.py`; do not edit by hand. Its weights are random, then briefly")
    w("distilled on the target's greedy outputs so that some drafts are accepted: it tests the mechanics (the draft")
    w("step, reading the target's K/V, the draft/verify loop, acceptance), not drafting quality.")
    w("")
    w("It is not part of the transformers parity set (`../index.json`, `../README.md`), and rlx cannot load the")
    w("`gemma4-assistant` architecture yet: code that walks every folder of `tests/fixtures/tiny` and loads every")
    w("`*.gguf` / `hf/` (e.g. `every_tiny_file` in `crates/rlx-gemma/tests/cuda.rs`) skips folders that hold an `assistant.json`.")
    w("")
    w(f"Size: {sum(v['bytes'] for v in meta['files'].values()) / 1e6:.2f} MB without this README and `assistant.json`.")
    w("")
    w("```")
    w("python3 scripts/tiny/make_gemma4_assistant.py                       # rebuild everything (~2 min, 2 cores)")
    w("python3 scripts/tiny/make_gemma4_assistant.py --check               # NumPy draft step vs the stored chains")
    w("python3 scripts/tiny/make_gemma4_assistant.py --check --speculative-simple PATH/llama-speculative-simple")
    w("```")
    w("")
    w("## The model")
    w("")
    w(f"* Assistant: hidden {c['hidden_size']}, FFN {c['intermediate_size']} (GELU-tanh, gated), "
      f"{c['num_hidden_layers']} layers `{c['layer_types']}`,")
    w(f"  {c['num_attention_heads']} query heads of {c['head_dim']} (sliding) / {full_hd} (full), no K/V projections "
      f"(every layer reads the target's K/V), RMS eps {c['rms_norm_eps']},")
    w(f"  window {W}, vocab {c['vocab_size']}, tied LM head = its own `model.embed_tokens`, no logit softcap, "
      f"`backbone_hidden_size` {meta['hf_config']['backbone_hidden_size']} (the target's hidden),")
    w("  `use_ordered_embeddings` false (no centroid head). `hf/generation_config.json` sets `num_assistant_tokens` 4.")
    w("* Target (`../gemma4-dense`): hidden 32, layers [sliding, sliding, full], sliding 2 KV heads x 32, full 1 KV head")
    w("  x 64 with `attention_k_eq_v`, window 8, final logit softcap 20, no KV sharing.")
    w("* K/V read by each assistant layer: " + "; ".join(
        f"layer {i} ({v['type']}) reads target layer {v['target_layer']}" for i, v in meta["kv_sources"].items())
      + ". transformers' rule: per layer type, the last target layer that computes its own K/V (`kv_sharing_modes`")
    w("  \"store\"); llama.cpp's: sliding layers read target layer n-2, full layers n-1 (after the target's own K/V")
    w("  reuse mapping). Both give layers 1 and 2 here.")
    w(f"* Weights: seeded (seed {meta['seed']}) N(0, 1/fan_in) matrices, N(0, 1/hidden) embedding, U(0.5, 1.5) norms (final x3)")
    w(f"  and `layer_scalar`, then {dist['steps']} Adam steps (lr {dist['lr']}, batch {dist['batch']}) on chains of 4")
    w(f"  teacher-forced draft steps at every position of {dist['n_seq']} greedy continuations (BOS + {dist['prompt_len'] - 1}")
    w(f"  random tokens, {dist['seq_len']} tokens) of the target, llama.cpp's window, cross-entropy against the target's")
    w(f"  greedy token. Per-step accuracy on {dist['heldout_samples']} held-out chains: {dist['heldout_step_accuracy']},")
    w(f"  mean accepted prefix {dist['heldout_mean_accepted']} of 4 (train: {dist['train_step_accuracy']}). The target's greedy")
    w("  text repeats tokens a lot, and the drafter mostly learned to draft one token four times.")
    w("")
    w("Tensors (`hf/model.safetensors`, float32; `model-f32.gguf`, F32, equal element for element, checked on every build):")
    w("")
    w("| HF | GGUF |")
    w("|---|---|")
    for k, v in meta["hf_to_gguf"].items():
        w(f"| `{k}` | `{v}` |")
    w("| (`lm_head.weight`, tied, not saved) | (none: `token_embd` is the output too) |")
    rf = meta["checks"]["gguf_roundtrip"]["rope_freqs"]
    w(f"| (none) | `rope_freqs.weight` [{len(rf)}]: {rf.count(1.0)} x 1.0 then {len(rf) - rf.count(1.0)} x 1e30 (full layers: "
      "proportional RoPE) |")
    w("")
    w("GGUF metadata (`gemma4-assistant.*`): " + ", ".join(
        f"`{k.split('.', 1)[1]}` = {json.dumps(v)}" for k, v in meta["gguf_metadata"].items() if k != "general.architecture")
      + ". `embedding_length_out` is the target's hidden (the width of h); `nextn_predict_layers` = `block_count`.")
    w("")
    w("## One draft step")
    w("")
    w("Inputs: the position `P` of `id_last` (= the number of tokens in the target's cache; the same for every step of")
    w("a round), a token `tok` (step 0: `id_last`, the token the target produced last, not in its cache; step s: the")
    w("draft of step s-1) and `h` (step 0: the target's hidden state after its final norm, i.e. the LM head's input")
    w("before softcapping, at row P-1, the row that produced `id_last`; step s: `h_next` of step s-1); and the target's")
    w("cached K/V (as stored: K normed and RoPE'd, V normed) of positions 0..P-1 of the two layers above.")
    w("")
    w("```")
    w("x = pre_projection @ concat(E_target[tok] * sqrt(32), h)        # target's embedding table; [48 x 64]")
    w("per layer: a = RMS(x) * input_layernorm;  q = q_proj @ a -> [4 heads, d];  q = RMS_per_head(q) * q_norm")
    w("           q = RoPE-NEOX(q, position P)   # sliding: theta 1e4 on all d; full: theta 1e6, first d/8 pairs only")
    w("           o = softmax(q . K^T) V          # scale 1.0, GQA, keys: full 0..P-1; sliding: see the window below")
    w("           x = x + RMS(o_proj @ o) * post_attention_layernorm")
    w("           m = RMS(x) * pre_feedforward_layernorm;  m = down @ (gelu_tanh(gate @ m) * (up @ m))")
    w("           x = (x + RMS(m) * post_feedforward_layernorm) * layer_scalar")
    w("y = RMS(x) * norm;  logits = embed_tokens @ y  (full vocab, no softcap);  h_next = post_projection @ y")
    w("draft = argmax(logits)")
    w("```")
    w("")
    w(f"**Sliding window.** llama.cpp's mask gives a sliding layer the keys P-W+1..P-1 (W-1 = {W - 1} keys, as if the")
    w(f"query at P had its own key); transformers' assistant keeps the last W+1 = {W + 1} rows of the sliding K/V it is")
    w(f"handed (P-W-1..P-1 when handed rows 0..P-1). The two agree while P <= W-1 = {W - 1}. llama.cpp's rule is the one an")
    w("engine should implement (and the one `rule: \"llama\"` references use): transformers computes it when handed only")
    w("those W-1 rows, which is how these references were made. The step never writes K/V and never advances P.")
    w("")
    w("## Files")
    w("")
    w("```")
    w("hf/                    the checkpoint (config.json with text_config, generation_config.json, model.safetensors)")
    w("                       and the target's tokenizer files (the converter needs tokenizer.json)")
    w("model-f32.gguf         convert_hf_to_gguf.py hf --outtype f32")
    w("chains.json            (a) one entry per draft chain, see below")
    w("chain-logits.npy       float32 [n_chains, 4, 384]   logits of draft step s of chain i")
    w("chain-h.npy            float32 [n_chains, 5, 32]    [i, 0]: the target's h fed to step 0; [i, s+1]: h_next of step s")
    w("loops.json             (b, c) greedy speculative loops on the three prompts of ../prompts.json")
    w("assistant.json         HF config, GGUF metadata, HF -> GGUF names, distillation log, checks, tool versions, sha256")
    w("```")
    w("")
    w("`chains.json`: `kv_sources` (assistant layer -> target layer), and per chain `prompt` (a key of")
    w("`../prompts.json`), `tokens` (token ids 0..P: the prompt, then the target's greedy continuation), `P`, `id_last`")
    w("(= `tokens[P]`), `step_inputs` (the token fed to each step: `id_last`, then the previous drafts), `drafts` (argmax")
    w("of each step), `rule` (`llama`: sliding keys P-W+1..P-1; `transformers`: the module's own W+1 rows),")
    w("`rules_agree` (P <= W-1: both rules give the same keys, and the same logits, checked), `visible_rows` (first and")
    w("last key position per layer type), `top2_margin` (logit gap between the two best tokens), and `llama_cpp`: the")
    w("same chain run by llama.cpp from its own target pass (its drafts; relative L2 of its h input, logits and h_next")
    w("against the stored ones; and of its logits against transformers run with ggml's f16-table GELU). The chain's")
    w("step s reads `chain-logits.npy[i, s]`, `chain-h.npy[i, s]` (its h input) and `chain-h.npy[i, s + 1]`.")
    w("")
    w("`loops.json`: per prompt `greedy` (plain greedy, `max_new_tokens` tokens) and three loops with `tokens`,")
    w("`equals_greedy` and `rounds`: `transformers_generate` (`generate(assistant_model=...)`; its candidate generator")
    w("is wrapped to record each round), `clean` (the same loop with transformers' modules and clean inputs: the")
    w("assistant gets exactly the K/V of 0..P-1 with llama.cpp's window) and `llama_cpp` (libllama driven like")
    w("`common/speculative.cpp`'s draft-mtp with a Gemma 4 assistant: an MTP context with `ctx_other` = the target,")
    w("rejected cells removed before drafting). A round is `P` (position of `id_last`), `id_last`, `drafts`,")
    w("`accepted` (drafts kept; the target's next token is always kept too). The loop: prefill the prompt, the target's")
    w("first greedy token is `id_last` at P = len(prompt) with h = the last prompt row; each round drafts")
    w("min(4, max_len - len - 1) tokens (0: a plain target step), verifies `[id_last, d1..dk]` at P..P+k, keeps the")
    w("matching prefix and the target's token after it, and continues with h = the target's row of the last kept draft")
    w("(or of `id_last`), P += accepted + 1; kept tokens are cut at max_len and at EOS, as transformers does.")
    w("`transformers_generate` rounds also hold `kv_rows` (K/V rows transformers handed the assistant: full,")
    w("sliding), `clean_drafts` (what the clean rule drafts from the same P and `id_last`), `same_as_clean`,")
    w("`h_rel_l2_vs_clean` and `input_differences` (`stale`: the full-layer K/V include the row at P itself, left by a")
    w("rejected draft of the previous verification, and the sliding K/V include all rejected drafts' rows;")
    w("`window`: P > W-1).")
    w("")
    w("## What agrees")
    w("")
    w(f"* NumPy draft step (`--check`, float64 from the safetensors, target K/V from transformers) vs the stored")
    w(f"  chains: worst relative L2 {meta['checks']['numpy_step']['logits_rel_l2']:.1e} (logits), "
      f"{meta['checks']['numpy_step']['h_next_rel_l2']:.1e} (h_next), every argmax equal.")
    w("* Draft chains (drafts by transformers, by llama.cpp from its own target pass; relative L2 of llama.cpp's logits")
    w("  against the stored ones and against transformers with ggml's GELU, worst step):")
    w("")
    w("| prompt | P | rule | sliding keys | id_last | drafts | llama.cpp drafts | rel L2 | rel L2, ggml GELU |")
    w("|---|---|---|---|---|---|---|---|---|")
    for x in ch:
        ll = x["llama_cpp"]
        g = ll.get("logits_rel_l2_vs_transformers_with_ggml_gelu")
        w(f"| {x['prompt']} | {x['P']} | {x['rule']}{' (= both)' if x['rules_agree'] else ''} | "
          f"{x['visible_rows']['sliding_attention'][0]}..{x['visible_rows']['sliding_attention'][1]} | {x['id_last']} | "
          f"{x['drafts']} | {ll['drafts']} | {max(ll['logits_rel_l2']):.1e} | {max(g):.1e} |" if g else
          f"| {x['prompt']} | {x['P']} | {x['rule']} | "
          f"{x['visible_rows']['sliding_attention'][0]}..{x['visible_rows']['sliding_attention'][1]} | {x['id_last']} | "
          f"{x['drafts']} | {ll['drafts']} | {max(ll['logits_rel_l2']):.1e} (other rule) | - |")
    w("")
    w("  llama.cpp's distance from transformers (~1e-4) is its f16-table GELU, in the target (h, K/V) and in the")
    w("  assistant: with that GELU emulated in transformers it shrinks to the last column. The `transformers` rows show")
    w("  the window difference (same inputs, other keys); llama.cpp follows the `llama` rows.")
    w("* Speculative loops (accepted drafts per round):")
    w("")
    w("| prompt | loop | equals greedy | rounds | accepted per round |")
    w("|---|---|---|---|---|")
    for e in loops:
        for key in ("transformers_generate", "clean", "llama_cpp"):
            r = e[key]["rounds"]
            w(f"| {e['prompt']} ({len(e['prompt_ids'])} tokens) | {key} | {e[key]['equals_greedy']} | {len(r)} | "
              f"{[x['accepted'] for x in r]} |")
    w("")
    same = all(e["llama_cpp"]["rounds_equal_clean"] for e in loops)
    w(f"  llama.cpp's rounds (drafts and accepted counts) {'equal' if same else 'do NOT all equal'} the clean loop's on "
      f"every prompt. transformers' generate")
    n_r = sum(1 for e in loops for r in e["transformers_generate"]["rounds"] if r["drafts"])
    n_d = sum(1 for e in loops for r in e["transformers_generate"]["rounds"] if r["drafts"] and not r["same_as_clean"])
    n_s = sum(1 for e in loops for r in e["transformers_generate"]["rounds"] if "stale" in r.get("input_differences", []))
    n_w = sum(1 for e in loops for r in e["transformers_generate"]["rounds"] if "window" in r.get("input_differences", []))
    w(f"  drafts differently in {n_d} of its {n_r} drafting rounds: {n_s} rounds had stale K/V rows of rejected drafts,")
    w(f"  {n_w} had P > W-1; every round with neither drafts exactly the clean drafts. So its accepted counts are not")
    w("  a reference for an engine that removes rejected drafts (as llama.cpp and rlx do); `clean` / `llama_cpp` are.")
    w("  Every loop's output equals plain greedy (greedy speculative decoding is lossless).")
    if "speculative_simple" in meta["checks"]:
        w("* llama.cpp's own `llama-speculative-simple --spec-type draft-mtp` (F32 caches, no flash attention) on two")
        w("  text prompts, replayed by the libllama driver of the script (speculative-simple's variant of the loop: the")
        w("  prompt's last token is the first `id_last`): " + "; ".join(
            f"{r['text'][:24]!r}.. {r['rounds']} rounds, accepted {r['accepted']}, "
            f"{'identical' if r['driver_replay_identical'] else 'DIFFERENT'}" for r in meta["checks"]["speculative_simple"])
          + ".")
    w("")
    w("## Tool versions")
    w("")
    w("```")
    for k, v in meta["tools"].items():
        w(f"{k}: {v}")
    w("```")
    w("")
    w("transformers 5.23.0 cannot build any assistant (`kv_sharing_modes` raises for an all-shared config); 5.24.0 can.")
    w("The llama.cpp tree is the one vendored in the llama-cpp-python 0.3.36 sdist (`~/.cache/llama.cpp-ref/src`,")
    w("built there with `gemma4-assistant`); it has no git metadata, hence the file hashes above.")
    (out / "README.md").write_text("\n".join(Lw) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--speculative-simple", type=Path, metavar="BINARY",
                    help="also cross-check the llama.cpp driver with a built llama-speculative-simple "
                         "(recorded in assistant.json and README.md; with --check: only the checks)")
    ap.add_argument("--check", action="store_true",
                    help="only recompute the stored chains with the NumPy draft step and compare")
    args = ap.parse_args()
    if args.check:
        check(args.out)
        if args.speculative_simple:
            res = speculative_simple_check(args.speculative_simple, args.out)
            return 0 if all(r["driver_replay_identical"] for r in res) else 1
        return 0
    build(args, lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
