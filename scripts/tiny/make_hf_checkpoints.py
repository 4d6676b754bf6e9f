#!/usr/bin/env python3
"""Hugging Face checkpoints of the tiny models, as transformers saves them.

For each tiny model: the transformers model built from its config, loaded with
exactly the weights of its committed model-f32.gguf (the inverse of llama.cpp's
conversion, which make_tiny_models.py checks is exact), checked to give the
committed transformers logits (hf-f32/*.npy) within float32 round-off (another
CPU may sum in another order), then written with
save_pretrained into tests/fixtures/tiny/<name>/hf/ with the tokenizer files
(tokenizer.model, tokenizer.json, tokenizer_config.json with the chat template,
special_tokens_map.json). The tokenizer is retrained with the same seed and
checked against the GGUF's vocabulary.

    python3 scripts/tiny/make_hf_checkpoints.py [--only NAME,...]

Needs torch, transformers, sentencepiece, tokenizers, safetensors, gguf.
"""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_tiny_models as M  # noqa: E402
import specs as S  # noqa: E402
import tiny_tokenizer as T  # noqa: E402

FIXTURES = M.REPO / "tests/fixtures/tiny"
MODELS = ["gemma", "gemma2", "gemma3", "gemma3n", "gemma4-dense", "gemma4-ple", "gemma4-moe"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(MODELS))
    args = ap.parse_args()
    want = args.only.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        spm = T.train_spm(Path(tmp) / "tokenizer", S.VOCAB)
        for spec in S.SPECS:
            name, arch = spec["name"], spec["arch"]
            if name not in want:
                continue
            gguf_path = FIXTURES / name / "model-f32.gguf"
            vocab = M.gguf.GGUFReader(gguf_path).fields["tokenizer.ggml.tokens"]
            pieces = [bytes(vocab.parts[i]).decode() for i in vocab.data]
            import sentencepiece
            sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
            ours = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
            if arch != "gemma4" and ours != pieces:
                raise SystemExit(f"{name}: the retrained tokenizer differs from the GGUF's")
            cfg = M.make_config(spec)
            model = M.new_model(cfg, arch)
            sd = M.gguf_state_dict(gguf_path, model, arch)
            model = M.load_state(model, cfg, arch, sd)
            prompts = M.json.loads((FIXTURES / name / "prompts.json").read_text())
            got = M.hf_logits(model, prompts)
            for k, v in got.items():
                ref = np.load(FIXTURES / name / "hf-f32" / f"{k}.npy")
                rel = float(np.linalg.norm(v - ref) / np.linalg.norm(ref))
                if rel > 1e-5:
                    raise SystemExit(f"{name} {k}: logits differ from the committed ones: rel L2 {rel:.2e}")
                print(f"{name} {k}: rel L2 {rel:.1e} against the committed logits")
            out = FIXTURES / name / "hf"
            if out.exists():
                shutil.rmtree(out)
            model.save_pretrained(out, safe_serialization=True)
            if arch == "gemma3n":
                add_unused_shared_kv_from_gguf(out, model, gguf_path)
            T.write_tokenizer_files(out, spm, S.VOCAB, with_json=True)
            print(f"{name}: {sum(f.stat().st_size for f in out.iterdir()) / 1e6:.2f} MB in {out}")
    return 0


def add_unused_shared_kv_from_gguf(hf_dir: Path, model, gguf_path: Path) -> None:
    """The KV-shared layers' unused K/V weights, which real Gemma 3n checkpoints
    carry and transformers does not build, taken from the GGUF."""
    from safetensors.torch import load_file, save_file
    t = M._torch()
    arrs, _ = M.read_gguf_tensors(gguf_path)
    c = model.config
    f = hf_dir / "model.safetensors"
    sd = load_file(f)
    for i in range(c.num_hidden_layers - c.num_kv_shared_layers, c.num_hidden_layers):
        p = f"model.layers.{i}.self_attn."
        sd[p + "k_proj.weight"] = t.from_numpy(arrs[f"blk.{i}.attn_k.weight"].copy())
        sd[p + "v_proj.weight"] = t.from_numpy(arrs[f"blk.{i}.attn_v.weight"].copy())
        sd[p + "k_norm.weight"] = t.from_numpy(arrs[f"blk.{i}.attn_k_norm.weight"].copy())
    save_file(dict(sorted(sd.items())), f, metadata={"format": "pt"})


if __name__ == "__main__":
    sys.exit(main())
