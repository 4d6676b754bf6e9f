#!/usr/bin/env bash
# Loop instruction counts of rlx's AArch64 kernels (the numbers in
# BENCHMARKS.md's ARM section: speed cannot be timed on x86, so kernels are
# compared by the instructions one pass of their loops takes) and, given a
# llama.cpp tree (LLAMA_DIR: the folder holding ggml/), of llama.cpp's ARM
# kernels for the same formats, compiled with aarch64-linux-gnu-gcc -O3
# (dotprod for the dots, i8mm for the GEMMs). Needs the aarch64 Rust target
# and gcc/g++-aarch64-linux-gnu.
#
#   LLAMA_DIR=~/llama.cpp bash scripts/arm-loop-counts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --target aarch64-unknown-linux-gnu -p rlx-runtime
rlib=$(ls -t target/aarch64-unknown-linux-gnu/release/deps/librlx_runtime-*.rlib | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && ar x "$OLDPWD/$rlib")
dis() { aarch64-linux-gnu-objdump -d -C --no-show-raw-insn "$@"; }
echo "== rlx ($(git rev-parse --short HEAD))"
for o in "$tmp"/*.o; do dis "$o"; done |
    python3 scripts/arm-loop-counts.py neon::vec_dot_ neon::rows_ neon_gemm::tile \
        neon_f32:: exact::act_groups attention::neon::entry
if [ -n "${LLAMA_DIR:-}" ]; then
    g="$LLAMA_DIR/ggml"
    inc=(-I"$g/include" -I"$g/src" -I"$g/src/ggml-cpu" -DGGML_USE_CPU)
    aarch64-linux-gnu-gcc -O3 -march=armv8.2-a+dotprod "${inc[@]}" \
        -c "$g/src/ggml-cpu/arch/arm/quants.c" -o "$tmp/quants.o"
    aarch64-linux-gnu-g++ -O3 -march=armv8.6-a+dotprod+i8mm "${inc[@]}" \
        -c "$g/src/ggml-cpu/arch/arm/repack.cpp" -o "$tmp/repack.o"
    echo "== llama.cpp"
    dis "$tmp/quants.o" "$tmp/repack.o" |
        python3 scripts/arm-loop-counts.py _q8_0_q8_0 _q4_0_q8_0 _q5_0_q8_0 _mxfp4_q8_0 \
            _q2_K_q8_K _q3_K_q8_K _q4_K_q8_K _q5_K_q8_K _q6_K_q8_K ggml_gemm_
fi
