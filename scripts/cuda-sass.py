#!/usr/bin/env python3
"""The CUDA kernels' machine code without a GPU: kernels.cu compiled by NVRTC
for a real architecture (default sm_90), ptxas's register, spill and stack
report per kernel, and, with cuobjdump, instruction counts of chosen kernels.

    python3 scripts/cuda-sass.py [--arch sm_90] [--kernels REGEX] [--sass DIR]

Needs libnvrtc (the nvidia-cuda-nvrtc wheel; LD_LIBRARY_PATH or --nvrtc) and,
for --sass, cuobjdump (the nvidia-cuda-nvcc wheel or a CUDA toolkit).
"""
import argparse
import ctypes
import collections
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.environ.get("KSRC", os.path.join(ROOT, "crates/rlx-runtime/src/cuda/kernels.cu"))


def compile_cubin(nvrtc, arch, src=None):
    """kernels.cu (or the source text `src`) as a cubin, with ptxas's log."""
    lib = ctypes.CDLL(nvrtc)
    prog = ctypes.c_void_p()
    src = open(SRC, "rb").read() if src is None else src.encode()
    check = lambda rc, what: rc == 0 or sys.exit(f"{what}: NVRTC error {rc}")
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"kernels.cu", 0, None, None), "create")
    opts = [f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    log = log.value.decode(errors="replace")
    if rc != 0:
        sys.exit(f"compile failed:\n{log}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    check(lib.nvrtcGetCUBIN(prog, cubin), "cubin")
    return cubin.raw, log


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kernels", default=".", help="regex over kernel names")
    ap.add_argument("--nvrtc", default="libnvrtc.so")
    ap.add_argument("--sass", help="directory to write each chosen kernel's SASS into")
    a = ap.parse_args()
    cubin, log = compile_cubin(a.nvrtc, a.arch)
    pat = re.compile(a.kernels)
    # ptxas -v: "Compiling entry function 'X'" then "Used N registers, ..."
    name = None
    rows = []
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
            stack = spill_st = spill_ld = 0
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            stack, spill_st, spill_ld = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            if pat.search(name):
                rows.append((name, int(m.group(1)), stack, spill_st, spill_ld))
            name = None
    print(f"{'kernel':32} {'regs':>5} {'stack':>6} {'spill st':>9} {'spill ld':>9}")
    for r in rows:
        print(f"{r[0]:32} {r[1]:>5} {r[2]:>6} {r[3]:>9} {r[4]:>9}")
    bad = [r[0] for r in rows if r[3] or r[4]]
    print(f"{len(rows)} kernels, {len(bad)} with spills{': ' + ' '.join(bad) if bad else ''}")
    if not a.sass:
        return
    tool = shutil.which("cuobjdump") or sys.exit("no cuobjdump on PATH")
    os.makedirs(a.sass, exist_ok=True)
    path = os.path.join(a.sass, "kernels.cubin")
    open(path, "wb").write(cubin)
    for r in rows:
        out = subprocess.run([tool, "-sass", "-fun", r[0], path], capture_output=True, text=True).stdout
        open(os.path.join(a.sass, r[0] + ".sass"), "w").write(out)
        ops = collections.Counter()
        for line in out.splitlines():
            m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
            if m:
                ops[m.group(1).split(".")[0]] += 1
        key = ["LDG", "LD", "LDS", "LDL", "STL", "IDP", "FFMA", "PRMT", "SHFL", "BRA"]
        wide = sum(1 for line in out.splitlines() if "LDG.E.128" in line or "LDG.E.ENL2.256" in line)
        print(f"{r[0]:32} " + " ".join(f"{k}={ops[k]}" for k in key) + f" LDG.128={wide}")


if __name__ == "__main__":
    main()
