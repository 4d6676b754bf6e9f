#!/usr/bin/env python3
"""Decode products (`mmv*` in kernels.cu) alone on a GPU, with CuPy: each
kernel variant at the shapes of a Gemma 3 decode step, launched back to
back from a captured CUDA graph (as a decode step's plan runs) over weight
copies that together exceed the L2 cache (as a step's layers do), with the
bytes each launch reads and the TB/s that makes. Every variant's output is
checked bit for bit against the plan's kernel, listed first.

    python3 scripts/cuda-mmv-bench.py [--shapes 4b,1b] [--reps 64] [--rows 1]

Variants are instantiated here from mmv_body (units a lane loads at once,
warps a block, a register bound through __launch_bounds__), appended to
kernels.cu, which is compiled by NVRTC as the runtime compiles it. Needs
CuPy and a GPU (the device machines have both).
"""
import argparse
import pathlib

import cupy as cp
import numpy as np

SRC = pathlib.Path(__file__).resolve().parent.parent / "crates/rlx-runtime/src/cuda/kernels.cu"

# bytes per 256-element super-block / 32-element block, elements per block
TYPES = {"q4_k": (144, 256), "q6_k": (210, 256), "q8_0": (34, 32)}

# (name, weight type, rows, k, weights in one launch) per model shape
SHAPES = {
    "4b": [
        ("gate+up", "q4_k", 20480, 2560, 2),
        ("down", "q4_k", 2560, 10240, 1),
        ("down q6", "q6_k", 2560, 10240, 1),
        ("q+k", "q4_k", 3072, 2560, 2),
        ("v q6", "q6_k", 1024, 2560, 1),
        ("o", "q4_k", 2560, 2048, 1),
        ("lm head", "q6_k", 262144, 2560, 1),
    ],
    # The 1B's rows of 1152 are not whole K-quant super-blocks: Q8_0 here.
    "1b": [
        ("gate+up", "q8_0", 13824, 1152, 2),
        ("down", "q4_k", 1152, 6912, 1),
        ("q+k", "q8_0", 1280, 1152, 2),
        ("lm head", "q8_0", 262144, 1152, 1),
    ],
}


