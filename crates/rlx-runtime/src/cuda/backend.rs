//! One GPU as a [`Backend`]: its weights uploaded once, plans compiled for
//! it, K/V pools in its memory.

use std::sync::Arc;

use rlx_gguf::GgmlType;
use rlx_ir::{Graph, Op};

use super::{compile_cuda, supports, CudaDevice, CudaError, CudaKvStorage, CudaPlan, CudaWeights};
use crate::backend::{
    kv_dtype_for, step, Backend, Device, Executable, MemoryReport, PreparedKv, StepProfile,
};
use crate::batch::Batch;
use crate::compile::{CompileOptions, HostTensor, Precision, RunError, StepOutputs};
use crate::kv::{KvDType, KvPool, KvPoolConfig, KvStorage, SlotSet};
use crate::reduce::{LogitRows, RowDigest, RowReduce};
use crate::weights::WeightStore;

/// A GPU with a model's weights on it.
pub struct CudaBackend {
    store: Arc<WeightStore>,
    weights: Arc<CudaWeights>,
}

impl CudaBackend {
    /// Opens GPU `ordinal` (shared with anything else in the process using
    /// it; its compiled kernels kept in `kernel_cache` between runs) and
    /// uploads the weights of `store` that `keep` lists (all when `None`).
    pub fn new(
        ordinal: usize,
        store: Arc<WeightStore>,
        keep: Option<&[bool]>,
        kernel_cache: Option<&std::path::Path>,
    ) -> Result<Self, RunError> {
        let label = format!("cuda:{ordinal}");
        let device =
            CudaDevice::with_kernel_cache(ordinal, kernel_cache).map_err(|e| e.into_run(&label))?;
        let weights = CudaWeights::upload(&device, &store, keep).map_err(|e| e.into_run(&label))?;
        Ok(CudaBackend {
            store,
            weights: Arc::new(weights),
        })
    }

    pub fn cuda(&self) -> &Arc<CudaDevice> {
        self.weights.device()
    }

    pub fn weights(&self) -> &Arc<CudaWeights> {
        &self.weights
    }

    fn err(&self, e: CudaError) -> RunError {
        e.into_run(&self.cuda().label())
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> Device {
        Device::Cuda(self.cuda().ordinal())
    }

    fn kind(&self) -> &'static str {
        "CUDA"
    }

    /// One attention kernel per pair of key and value types.
    fn kv_dtypes(&self) -> Vec<KvDType> {
        KvDType::ALL.to_vec()
    }

    fn default_kv_dtype(&self, precision: Precision) -> KvDType {
        kv_dtype_for(precision)
    }

    fn describe(&self) -> String {
        format!("{}: {}", self.cuda().label(), self.cuda().name())
    }

    fn store(&self) -> &Arc<WeightStore> {
        &self.store
    }

    /// The ops [`CudaPlan`] has kernels for.
    fn supports_op(&self, op: &Op) -> bool {
        match op {
            Op::Input { .. }
            | Op::Attention(_)
            | Op::BatchMatMul
            | Op::MatchRms { .. }
            | Op::GaussianTopK { .. }
            | Op::Moe { .. }
            | Op::Weight { .. }
            | Op::Gather
            | Op::MatMul { .. }
            | Op::Add
            | Op::Mul
            | Op::Scale { .. }
            | Op::AddConst { .. }
            | Op::RmsNorm(_)
            | Op::Gelu
            | Op::GeGlu
            | Op::Softcap { .. }
            | Op::Rope(_)
            | Op::KvWrite { .. }
            | Op::TakeRows
            | Op::Narrow { .. }
            | Op::Reshape { .. }
            | Op::Concat { .. } => true,
        }
    }

    /// The types the matmul and gather kernels read in place (vectors of
    /// any type are uploaded as f32).
    fn supports_weight(&self, ty: GgmlType) -> bool {
        supports(ty)
    }

