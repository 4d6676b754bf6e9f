#!/usr/bin/env python3
"""A Hugging Face checkpoint (bf16 safetensors, config.json, tokenizer.model
built from the GGUF's vocabulary, tokenizer_config.json) made from a Gemma 3
GGUF file, for benchmarking checkpoint loading and quantize-at-load on a
real-size model where the original checkpoint is not at hand.

    python3 scripts/make-hf-from-gguf.py MODEL.gguf OUT_DIR

Needs torch, transformers, gguf, sentencepiece (with protobuf).
"""

import json
import sys
from pathlib import Path

import numpy as np
import gguf
import torch
from sentencepiece import sentencepiece_model_pb2 as spm_pb
from transformers import Gemma3TextConfig, Gemma3ForCausalLM


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    r = gguf.GGUFReader(src)
    f = r.fields

    def val(k):
        fl = f[k]
        return fl.parts[fl.data[0]].tolist()[0] if fl.types[0] != gguf.GGUFValueType.STRING \
            else bytes(fl.parts[fl.data[0]]).decode()

    def arr(k, text=False):
        fl = f[k]
        return [bytes(fl.parts[i]).decode() if text else fl.parts[i].tolist()[0] for i in fl.data]

    assert val("general.architecture") == "gemma3"
    tokens = arr("tokenizer.ggml.tokens", True)
    n_layer = val("gemma3.block_count")
    cfg = Gemma3TextConfig(
        vocab_size=len(tokens), hidden_size=val("gemma3.embedding_length"),
        intermediate_size=val("gemma3.feed_forward_length"), num_hidden_layers=n_layer,
        num_attention_heads=val("gemma3.attention.head_count"),
        num_key_value_heads=val("gemma3.attention.head_count_kv"),
        head_dim=val("gemma3.attention.key_length"),
        query_pre_attn_scalar=val("gemma3.attention.key_length"),
        max_position_embeddings=val("gemma3.context_length"),
        rms_norm_eps=val("gemma3.attention.layer_norm_rms_epsilon"),
        sliding_window=val("gemma3.attention.sliding_window"),
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                     for i in range(n_layer)],
        rope_parameters={"full_attention": {"rope_type": "default",
                                            "rope_theta": val("gemma3.rope.freq_base")},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )
    with torch.device("meta"):
        model = Gemma3ForCausalLM(cfg)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, n_layer)
    tensors = {t.name: t for t in r.tensors}
    sd = {}
    for name in model.state_dict():
        if name == "lm_head.weight":
            continue
        g = tmap.get_name(name, try_suffixes=(".weight",))
        t = tensors[g]
        a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        a = a.reshape([int(x) for x in reversed(t.shape)])
        if name.endswith("norm.weight"):
            a = a - np.float32(1.0)
        sd[name] = torch.from_numpy(a.copy()).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    cfg.dtype = "bfloat16"
    cfg.architectures = ["Gemma3ForCausalLM"]
    (out / "config.json").write_text(cfg.to_json_string())
    m = spm_pb.ModelProto()
    scores, types = arr("tokenizer.ggml.scores"), arr("tokenizer.ggml.token_type")
    for text, score, kind in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece, p.score, p.type = text, score, kind
    m.trainer_spec.model_type = spm_pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.normalizer_spec.add_dummy_prefix = False
    (out / "tokenizer.model").write_bytes(m.SerializeToString())
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>",
        "eos_token": "<eos>", "pad_token": "<pad>"}, indent=2))
    print(out)


if __name__ == "__main__":
    main()
