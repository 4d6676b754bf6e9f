#!/usr/bin/env python3
"""Generate tests/fixtures/quants: ggml block data with llama.cpp's own results.

Usage:
    scripts/make_quant_fixtures.py [--lib libggml-base.so] [--model gemma.gguf] [--out DIR]

The library defaults to $GGML_BASE_LIB, else the llama.cpp reference build in
~/.cache/llama.cpp-ref; the model to $RLX_TEST_MODEL, else the rlx model cache.

Written under --out (default: the repo's tests/fixtures/quants):
  random/<T>.blocks, random/<T>.f32    random blocks with finite scales, and
                                       libggml's dequantize_row_<t> of them
  real/<T>.blocks, real/<T>.f32        rows of the Gemma 3 270M file, same
  real/manifest.json                   which tensor and rows each real file holds
  quantize/<T>.input.f32, <T>.ref      inputs and libggml's quantize_row_<t>_ref

Every dequantization that gguf-py also implements is checked against it bit
for bit; any disagreement is printed and the script exits non-zero (after
writing, since libggml stays the reference).
"""

import argparse
import ctypes
import hashlib
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFReader

REPO = Path(__file__).resolve().parent.parent
DEFAULT_LIB = Path.home() / ".cache/llama.cpp-ref/src/build/bin/libggml-base.so"
DEFAULT_MODEL = Path.home() / ".cache/rlx/models/gemma-3-270m-q4_k_m.gguf"

# name: (ggml type id, elements per block, bytes per block)
TYPES = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q8_1": (9, 32, 36),
    "Q2_K": (10, 256, 84),
    "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "Q8_K": (15, 256, 292),
    "IQ2_XXS": (16, 256, 66),
    "IQ2_XS": (17, 256, 74),
    "IQ3_XXS": (18, 256, 98),
    "IQ1_S": (19, 256, 50),
    "IQ4_NL": (20, 32, 18),
    "IQ3_S": (21, 256, 110),
    "IQ2_S": (22, 256, 82),
    "IQ4_XS": (23, 256, 136),
    "IQ1_M": (29, 256, 56),
    "BF16": (30, 1, 2),
    "TQ1_0": (34, 256, 54),
    "TQ2_0": (35, 256, 66),
    "MXFP4": (39, 32, 17),
    "NVFP4": (40, 64, 36),
    "Q1_0": (41, 128, 18),
    "Q2_0": (42, 64, 18),
}

RANDOM_TYPES = [
    "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
    "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
    "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0",
]

QUANT_TYPES = [
    "Q8_0", "Q8_1", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q8_K", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
]

# Byte offsets of the f16 scale fields (d, dmin, m, s) in each block, from the
# block_* structs in ggml-common.h. Types missing here are handled specially.
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
    "Q8_0": [0], "Q8_1": [0, 2],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2],
    "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0], "IQ2_XXS": [0], "IQ2_XS": [0],
    "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
    "TQ1_0": [52], "TQ2_0": [64], "Q1_0": [0], "Q2_0": [0],
}
IQ1_M_SCALES = 48  # four u16 whose top nibbles form the f16 super-scale

# Scale bit patterns put into the first blocks so that zero, negative zero,
# subnormal and largest scales are covered, not only the random range.
EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0x3C00]
EDGE_F32 = [0.0, -0.0, 1e-45, -1.1754942e-38, 3.0e30, 1.0]
EDGE_E8M0 = [0, 1, 2, 127, 128, 200]  # 0 and 1 take ggml's denormal path

# Random fixtures: 12 super-blocks, or 1536 elements of the smaller block
# types, 1024 of F16/BF16; enough to hit every code path, small enough to ship.
QUANT_ELEMS = 3072
SEED = 0x5EED_0F_6E


def rng_for(kind: str, name: str) -> np.random.Generator:
    # Per-type streams, so adding a type never changes another's fixture.
    return np.random.default_rng([SEED, zlib.crc32(f"{kind}/{name}".encode())])


def random_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    mag = 10.0 ** rng.uniform(-4.0, 1.0, n)
    sign = rng.choice([-1.0, 1.0], n)
    return (mag * sign).astype(np.float16).view(np.uint16)


