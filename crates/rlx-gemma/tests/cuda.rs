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

use common::scenario::{compare_sessions, worst_against_alone, Script};

use rlx_gemma::{Device, Model, ModelError, ModelOptions, Precision, SessionOptions};
use rlx_runtime::{KvDType, KvTypes};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(rel)
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    common::rel_l2(a, b)
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
            kernel_cache: Some(kernel_cache()),
            ..ModelOptions::default()
        },
    )
}

/// Where the GPU's compiled kernels are kept between test processes (each
/// would otherwise compile kernels.cu, a minute or more).
fn kernel_cache() -> std::path::PathBuf {
    std::env::temp_dir().join("rlx-test-kernels")
}

/// The worst relative L2 between the CPU and the GPU over every check, or
/// the GPU's refusal of the model (from its first session; every model and
/// type is expected to run, so a refusal fails the test with its reason).
fn compare(path: &Path, prompt_len: usize, chunk: usize) -> Result<f64, ModelError> {
    compare_kv(path, prompt_len, chunk, None)
}

/// [`compare`] with both caches of element type `kv` (the device's default
/// for the exact path where `None`).
fn compare_kv(
    path: &Path,
    prompt_len: usize,
    chunk: usize,
    kv: Option<KvDType>,
) -> Result<f64, ModelError> {
    let cpu = load(path, Device::Cpu).unwrap();
    let gpu = load(path, Device::Cuda(0))?;
    // Rounding K/V to a smaller type turns the devices' last-bit
    // differences in an element into one unit of the cache type now and
    // then: 2^-11 of it for f16, 2^-8 for bf16, a 127th or an 8th of its
    // block's largest for Q8_0 and Q4_0 (where f32 storage keeps 2^-24).
    let bound = match kv {
        Some(KvDType::F16) => 1e-3,
        Some(KvDType::BF16) => 5e-3,
        Some(KvDType::Q8_0) => 2e-2,
        Some(KvDType::Q4_0) => 5e-2,
        _ => 1e-4,
    };
    let name = path.display().to_string();
    compare_sessions(
        &cpu,
        &gpu,
        &name,
        prompt_len,
        chunk,
        kv.map(KvTypes::both),
        bound,
    )
}

/// Every model file of the tiny fixtures (every generation and weight
/// type, Hugging Face checkpoints included, the odd-sized models) and of
/// the quantization fixtures.
fn every_tiny_file() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let root = fixture("");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        // A drafter (a Gemma 4 assistant, marked by its assistant.json)
        // runs on a target's states, not as a model of its own.
        .filter(|p| p.is_dir() && !p.join("assistant.json").exists())
        .collect();
    dirs.push(root.join("../quantize"));
    dirs.sort();
    for dir in dirs {
        let mut here: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "gguf")
                    || (p.file_name().is_some_and(|n| n == "hf") && p.join("config.json").exists())
            })
            .collect();
        here.sort();
        files.extend(here);
    }
    files
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn every_tiny_model_matches_the_cpu() {
    // Held so that the kernels compile once for all the models.
    let _gpu = rlx_runtime::cuda::CudaDevice::new(0).unwrap();
    let files = every_tiny_file();
    assert!(files.len() >= 30, "fixtures missing: {files:?}");
    let mut matched = Vec::new();
    for f in &files {
        let name = f
            .strip_prefix(fixture(""))
            .unwrap_or(f)
            .display()
            .to_string();
        // 40 tokens in chunks of 16: the 8-token sliding window's ring wraps.
        let worst = compare(f, 40, 16).unwrap_or_else(|e| panic!("{name}: refused: {e}"));
        println!("{name}: worst relative L2 {worst:.2e}");
        matched.push(name);
    }
    println!("{} files match the CPU", matched.len());
    // Every generation and layer kind.
    for must in [
        "gemma/model-f32",
        "gemma2/model-f32",
        "gemma3/model-f32",
        "gemma3n/model-f32",
        "gemma4-dense/model-f32",
        "gemma4-ple/model-f32",
        "gemma4-ple/hf",
        "gemma4-moe/model-f32",
        "gemma4-moe/model-Q8_0",
        "gemma4-odd/hf",
        "gemma3-odd/hf",
        "gemma3-q/model-Q2_K",
        "gemma3-q/model-IQ4_NL",
        "../quantize/gemma3-Q3_K_M",
    ] {
        assert!(
            matched.iter().any(|m| m.starts_with(must)),
            "{must} did not run"
        );
    }
}

