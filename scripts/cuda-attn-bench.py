#!/usr/bin/env python3
"""Decode attention (`attention_*` in kernels.cu) alone on a GPU, with CuPy:
one query row over a paged f16 K/V pool at the head shapes of Gemma 3
1B/4B/12B and a range of context lengths, as a decode step's plan launches
it (a grid of query-head groups × 128 splits, output as the next product's
8-bit blocks), each launch reading another layer's pool. Times come from a
captured graph of back-to-back launches ("warm") and from the same with a
kernel between launches that streams more than the L2 holds, as a step's
weights do between two layers' attention ("cold", the streaming kernel's
own time taken off). With --stamps, the kernel is also built with clock
stamps at its phases and the working block's phases are printed. Every
variant's output is checked against a NumPy reference first.

    python3 scripts/cuda-attn-bench.py build DIR [--nvrtc libnvrtc.so] [--base REV] [--rev NAME=REV]...
    python3 scripts/cuda-attn-bench.py run DIR [--shapes 1b,4b] [--ctx 16,64,192,1024,4096]

`build` compiles kernels.cu (and, with stamps, a copy with clock stamps
written in by text substitution) for sm_90 with NVRTC, so the GPU machine
neither runs NVRTC nor translates PTX; `run` needs CuPy and a GPU.
"""
import argparse
import importlib.util
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = pathlib.Path(os.environ.get("KSRC", ROOT / "crates/rlx-runtime/src/cuda/kernels.cu"))

# (query heads, K/V heads, head length) of each shape.
SHAPES = {"1b": (4, 1, 256), "4b": (8, 4, 256), "12b": (16, 8, 256)}
BLOCK = 32
SPLITS = 128
PART = 512 + 2
LAYERS = 26

# Clock stamps written into attention_body, each after the line given:
# (unique text, stamp slot).
STAMPS = [
    ("    int per = hq / gq;\n", 0),
    ("    keys.query(qi, &qp, &end, &e0, &e_end);\n", 1),
    ("    if (ch0 < e_end * CPB) keys.block(ch0 / CPB, &phys0, &lo0);\n", 2),
    ("    pdl_begin();\n", 3),
    ("    __syncthreads();\n    for (int ch = e0 * CPB + warp;", 4),
    ("        float sc = warp_sums<NV>(x, lane) * scale;\n", 5),
    ("    // The warps' results merged in warp order", 6),
    ("    if (!merged) return;", 7),
    ("    if (!last) return;\n", 8),
    ("    attention_merge(part, out, qs, qd, ob, (size_t)qi * hq + h0, gq, used, hdv);\n", 9),
]
STAMP_DEF = """
__device__ long long attn_stamps[128 * 16];
__device__ __forceinline__ void attn_stamp(int i) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        attn_stamps[blockIdx.y * 16 + i] = clock64();
        if (i == 0) attn_stamps[blockIdx.y * 16 + 14] = t;
        attn_stamps[blockIdx.y * 16 + 15] = t;
    }
}
"""


def stamped(src):
    # Only attention_body is stamped.
    at = src.index("template <int KT, int VT, class Keys>\n__device__ void attention_body")
    end = src.index("\n}\n", at) + 3
    head, src, tail = src[:at], src[at:end], src[end:]
    for text, slot in STAMPS:
        assert src.count(text) == 1, f"stamp {slot}: {text!r} is not once in attention_body"
        call = f"attn_stamp({slot});"
        if slot == 3:
            src = src.replace(text, f"    pdl_begin();\n    {call}\n")
        elif slot == 5:
            src = src.replace(text, text + f"        if (ch == ch0) {call}\n")
        elif slot == 4:
            src = src.replace(text, f"    __syncthreads();\n    {call}\n    for (int ch = e0 * CPB + warp;")
        elif slot in (6, 7):
            src = src.replace(text, f"    {call}\n" + text)
        else:
            src = src.replace(text, text + f"    {call}\n")
    return head + STAMP_DEF + src + tail


def compile_cubin(nvrtc, src):
    """The source as an sm_90 cubin, compiled as scripts/cuda-sass.py does."""
    spec = importlib.util.spec_from_file_location("cuda_sass", ROOT / "scripts/cuda-sass.py")
    sass = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass)
    return sass.compile_cubin(nvrtc, "sm_90", src)[0]


