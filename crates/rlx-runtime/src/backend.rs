//! The one interface a device implements, and the one place that maps a
//! [`Device`] to its implementation.
//!
//! A backend owns the weights on its device (mapped or uploaded once and
//! shared by every plan), compiles graphs into [`Executable`] plans, makes
//! the storage of a [`KvPool`], says what it supports and reports memory.
//! Callers hold an `Arc<dyn Backend>` and never match on devices.

use std::fmt;
use std::sync::Arc;

use rlx_gguf::GgmlType;
use rlx_ir::{Graph, Op};

use crate::batch::Batch;
use crate::compile::{CompileOptions, HostTensor, Precision, RunError, StepOutputs, Tap};
use crate::cpu::features::Isa;
use crate::cpu::{CpuBackend, CpuDevice};
use crate::kv::{KvDType, KvPool, KvPoolConfig, KvStorage, SlotSet, StepLayout};
use crate::reduce::{reduce_row, LogitRows, RowDigest, RowReduce};
use crate::weights::WeightStore;

/// Where a model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    #[default]
    Cpu,
    /// The NVIDIA GPU of this ordinal (needs the `cuda` feature).
    Cuda(usize),
}

impl Device {
    /// `cpu`, `cuda` or `cuda:N`.
    pub fn parse(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(format!(
                    "unknown device {s:?} (expected cpu, cuda or cuda:N)"
                )),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// How to open a backend.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    /// CPU threads (on a GPU: for loading and the host side only).
    pub threads: usize,
    /// The weights (by id) a device that copies weights into its own
    /// memory holds; all when `None`. The CPU reads every weight where it
    /// is mapped.
    pub weights: Option<Vec<bool>>,
    /// Where a device that compiles its kernels at start keeps them between
    /// runs; `None`: compiled at every start.
    pub kernel_cache: Option<std::path::PathBuf>,
    /// The highest instruction set the CPU's kernels may use (lowered to
    /// what the CPU has); `None`: the best it has.
    pub isa: Option<Isa>,
    /// Time the CPU's decode kernels at start (about 10 ms) and keep, per
    /// weight type, the faster of the 256- and 512-bit ones; otherwise the
    /// widest.
    pub measure_kernels: bool,
}

impl BackendOptions {
    /// Every weight, `threads` CPU threads.
    pub fn threads(threads: usize) -> Self {
        BackendOptions {
            threads,
            weights: None,
            kernel_cache: None,
            isa: None,
            measure_kernels: false,
        }
    }
}

/// Memory of a device, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// What the device has, when known.
    pub total: Option<usize>,
    /// What is available for new allocations, when known.
    pub available: Option<usize>,
    /// What the weights take on the device (0 where they stay mapped).
    pub weights: usize,
}

/// What one kernel took over the profiled steps of one size
/// ([`Backend::set_profiling`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The kernel's name (`cublas_gemm_bf16` for a cuBLAS product).
    pub name: String,
    /// Launches over all the steps.
    pub launches: usize,
    /// Seconds over all the steps.
    pub seconds: f64,
    /// Bytes of weights its launches read over all the steps (0 where not
    /// counted: kernels that read no weights).
    pub weight_bytes: u64,
}

/// The kernels of the profiled steps of `rows` rows, slowest first.
#[derive(Clone, Debug, PartialEq)]
pub struct StepProfile {
    pub rows: usize,
    pub steps: usize,
    pub kernels: Vec<KernelTime>,
}