    fn compile(
        &self,
        graph: &Graph,
        opts: &CompileOptions,
    ) -> Result<Box<dyn Executable>, RunError> {
        let plan =
            compile_cuda(graph, &self.store, &self.weights, opts).map_err(|e| self.err(e))?;
        Ok(Box::new(plan))
    }

    fn kv_storage(
        &self,
        config: &KvPoolConfig,
        slots: &SlotSet,
    ) -> Result<Box<dyn KvStorage>, RunError> {
        let storage = CudaKvStorage::new(self.cuda(), config, slots).map_err(|e| self.err(e))?;
        Ok(Box::new(storage))
    }

    fn memory(&self) -> MemoryReport {
        let (available, total) = match self.cuda().memory() {
            Ok((free, total)) => (Some(free), Some(total)),
            Err(_) => (None, None),
        };
        MemoryReport {
            total,
            available,
            weights: self.weights.bytes(),
        }
    }

    fn set_profiling(&self, on: bool) -> bool {
        self.cuda().set_profiling(on);
        true
    }

    fn take_profile(&self) -> Vec<StepProfile> {
        self.cuda().take_profile()
    }
}

impl CudaPlan {
    /// One step on a prepared pool: the spans recorded, then the run, with
    /// output `reduce.0` reduced on the device where `reduce` is given.
    fn execute_step(
        &mut self,
        batch: &Batch,
        mut kv: Option<PreparedKv<'_>>,
        values: &[(String, HostTensor)],
        reduce: Option<(&str, &[RowReduce])>,
    ) -> Result<(StepOutputs, Option<Vec<RowDigest>>), RunError> {
        let label = self.cuda_label();
        if let Some(k) = kv.as_mut() {
            self.record_spans(batch, k.pool, k.layout)
                .map_err(|e| e.into_run(&label))?;
        }
        self.run_inner(batch, kv.map(|k| (&*k.pool, k.layout)), values, reduce)
            .map_err(|e| e.into_run(&label))
    }
}

impl Executable for CudaPlan {
    fn execute(
        &mut self,
        batch: &Batch,
        kv: Option<PreparedKv<'_>>,
        values: &[(String, HostTensor)],
    ) -> Result<StepOutputs, RunError> {
        Ok(self.execute_step(batch, kv, values, None)?.0)
    }

    fn run_reduced(
        &mut self,
        batch: &Batch,
        kv: Option<&mut KvPool>,
        name: &str,
        rows: &[RowReduce],
    ) -> Result<(StepOutputs, LogitRows), RunError> {
        self.check(batch, kv.as_deref())?;
        let (outs, digests) = step(batch, kv, |kv| {
            self.execute_step(batch, kv, &[], Some((name, rows)))
        })?;
        Ok((outs, LogitRows::Reduced(digests.unwrap_or_default())))
    }

    fn fetch_row(&mut self, name: &str, row: usize) -> Result<Vec<f32>, RunError> {
        self.fetch_kept_row(name, row)
            .map_err(|e| e.into_run(&self.cuda_label()))
    }

    fn reduce_kept(
        &mut self,
        name: &str,
        row: usize,
        req: &RowReduce,
    ) -> Result<RowDigest, RunError> {
        self.reduce_kept_row(name, row, req)
            .map_err(|e| e.into_run(&self.cuda_label()))
    }

    fn fetch_logit(&mut self, name: &str, row: usize, token: u32) -> Result<f32, RunError> {
        self.fetch_kept_logit(name, row, token)
            .map_err(|e| e.into_run(&self.cuda_label()))
    }

    fn check(&self, batch: &Batch, pool: Option<&KvPool>) -> Result<(), RunError> {
        self.check_step(batch, pool)
            .map_err(|e| e.into_run(&self.cuda_label()))
    }

    fn graph(&self) -> &Graph {
        CudaPlan::graph(self)
    }

    fn arena_bytes(&self) -> usize {
        CudaPlan::arena_bytes(self)
    }

    fn dump(&self) -> String {
        CudaPlan::dump(self)
    }
}