/// Every named value of the graph (the embeddings, per-layer inputs, each
/// layer's attention, FFN and output, the final norm, the logits) on the
/// GPU against the CPU for prompts of `n` tokens: the first that differs
/// says where a kernel goes wrong. `None` where the GPU refuses the model.
fn named_values(path: &Path, n: usize) -> Option<Vec<(String, f64)>> {
    use rlx_runtime::{Batch, CompileOptions, HostTensor, StepOutputs};
    let cpu = load(path, Device::Cpu).unwrap();
    let gpu = load(path, Device::Cuda(0)).unwrap();
    let run = |model: &Model| -> Option<StepOutputs> {
        let mut g = rlx_gemma::build_graph(model.config(), model.store()).unwrap();
        let named: Vec<(String, rlx_ir::NodeId)> = g
            .ids()
            .filter(|&id| g.node(id).dtype == rlx_ir::DType::F32 && !g.node(id).inputs.is_empty())
            .filter_map(|id| g.node(id).name.clone().map(|s| (s, id)))
            .collect();
        for (s, id) in &named {
            if !g.outputs().iter().any(|(o, _)| o == s) {
                g.output(s, *id);
            }
        }
        let max = rlx_ir::Bindings::new()
            .with(rlx_ir::Sym::SEQ, n)
            .with(rlx_ir::Sym::ROWS, n);
        let mut opts = CompileOptions::new(max);
        opts.precision = Precision::Exact;
        let mut plan = model.backend().compile(&g, &opts).ok()?;
        let mut pool = model
            .backend()
            .kv_pool(model.kv_config(n.max(32), 1, n, KvTypes::both(KvDType::F32)))
            .unwrap();
        let seq = pool.add_sequence();
        let mut batch = Batch::new();
        let vocab = model.config().n_vocab;
        for i in 0..n {
            batch.push(seq, i, ((i * 7919 + 2) % vocab) as u32, true);
        }
        Some(plan.run(&batch, Some(&mut pool)).unwrap())
    };
    let (a, b) = (run(&cpu).unwrap(), run(&gpu)?);
    let f32s = |t: &HostTensor| match t {
        HostTensor::F32 { data, .. } => data.clone(),
        HostTensor::I32 { .. } => unreachable!("named values are f32"),
    };
    // In graph order (the logits, an output already, come back first).
    let g = rlx_gemma::build_graph(cpu.config(), cpu.store()).unwrap();
    let order: Vec<String> = g.ids().filter_map(|id| g.node(id).name.clone()).collect();
    assert!(a.len() > 3, "named values: {:?}", order);
    let mut a: Vec<(&str, &HostTensor)> = a.iter().collect();
    a.sort_by_key(|(name, _)| order.iter().position(|o| o == name));
    Some(
        a.into_iter()
            .map(|(name, x)| {
                let y = b.get(name).expect("same outputs");
                assert_eq!(x.shape(), y.shape(), "{name}");
                (name.to_string(), rel_l2(&f32s(y), &f32s(x)))
            })
            .collect(),
    )
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn every_named_value_matches_the_cpu() {
    let _gpu = rlx_runtime::cuda::CudaDevice::new(0).unwrap();
    let mut failures = Vec::new();
    let models = common::TINY_GENERATIONS
        .iter()
        .map(|m| format!("{m}/model-f32.gguf"))
        .chain(common::ODD_SIZES.iter().map(|m| format!("{m}/hf")));
    for m in models {
        for n in [1, 2, 3, 12] {
            let Some(values) = named_values(&fixture(&m), n) else {
                println!("{m}: refused by the GPU");
                break;
            };
            let worst = values.iter().map(|v| v.1).fold(0.0, f64::max);
            println!("{m}, {n} rows: {} values, worst {worst:.2e}", values.len());
            // In graph order: the first value off is where it went wrong.
            if let Some((name, e)) = values.iter().find(|v| v.1 >= 1e-4) {
                failures.push(format!("{m}, {n} rows: {name} first differs ({e:.2e})"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn every_cache_type_matches_the_cpus() {
    // Both devices round K/V to the same values (f16/bf16 round to nearest
    // even; Q8_0/Q4_0 blocks as rlx_gguf quantizes) and compute attention
    // over them in f32. (Gemma 2's and gemma4-odd's heads of 16 and 20
    // fit no 32-element block.)
    let _gpu = rlx_runtime::cuda::CudaDevice::new(0).unwrap();
    for f in [
        "gemma2/model-f32.gguf",
        "gemma3/model-f32.gguf",
        "gemma3n/model-f32.gguf",
        "gemma4-ple/model-f32.gguf",
        "gemma4-moe/model-Q8_0.gguf",
        "gemma4-odd/hf",
    ] {
        let blocks = !f.contains("odd") && !f.starts_with("gemma2");
        for kv in KvDType::ALL
            .into_iter()
            .filter(|t| *t != KvDType::F32 && (blocks || t.block_elems() == 1))
        {
            let worst = compare_kv(&fixture(f), 40, 16, Some(kv)).unwrap();
            println!("{f}, {kv:?} K/V: worst relative L2 {worst:.2e}");
        }
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
        let worst = compare(Path::new(path), 700, 256).unwrap_or_else(|e| panic!("{path}: {e}"));
        println!("{path}: worst relative L2 {worst:.2e}");
    }
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
        "gemma3n/model-f32.gguf",
        "gemma4-dense/model-f32.gguf",
        "gemma4-ple/model-f32.gguf",
        "gemma4-moe/model-f32.gguf",
        "gemma4-odd/hf",
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

/// The model at `path` on the GPU with `offload`.
fn load_split(path: &Path, offload: rlx_gemma::Offload) -> Result<Model, ModelError> {
    Model::load(
        path,
        ModelOptions {
            device: Device::Cuda(0),
            precision: Precision::Exact,
            offload,
            kernel_cache: Some(kernel_cache()),
            ..ModelOptions::default()
        },
    )
}

#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn every_split_matches_the_cpu() {
    use rlx_gemma::{GpuLayers, Offload};
    let _gpu = rlx_runtime::cuda::CudaDevice::new(0).unwrap();
    let mut files: Vec<PathBuf> = common::TINY_GENERATIONS
        .iter()
        .map(|g| fixture(g).join("model-f32.gguf"))
        .chain(common::ODD_SIZES.iter().map(|g| fixture(g).join("hf")))
        .collect();
    files.push(fixture("gemma3-q/model-Q4_K_M.gguf"));
    for f in &files {
        let cpu = load(f, Device::Cpu).unwrap();
        let n = cpu.config().layers.len();
        let mut offloads: Vec<Offload> = (1..n)
            .map(|c| Offload {
                gpu_layers: GpuLayers::Count(c),
                ..Offload::default()
            })
            .collect();
        if cpu.config().layers.iter().any(|l| l.moe.is_some()) {
            for moe in [usize::MAX, 1] {
                offloads.push(Offload {
                    cpu_moe_layers: moe,
                    gpu_layers: GpuLayers::Count(n),
                    ..Offload::default()
                });
            }
        }
        for offload in offloads {
            let split = load_split(f, offload.clone()).unwrap();
            let what = format!("{}: {}", f.display(), split.split().expect("a split"));
            let worst = compare_sessions(&cpu, &split, &what, 40, 16, None, 1e-4).unwrap();
            println!("{what}: worst relative L2 {worst:.2e}");
        }
    }
}

/// Sampling from rows reduced on the GPU picks the tokens that sampling the
/// same rows whole picks: greedy, llama.cpp's default chain (top-k, top-p,
/// min-p, penalties), top-p alone, a bias that bans the favourite, step
/// after step with the history growing.
#[test]
#[ignore = "needs an NVIDIA GPU (see the file's header)"]
fn sampling_reduced_rows_on_the_gpu_picks_what_whole_rows_pick() {
    use rlx_gemma::sampling::{Sampler, SamplerConfig, SamplingError};
    use rlx_gemma::LogitRows;
    let model = load(&fixture("gemma3/model-f32.gguf"), Device::Cuda(0)).unwrap();
    let vocab = model.config().n_vocab as u32;
    let prompt: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % vocab).collect();
    let base = SamplerConfig {
        seed: 42,
        ..SamplerConfig::default()
    };
    let configs = [
        base.clone(),
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.1,
            penalty_last_n: 64,
            ..base.clone()
        },
        SamplerConfig {
            temperature: 1.0,
            top_p: 0.5,
            ..base.clone()
        },
        SamplerConfig {
            logit_bias: vec![(prompt[0], f32::NEG_INFINITY), (5, 2.5)],
            frequency_penalty: 0.5,
            penalty_last_n: 8,
            ..base.clone()
        },
    ];
    for cfg in configs {
        let opts = SessionOptions {
            context: Some(64),
            ..SessionOptions::default()
        };
        let (mut whole, mut reduced) = (
            model.session(opts.clone()).unwrap(),
            model.session(opts).unwrap(),
        );
        let (mut sa, mut sb) = (
            Sampler::new(cfg.clone()).unwrap(),
            Sampler::new(cfg.clone()).unwrap(),
        );
        for &t in &prompt {
            sa.accept(t);
            sb.accept(t);
        }
        // Both run the same steps (a prefill, then single tokens), so
        // their rows are the same bits.
        let head = &prompt[..prompt.len() - 1];
        whole.feed(head).unwrap();
        reduced.feed(head).unwrap();
        let mut row = whole.feed(&prompt[prompt.len() - 1..]).unwrap();
        let mut last = prompt[prompt.len() - 1];
        let mut fetched = 0;
        for step in 0..24 {
            let want = sa.sample(&row).unwrap();
            let req = sb.request();
            let rows = reduced.feed_reduced(&[last], &req).unwrap();
            let LogitRows::Reduced(d) = rows else {
                panic!("the GPU returned a whole row")
            };
            let mut fetch = || {
                fetched += 1;
                reduced
                    .fetch_last()
                    .map_err(|e| SamplingError::Fetch(e.to_string()))
            };
            let got = sb.sample_digest(&req, &d[0], &mut fetch).unwrap();
            assert_eq!(got, want, "{cfg:?}: step {step}");
            sa.accept(want);
            sb.accept(got);
            row = whole.feed(&[want]).unwrap();
            last = got;
        }
        println!(
            "T {} top-k {} top-p {}: 24 tokens alike, {fetched} rows read back whole",
            cfg.temperature, cfg.top_k, cfg.top_p
        );
    }
}