/// A device: weights, plans and K/V storage.
pub trait Backend: Send + Sync {
    fn device(&self) -> Device;
    /// The kind of device, for messages: `CPU`, `CUDA`.
    fn kind(&self) -> &'static str;
    /// The K/V storage types its attention kernels read.
    fn kv_dtypes(&self) -> Vec<KvDType>;
    /// The K/V storage type used when none is asked for.
    fn default_kv_dtype(&self, precision: Precision) -> KvDType;
    /// One line for logs and `rlx bench`.
    fn describe(&self) -> String;
    /// The model's weights as mapped from the file; plans refer to the
    /// backend's own copy of them.
    fn store(&self) -> &Arc<WeightStore>;
    fn supports_op(&self, op: &Op) -> bool;
    fn supports_weight(&self, ty: GgmlType) -> bool;
    fn compile(
        &self,
        graph: &Graph,
        opts: &CompileOptions,
    ) -> Result<Box<dyn Executable>, RunError>;
    /// Storage on this device for the owning slots of `config` that
    /// `slots` keeps.
    fn kv_storage(
        &self,
        config: &KvPoolConfig,
        slots: &SlotSet,
    ) -> Result<Box<dyn KvStorage>, RunError>;
    /// A K/V pool with its storage on this device.
    fn kv_pool(&self, config: KvPoolConfig) -> Result<KvPool, RunError> {
        let storage = self.kv_storage(&config, &SlotSet::All)?;
        Ok(KvPool::new(config, storage)?)
    }
    fn memory(&self) -> MemoryReport;
    /// Turns timing every kernel launch on or off; false where the device
    /// cannot (the CPU). While on, steps run one kernel at a time (no
    /// graphs, no overlap between kernels), so they are slower than
    /// otherwise; the sum of a step's kernels bounds what it takes.
    fn set_profiling(&self, on: bool) -> bool {
        let _ = on;
        false
    }
    /// What was timed since the last call, by step size.
    fn take_profile(&self) -> Vec<StepProfile> {
        Vec::new()
    }
}

/// The K/V type llama.cpp keeps with its arithmetic (f16), or f32 on the
/// exact path: what the CPU and CUDA backends use when none is asked for.
pub fn kv_dtype_for(precision: Precision) -> KvDType {
    match precision {
        Precision::Quantized => KvDType::F16,
        Precision::Exact => KvDType::F32,
    }
}

/// The one sequence of a step, for every plan: the batch validated once,
/// the pool prepared (blocks taken, rows marked), `run` on it, and the pool
/// committed (sequences advanced) only when `run` succeeded.
pub fn step<T>(
    batch: &Batch,
    kv: Option<&mut KvPool>,
    run: impl FnOnce(Option<PreparedKv<'_>>) -> Result<T, RunError>,
) -> Result<T, RunError> {
    batch.runs()?;
    let Some(pool) = kv else {
        return run(None);
    };
    let layout = pool.prepare(batch)?;
    let out = run(Some(PreparedKv {
        pool: &mut *pool,
        layout: &layout,
    }))?;
    pool.commit(&layout);
    Ok(out)
}

/// A pool prepared for a step ([`KvPool::prepare`]) and its layout; the
/// caller commits it once every plan of the step has run.
pub struct PreparedKv<'a> {
    pub pool: &'a mut KvPool,
    pub layout: &'a StepLayout,
}

