#!/usr/bin/env bash
# The CUDA backend on a GPU machine that has no Rust toolchain: build here,
# run there.
#
#   scripts/cuda-check.sh build     # here: binaries, sm_90 kernels (CUDA_ARCH=8.0 …)
#                                   # and a tokenizer-only GGUF into .devbin/
#   scripts/cuda-check.sh run       # there: parity tests, then rlx bench on the GPU
#                                   # (BENCH_ONLY=1: only the benches;
#                                   # SHAPES="1b 4b": which shapes to bench;
#                                   # CPU_BENCH=1: the host CPU's figures too)
#
# `run` writes Gemma 3 270M- and 1B-shaped random files with make_gguf (the
# tokenizer comes from .devbin/tokenizer.gguf), runs the runtime's CUDA unit
# tests (every type's decoders, K/V stores and paged batches of every K/V
# type against the CPU backend) and crates/rlx-gemma/tests/cuda.rs (the GPU
# against the CPU's exact path: every tiny fixture — every generation, weight
# type and checkpoint — each named value, every K/V type, those files, and
# mixed batches of many sequences against each alone), then `rlx bench` on
# the GPU (one sequence, and --batch 1,8,32,64; SHAPES="" for none) and on
# the machine's CPU for comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.devbin
case "${1:-}" in
  build)
    mkdir -p "$BIN"
    grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >>.git/info/exclude
    cargo build --release -q -p rlx-cli
    cargo build --release -q -p rlx-gguf --example make_gguf
    test_bin=$(cargo test --release -p rlx-gemma --features cuda --test cuda --no-run 2>&1 |
      grep -o 'target/release/deps/cuda-[0-9a-f]*' | head -1)
    unit_bin=$(cargo test --release -p rlx-runtime --features cuda --lib --no-run 2>&1 |
      grep -o 'target/release/deps/rlx_runtime-[0-9a-f]*' | head -1)
    cp target/release/rlx target/release/examples/make_gguf "$BIN/"
    cp "$test_bin" "$BIN/cuda-test"
    cp "$unit_bin" "$BIN/cuda-unit-test"
    strip "$BIN/rlx" "$BIN/make_gguf" "$BIN/cuda-test" "$BIN/cuda-unit-test"
    # The kernels compiled here for an H100/H200 (sm_90), as rlx keeps them
    # in ~/.cache/rlx/kernels: the GPU machine neither runs NVRTC nor
    # translates PTX at each fresh start (a minute or more each).
    rm -rf "$BIN/kernels"
    cargo run --release -q -p rlx-runtime --features cuda --example compile_kernels -- \
      "${CUDA_ARCH:-9.0}" "$BIN/kernels" ||
      echo "no kernels compiled here (libnvrtc on LD_LIBRARY_PATH?): the GPU machine compiles them"
    [ -f "$BIN/tokenizer.gguf" ] ||
      "$BIN/make_gguf" tokenizer --from "$(bash scripts/fetch-model.sh)" -o "$BIN/tokenizer.gguf"
    du -sh "$BIN"/*
    ;;
  run)
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    # Where rlx and the GPU tests keep compiled kernels.
    for dir in ~/.cache/rlx/kernels "${TMPDIR:-/tmp}/rlx-test-kernels"; do
      [ ! -d "$BIN/kernels" ] || { mkdir -p "$dir" && cp "$BIN"/kernels/* "$dir/"; }
    done
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    M=/tmp/rlx-models
    mkdir -p "$M"
    SHAPES=${SHAPES-270m 1b 4b}
    for shape in 270m 1b $SHAPES; do
      [ -f "$M/$shape.gguf" ] || "$BIN/make_gguf" random --shape "$shape" --type q4_k_m \
        --tokenizer-from "$BIN/tokenizer.gguf" -o "$M/$shape.gguf" 2>&1 | head -1
    done
    if [ -z "${BENCH_ONLY:-}" ]; then
      "$BIN/cuda-unit-test" --ignored --nocapture --test-threads 1 cuda::tests
      RLX_CUDA_MODELS="$M/270m.gguf $M/1b.gguf" "$BIN/cuda-test" --ignored --nocapture --test-threads 1
    fi
    for shape in $SHAPES; do
      for precision in q8 exact; do
        "$BIN/rlx" bench -m "$M/$shape.gguf" --device cuda --precision $precision -p 512 -n 128 -r 3
      done
      "$BIN/rlx" bench -m "$M/$shape.gguf" --device cuda --batch 1,8,32,64 -p 128 -n 64 -r 2
      [ -z "${CPU_BENCH:-}" ] || "$BIN/rlx" bench -m "$M/$shape.gguf" -p 512 -n 128 -r 2 | tail -n +3
    done
    ;;
  *)
    echo "usage: scripts/cuda-check.sh build|run" >&2
    exit 2
    ;;
esac
