//! The CPU backend: a persistent thread pool, runtime-dispatched SIMD
//! matmuls for every weight type, plain f32 kernels for the other ops, K/V
//! in host memory. Weights stay in the file's mapping.

#[cfg(target_arch = "aarch64")]
mod arm;
pub mod features;
pub mod kernels;
pub mod kv;
pub mod matmul;
mod plan;
pub mod pool;
pub(crate) mod simd;

use std::marker::PhantomData;
use std::sync::Arc;

use features::Isa;
use pool::ThreadPool;
use rlx_gguf::GgmlType;
use rlx_ir::{Graph, Op};

use crate::backend::{
    host_memory, kv_dtype_for, Backend, Device, Executable, MemoryReport, PreparedKv,
};
use crate::batch::Batch;
use crate::compile::{
    bind_early, CompileOptions, HostTensor, Precision, RunError, StepOutputs, Tap,
};
use crate::kv::{KvDType, KvPool, KvPoolConfig, KvStorage, SlotSet};
use crate::weights::WeightStore;
pub use kv::CpuKvStorage;
pub use plan::{compile, Plan};

/// The CPU as a [`Backend`].
pub struct CpuBackend {
    store: Arc<WeightStore>,
    device: CpuDevice,
}

impl CpuBackend {
    pub fn new(store: Arc<WeightStore>, threads: usize) -> Self {
        CpuBackend {
            store,
            device: CpuDevice::new(threads),
        }
    }

    /// A backend on an existing device (a chosen ISA, a shared pool).
    pub fn with_device(store: Arc<WeightStore>, device: CpuDevice) -> Self {
        CpuBackend { store, device }
    }

    pub fn cpu(&self) -> &CpuDevice {
        &self.device
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn kind(&self) -> &'static str {
        "CPU"
    }

    /// Rows of every type are read in place or a block at a time.
    fn kv_dtypes(&self) -> Vec<KvDType> {
        KvDType::ALL.to_vec()
    }

    fn default_kv_dtype(&self, precision: Precision) -> KvDType {
        kv_dtype_for(precision)
    }

    fn describe(&self) -> String {
        let isa = self.device.isa();
        let extra = match isa {
            Isa::Avx512 if features::has_avx512_vnni() => " + vnni",
            Isa::Neon if features::has_neon_i8mm() => " + dotprod + i8mm",
            Isa::Neon if features::has_neon_dotprod() => " + dotprod",
            _ => "",
        };
        format!(
            "cpu: {} threads, {isa}{extra}, decode kernels: {}",
            self.device.threads(),
            self.device.rows()
        )
    }

    fn store(&self) -> &Arc<WeightStore> {
        &self.store
    }

    /// The CPU is the reference: it runs every op.
    fn supports_op(&self, _op: &Op) -> bool {
        true
    }

    /// Every ggml type has a CPU matmul (quantized or dequantizing).
    fn supports_weight(&self, _ty: GgmlType) -> bool {
        true
    }

    fn compile(
        &self,
        graph: &Graph,
        opts: &CompileOptions,
    ) -> Result<Box<dyn Executable>, RunError> {
        Ok(Box::new(compile(graph, &self.store, &self.device, opts)?))
    }

    fn kv_storage(
        &self,
        config: &KvPoolConfig,
        slots: &SlotSet,
    ) -> Result<Box<dyn KvStorage>, RunError> {
        Ok(Box::new(CpuKvStorage::new(config, slots)?))
    }

    fn memory(&self) -> MemoryReport {
        host_memory()
    }
}

impl Executable for Plan {
    fn check(&self, batch: &Batch, _pool: Option<&KvPool>) -> Result<(), RunError> {
        bind_early(self.graph(), &self.options().max, batch).map(|_| ())
    }

    fn execute(
        &mut self,
        batch: &Batch,
        kv: Option<PreparedKv<'_>>,
        values: &[(String, HostTensor)],
    ) -> Result<StepOutputs, RunError> {
        self.run_inner(batch, kv, values, None)
    }

    fn run_with_tap(
        &mut self,
        batch: &Batch,
        kv: Option<&mut KvPool>,
        tap: &mut Tap<'_>,
    ) -> Result<StepOutputs, RunError> {
        Plan::run_with_tap(self, batch, kv, tap)
    }

    fn graph(&self) -> &Graph {
        Plan::graph(self)
    }

    fn arena_bytes(&self) -> usize {
        Plan::arena_bytes(self)
    }

    fn dump(&self) -> String {
        Plan::dump(self)
    }
}

/// A CPU device: the thread pool and instruction set kernels may use.
#[derive(Clone)]
pub struct CpuDevice {
    pool: Arc<ThreadPool>,
    isa: Isa,
    rows: matmul::RowChoice,
}

impl CpuDevice {
    /// `threads` threads in all, the best instruction set this CPU supports.
    pub fn new(threads: usize) -> Self {
        CpuDevice {
            pool: Arc::new(ThreadPool::new(threads)),
            isa: Isa::detect(),
            rows: matmul::RowChoice::WIDEST,
        }
    }

    /// Restricts kernels to `isa` (e.g. the portable path in tests).
    pub fn with_isa(mut self, isa: Isa) -> Self {
        self.isa = isa;
        self
    }

    /// Decode kernels chosen by timing them on this CPU
    /// ([`matmul::RowChoice::measure`], about 10 ms) instead of the widest.
    pub fn with_measured_kernels(mut self) -> Self {
        self.rows = matmul::RowChoice::measure(self.isa);
        self
    }

    /// Which types' decode kernels take a lower instruction set.
    pub fn rows(&self) -> matmul::RowChoice {
        self.rows
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
}

/// A mutable slice shared by pool tasks that each write a disjoint part.
pub(crate) struct SharedMut<'a> {
    ptr: *mut f32,
    len: usize,
    _life: PhantomData<&'a mut [f32]>,
}

// SAFETY: tasks only write disjoint ranges (each caller documents why).
unsafe impl Send for SharedMut<'_> {}
// SAFETY: as for `Send`: shared between tasks that write disjoint ranges.
unsafe impl Sync for SharedMut<'_> {}

impl<'a> SharedMut<'a> {
    pub fn new(s: &'a mut [f32]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: PhantomData,
        }
    }

    /// # Safety
    /// No two live slices from one `SharedMut` may overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &'a mut [f32] {
        assert!(start + len <= self.len, "range past the shared slice");
        // SAFETY: in bounds (checked above); disjointness is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
