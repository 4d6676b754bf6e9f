//! A model split between two devices gives the logits of the whole model
//! on one. Without a GPU the second device is the CPU under another name
//! (a backend that reports itself as `cuda:0`, with the memory a test
//! gives it), so the split itself — placement, parts, values crossing
//! between plans, K/V rows kept per device, fitting — runs here and in CI.
//! `tests/cuda.rs` runs the same splits on a real GPU.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::scenario::{compare_sessions, worst_against_alone, Script};
use common::{ODD_SIZES, TINY_GENERATIONS};

use rlx_gemma::{Device, GpuLayers, KvDType, Model, ModelError, ModelOptions, Offload, Precision};
use rlx_ir::{Graph, Op};
use rlx_runtime::cpu::CpuBackend;
use rlx_runtime::{
    Backend, BackendOptions, CompileOptions, Executable, KvPoolConfig, KvStorage, MemoryReport,
    RunError, SlotSet, WeightStore,
};

/// The CPU, reporting itself as `device` with `available` bytes free.
struct Named {
    cpu: CpuBackend,
    device: Device,
    available: Option<usize>,
}

impl Backend for Named {
    fn device(&self) -> Device {
        self.device
    }
    fn kind(&self) -> &'static str {
        "test"
    }
    fn kv_dtypes(&self) -> Vec<KvDType> {
        self.cpu.kv_dtypes()
    }
    fn default_kv_dtype(&self, precision: Precision) -> KvDType {
        self.cpu.default_kv_dtype(precision)
    }
    fn describe(&self) -> String {
        format!("{} (the CPU under another name)", self.device)
    }
    fn store(&self) -> &Arc<WeightStore> {
        self.cpu.store()
    }
    fn supports_op(&self, op: &Op) -> bool {
        self.cpu.supports_op(op)
    }
    fn supports_weight(&self, ty: rlx_gguf::GgmlType) -> bool {
        self.cpu.supports_weight(ty)
    }
    fn compile(
        &self,
        graph: &Graph,
        opts: &CompileOptions,
    ) -> Result<Box<dyn Executable>, RunError> {
        self.cpu.compile(graph, opts)
    }
    fn kv_storage(
        &self,
        config: &KvPoolConfig,
        slots: &SlotSet,
    ) -> Result<Box<dyn KvStorage>, RunError> {
        self.cpu.kv_storage(config, slots)
    }
    fn memory(&self) -> MemoryReport {
        MemoryReport {
            total: self.available,
            available: self.available,
            weights: 0,
        }
    }
}

fn tiny(name: &str) -> PathBuf {
    let dir = common::fixtures().join("tiny").join(name);
    let hf = dir.join("hf");
    if hf.join("config.json").exists() && !dir.join("model-f32.gguf").exists() {
        hf
    } else {
        dir.join("model-f32.gguf")
    }
}

/// The model at `path` with `offload`, its accelerator the CPU named
/// `cuda:0` with `available` bytes free.
fn load(path: &Path, offload: Offload, available: Option<usize>) -> Result<Model, ModelError> {
    let opener = move |device: Device, store: &Arc<WeightStore>, opts: &BackendOptions| {
        let cpu = CpuBackend::new(Arc::clone(store), opts.threads);
        let b: Arc<dyn Backend> = match device {
            Device::Cpu => Arc::new(cpu),
            _ => Arc::new(Named {
                cpu,
                device,
                available,
            }),
        };
        Ok(b)
    };
    let file = rlx_gemma::model::open_file(path)?;
    let opts = ModelOptions {
        device: Device::Cuda(0),
        precision: Precision::Exact,
        threads: 2,
        offload,
        ..ModelOptions::default()
    };
    Model::from_file_with(file, opts, &opener)
}

fn cpu(path: &Path) -> Model {
    Model::load(
        path,
        ModelOptions {
            threads: 2,
            ..ModelOptions::default()
        },
    )
    .unwrap()
}

fn layers(n: usize) -> Offload {
    Offload {
        gpu_layers: GpuLayers::Count(n),
        ..Offload::default()
    }
}

