"""The tiny models: HF configs and what to build for each.

Sizes are chosen so that all of tests/fixtures/tiny stays around 12 MB:
  * the "*-q" model has hidden 256 so every K-quant block fits (ne[0] % 256 == 0) and carries
    the full quantization matrix;
  * the architecture models have hidden 32 (block-32 types only: Q8_0, Q4_0, IQ4_NL fit), which
    keeps them at 0.1-0.6 MB of f32 (gemma3n: its per-layer table is V x 256 x L regardless).
"""

from __future__ import annotations

VOCAB = 384          # SentencePiece vocab; the HF vocab_size equals it
WINDOW = 8           # sliding window for every SWA model
PROMPT_LENS = (5, 12, 20)

ALL_QUANTS = ["Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q2_K", "IQ4_NL"]
BLOCK32_QUANTS = ["Q8_0", "Q4_0", "IQ4_NL"]

_common = dict(
    vocab_size=VOCAB,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
    tie_word_embeddings=True,
    max_position_embeddings=1024,
    attention_bias=False,
)

# Every spec: name, arch (HF model_type family), hf: config kwargs, outtypes: converter output
# types besides f32, quants: llama-quantize types, seed, emb_std: std of the embedding table.
SPECS: list[dict] = [
    dict(
        name="gemma",
        about='Gemma 1: pre-norms only, MQA (H 2 / Hkv 1), head_dim 64 != hidden/H (16), tied head, norm weights stored as 1+w.',
        arch="gemma",
        seed=101,
        hf=dict(_common, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=64,  # hd != d/H, like 7B
                hidden_activation="gelu_pytorch_tanh", hidden_act="gelu_pytorch_tanh",
                rope_theta=10000.0),
        outtypes=["f16", "bf16"],
        quants=["Q8_0"],
    ),
    dict(
        name="gemma2",
        about='Gemma 2: sandwich norms, GQA 4/2 with head_dim 16, layer 0 sliding (window 8) and layer 1 global, attention softcap 10 and final softcap 15 (non-default values, read from the GGUF).',
        arch="gemma2",
        seed=202,
        hf=dict(_common, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                query_pre_attn_scalar=16, sliding_window=WINDOW,
                attn_logit_softcapping=10.0, final_logit_softcapping=15.0,
                hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0),
        init=dict(q_gain=4.0),  # attention scores std ~4, so the softcap of 10 bites
        outtypes=[],
        quants=["Q8_0"],
    ),
    dict(
        name="gemma3",
        about='Gemma 3 (1B-like): QK-norm, GQA 4/2, layers 0-4 sliding (theta 10k), layer 5 global (theta 1M), no softcap.',
        arch="gemma3",
        seed=303,
        hf=dict(_common, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                query_pre_attn_scalar=32, sliding_window=WINDOW,
                # llama.cpp assumes period 6 (layer 5 global) because the converter writes no pattern
                layer_types=["sliding_attention"] * 5 + ["full_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
                hidden_activation="gelu_pytorch_tanh"),
        outtypes=[],
        quants=["Q8_0"],
    ),
    dict(
        name="gemma3-linear8",
        about='Gemma 3 (4B/12B/27B-like): as gemma3 but RoPE linear scaling x8 on the global layer only.',
        arch="gemma3",
        seed=304,
        hf=dict(_common, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                query_pre_attn_scalar=32, sliding_window=WINDOW,
                layer_types=["sliding_attention"] * 5 + ["full_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                    "rope_theta": 1000000.0}},
                hidden_activation="gelu_pytorch_tanh"),
        outtypes=[],
        quants=[],
    ),
    dict(
        # the quantization-matrix model: hidden 256 (one 256-superblock per row), n_ff 512 (two
        # superblocks per ffn_down row), one sliding layer (llama.cpp's period-6 default makes
        # layer 0 local, as HF's layer_types say)
        name="gemma3-q",
        about='Quantization matrix: Gemma 3 with hidden 256, one sliding layer, H 2 / Hkv 1 with head_dim 128, n_ff 512 (two 256-superblocks per ffn_down row).',
        arch="gemma3",
        seed=305,
        hf=dict(_common, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                query_pre_attn_scalar=128, sliding_window=WINDOW,
                layer_types=["sliding_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
                hidden_activation="gelu_pytorch_tanh"),
        init=dict(branch_gain=6.0),
        outtypes=[],
        quants=ALL_QUANTS,
        keep_f32=False,
    ),
    dict(
        name="gemma3n",
        about='Gemma 3n: AltUp (4 streams), LAuReL (rank 64), per-layer embeddings (256 per layer), activation sparsity 0.95 on layers 0-1, KV sharing on layers 2-3 (2 <- 0 sliding, 3 <- 1 global), V-norm, final softcap 30, layers S,G,S,G.',
        arch="gemma3n",
        seed=404,
        hf=dict(_common, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
                final_logit_softcapping=30.0,   # llama.cpp hardcodes 30 for gemma3n
                vocab_size_per_layer_input=VOCAB,
                hidden_size_per_layer_input=256,  # llama.cpp hardcodes 256
                altup_active_idx=0, altup_num_inputs=4, altup_coef_clip=120.0, altup_correct_scale=True,
                laurel_rank=64,                   # llama.cpp hardcodes 64
                num_kv_shared_layers=2,
                activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
                hidden_activation="gelu_pytorch_tanh"),
        init=dict(final_gain=8.0, qk_norm_gain=0.6),  # logits std ~8 so the final softcap (30) bites;
        # attention-score std ~2.5 (3n/4 use no 1/sqrt(hd) scale)
        outtypes=[],
        quants=[],
    ),
    dict(
        # E2B-like: per-layer embeddings, KV sharing, double-wide MLP on shared layers
        name="gemma4-ple",
        about='Gemma 4 E2B-like: per-layer embeddings (32 per layer), KV sharing on layers 2-3 (2 <- 0, 3 <- 1), double-wide MLP on the shared layers (n_ff 64/128 per layer), local head_dim 32 / global 64 with proportional RoPE (partial 0.25), layer_output_scale.',
        arch="gemma4",
        seed=505,
        hf=dict(_common, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1000000.0}},
                final_logit_softcapping=30.0,
                vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=32,
                num_kv_shared_layers=2, use_double_wide_mlp=True,
                attention_k_eq_v=False, enable_moe_block=False,
                hidden_activation="gelu_pytorch_tanh"),
        init=dict(final_gain=8.0, qk_norm_gain=0.6),
        outtypes=[],
        quants=["Q8_0"],
    ),
    dict(
        # 31B-like: different local/global head dims and KV head counts, K = V on global layers
        name="gemma4-dense",
        about='Gemma 4 31B-like: local head_dim 32 / global 64, KV heads 2 local / 1 global (per-layer array), attention_k_eq_v on the global layer (no attn_v), final softcap 20 (not the default 30).',
        arch="gemma4",
        seed=506,
        hf=dict(_common, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
                num_global_key_value_heads=1,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1000000.0}},
                final_logit_softcapping=20.0,  # not the default 30: the key must be read
                hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB,
                num_kv_shared_layers=0, attention_k_eq_v=True, enable_moe_block=False,
                hidden_activation="gelu_pytorch_tanh"),
        init=dict(final_gain=6.0, qk_norm_gain=0.6),
        outtypes=[],
        quants=["Q8_0"],
    ),
    dict(
        # 26B-A4B-like: shared expert + routed experts on every layer, K = V on global layers
        name="gemma4-moe",
        about='Gemma 4 26B-A4B-like: every layer has a shared expert (n_ff 64) plus 4 routed experts (n_ff 32), top-2, router scale and per-expert scale; K = V on the global layer.',
        arch="gemma4",
        seed=507,
        hf=dict(_common, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
                num_global_key_value_heads=1,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "full_attention"],
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1000000.0}},
                final_logit_softcapping=30.0,
                hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB,
                num_kv_shared_layers=0, attention_k_eq_v=True,
                enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                hidden_activation="gelu_pytorch_tanh"),
        init=dict(final_gain=8.0, qk_norm_gain=0.6),
        outtypes=[],
        quants=["Q8_0"],
    ),
]