def random_rows(ty, rows, k, rng):
    """Random blocks with finite, small scales."""
    bb, be = TYPES[ty]
    blocks = rows * k // be
    b = rng.integers(0, 256, size=(blocks, bb), dtype=np.uint8)
    half = lambda v: np.frombuffer(np.float16(v).tobytes(), dtype=np.uint8)
    if ty == "q4_k":
        b[:, 0:2] = half(0.01)
        b[:, 2:4] = half(0.002)
    elif ty == "q6_k":
        b[:, 208:210] = half(0.01)
    else:
        b[:, 0:2] = half(0.01)
    return b.reshape(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4b,1b")
    ap.add_argument("--reps", type=int, default=64)
    ap.add_argument("--rows", type=int, default=1, help="activation rows (1 or up to 8)")
    args = ap.parse_args()
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    l2 = dev.attributes["L2CacheSize"]
    extra = []
    for ty, code in (("q4_k", "T_Q4_K"), ("q6_k", "T_Q6_K"), ("q8_0", "T_Q8_0")):
        for u in (6, 8):  # (2 and 3 are kernels.cu's own)
            extra.append(f'extern "C" __global__ void mmvq1u{u}_{ty}(MMV_PARAMS) '
                         f'{{ mmv_body<{code}, 1, true, {u}>(MMV_ARGS); }}')
        for lb in (8, 12, 16):
            extra.append(f'extern "C" __global__ void __launch_bounds__(128, {lb}) '
                         f'mmvq1lb{lb}_{ty}(MMV_PARAMS) {{ mmv_body<{code}, 1, true>(MMV_ARGS); }}')
            extra.append(f'extern "C" __global__ void __launch_bounds__(128, {lb}) '
                         f'mmvq1u2lb{lb}_{ty}(MMV_PARAMS) '
                         f'{{ mmv_body<{code}, 1, true, 2>(MMV_ARGS); }}')
    mod = cp.RawModule(code=SRC.read_text() + "\n" + "\n".join(extra) + "\n")
    mod.compile()  # a compile error here, not as every kernel missing below
    rng = np.random.default_rng(1)
    mt = args.rows
    nx = 1 if mt == 1 else 8
    print(f"{dev.attributes['MultiProcessorCount']} SMs, L2 {l2 >> 20} MiB, {mt} activation row(s)")
    print(f"{'shape':<9}{'product':<9}{'kernel/warps':<22}{'grid':>7}{'us':>9}{'MB':>8}{'TB/s':>7}  same")
    for shape in args.shapes.split(","):
        for name, ty, n, k, nw in SHAPES[shape]:
            bb, be = TYPES[ty]
            row_bytes = k // be * bb
            nbytes = n * row_bytes
            copies = max(1, min(16, -(-3 * l2 // nbytes)))
            ws = []
            for _ in range(copies):
                host = random_rows(ty, n, k, rng)
                ws.append(cp.asarray(host))
            units = k // 32
            xq = cp.asarray(rng.integers(-127, 128, size=mt * k, dtype=np.int8))
            xd = cp.asarray(np.full(mt * units, 0.02, dtype=np.float16).view(np.uint16))
            x = cp.asarray(rng.standard_normal(mt * k).astype(np.float32))
            y = cp.zeros(mt * n, dtype=np.float32)
            e0 = n // nw if nw > 1 else n
            e1 = n
            # (kernel, warps a block)
            variants = [(f"mmvq{nx}_{ty}", 4)]
            if nx == 1:
                variants += [(f"mmvq1_{ty}", 8)]
                variants += [(f"mmvq1u{u}_{ty}", 4) for u in (2, 3, 6, 8)]
                variants += [(f"mmvq1lb{lb}_{ty}", 4) for lb in (8, 12, 16)]
                variants += [(f"mmvq1u2lb{lb}_{ty}", 4) for lb in (8, 12, 16)]
            ref = None
            # The uploads ran on the default stream; the launches go to another.
            cp.cuda.Device().synchronize()
            stream = cp.cuda.Stream(non_blocking=True)
            times = []
            for kname, warps in variants:
                try:
                    f = mod.get_function(kname)
                except Exception:
                    continue
                grid = -(-n // warps)

                def launch(w):
                    # Two weights: the second starts at row e0 of the copy.
                    w0 = w.data.ptr
                    w1 = w0 + (e0 * row_bytes if nw > 1 else 0)
                    f((grid,), (32 * warps,),
                      (np.uint64(w0), np.uint64(w1), np.uint64(w1), np.int32(e0), np.int32(e1),
                       np.uint64(x.data.ptr), np.uint64(xq.data.ptr), np.uint64(xd.data.ptr),
                       np.uint64(y.data.ptr), np.int32(mt), np.int32(n), np.int32(k),
                       np.int32(n), np.int32(0)), stream=stream)

                y.fill(0)
                launch(ws[0])
                stream.synchronize()
                out = y.get()
                same = "ref" if ref is None else ("yes" if np.array_equal(out, ref) else
                                                  f"NO {np.max(np.abs(out - ref)):.2e}")
                if ref is None:
                    ref = out
                stream.begin_capture()
                for r in range(args.reps):
                    launch(ws[r % copies])
                graph = stream.end_capture()
                graph.launch(stream)
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
                graph.launch(stream)
                end.record(stream)
                end.synchronize()
                us = cp.cuda.get_elapsed_time(start, end) * 1000 / args.reps
                label = f"{kname}/{warps}w"
                times.append((us, label, same))
                print(f"{shape:<9}{name:<9}{label:<22}{grid:>7}{us:>9.2f}{nbytes / 1e6:>8.1f}"
                      f"{nbytes / us / 1e6:>7.2f}  {same}")
            if times:
                best = min(times)
                print(f"BEST {shape} {name}: {best[1]} {best[0]:.2f} us ({nbytes / best[0] / 1e6:.2f}"
                      f" TB/s, {best[2]}) against {times[0][1]} {times[0][0]:.2f} us")
            del ws


if __name__ == "__main__":
    main()
