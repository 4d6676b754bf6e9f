#!/usr/bin/env python3
"""llama.cpp's token ids for every corpus string, the reference the Rust tests match exactly.

    PYTHONPATH=/root/.cache/llama.cpp-ref/llama_cpp_python-0.3.36 \
    LLAMA_CPP_LIB_PATH=/root/.cache/llama.cpp-ref/src/build/bin \
    python3 scripts/tokenizer/reference_ids.py --model ~/.cache/rlx/models/gemma-3-270m-q4_k_m.gguf \
        --out tests/fixtures/tokenizer/gemma3-270m.jsonl

Each output line: {"name", "bos_plain": ids with add_bos and special parsing off,
"bos_special": add_bos with parsing on, "plain": no BOS, parsing off}. With --pieces, a second
file holds llama_token_to_piece for a sample of ids (every token that is neither normal nor
plain control, 500 control ones and a seeded sample of normal ones), base64, with special rendering off and on.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import random
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer" / "corpus.jsonl"


def load_corpus(path: Path) -> list[tuple[str, bytes]]:
    rows = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line:
            continue
        r = json.loads(line)
        data = base64.b64decode(r["b64"]) if r.get("invalid_utf8") else r["text"].encode("utf-8")
        rows.append((r["name"], data))
    return rows


def crashes_llama_bpe(data: bytes) -> bool:
    """True when llama.cpp's BPE pre-split would abort the process on this input: its lenient
    UTF-8 decoder accepts F4..F7 sequences above U+10FFFF, and re-encoding them throws."""
    i = 0
    while i < len(data):
        b = data[i]
        cont = lambda k: i + k < len(data) and data[i + k] & 0xC0 == 0x80
        if b & 0xF8 == 0xF0 and cont(1) and cont(2) and cont(3):
            cpt = ((b & 7) << 18) | ((data[i + 1] & 0x3F) << 12) | ((data[i + 2] & 0x3F) << 6) | (data[i + 3] & 0x3F)
            if cpt > 0x10FFFF:
                return True
            i += 4
        elif b & 0xE0 == 0xC0 and cont(1):
            i += 2
        elif b & 0xF0 == 0xE0 and cont(1) and cont(2):
            i += 3
        else:
            i += 1
    return False


def vocab_fnv1a64(pieces: list[bytes]) -> str:
    """FNV-1a over every piece followed by a NUL; the Rust tests recompute it to notice a
    model file that changed since the references were taken."""
    h = 0xcbf29ce484222325
    for p in pieces:
        for b in p + b"\0":
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def token_to_piece(vocab, tok: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, special)
    return buf.raw[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=str(CORPUS))
    ap.add_argument("--pieces", help="also write token_to_piece references here")
    ap.add_argument("--normal-sample", type=int, default=2000)
    ap.add_argument("--variants", default="bos_plain,bos_special,plain")
    args = ap.parse_args()

    model = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = load_corpus(Path(args.corpus))
    variants = {
        "bos_plain": dict(add_bos=True, special=False),
        "bos_special": dict(add_bos=True, special=True),
        "plain": dict(add_bos=False, special=False),
    }
    wanted = args.variants.split(",")
    is_bpe = llama_cpp.llama_vocab_type(llama_cpp.llama_model_get_vocab(model._model.model)) == llama_cpp.LLAMA_VOCAB_TYPE_BPE
    with out.open("w") as f:
        for name, data in rows:
            rec = {"name": name}
            if is_bpe and crashes_llama_bpe(data):
                rec["llama_cpp_aborts"] = True
            else:
                for v in wanted:
                    rec[v] = model.tokenize(data, **variants[v])
            f.write(json.dumps(rec) + "\n")
    print(f"wrote {len(rows)} references to {out}")

    if args.pieces:
        vocab = llama_cpp.llama_model_get_vocab(model._model.model)
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        attrs = [llama_cpp.llama_vocab_get_attr(vocab, t) for t in range(n)]
        normal = [t for t in range(n) if attrs[t] == 4]
        control = [t for t in range(n) if attrs[t] in (8, 10)]  # 10: control + unused
        other = [t for t in range(n) if attrs[t] not in (4, 8, 10)]
        rng = random.Random(7)
        sample = sorted(
            other
            + control[:200]
            + rng.sample(control[200:], min(300, max(0, len(control) - 200)))
            + rng.sample(normal, min(args.normal_sample, len(normal)))
        )
        eog = [t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        texts = [llama_cpp.llama_vocab_get_text(vocab, t) for t in range(n)]
        with Path(args.pieces).open("w") as f:
            f.write(json.dumps({
                "model": Path(args.model).name,
                "vocab_fnv1a64": vocab_fnv1a64(texts),
                "n_tokens": n,
                "bos": llama_cpp.llama_vocab_bos(vocab),
                "eos": llama_cpp.llama_vocab_eos(vocab),
                "eot": llama_cpp.llama_vocab_eot(vocab),
                "eog": eog,
            }) + "\n")
            for t in sample:
                f.write(json.dumps({
                    "id": t,
                    "plain": base64.b64encode(token_to_piece(vocab, t, False)).decode(),
                    "special": base64.b64encode(token_to_piece(vocab, t, True)).decode(),
                }) + "\n")
        print(f"wrote {len(sample)} pieces to {args.pieces}")


if __name__ == "__main__":
    main()
