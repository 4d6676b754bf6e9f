//! The CUDA backend against the CPU's exact path on the same files: prefill
//! (in chunks, so sliding layers drop blocks), decode steps, all-position
//! scoring and a rewind; and mixed batches of many sequences on the GPU
//! against each sequence alone on the CPU. Needs an NVIDIA GPU, so CI (which has none) skips
//! these; run them on one with
//!
//! ```sh
//! cargo test --release -p rlx-gemma --features cuda --test cuda -- --ignored --nocapture
//! ```
//!
//! `RLX_CUDA_MODELS` adds GGUF paths (blank-separated) to the tiny fixtures.
#![cfg(feature = "cuda")]

mod common;

use std::path::{Path, PathBuf};

use common::scenario::{worst_against_alone, Script};

use rlx_gemma::{Device, Model, ModelError, ModelOptions, Precision, SessionOptions};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(rel)
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    common::rel_l2(a, b)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

fn load(path: &Path, device: Device) -> Result<Model, ModelError> {
    load_at(path, device, Precision::Exact)
}

fn load_at(path: &Path, device: Device, precision: Precision) -> Result<Model, ModelError> {
    Model::load(
        path,
        ModelOptions {
            device,
            precision,
            ..ModelOptions::default()
        },
    )
}

/// The worst relative L2 between the CPU and the GPU over every check.
fn compare(path: &Path, prompt_len: usize, chunk: usize) -> f64 {
    let cpu = load(path, Device::Cpu).unwrap();
    let gpu = load(path, Device::Cuda(0)).unwrap();
    let vocab = cpu.config().n_vocab;
    let prompt: Vec<u32> = std::iter::once(2)
        .chain((1..prompt_len).map(|i| ((i * 7919) % (vocab - 16) + 16) as u32))
        .collect();
    let opts = SessionOptions {
        context: Some(prompt_len + 32),
        prefill_chunk: chunk,
        ..SessionOptions::default()
    };
    let (mut a, mut b) = (
        cpu.session(opts.clone()).unwrap(),
        gpu.session(opts).unwrap(),
    );
    let mut worst = 0f64;
    let mut check = |what: &str, x: &[f32], y: &[f32]| {
        let e = rel_l2(y, x);
        assert!(e < 1e-4, "{}: {what}: relative L2 {e:.2e}", path.display());
        worst = worst.max(e);
    };
    let (mut la, mut lb) = (a.feed(&prompt).unwrap(), b.feed(&prompt).unwrap());
    check("prefill", &la, &lb);
    for step in 0..8 {
        let t = argmax(&la);
        assert_eq!(t, argmax(&lb), "{}: greedy token {step}", path.display());
        la = a.feed(&[t]).unwrap();
        lb = b.feed(&[t]).unwrap();
        check(&format!("decode {step}"), &la, &lb);
    }
    // Back a few tokens and on again (the rings keep what the rewind needs,
    // or the prefix runs again).
    let keep = prompt_len - 3;
    a.rewind(keep).unwrap();
    b.rewind(keep).unwrap();
    let tail = &prompt[keep..];
    check(
        "after rewind",
        &a.feed(tail).unwrap(),
        &b.feed(tail).unwrap(),
    );
    // Logits of every position.
    a.reset();
    b.reset();
    let short = &prompt[..prompt_len.min(20)];
    check("score", &a.score(short).unwrap(), &b.score(short).unwrap());
    worst
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn tiny_models_match_the_cpu() {
    // Held so that the kernels compile once for all the models.
    let _gpu = rlx_runtime::cuda::CudaDevice::new(0).unwrap();
    let files = [
        "gemma/model-f32.gguf",
        "gemma/model-f16.gguf",
        "gemma/model-bf16.gguf",
        "gemma/model-Q8_0.gguf",
        "gemma2/model-f32.gguf",
        "gemma2/model-Q8_0.gguf",
        "gemma3/model-f32.gguf",
        "gemma3/model-Q8_0.gguf",
        "gemma3-linear8/model-f32.gguf",
        "gemma3-q/model-Q4_0.gguf",
        "gemma3-q/model-Q4_K_M.gguf",
        "gemma3-q/model-Q5_K_M.gguf",
        "gemma3-q/model-Q6_K.gguf",
        "gemma3-q/model-Q8_0.gguf",
    ];
    for f in files {
        // 40 tokens in chunks of 16: the 8-token sliding window's ring wraps.
        let worst = compare(&fixture(f), 40, 16);
        println!("{f}: worst relative L2 {worst:.2e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn extra_models_match_the_cpu() {
    let _gpu = rlx_runtime::cuda::CudaDevice::new(0).unwrap();
    // Ignored by default and run on purpose, so an empty list is an error,
    // not a pass with nothing checked.
    let list = std::env::var("RLX_CUDA_MODELS")
        .expect("RLX_CUDA_MODELS names the GGUF files to check (scripts/cuda-check.sh sets it)");
    assert!(!list.trim().is_empty(), "RLX_CUDA_MODELS is empty");
    for path in list.split_whitespace() {
        let worst = compare(Path::new(path), 700, 256);
        println!("{path}: worst relative L2 {worst:.2e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn a_type_without_kernels_is_a_clear_error() {
    let model = load(&fixture("gemma3-q/model-Q2_K.gguf"), Device::Cuda(0)).unwrap();
    let err = model
        .session(SessionOptions {
            context: Some(16),
            ..SessionOptions::default()
        })
        .err()
        .expect("Q2_K has no CUDA kernel");
    let msg = err.to_string();
    assert!(msg.contains("Q2_K") && msg.contains("CUDA"), "{msg}");
}

/// The worst relative L2, over the scenario's sequences, of the GPU's
/// batched logits against each sequence scored alone on the CPU.
fn batched_against_cpu(path: &Path, script: &Script) -> f64 {
    let cpu = load(path, Device::Cpu).unwrap();
    let gpu = load(path, Device::Cuda(0)).unwrap();
    worst_against_alone(&gpu, &cpu, script)
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn batched_sequences_on_the_gpu_match_each_alone() {
    let _gpu = rlx_runtime::cuda::CudaDevice::new(0).unwrap();
    let script = Script::TINY;
    for f in [
        "gemma/model-f32.gguf",
        "gemma2/model-f32.gguf",
        "gemma3/model-f32.gguf",
        "gemma3/model-Q8_0.gguf",
        "gemma3-q/model-Q4_K_M.gguf",
    ] {
        let worst = batched_against_cpu(&fixture(f), &script);
        println!("{f}: batched on the GPU vs alone on the CPU, worst relative L2 {worst:.2e}");
        assert!(worst < 1e-4, "{f}: {worst:.2e}");
    }
    let list = std::env::var("RLX_CUDA_MODELS").unwrap_or_default();
    if let Some(path) = list.split_whitespace().next() {
        let script = Script::LONG;
        let worst = batched_against_cpu(Path::new(path), &script);
        println!("{path}: batched on the GPU vs alone on the CPU, worst relative L2 {worst:.2e}");
        assert!(worst < 1e-4, "{path}: {worst:.2e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn reduced_precision_on_the_gpu_is_no_worse_than_on_the_cpu() {
    // `q8` on the GPU multiplies many rows in bf16 on the tensor cores (an
    // 8-bit mantissa: ~1e-2 on logits of these random models), on the CPU
    // it quantizes activations to 8 bits (f32 weights stay exact there).
    // Against exact logits, on batches as the server runs them, the GPU's
    // error stays within bf16's reach and twice the CPU's; a wrong row,
    // offset or layout would be of order 1.
    let _gpu = rlx_runtime::cuda::CudaDevice::new(0).unwrap();
    let mut files: Vec<PathBuf> = ["gemma3/model-f32.gguf", "gemma3-q/model-Q4_K_M.gguf"]
        .iter()
        .map(|f| fixture(f))
        .collect();
    let list = std::env::var("RLX_CUDA_MODELS").unwrap_or_default();
    files.extend(list.split_whitespace().take(1).map(PathBuf::from));
    for path in files {
        let script = Script::TINY;
        let exact = load(&path, Device::Cpu).unwrap();
        let cpu_q8 = load_at(&path, Device::Cpu, Precision::Quantized).unwrap();
        let gpu_q8 = load_at(&path, Device::Cuda(0), Precision::Quantized).unwrap();
        let cpu = worst_against_alone(&cpu_q8, &exact, &script);
        let gpu = worst_against_alone(&gpu_q8, &exact, &script);
        println!(
            "{}: q8 against exact, worst relative L2: GPU {gpu:.2e}, CPU {cpu:.2e}",
            path.display()
        );
        assert!(
            gpu < (2.0 * cpu).max(5e-2),
            "{}: GPU {gpu:.2e} CPU {cpu:.2e}",
            path.display()
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn a_cache_beyond_the_gpus_free_memory_is_refused_before_allocating() {
    let model = load(&fixture("gemma3/model-f32.gguf"), Device::Cuda(0)).unwrap();
    // 2^30 tokens of this model's f32 K/V: 256 GiB, beyond any GPU.
    let Err(e) = model.session(SessionOptions {
        context: Some(1 << 30),
        ..SessionOptions::default()
    }) else {
        panic!("a 256 GiB cache was accepted")
    };
    let msg = e.to_string();
    println!("{msg}");
    assert!(matches!(e, ModelError::OutOfMemory { .. }), "{msg}");
    assert!(msg.contains("cuda:0"), "{msg}");
}
