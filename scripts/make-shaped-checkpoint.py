#!/usr/bin/env python3
"""A Hugging Face checkpoint directory with the shapes of a released Gemma
and no weights: its safetensors shards are headers followed by holes (sparse
files, nothing on disk), so it takes a second and no memory to make even for
26B parameters. It is the input of `random_weights` (an rlx-gemma example),
which writes a GGUF of those tensors with random weights in llama-quantize's
type mix for GPU benchmarks against llama.cpp:

    python3 scripts/make-shaped-checkpoint.py gemma4-26b-a4b /tmp/26b
    random_weights /tmp/26b /tmp/26b-Q4_K_M.gguf --type Q4_K_M

Where transformers is older or missing (a GPU machine), make the directory
here with `--no-holes` (config, tokenizer, index and `shards.json`, a few
MB) and write the holes there with the standard library only:

    python3 scripts/make-shaped-checkpoint.py --holes /tmp/26b

Shapes come from scripts/shapes.json (the text configs of the released
models, with their sources). The tokenizer is the tiny fixtures' (384
pieces) with the vocabulary padded to the model's size: tokens past 384 are
never produced by encoding, which a speed benchmark does not need.

Needs torch and transformers (with Gemma 3n and Gemma 4); builds the model
on the meta device only, to list its tensors.
"""

import json
import shutil
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "tests/fixtures/tiny"
SHARD_BYTES = 4 << 30


def write_holes(out: Path) -> None:
    """The shards `shards.json` lists, each a header and a hole, and a
    `tokenizer.json` padded to the vocabulary `pad_vocab` names."""
    pad = out / "pad_vocab"
    if pad.exists():
        tok = json.loads((out / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        taken = set(vocab.values())
        for i in range(int(pad.read_text())):
            if i not in taken:
                vocab[f"[PAD{i}]"] = i
        (out / "tokenizer.json").write_text(json.dumps(tok))
        pad.unlink()
    for fname, header in json.loads((out / "shards.json").read_text()).items():
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
        with open(out / fname, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.truncate(8 + len(raw) + end)


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--holes"] and len(argv) == 2:
        write_holes(Path(argv[1]))
        return 0
    holes = "--no-holes" not in argv
    argv = [a for a in argv if a != "--no-holes"]
    if len(argv) != 2:
        print(__doc__)
        return 2
    name, out = argv[0], Path(argv[1])
    shapes = json.loads((REPO / "scripts/shapes.json").read_text())
    if name not in shapes or not isinstance(shapes[name], dict) or name == "sources":
        known = [k for k, v in shapes.items() if k.startswith("gemma") and isinstance(v, dict)]
        print(f"unknown shape {name!r}; known: {', '.join(known)}")
        return 2
    import torch
    import transformers as tr

    arch = "gemma3n" if name.startswith("gemma3n") else "gemma4"
    cfg_cls, model_cls, tok_from = {
        "gemma3n": (tr.Gemma3nTextConfig, tr.Gemma3nForCausalLM, "gemma3n"),
        "gemma4": (tr.Gemma4TextConfig, tr.Gemma4ForCausalLM, "gemma4-ple"),
    }[arch]
    cfg = cfg_cls(**shapes[name])
    with torch.device("meta"):
        model = model_cls(cfg)
    tensors = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    if arch == "gemma3n":
        # transformers builds no K/V projections on KV-shared layers, but the
        # released checkpoints carry them (unused) and llama.cpp's loader
        # requires them.
        kv = cfg.num_key_value_heads * cfg.head_dim
        for i in range(cfg.num_hidden_layers - cfg.num_kv_shared_layers, cfg.num_hidden_layers):
            p = f"model.layers.{i}.self_attn."
            tensors.setdefault(p + "k_proj.weight", (kv, cfg.hidden_size))
            tensors.setdefault(p + "v_proj.weight", (kv, cfg.hidden_size))
            tensors.setdefault(p + "k_norm.weight", (cfg.head_dim,))

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # Shards of at most SHARD_BYTES of bf16, each a header and a hole.
    shards, current, size = [], {}, 0
    for k in sorted(tensors):
        n = 2
        for d in tensors[k]:
            n *= d
        if current and size + n > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[k] = (tensors[k], size, size + n)
        size += n
    shards.append(current)
    weight_map, headers = {}, {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header = {"__metadata__": {"format": "pt"}}
        for k, (shape, a, b) in shard.items():
            header[k] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [a, b]}
            weight_map[k] = fname
        headers[fname] = header
    (out / "shards.json").write_text(json.dumps(headers))
    total = sum(b - a for shard in shards for _, a, b in shard.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    config = cfg.to_dict()
    config["architectures"] = [model_cls.__name__]
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=1))

    src = TINY / tok_from / "hf"
    for f in ["tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"]:
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    if arch == "gemma4":
        shutil.copy(src / "tokenizer.json", out / "tokenizer.json")
        (out / "pad_vocab").write_text(str(cfg.vocab_size))
    if holes:
        write_holes(out)
    params = total // 2
    print(f"{name}: {len(tensors)} tensors, {params / 1e9:.2f}B parameters, "
          f"{len(shards)} sparse shards in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