/// Every generation with the boundary after every layer: the split's
/// logits are the CPU's.
#[test]
fn every_layer_boundary_gives_the_cpu_logits() {
    let mut names: Vec<&str> = TINY_GENERATIONS.to_vec();
    names.extend(ODD_SIZES);
    for name in names {
        let path = tiny(name);
        let reference = cpu(&path);
        let n = reference.config().layers.len();
        for gpu_layers in 1..n {
            let split = load(&path, layers(gpu_layers), None).unwrap();
            let s = split.split().expect("a split");
            assert_eq!((s.gpu_layers, s.layers), (gpu_layers, n));
            // The plan runs parts on both devices.
            let graph = rlx_gemma::build_graph(split.config(), split.store()).unwrap();
            let max = rlx_ir::Bindings::new()
                .with(rlx_ir::Sym::SEQ, 8)
                .with(rlx_ir::Sym::ROWS, 1);
            let dump = split
                .backend()
                .compile(&graph, &CompileOptions::new(max))
                .unwrap()
                .dump();
            let parts: Vec<&str> = dump.lines().filter(|l| l.starts_with("part ")).collect();
            assert!(
                parts.iter().any(|p| p.ends_with("on cuda:0:"))
                    && parts.iter().any(|p| p.ends_with("on cpu:")),
                "{name}: {parts:?}"
            );
            let what = format!(
                "{name} with {gpu_layers} of {n} layers on the second device ({} parts)",
                parts.len()
            );
            let worst = compare_sessions(&reference, &split, &what, 40, 16, None, 1e-5).unwrap();
            println!("{what}: worst relative L2 {worst:.1e}");
        }
    }
}

/// Experts of every layer, and of the first only, on the CPU with the rest
/// of the model on the other device.
#[test]
fn experts_on_the_cpu_give_the_cpu_logits() {
    let path = tiny("gemma4-moe");
    let reference = cpu(&path);
    let n = reference.config().layers.len();
    for moe in [usize::MAX, 1] {
        let offload = Offload {
            gpu_layers: GpuLayers::Count(n),
            cpu_moe_layers: moe,
            ..Offload::default()
        };
        let split = load(&path, offload, None).unwrap();
        let s = split.split().expect("a split");
        assert_eq!(s.cpu_moe_layers, moe.min(n));
        let what = format!(
            "gemma4-moe with the experts of {} layers on the CPU",
            moe.min(n)
        );
        let worst = compare_sessions(&reference, &split, &what, 40, 16, None, 1e-5).unwrap();
        println!("{what}: worst relative L2 {worst:.1e}");
    }
}

/// Mixed batches (adds, forks, removals, prompt chunks beside decode
/// tokens) on a split against each sequence alone on the CPU.
#[test]
fn mixed_batches_on_a_split_match_each_sequence_alone() {
    for name in ["gemma3", "gemma3n", "gemma4-ple"] {
        let path = tiny(name);
        let reference = cpu(&path);
        let n = reference.config().layers.len();
        let split = load(&path, layers(n / 2), None).unwrap();
        let worst = worst_against_alone(&split, &reference, &Script::TINY);
        println!("{name}: worst relative L2 {worst:.1e}");
        assert!(worst < 1e-5, "{name}: {worst:.2e}");
    }
}

/// Fitting: the whole model where it fits, the last layers that fit where
/// it does not, the CPU alone where none does; an asked-for split that does
/// not fit is refused before loading, naming each share.
#[test]
fn a_model_is_fitted_to_the_free_memory() {
    let path = tiny("gemma3");
    let reference = cpu(&path);
    let n = reference.config().layers.len();
    let whole = load(&path, Offload::default(), Some(usize::MAX)).unwrap();
    assert!(whole.split().is_none(), "fits whole");
    // Room for the K/V and scratch but not every weight.
    let all_but = {
        let store = reference.store();
        let weights: usize = (0..store.len())
            .map(|i| store.bytes(rlx_ir::WeightId(i as u32)).len())
            .sum();
        let gpu_share = load(&path, layers(n - 1), None).unwrap();
        let share = gpu_share.split().unwrap().shares[0];
        assert!(share.weights < weights);
        share.total()
    };
    let fitted = load(&path, Offload::default(), Some(all_but)).unwrap();
    let s = fitted.split().expect("split to fit");
    assert_eq!(s.gpu_layers, n - 1, "{s}");
    assert!(s.shares[0].total() <= all_but, "{s}");
    compare_sessions(&reference, &fitted, "fitted", 40, 16, None, 1e-5).unwrap();
    let none = load(&path, Offload::default(), Some(1 << 10)).unwrap();
    assert_eq!(none.split().map(|s| s.gpu_layers), Some(0));
    assert_eq!(none.device(), Device::Cpu);
    let Err(e) = load(&path, layers(n - 1), Some(1 << 10)) else {
        panic!("a split larger than the device was accepted");
    };
    let msg = e.to_string();
    assert!(
        msg.contains("needs about") && msg.contains("cuda:0"),
        "{msg}"
    );
}