/// A compiled graph on one device.
pub trait Executable: Send {
    /// Checks what can be checked of a step before the pool changes (the
    /// batch's length against the plan, the pool's layers against the
    /// graph's); a step that passes does not fail for those reasons later.
    fn check(&self, batch: &Batch, pool: Option<&KvPool>) -> Result<(), RunError> {
        let _ = (batch, pool);
        Ok(())
    }
    /// Runs one step of `batch` (validated: see [`step`]) on a pool already
    /// prepared for it, with the graph's f32 inputs taken by name from
    /// `values`; returns the graph's outputs.
    fn execute(
        &mut self,
        batch: &Batch,
        kv: Option<PreparedKv<'_>>,
        values: &[(String, HostTensor)],
    ) -> Result<StepOutputs, RunError>;
    /// Runs one step of `batch`; a graph that uses the K/V pool writes and
    /// reads each row at its own sequence and position, and the pool
    /// advances its sequences afterwards.
    fn run(&mut self, batch: &Batch, kv: Option<&mut KvPool>) -> Result<StepOutputs, RunError> {
        self.check(batch, kv.as_deref())?;
        step(batch, kv, |kv| self.execute(batch, kv, &[]))
    }
    /// Like `run`, calling `tap(name, shape, values)` for every named f32
    /// value where the device can (the CPU); others run without the tap.
    fn run_with_tap(
        &mut self,
        batch: &Batch,
        kv: Option<&mut KvPool>,
        tap: &mut Tap<'_>,
    ) -> Result<StepOutputs, RunError> {
        let _ = tap;
        self.run(batch, kv)
    }
    /// Like `run`, with the f32 output `name` (`[rows × vocab]`) reduced
    /// row by row as `rows` asks (one request per row) where the device
    /// can, its rows then kept on the device for [`Executable::fetch_row`]
    /// until the next step; a device that cannot returns them whole (the
    /// CPU: they are in host memory already). The other outputs come back
    /// as `run` returns them.
    fn run_reduced(
        &mut self,
        batch: &Batch,
        kv: Option<&mut KvPool>,
        name: &str,
        rows: &[RowReduce],
    ) -> Result<(StepOutputs, LogitRows), RunError> {
        let _ = rows;
        let mut out = self.run(batch, kv)?;
        let full = out.take_f32(name)?;
        Ok((out, LogitRows::Full(full)))
    }
    /// Row `row` of output `name` of the last [`Executable::run_reduced`]
    /// step, where it was kept on the device.
    fn fetch_row(&mut self, name: &str, row: usize) -> Result<Vec<f32>, RunError> {
        let _ = row;
        Err(RunError::NoOutput(name.into()))
    }
    /// Row `row` of output `name` of the last [`Executable::run_reduced`]
    /// step reduced again as `req` asks (another digest of a kept row: the
    /// model's own distribution for log-probabilities, say). By default the
    /// row is read back and reduced on the host.
    fn reduce_kept(
        &mut self,
        name: &str,
        row: usize,
        req: &RowReduce,
    ) -> Result<RowDigest, RunError> {
        Ok(reduce_row(&self.fetch_row(name, row)?, req))
    }
    /// One logit, `token`'s, of row `row` of output `name` of the last
    /// [`Executable::run_reduced`] step, where it was kept.
    fn fetch_logit(&mut self, name: &str, row: usize, token: u32) -> Result<f32, RunError> {
        let values = self.fetch_row(name, row)?;
        values
            .get(token as usize)
            .copied()
            .ok_or_else(|| RunError::NoOutput(format!("{name}[{row}][{token}]")))
    }
    /// The optimised graph it runs.
    fn graph(&self) -> &Graph;
    /// Bytes of activations it owns.
    fn arena_bytes(&self) -> usize;
    fn dump(&self) -> String;
}

/// The backend of `device` for the weights of `store`.
pub fn open(
    device: Device,
    store: &Arc<WeightStore>,
    opts: &BackendOptions,
) -> Result<Arc<dyn Backend>, RunError> {
    match device {
        Device::Cpu => {
            let cpu = CpuDevice::new(opts.threads);
            let isa = opts.isa.map_or(cpu.isa(), |cap| cap.min(cpu.isa()));
            let mut cpu = cpu.with_isa(isa);
            if opts.measure_kernels {
                cpu = cpu.with_measured_kernels();
            }
            Ok(Arc::new(CpuBackend::with_device(Arc::clone(store), cpu)))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => Ok(Arc::new(crate::cuda::CudaBackend::new(
            ordinal,
            Arc::clone(store),
            opts.weights.as_deref(),
            opts.kernel_cache.as_deref(),
        )?)),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(RunError::Device {
            device: device.to_string(),
            msg: "this build has no CUDA backend (build with the `cuda` feature)".into(),
        }),
    }
}

/// Available host memory from `/proc/meminfo` (Linux); `None` elsewhere.
pub fn host_memory() -> MemoryReport {
    let read = || -> Option<(usize, usize)> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let field = |key: &str| -> Option<usize> {
            let line = text.lines().find(|l| l.starts_with(key))?;
            let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        };
        Some((field("MemTotal:")?, field("MemAvailable:")?))
    };
    match read() {
        Some((total, available)) => MemoryReport {
            total: Some(total),
            available: Some(available),
            weights: 0,
        },
        None => MemoryReport::default(),
    }
}