def random_blocks(name: str) -> bytes:
    _, be, bb = TYPES[name]
    rng = rng_for("random", name)
    if be == 1:
        n = 1024
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        exp_mask = 0x7C00 if name == "F16" else 0x7F80
        bad = (bits & exp_mask) == exp_mask
        while bad.any():  # redraw NaN/Inf patterns
            bits[bad] = rng.integers(0, 1 << 16, int(bad.sum()), dtype=np.uint16)
            bad = (bits & exp_mask) == exp_mask
        return bits.astype("<u2").tobytes()

    nb = 12 if be == 256 else 1536 // be
    blk = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
    ne = min(len(EDGE_F16), nb)

    def put_u16(col: int, vals: np.ndarray) -> None:
        v = vals.astype("<u2").view(np.uint8).reshape(nb, 2)
        blk[:, col:col + 2] = v

    if name in F16_FIELDS:
        for off in F16_FIELDS[name]:
            v = random_f16_bits(rng, nb)
            v[:ne] = EDGE_F16[:ne]
            put_u16(off, v)
    elif name == "Q8_K":
        d = (10.0 ** rng.uniform(-4.0, 1.0, nb) * rng.choice([-1.0, 1.0], nb)).astype(np.float32)
        d[:ne] = EDGE_F32[:ne]
        blk[:, 0:4] = d.astype("<f4").view(np.uint8).reshape(nb, 4)
    elif name == "IQ1_M":
        d = random_f16_bits(rng, nb)
        d[:ne] = EDGE_F16[:ne]
        for k in range(4):
            hi = ((d >> (4 * k)) & 0xF).astype(np.uint8)
            col = IQ1_M_SCALES + 2 * k + 1  # high byte of u16 k
            blk[:, col] = (blk[:, col] & 0x0F) | (hi << 4)
    elif name == "MXFP4":
        e = rng.integers(110, 141, nb, dtype=np.uint8)
        e[:ne] = EDGE_E8M0[:ne]
        blk[:, 0] = e
    elif name == "NVFP4":
        s = blk[:, 0:4]
        bad = (s == 0x7F) | (s == 0xFF)
        while bad.any():
            s[bad] = rng.integers(0, 256, int(bad.sum()), dtype=np.uint8)
            bad = (s == 0x7F) | (s == 0xFF)
    else:
        raise AssertionError(f"no scale layout for {name}")
    return blk.tobytes()


