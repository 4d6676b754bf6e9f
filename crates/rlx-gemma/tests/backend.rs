//! The backend interface from outside the runtime: a model runs on any
//! `Backend`, and one that lacks a weight type is refused with an error
//! naming the weight before anything is compiled.

mod common;

use std::sync::Arc;

use common::fixtures;
use rlx_gemma::{Model, ModelOptions, SessionOptions};
use rlx_gguf::{GgmlType, GgufFile};
use rlx_ir::{Graph, Op};
use rlx_runtime::cpu::CpuBackend;
use rlx_runtime::{
    Backend, CompileOptions, Device, Executable, KvDType, KvPoolConfig, KvStorage, MemoryReport,
    Precision, RunError, SlotSet, WeightStore,
};

/// The CPU backend, but claiming no kernels for one weight type.
struct Without {
    cpu: CpuBackend,
    missing: GgmlType,
}

impl Backend for Without {
    fn device(&self) -> Device {
        self.cpu.device()
    }
    fn kind(&self) -> &'static str {
        self.cpu.kind()
    }
    fn kv_dtypes(&self) -> Vec<KvDType> {
        self.cpu.kv_dtypes()
    }
    fn default_kv_dtype(&self, precision: Precision) -> KvDType {
        self.cpu.default_kv_dtype(precision)
    }
    fn describe(&self) -> String {
        format!("{} without {}", self.cpu.describe(), self.missing)
    }
    fn store(&self) -> &Arc<WeightStore> {
        self.cpu.store()
    }
    fn supports_op(&self, op: &Op) -> bool {
        self.cpu.supports_op(op)
    }
    fn supports_weight(&self, ty: GgmlType) -> bool {
        ty != self.missing && self.cpu.supports_weight(ty)
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
        self.cpu.memory()
    }
}

fn model(file: &str, missing: GgmlType) -> Model {
    let path = fixtures().join("tiny/gemma3").join(file);
    let store = Arc::new(WeightStore::new(Arc::new(GgufFile::open(&path).unwrap())));
    let backend = Without {
        cpu: CpuBackend::new(Arc::clone(&store), 2),
        missing,
    };
    Model::with_backend(Arc::new(backend), ModelOptions::default()).unwrap()
}

#[test]
fn a_model_runs_on_any_backend() {
    let custom = model("model-f32.gguf", GgmlType::Q2_K);
    let plain = Model::load(
        fixtures().join("tiny/gemma3/model-f32.gguf"),
        ModelOptions::default(),
    )
    .unwrap();
    let tokens = [2, 17, 99, 5, 42];
    let run = |m: &Model| {
        m.session(SessionOptions::default())
            .unwrap()
            .score(&tokens)
            .unwrap()
    };
    assert_eq!(run(&custom), run(&plain));
}

#[test]
fn a_weight_type_without_kernels_is_refused_by_name() {
    let m = model("model-Q8_0.gguf", GgmlType::Q8_0);
    let err = m.session(SessionOptions::default()).err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("Q8_0") && msg.contains("weight"), "{msg}");
}
