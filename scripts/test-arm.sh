#!/usr/bin/env bash
# The CPU kernels and the tiny-model parity tests built for 64-bit ARM Linux
# and run under QEMU user emulation (`-cpu max`: NEON with SDOT and I8MM),
# the kernel tests again on CPUs with less (Neoverse N1: SDOT, no I8MM, as
# Graviton 2 and Apple M1; Cortex-A72: plain NEON), plus lint for that
# target and a check that macOS on Apple Silicon builds.
# Installs what it needs on a fresh Debian machine: the Rust targets,
# gcc-aarch64-linux-gnu (the linker and C library) and qemu-user-static.
set -euo pipefail
cd "$(dirname "$0")/.."
have() { command -v "$1" >/dev/null 2>&1; }
if ! have aarch64-linux-gnu-gcc || ! have qemu-aarch64-static; then
    install=(apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user-static)
    sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" "${install[@]}" >/dev/null 2>&1 ||
        { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" "${install[@]}" >/dev/null; }
fi
rustup target add aarch64-unknown-linux-gnu aarch64-apple-darwin >/dev/null 2>&1
cargo clippy --target aarch64-unknown-linux-gnu -p rlx-runtime -p rlx-gemma --all-targets --release -- -D warnings
cargo check --target aarch64-apple-darwin -p rlx-runtime -p rlx-gemma --all-targets
cargo test --target aarch64-unknown-linux-gnu --release -p rlx-runtime
cargo test --target aarch64-unknown-linux-gnu --release -p rlx-gemma --test tiny_models
# Mixed batches on every tiny model (rows kernels, the GEMM, batched
# attention) against each sequence alone.
cargo test --target aarch64-unknown-linux-gnu --release -p rlx-gemma --test batching \
    batched_sequences_match_each_alone_on_every_tiny_model
for cpu in neoverse-n1 cortex-a72; do
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -cpu $cpu -L /usr/aarch64-linux-gnu" \
        cargo test --target aarch64-unknown-linux-gnu --release -p rlx-runtime --lib --test matmul --test kernels
done