class Ggml:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.ggml_type_size.restype = ctypes.c_size_t
        self.lib.ggml_type_size.argtypes = [ctypes.c_int]
        self.lib.ggml_blck_size.restype = ctypes.c_int64
        self.lib.ggml_blck_size.argtypes = [ctypes.c_int]
        for name, (tid, be, bb) in TYPES.items():
            got = (self.lib.ggml_blck_size(tid), self.lib.ggml_type_size(tid))
            if got != (be, bb):
                sys.exit(f"{name}: libggml says block {got}, script table says {(be, bb)}")

    def fn(self, symbol: str):
        f = getattr(self.lib, symbol)
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        f.restype = None
        return f

    def dequantize(self, name: str, data: bytes) -> np.ndarray:
        _, be, bb = TYPES[name]
        assert len(data) % bb == 0
        n = len(data) // bb * be
        if name == "F32":
            return np.frombuffer(data, "<f4").astype(np.float32)
        if name == "Q8_1":
            # ggml has no dequantize_row_q8_1 (Q8_1 is an activation format):
            # x = d * qs in f32, one rounding, which is what a decoder must do.
            b = np.frombuffer(data, np.uint8).reshape(-1, bb)
            d = b[:, 0:2].copy().view("<f2").astype(np.float32)
            q = b[:, 4:].view(np.int8).astype(np.float32)
            return (d * q).reshape(-1).astype(np.float32)
        if name == "F16":
            f = self.fn("ggml_fp16_to_fp32_row")
        elif name == "BF16":
            f = self.fn("ggml_bf16_to_fp32_row")
        else:
            f = self.fn("dequantize_row_" + c_suffix(name))
        src = np.frombuffer(data, np.uint8).copy()
        out = np.empty(n, np.float32)
        f(src.ctypes.data, out.ctypes.data, n)
        return out

    def quantize(self, name: str, x: np.ndarray) -> bytes:
        _, be, bb = TYPES[name]
        assert x.dtype == np.float32 and x.size % be == 0
        out = np.zeros(x.size // be * bb, np.uint8)
        self.fn(f"quantize_row_{c_suffix(name)}_ref")(x.ctypes.data, out.ctypes.data, x.size)
        return out.tobytes()


def c_suffix(name: str) -> str:
    # ggml's function names keep the K upper case: dequantize_row_q4_K.
    s = name.lower()
    return s[:-2] + "_K" if s.endswith("_k") else s


def check_gguf_py(label: str, name: str, data: bytes, ref: np.ndarray, problems: list) -> str:
    qt = getattr(gguf.GGMLQuantizationType, name, None)
    if qt is None:
        return "not in gguf-py"
    try:
        got = gguf.quants.dequantize(np.frombuffer(data, np.uint8), qt)
    except NotImplementedError:
        return "no gguf-py dequantizer"
    got = np.asarray(got).reshape(-1)
    if got.dtype != np.float32 or got.size != ref.size:
        problems.append(f"{label}: gguf-py gave {got.dtype} x {got.size}, libggml float32 x {ref.size}")
        return "MISMATCH"
    bad = np.flatnonzero(got.view(np.uint32) != ref.view(np.uint32))
    if bad.size:
        i = int(bad[0])
        problems.append(
            f"{label}: gguf-py differs from libggml at {bad.size} of {ref.size} values; "
            f"first at {i}: gguf-py {got[i]!r} ({got.view(np.uint32)[i]:#010x}) "
            f"libggml {ref[i]!r} ({ref.view(np.uint32)[i]:#010x})"
        )
        return "MISMATCH"
    return "gguf-py agrees"


def quant_input(name: str) -> np.ndarray:
    rng = rng_for("quantize", name)
    c = 256
    chunks = [
        rng.normal(0.0, 1.0, c),
        rng.normal(0.0, 0.02, c),  # weight-like
        rng.uniform(-1.0, 1.0, c),
        rng.uniform(0.0, 5.0, c),  # all positive: exercises the min paths
        rng.integers(-16, 17, c) * 0.25,  # exact ties after scaling
        rng.integers(-8, 8, c).astype(np.float64),
        np.zeros(c),
        rng.normal(0.0, 1.0, c),  # gets one huge outlier below
        rng.normal(0.0, 1e-6, c),  # tiny: f16 scales near underflow
        rng.normal(0.0, 1e-9, c) * (rng.uniform(0, 1, c) < 0.5),
        rng.standard_t(3, c) * 10.0,  # heavy tails
        np.repeat(10.0 ** rng.uniform(-3, 2, c // 32), 32) * rng.normal(0.0, 1.0, c),  # per-sub-block magnitude
    ]
    chunks[7][rng.integers(0, c)] = 1e4
    x = np.concatenate(chunks).astype(np.float32)
    assert x.size == QUANT_ELEMS and x.size % 256 == 0
    return x


def clear(d: Path, patterns) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for p in patterns:
        for f in d.glob(p):
            f.unlink()


def f32_bytes(a: np.ndarray) -> bytes:
    return np.asarray(a, np.float32).astype("<f4").tobytes()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, default=Path(os.environ.get("GGML_BASE_LIB", DEFAULT_LIB)))
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("RLX_TEST_MODEL", DEFAULT_MODEL)))
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/quants")
    args = ap.parse_args()

    ggml = Ggml(args.lib)
    problems: list[str] = []

    rdir = args.out / "random"
    clear(rdir, ["*.blocks", "*.f32"])
    for name in RANDOM_TYPES:
        data = random_blocks(name)
        ref = ggml.dequantize(name, data)
        if not np.isfinite(ref).all():
            problems.append(f"random/{name}: libggml produced non-finite values")
        (rdir / f"{name}.blocks").write_bytes(data)
        (rdir / f"{name}.f32").write_bytes(f32_bytes(ref))
        print(f"random/{name}: {ref.size} values; {check_gguf_py('random/' + name, name, data, ref, problems)}")

    # Real rows: token_embd is the one Q8_0 tensor with many rows, so take two
    # far apart; elsewhere the first two rows of the first tensor of the type.
    reader = GGUFReader(args.model)
    xdir = args.out / "real"
    clear(xdir, ["*.blocks", "*.f32", "manifest.json"])
    entries = []
    by_type: dict[str, list] = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type.name, []).append(t)
    for name, tensors in by_type.items():
        pick = {"Q8_0": ("token_embd.weight", [0, 1000])}.get(name)
        t = next(t for t in tensors if t.name == pick[0]) if pick else tensors[0]
        rows_wanted = pick[1] if pick else [0, 1]
        _, be, bb = TYPES[name]
        ne0 = int(t.shape[0])
        n_rows = int(np.prod([int(s) for s in t.shape[1:]], dtype=np.int64)) if len(t.shape) > 1 else 1
        rows = [r for r in rows_wanted if r < n_rows]  # the F32 tensors here are 1-D
        row_bytes = ne0 // be * bb
        raw = reader.data[t.data_offset:t.data_offset + t.n_bytes]
        data = b"".join(bytes(raw[r * row_bytes:(r + 1) * row_bytes]) for r in rows)
        ref = ggml.dequantize(name, data)
        (xdir / f"{name}.blocks").write_bytes(data)
        (xdir / f"{name}.f32").write_bytes(f32_bytes(ref))
        entries.append({"type": name, "tensor": t.name, "dims": [int(s) for s in t.shape],
                        "rows": rows, "row_elems": ne0, "row_bytes": row_bytes})
        print(f"real/{name}: {t.name} rows {rows}; {check_gguf_py('real/' + name, name, data, ref, problems)}")
    sha = hashlib.sha256()
    with open(args.model, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            sha.update(chunk)
    # One entry per line keeps the manifest readable and its diffs small.
    lines = ",\n".join("    " + json.dumps(e) for e in entries)
    head = f'{{\n  "model": {json.dumps(args.model.name)},\n  "sha256": "{sha.hexdigest()}",\n'
    (xdir / "manifest.json").write_text(head + f'  "entries": [\n{lines}\n  ]\n}}\n')

    qdir = args.out / "quantize"
    clear(qdir, ["*.input.f32", "*.ref"])
    for name in QUANT_TYPES:
        x = quant_input(name)
        (qdir / f"{name}.input.f32").write_bytes(f32_bytes(x))
        (qdir / f"{name}.ref").write_bytes(ggml.quantize(name, x))
        print(f"quantize/{name}: {x.size} values")

    total = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"total fixture size: {total} bytes")
    if problems:
        print("\nDISAGREEMENTS (fixtures written from libggml regardless):", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