def build(a):
    out = pathlib.Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = {"new": SRC.read_text()}
    rel = SRC.resolve().relative_to(ROOT)
    # Other revisions' kernels.cu beside the working tree's: NAME=REV.
    for spec in ([f"base={a.base}"] if a.base else []) + (a.rev or []):
        tag, rev = spec.split("=", 1)
        sources[tag] = subprocess.check_output(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"],
                                               text=True)
    variants = {}
    for tag, src in sources.items():
        variants[tag] = src
        if not a.no_stamps:
            variants[f"{tag}-stamps"] = stamped(src)
    for name, text in variants.items():
        (out / f"{name}.cubin").write_bytes(compile_cubin(a.nvrtc, text))
        print(f"{name}: {out / (name + '.cubin')}")


def run(a):
    import cupy as cp
    import numpy as np

    dev = cp.cuda.Device()
    clock_khz = dev.attributes["ClockRate"]
    l2 = dev.attributes["L2CacheSize"]
    print(f"{dev.attributes['MultiProcessorCount']} SMs, L2 {l2 >> 20} MiB, clock {clock_khz / 1e3:.0f} MHz")
    d = pathlib.Path(a.dir)
    mods = {p.stem: cp.RawModule(path=str(p)) for p in sorted(d.glob("*.cubin"))}
    flush_n = (4 * l2) // 16
    flush_buf = cp.zeros(flush_n * 4, dtype=cp.float32)
    flush_out = cp.zeros(1, dtype=cp.float32)
    flush = cp.RawModule(code=r"""
extern "C" __global__ void flush(const float4* x, long long n, float* out) {
    float s = 0.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) { float4 v = x[i]; s += v.x + v.y + v.z + v.w; }
    if (s == 12345.0f) out[0] = s;
}""").get_function("flush")
    rng = np.random.default_rng(1)
    stream = cp.cuda.Stream(non_blocking=True)

    def graph_time(launch, reps):
        stream.begin_capture()
        for r in range(reps):
            launch(r)
        g = stream.end_capture()
        g.launch(stream)
        stream.synchronize()
        best = None
        for _ in range(3):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record(stream)
            g.launch(stream)
            e.record(stream)
            e.synchronize()
            t = cp.cuda.get_elapsed_time(s, e) * 1000 / reps
            best = t if best is None else min(best, t)
        return best

    def do_flush(_r):
        flush((264,), (512,), (flush_buf, np.int64(flush_n), flush_out), stream=stream)

    t_flush = graph_time(do_flush, 32)
    print(f"flush ({4 * l2 >> 20} MiB read): {t_flush:.2f} us")
    print(f"{'shape':<5}{'ctx':>6} {'variant':<8}{'grid':>10}{'warm us':>9}{'cold us':>9}  check")
    for shape in a.shapes.split(","):
        hq, hkv, hd = SHAPES[shape]
        group = hq // hkv
        gq = max(g for g in range(1, min(4, 1024 // hd, group) + 1) if group % g == 0)
        gx = hq // gq
        for ctx in [int(c) for c in a.ctx.split(",")]:
            nb = -(-ctx // BLOCK)
            rows = nb * BLOCK
            layers = []
            for _ in range(LAYERS):
                k = rng.standard_normal((rows, hkv, hd)).astype(np.float16)
                v = rng.standard_normal((rows, hkv, hd)).astype(np.float16)
                perm = rng.permutation(nb)
                table = np.stack([perm, np.arange(nb)], axis=1).astype(np.int32).reshape(-1)
                layers.append((cp.asarray(k), cp.asarray(v), cp.asarray(table), k, v, perm))
            q_host = (rng.standard_normal((hq, hd)) * 0.3).astype(np.float32)
            q = cp.asarray(q_host)
            qpos = cp.asarray(np.array([ctx - 1], dtype=np.int32))
            run_of_row = cp.zeros(1, dtype=cp.int32)
            run_end = cp.asarray(np.array([ctx], dtype=np.int32))
            block_start = cp.asarray(np.array([0, nb], dtype=np.int32))
            out = cp.zeros(hq * hd, dtype=cp.float32)
            qs = cp.zeros(hq * hd, dtype=cp.int8)
            qd = cp.zeros(hq * hd // 32, dtype=cp.uint16)
            part = cp.zeros(hq * SPLITS * PART, dtype=cp.float32)
            done = cp.zeros(gx, dtype=cp.int32)
            scale = np.float32(hd ** -0.5)
            # Reference for layer 0: K/V rows of logical block b at perm[b].
            kc, vc, _, kh, vh, perm = layers[0]
            idx = (perm[:, None] * BLOCK + np.arange(BLOCK)[None, :]).reshape(-1)[:ctx]
            ref = np.zeros((hq, hd))
            for h in range(hq):
                g = h // group
                kk = kh[idx, g].astype(np.float64)
                vv = vh[idx, g].astype(np.float64)
                s = kk @ q_host[h].astype(np.float64) * float(scale)
                p = np.exp(s - s.max())
                ref[h] = p @ vv / p.sum()
            ref = ref.reshape(-1)
            for variant, mod in mods.items():
                f = mod.get_function("attention_f16_f16")
                for gy in sorted({SPLITS, min(SPLITS, nb)}, reverse=True):
                    def launch(r, to_q8=True, layer=None):
                        kc, vc, table = layers[r % LAYERS if layer is None else layer][:3]
                        f((gx, gy), (128,),
                          (q, kc, vc, qpos, run_of_row, run_end, block_start, table,
                           np.uint64(0), np.uint64(0), out,
                           qs if to_q8 else np.uint64(0), qd if to_q8 else np.uint64(0),
                           np.uint64(0), part, done, np.int32(hq), np.int32(hkv), np.int32(hd),
                           np.int32(hd), np.int32(gq), scale, np.float32(0.0), np.int32(0),
                           np.int32(0)), stream=stream)
                    out.fill(0)
                    stream.synchronize()
                    launch(0, to_q8=False, layer=0)
                    stream.synchronize()
                    err = float(np.linalg.norm(out.get() - ref) / np.linalg.norm(ref))
                    check = f"rel {err:.1e}" + ("" if err < 1e-3 else " WRONG")
                    warm = graph_time(launch, 2 * LAYERS)

                    def cold(r):
                        do_flush(r)
                        launch(r)
                    t_cold = graph_time(cold, 2 * LAYERS) - t_flush
                    print(f"{shape:<5}{ctx:>6} {variant:<8}{f'{gx}x{gy}':>10}{warm:>9.2f}{t_cold:>9.2f}  {check}")
                    if variant.endswith("stamps"):
                        st = mod.get_global("attn_stamps")
                        stamps = cp.ndarray((128, 16), dtype=cp.int64, memptr=st)
                        for r in range(3):
                            stamps.fill(0)
                            do_flush(0)
                            launch(r)
                            stream.synchronize()
                        s = stamps.get()
                        us = lambda c: c / clock_khz * 1e3
                        work = [y for y in range(gy) if s[y, 3] and s[y, 6]]
                        t0 = min(s[y, 14] for y in range(gy) if s[y, 14])
                        for y in work[:2] + work[-1:]:
                            ph = [f"{i}:{us(s[y, i] - s[y, 0]):.2f}" for i in range(10) if s[y, i]]
                            print(f"      split {y}: start +{(s[y, 14] - t0) / 1e3:.2f} us,"
                                  f" end +{(s[y, 15] - t0) / 1e3:.2f} us; phases (us from entry) "
                                  + " ".join(ph))
                        idle = [y for y in range(gy) if y not in work and s[y, 14]]
                        if idle:
                            print(f"      {len(idle)} splits without keys: last start"
                                  f" +{(max(s[y, 14] for y in idle) - t0) / 1e3:.2f} us")
            del layers


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("dir")
    b.add_argument("--nvrtc", default="libnvrtc.so")
    b.add_argument("--base", help="a git revision whose kernels.cu is built too, as base")
    b.add_argument("--rev", action="append", help="NAME=REV: another revision's kernels.cu, as NAME")
    b.add_argument("--no-stamps", action="store_true", help="no stamped copies")
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--shapes", default="1b,4b")
    r.add_argument("--ctx", default="16,64,192,1024,4096")
    a = ap.parse_args()
    build(a) if a.cmd == "build" else run(a)


if __name__ == "__main__":
    main()
