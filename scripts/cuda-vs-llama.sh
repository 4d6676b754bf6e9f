#!/usr/bin/env bash
# rlx against llama.cpp's CUDA build on a GPU machine without Rust or a
# network: build and lay out here, run there, in one lease.
#
#   scripts/cuda-vs-llama.sh build   # here: rlx (cuda-check.sh build), the
#                                    # random_weights example, llama.cpp's
#                                    # source trimmed to what a CUDA build
#                                    # needs, checkpoint layouts of SHAPES
#   scripts/cuda-vs-llama.sh run     # there: build llama-bench for sm_90
#                                    # (~4 min on 16 cores), write Q4_K_M
#                                    # files of random weights, then
#                                    # llama-bench and rlx bench alternating
#
# Environment: SHAPES (names in scripts/shapes.json; default
# "gemma3n-e4b gemma4-26b-a4b"), TYPE (default Q4_K_M), REPS (3),
# DEPTH (tokens of context for the long-context decode test on the 4B
# Gemma 3 shape, default 16384; empty for none), SPLIT ("SHAPE N": a
# make_gguf shape run with its last N layers and the LM head on the GPU
# and the rest on the CPU, against llama-bench -ngl N+1, whose count
# includes the LM head; default none), PYTHON (here: one with
# transformers that knows Gemma 3n and 4), FILES_ONLY (there: stop once
# llama.cpp is built and the files are written), LLAMA_DIR (here: the
# llama-cpp-python source tree, default ~/.cache/llama.cpp-ref/src).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.devbin
SHAPES=${SHAPES-gemma3n-e4b gemma4-26b-a4b}
TYPE=${TYPE:-Q4_K_M}
REPS=${REPS:-3}
case "${1:-}" in
  build)
    bash scripts/cuda-check.sh build
    cargo build --release -q -p rlx-gemma --example random_weights
    cp target/release/examples/random_weights "$BIN/"
    strip "$BIN/random_weights"
    src=${LLAMA_DIR:-$HOME/.cache/llama.cpp-ref/src}
    [ -f "$src/CMakeLists.txt" ] || { echo "no llama.cpp source in $src" >&2; exit 1; }
    # The library, common and tools; no models, docs, tests or other backends.
    skip=(build models docs media tests examples gguf-py app benches pocs ci tools/server/public)
    for b in cann et hexagon metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
      skip+=("ggml/src/ggml-$b")
    done
    tmp=$(mktemp -d)
    mkdir "$tmp/llama.cpp"
    tar -C "$src" -cf - --anchored "${skip[@]/#/--exclude=./}" . | tar -C "$tmp/llama.cpp" -xf -
    tar -C "$tmp" -czf "$BIN/llama-src.tgz" llama.cpp
    rm -rf "$tmp" "$BIN/layouts"
    for s in $SHAPES; do
      "${PYTHON:-python3}" scripts/make-shaped-checkpoint.py "$s" "$BIN/layouts/$s" --no-holes
    done
    du -sh "$BIN" "$BIN"/*
    ;;
  run)
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    L=/tmp/llama
    # llama.cpp builds on the CPU cores while the files below are written.
    if [ ! -x $L/build/bin/llama-bench ]; then
      (
        mkdir -p $L && tar -C $L -xzf "$BIN/llama-src.tgz" --strip-components=1
        cmake -S $L -B $L/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
          -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
          -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/dev/null
        cmake --build $L/build -j"$(nproc)" --target llama-bench >/dev/null
      ) > /tmp/llama-build.log 2>&1 &
    fi
    M=/tmp/rlx-models
    mkdir -p $M
    files=()
    for s in $SHAPES; do
      f=$M/$s-$TYPE.gguf
      if [ ! -f "$f" ]; then
        cp -r "$BIN/layouts/$s" "$M/$s"
        python3 scripts/make-shaped-checkpoint.py --holes "$M/$s"
        "$BIN/random_weights" "$M/$s" "$f" --type "$TYPE" 2>&1 | tail -1
        rm -rf "${M:?}/$s"
      fi
      files+=("$f")
    done
    DEPTH=${DEPTH-16384}
    if [ -n "$DEPTH" ]; then
      [ -f $M/4b.gguf ] || "$BIN/make_gguf" random --shape 4b --type q4_k_m \
        --tokenizer-from "$BIN/tokenizer.gguf" -o $M/4b.gguf 2>&1 | head -1
    fi
    wait
    [ -x $L/build/bin/llama-bench ] || { tail -20 /tmp/llama-build.log; exit 1; }
    [ "${FILES_ONLY:-}" ] && { ls -la $M; exit 0; }
    for f in "${files[@]}"; do
      for rep in 1 2; do
        $L/build/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r "$REPS" -o md 2>/dev/null | grep -E "pp[0-9]|tg[0-9]"
        "$BIN/rlx" bench -m "$f" --device cuda -p 512 -n 128 -r "$REPS" | grep -E "pp[0-9]|tg[0-9]"
      done
    done
    if [ -n "${SPLIT:-}" ]; then
      read -r shape ngl <<<"$SPLIT"
      [ -f $M/$shape.gguf ] || "$BIN/make_gguf" random --shape "$shape" --type q4_k_m \
        --tokenizer-from "$BIN/tokenizer.gguf" -o $M/$shape.gguf 2>&1 | head -1
      for rep in 1 2; do
        $L/build/bin/llama-bench -m $M/$shape.gguf -ngl $((ngl + 1)) -fa 1 -p 512 -n 64 -r 2 \
          -o md 2>/dev/null | grep -E "pp[0-9]|tg[0-9]"
        "$BIN/rlx" bench -m $M/$shape.gguf --device cuda -ngl "$ngl" -p 512 -n 64 -r 2 |
          grep -E "pp[0-9]|tg[0-9]"
      done
    fi
    if [ -n "$DEPTH" ]; then
      for kv in f16 q8_0; do
        $L/build/bin/llama-bench -m $M/4b.gguf -ngl 99 -fa 1 -ctk $kv -ctv $kv -p 0 -n 128 \
          -d "$DEPTH" -r 1 -o md 2>/dev/null | grep -E "tg[0-9]"
        "$BIN/rlx" bench -m $M/4b.gguf --device cuda --kv-type $kv -p 0 -n 128 -d "$DEPTH" -r 1 | grep -E "tg[0-9]"
      done
    fi
    ;;
  *)
    echo "usage: scripts/cuda-vs-llama.sh build|run" >&2
    exit 2
    ;;
esac
