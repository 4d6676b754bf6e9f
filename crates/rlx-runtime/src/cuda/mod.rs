//! The CUDA backend: the same graphs as the CPU backend, run by kernels
//! compiled at start with NVRTC (`kernels.cu`), many sequences per step.
//!
//! - [`CudaBackend`]: the [`Backend`](crate::Backend) of one GPU — its
//!   weights, plans and K/V storage.
//! - [`CudaDevice`]: context, stream and the compiled kernels.
//! - [`CudaWeights`]: every weight of a store uploaded once, matrices in
//!   their packed GGUF blocks (vectors as f32); plans refer to it.
//! - [`CudaKvStorage`]: the rows of a [`KvPool`](crate::KvPool) in device
//!   memory. Per owning layer one f32 buffer of keys and one of values,
//!   `blocks × BLOCK_TOKENS` rows each; row `b·BLOCK_TOKENS + i` is row `i`
//!   of physical block `b` of the layer's group. The pool keeps the block
//!   tables on the host.
//! - [`compile_cuda`] → [`CudaPlan`]: the CPU plan's schedule and arena
//!   layout, in one device buffer.
//!
//! A step's plan uploads, in one copy before its kernels, the step inputs
//! and what the kernels need of the pool's layout: the physical row each
//! batch row's K/V go to, each row's sequence (run), each run's end and the
//! (physical, logical) blocks it reads. Attention derives a key's position
//! from its block's logical index, so no row positions live on the device:
//! a key is valid if its position is below its run's end after this step,
//! and the mask decides the rest. These buffers have fixed addresses, so a
//! run at the plan's maxima is captured once as a CUDA graph and replayed
//! for every later step with the same storage.
//!
//! Arithmetic is f32 on exactly dequantized weights (the CPU's `exact`
//! precision), except in `q8` plans: products of up to eight rows read the
//! activations as 8-bit blocks (integer dot products), larger ones run on
//! bf16 tensor cores. The CUDA libraries are loaded at run time: without a driver
//! [`CudaDevice::new`] returns an error and nothing else changes.

mod backend;
mod kv;
mod plan;
mod profile;
mod reduce;

use std::sync::{Arc, Mutex, Weak};

use cudarc::cublas::{sys as blas, CudaBlas};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions as NvrtcOptions, Ptx};
use rlx_gguf::GgmlType;

use crate::compile::RunError;
use crate::kv::KvDType;
use crate::weights::WeightStore;

pub use backend::CudaBackend;
pub use kv::CudaKvStorage;
pub use plan::{compile_cuda, CudaPlan};

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA device: {0}")]
    Unavailable(String),
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("cuBLAS: {0}")]
    Blas(#[from] cudarc::cublas::result::CublasError),
    #[error("the CUDA kernels did not compile: {0}")]
    Compile(String),
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Kv(#[from] crate::kv::KvError),
    #[error(transparent)]
    Run(#[from] RunError),
}

impl CudaError {
    /// The error as the [`Backend`](crate::Backend) interface reports it:
    /// run and K/V errors as they are, device errors naming `device`.
    pub fn into_run(self, device: &str) -> RunError {
        match self {
            CudaError::Run(e) => e,
            CudaError::Kv(e) => RunError::Kv(e),
            e => RunError::Device {
                device: device.to_string(),
                msg: e.to_string(),
            },
        }
    }
}

/// Bytes of the cuBLAS workspace (what NVIDIA advises for Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;

/// Weight types the kernels read, and their kernel-name suffixes; a type's
/// index is the code `kernels.cu` uses (`T_F32` = 0 …, its `FOR_EACH_TYPE`).
const TYPES: [(GgmlType, &str); 16] = [
    (GgmlType::F32, "f32"),
    (GgmlType::F16, "f16"),
    (GgmlType::BF16, "bf16"),
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q5_1, "q5_1"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q4_K, "q4_k"),
    (GgmlType::Q5_K, "q5_k"),
    (GgmlType::Q6_K, "q6_k"),
    (GgmlType::Q2_K, "q2_k"),
    (GgmlType::Q3_K, "q3_k"),
    (GgmlType::IQ4_NL, "iq4_nl"),
    (GgmlType::IQ4_XS, "iq4_xs"),
    (GgmlType::MXFP4, "mxfp4"),
];

/// The attention kernel's index for keys of type `k` and values of type `v`
/// (the kernels are made for every pair of [`KvDType::ALL`]).
fn attention_index(k: KvDType, v: KvDType) -> usize {
    let at = |t| {
        KvDType::ALL
            .iter()
            .position(|&x| x == t)
            .expect("every K/V type")
    };
    at(k) * KvDType::ALL.len() + at(v)
}

/// The kernel code of a weight type, if the kernels read it.
fn type_code(ty: GgmlType) -> Option<u32> {
    TYPES.iter().position(|&(t, _)| t == ty).map(|i| i as u32)
}

/// The weight types the CUDA kernels read in place.
pub fn supports(ty: GgmlType) -> bool {
    type_code(ty).is_some()
}

/// `kernels.cu` compiled to PTX for compute capability `major.minor` (needs
/// only libnvrtc, no GPU).
pub fn compile_kernels(major: i32, minor: i32) -> Result<Ptx, CudaError> {
    // SAFETY: only tries to open the shared library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "the NVRTC library (libnvrtc) is not installed".into(),
        ));
    }
    compile_ptx_with_opts(
        include_str!("kernels.cu"),
        NvrtcOptions {
            options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
            name: Some("kernels.cu".into()),
            ..NvrtcOptions::default()
        },
    )
    .map_err(|e| CudaError::Compile(format!("{e:?}")))
}

/// `kernels.cu` compiled to machine code (a cubin) for compute capability
/// `major.minor` by NVRTC (needs only libnvrtc, no GPU): what a device
/// loads without the driver translating PTX at every start where its own
/// cache is off or full (about a minute over kernels.cu).
pub fn compile_kernels_cubin(major: i32, minor: i32) -> Result<Vec<u8>, CudaError> {
    use cudarc::nvrtc::{result, sys};
    // SAFETY: only tries to open the shared library.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "the NVRTC library (libnvrtc) is not installed".into(),
        ));
    }
    let err = |what: &str, e: result::NvrtcError| CudaError::Compile(format!("{what}: {e:?}"));
    let src = std::ffi::CString::new(include_str!("kernels.cu")).expect("no NUL in the source");
    let prog = result::create_program(&src, Some(c"kernels.cu")).map_err(|e| err("create", e))?;
    let options = [format!("--gpu-architecture=sm_{major}{minor}")];
    // SAFETY: `prog` is a live program (destroyed below, once); the sizes
    // NVRTC reports are those of the buffers it then fills.
    unsafe {
        let compiled = match result::compile_program(prog, &options) {
            Ok(()) => {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| err("cubin size", e))
                    .and_then(|()| {
                        let mut bin = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast())
                            .result()
                            .map(|()| bin)
                            .map_err(|e| err("cubin", e))
                    })
            }
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        std::ffi::CStr::from_ptr(l.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default();
                Err(CudaError::Compile(format!(
                    "sm_{major}{minor}: {e:?}: {log}"
                )))
            }
        };
        let _ = result::destroy_program(prog);
        compiled
    }
}

/// [`compile_kernels`] through a directory of earlier results: the PTX for
/// the same source and architecture is read back instead of compiled again
/// (NVRTC takes tens of seconds over kernels.cu). Without a directory, or
/// when it cannot be read or written, the kernels are compiled as usual.
pub fn compile_kernels_cached(
    major: i32,
    minor: i32,
    cache: Option<&std::path::Path>,
) -> Result<Ptx, CudaError> {
    let make = || compile_kernels(major, minor).map(|p| p.to_src().into_bytes());
    let text = kept(cache, &format!("compute_{major}{minor}"), "ptx", make)?;
    String::from_utf8(text)
        .map(Ptx::from_src)
        .map_err(|e| CudaError::Compile(format!("kept PTX is not text: {e}")))
}

/// What a device of compute capability `major.minor` loads: the machine
/// code of [`compile_kernels_cubin`] through `cache` as
/// [`compile_kernels_cached`] keeps PTX, or, where NVRTC cannot make
/// machine code for that architecture, the PTX.
pub fn compile_module_cached(
    major: i32,
    minor: i32,
    cache: Option<&std::path::Path>,
) -> Result<Ptx, CudaError> {
    let make = || compile_kernels_cubin(major, minor);
    match kept(cache, &format!("sm_{major}{minor}"), "cubin", make) {
        Ok(bin) => Ok(Ptx::from_binary(bin)),
        Err(CudaError::Compile(_)) => compile_kernels_cached(major, minor, cache),
        Err(e) => Err(e),
    }
}

/// kernels.cu compiled for `arch` by `make`, through `cache` where there
/// is one ([`cached_bytes`], files `*.<ext>`).
fn kept(
    cache: Option<&std::path::Path>,
    arch: &str,
    ext: &str,
    make: impl FnOnce() -> Result<Vec<u8>, CudaError>,
) -> Result<Vec<u8>, CudaError> {
    match cache {
        Some(dir) => cached_bytes(dir, &kernels_key(arch), ext, make),
        None => make(),
    }
}

/// What a compiled kernels.cu depends on: its source (by hash and length),
/// the target architecture and the rlx version that compiled it.
fn kernels_key(arch: &str) -> String {
    use std::hash::{Hash, Hasher};
    let src = include_str!("kernels.cu");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    src.hash(&mut h);
    format!(
        "rlx {} kernels.cu {:016x} {} bytes {arch}",
        env!("CARGO_PKG_VERSION"),
        h.finish(),
        src.len()
    )
}

/// The bytes kept under `key` in `dir` (a file `<hash of key>.<ext>` whose
/// first line is the key itself, so a different key never matches), or
/// `make`'s, which are then written there for next time. A cache that
/// cannot be read or written only costs the work.
fn cached_bytes<E>(
    dir: &std::path::Path,
    key: &str,
    ext: &str,
    make: impl FnOnce() -> Result<Vec<u8>, E>,
) -> Result<Vec<u8>, E> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let path = dir.join(format!("{:016x}.{ext}", h.finish()));
    if let Ok(data) = std::fs::read(&path) {
        if let Some(body) = data
            .strip_prefix(key.as_bytes())
            .and_then(|t| t.strip_prefix(b"\n"))
        {
            return Ok(body.to_vec());
        }
    }
    let body = make()?;
    // Written beside and renamed into place, so a reader never sees half.
    let tmp = dir.join(format!(".{:016x}.{}.tmp", h.finish(), std::process::id()));
    let mut data = Vec::with_capacity(key.len() + 1 + body.len());
    data.extend_from_slice(key.as_bytes());
    data.push(b'\n');
    data.extend_from_slice(&body);
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, &data))
        .and_then(|_| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(body)
}

/// The kernels of `kernels.cu`, looked up once.
struct Kernels {
    /// Per weight type code: `matmul_<type>` and `gather_<type>`.
    matmul: Vec<CudaFunction>,
    gather: Vec<CudaFunction>,
    /// Per weight type code, the products of up to eight activation rows:
    /// `mmv1_`, `mmv8_` (f32 activations, one row and up to eight), then
    /// `mmvq1_`, `mmvq8_` (8-bit activation blocks), then `mmvq1u2_`,
    /// `mmvq1u3_` (one row, two or three units a lane at once), then
    /// `mmvq8u2_`, `mmvq8u3_` (the same for up to eight), each `_<type>`.
    mmv: Vec<Vec<CudaFunction>>,
    /// Per weight type code, the tensor-core products of up to 16, 32 and
    /// 64 activation rows (`mmq16_`, `mmq32_`, `mmq64_`), and the sum of
    /// their shares of k.
    mmq: Vec<Vec<CudaFunction>>,
    mmq_sum: CudaFunction,
    quantize_q8: CudaFunction,
    /// Per weight type code: `dequant_<type>`, rows into f32 or bf16 for a
    /// cuBLAS product.
    dequant: Vec<CudaFunction>,
    /// Per weight type code: `moe_rows_<type>`, expert rows against the
    /// activations of the slots routed to each expert.
    moe_rows: Vec<CudaFunction>,
    moe_route: CudaFunction,
    moe_lists: CudaFunction,
    moe_geglu: CudaFunction,
    moe_combine: CudaFunction,
    match_rms: CudaFunction,
    gaussian_topk: CudaFunction,
    batch_matmul: CudaFunction,
    to_bf16: CudaFunction,
    /// Waits on the GPU a given time (profiled steps queue behind it).
    spin: CudaFunction,
    rms_norm: CudaFunction,
    /// RMS norm writing 8-bit activation blocks (a `q8` decode product's
    /// input) instead of f32.
    rms_norm_q8: CudaFunction,
    /// RMS norm writing a many-row product's bf16 operand.
    rms_norm_bf16: CudaFunction,
    /// A residual add between two norms, writing the sum and the second
    /// norm's 8-bit blocks; GeGLU writing 8-bit blocks.
    add_norm_q8: CudaFunction,
    /// The same writing a many-row product's bf16 operand; GeGLU likewise.
    add_norm_bf16: CudaFunction,
    geglu_bf16: CudaFunction,
    geglu_q8: CudaFunction,
    binary: CudaFunction,
    unary: CudaFunction,
    geglu: CudaFunction,
    rope: CudaFunction,
    rms_norm_rope: CudaFunction,
    /// A layer's q/k norms and ropes, v norm and K/V write in one launch.
    head_prep: CudaFunction,
    kv_write: CudaFunction,
    /// Per (key type, value type) of [`KvDType::ALL`]: `attention_<k>_<v>`,
    /// at [`attention_index`].
    attention: Vec<CudaFunction>,
    /// Attention over K/V given as inputs (f32).
    attention_inputs: CudaFunction,
    take_rows: CudaFunction,
    narrow: CudaFunction,
    concat_part: CudaFunction,
    reduce_part: CudaFunction,
    reduce_draw: CudaFunction,
    reduce_merge: CudaFunction,
    _module: Arc<CudaModule>,
}

/// One GPU: its context, the stream every plan runs on, the kernels.
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    /// cuBLAS for products of many rows, where libcublas is installed.
    blas: Option<Blas>,
    name: String,
    /// Streaming multiprocessors: how many blocks fill the GPU.
    sms: usize,
    /// Programmatic dependent launch (compute capability 9.0 on): plans
    /// launch each kernel so that it may start before the one before it ends.
    pdl: bool,
    /// bf16 tensor-core `mma.sync` and `cp.async` (compute capability 8.0
    /// on): products of up to 64 rows straight from the weights' blocks.
    mma: bool,
    /// Whether every launch is timed ([`CudaDevice::set_profiling`]), and
    /// what has been.
    profiling: std::sync::atomic::AtomicBool,
    profiler: Mutex<profile::Profiler>,
}

/// A cuBLAS handle on the device's stream, with a workspace of our own so
/// that its calls can be captured into graphs (cuBLAS would otherwise
/// allocate during capture).
struct Blas {
    handle: CudaBlas,
    _workspace: CudaSlice<u8>,
}

/// Element type of a [`CudaDevice::gemm`]'s two inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GemmType {
    F32,
    BF16,
}

impl GemmType {
    fn bytes(self) -> usize {
        match self {
            GemmType::F32 => 4,
            GemmType::BF16 => 2,
        }
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({})", self.name)
    }
}

impl CudaDevice {
    /// GPU `ordinal`, shared by everything in the process that asks for it:
    /// the first call opens it and compiles the kernels (seconds), later
    /// ones return the same device while it is in use.
    pub fn new(ordinal: usize) -> Result<Arc<CudaDevice>, CudaError> {
        Self::with_kernel_cache(ordinal, None)
    }

    /// [`CudaDevice::new`], keeping compiled kernels in `cache` between
    /// runs (see [`compile_kernels_cached`]).
    pub fn with_kernel_cache(
        ordinal: usize,
        cache: Option<&std::path::Path>,
    ) -> Result<Arc<CudaDevice>, CudaError> {
        static OPEN: Mutex<Vec<(usize, Weak<CudaDevice>)>> = Mutex::new(Vec::new());
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, d)| d.strong_count() > 0);
        if let Some(d) = open
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, d)| d.upgrade())
        {
            return Ok(d);
        }
        let d = Self::open(ordinal, cache)?;
        open.push((ordinal, Arc::downgrade(&d)));
        Ok(d)
    }

    fn open(ordinal: usize, cache: Option<&std::path::Path>) -> Result<Arc<CudaDevice>, CudaError> {
        // SAFETY: these only try to open the shared libraries.
        let (driver, nvrtc) = unsafe {
            (
                cudarc::driver::sys::is_culib_present(),
                cudarc::nvrtc::sys::is_culib_present(),
            )
        };
        if !driver {
            return Err(CudaError::Unavailable(
                "the CUDA driver library (libcuda) is not installed".into(),
            ));
        }
        if !nvrtc {
            return Err(CudaError::Unavailable(
                "the NVRTC library (libnvrtc) is not installed".into(),
            ));
        }
        let count = CudaContext::device_count()?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::Unavailable(format!(
                "GPU {ordinal} asked for, {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        // One stream, used in order: the context need not track events.
        // SAFETY: every buffer is used on this one stream only.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured
        // into a graph.
        let stream = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        // Machine code where NVRTC made it; should the driver refuse it,
        // PTX, which the driver translates itself.
        let module = match ctx.load_module(compile_module_cached(major, minor, cache)?) {
            Ok(m) => m,
            Err(_) => ctx.load_module(compile_kernels_cached(major, minor, cache)?)?,
        };
        let f = |name: &str| module.load_function(name);
        let per_type = |kind: &str| -> Result<Vec<CudaFunction>, _> {
            TYPES
                .iter()
                .map(|(_, t)| f(&format!("{kind}_{t}")))
                .collect()
        };
        // Per type, one kernel of each named family: `<kind>_<type>`.
        let per_type_set = |kinds: &[&str]| -> Result<Vec<Vec<CudaFunction>>, _> {
            TYPES
                .iter()
                .map(|(_, t)| kinds.iter().map(|kind| f(&format!("{kind}_{t}"))).collect())
                .collect()
        };
        let kernels = Kernels {
            matmul: per_type("matmul")?,
            mmv: per_type_set(&[
                "mmv1", "mmv8", "mmvq1", "mmvq8", "mmvq1u2", "mmvq1u3", "mmvq8u2", "mmvq8u3",
            ])?,
            mmq: per_type_set(&["mmq16", "mmq32", "mmq64"])?,
            mmq_sum: f("mmq_sum")?,
            quantize_q8: f("quantize_q8")?,
            gather: per_type("gather")?,
            dequant: per_type("dequant")?,
            moe_rows: per_type("moe_rows")?,
            moe_route: f("moe_route")?,
            moe_lists: f("moe_lists")?,
            moe_geglu: f("moe_geglu")?,
            moe_combine: f("moe_combine")?,
            match_rms: f("match_rms")?,
            gaussian_topk: f("gaussian_topk")?,
            batch_matmul: f("batch_matmul")?,
            to_bf16: f("to_bf16")?,
            spin: f("spin")?,
            rms_norm: f("rms_norm")?,
            rms_norm_q8: f("rms_norm_q8")?,
            rms_norm_bf16: f("rms_norm_bf16")?,
            add_norm_q8: f("add_norm_q8")?,
            add_norm_bf16: f("add_norm_bf16")?,
            geglu_bf16: f("geglu_bf16")?,
            geglu_q8: f("geglu_q8")?,
            binary: f("binary")?,
            unary: f("unary")?,
            geglu: f("geglu")?,
            rope: f("rope")?,
            rms_norm_rope: f("rms_norm_rope")?,
            head_prep: f("head_prep")?,
            kv_write: f("kv_write")?,
            attention: KvDType::ALL
                .iter()
                .flat_map(|k| KvDType::ALL.iter().map(move |v| (k, v)))
                .map(|(k, v)| f(&format!("attention_{}_{}", k.name(), v.name())))
                .collect::<Result<_, _>>()?,
            attention_inputs: f("attention_inputs")?,
            take_rows: f("take_rows")?,
            narrow: f("narrow")?,
            concat_part: f("concat_part")?,
            reduce_part: f("reduce_part")?,
            reduce_draw: f("reduce_draw")?,
            reduce_merge: f("reduce_merge")?,
            _module: module,
        };
        // SAFETY: only tries to open the shared library.
        let blas = if unsafe { blas::is_culib_present() } {
            let handle = CudaBlas::new(Arc::clone(&stream))?;
            let workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE)?;
            let ptr = {
                let (p, _guard) = workspace.device_ptr(&stream);
                p
            };
            // SAFETY: the workspace lives as long as the handle (both in
            // `Blas`) and is used only on the handle's stream.
            unsafe {
                blas::cublasSetWorkspace_v2(*handle.handle(), ptr as *mut _, BLAS_WORKSPACE)
                    .result()?;
            }
            Some(Blas {
                handle,
                _workspace: workspace,
            })
        } else {
            None
        };
        let name = format!("{} (sm_{major}{minor})", ctx.name()?);
        let sms = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        Ok(Arc::new(CudaDevice {
            ordinal,
            ctx,
            stream,
            kernels,
            blas,
            name,
            sms: sms.max(1) as usize,
            pdl: major >= 9,
            mma: major >= 8,
            profiling: Default::default(),
            profiler: Default::default(),
        }))
    }

    /// The GPU's index among the machine's.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// `cuda:N`, as errors name the device.
    pub fn label(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    /// The GPU's name and compute capability.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Whether products of many rows go to cuBLAS.
    fn has_blas(&self) -> bool {
        self.blas.is_some()
    }

    /// `y[t, r]` (rows `ldy` apart) `= Σ_k x[t, k] · w[r, k]` for `r < n`,
    /// `t < m`, queued on the stream: `w` [n, k] and `x` [m, k] both of
    /// type `ty`, `y` f32, all device addresses; f32 accumulation.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        ty: GemmType,
        w: u64,
        x: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
        ldy: usize,
    ) -> Result<(), CudaError> {
        let Some(b) = &self.blas else {
            return Err(CudaError::Unsupported("cuBLAS is not loaded".into()));
        };
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| CudaError::Unsupported(format!("a product of size {v}")))
        };
        let dt = match ty {
            GemmType::F32 => blas::cudaDataType::CUDA_R_32F,
            GemmType::BF16 => blas::cudaDataType::CUDA_R_16BF,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Column-major: y^T [n, m] (leading dimension ldy) = w [n, k] · x^T,
        // with w read transposed from its row-major [n, k] (= column-major
        // [k, n]) and x^T being row-major x [m, k] as column-major [k, m].
        // SAFETY: the caller passes buffers of at least n·k and m·k elements
        // of `ty` and an output with m rows of ldy ≥ n f32, all on this
        // device; cuBLAS runs on the device's stream, in order with the
        // kernels that produce and consume them.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *b.handle.handle(),
                blas::cublasOperation_t::CUBLAS_OP_T,
                blas::cublasOperation_t::CUBLAS_OP_N,
                int(n)?,
                int(m)?,
                int(k)?,
                &alpha as *const f32 as *const _,
                w as *const _,
                dt,
                int(k)?,
                x as *const _,
                dt,
                int(k)?,
                &beta as *const f32 as *const _,
                y as *mut _,
                blas::cudaDataType::CUDA_R_32F,
                int(ldy)?,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        if self.profiling() {
            let name = match ty {
                GemmType::F32 => "cublas_gemm_f32",
                GemmType::BF16 => "cublas_gemm_bf16",
            };
            self.profile_launch(None, name, (n * k * ty.bytes()) as u64)?;
        }
        Ok(())
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        // Event tracking is off, so the guard records nothing.
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }
}

/// One device copy of every weight of a store.
pub struct CudaWeights {
    device: Arc<CudaDevice>,
    /// Per weight: its buffer (packed blocks; f32 for vectors), or none for
    /// a matrix of a type the kernels do not read (a plan using it fails).
    bufs: Vec<Option<CudaSlice<u8>>>,
    bytes: usize,
}

impl CudaWeights {
    /// Uploads `store`'s weights. Matrices keep their GGUF blocks (those of
    /// a type the kernels do not read stay behind, and a plan that uses one
    /// fails to compile); vectors (norm weights, scales) are stored
    /// dequantized to f32.
    /// Uploads the weights of `store` that `keep` lists (by id; all when
    /// `None`).
    pub fn upload(
        device: &Arc<CudaDevice>,
        store: &WeightStore,
        keep: Option<&[bool]>,
    ) -> Result<CudaWeights, CudaError> {
        let mut bufs = Vec::with_capacity(store.len());
        let mut bytes = 0;
        for i in 0..store.len() {
            let w = rlx_ir::WeightId(i as u32);
            let info = store.info(w);
            let data = store.bytes(w);
            let buf = if keep.is_some_and(|k| !k.get(i).copied().unwrap_or(false)) {
                None
            } else if info.shape.len() == 1 {
                let v = rlx_gguf::dequantize_to_vec(info.ty, data)
                    .map_err(|e| CudaError::Unsupported(format!("weight {:?}: {e}", info.name)))?;
                let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Some(device.stream.clone_htod(&raw)?)
            } else if supports(info.ty) {
                Some(device.stream.clone_htod(data)?)
            } else {
                None
            };
            bytes += buf.as_ref().map_or(0, |b| b.len());
            bufs.push(buf);
        }
        device.stream.synchronize()?;
        Ok(CudaWeights {
            device: Arc::clone(device),
            bufs,
            bytes,
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Device memory the weights take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device address of a weight, if it was uploaded.
    fn ptr(&self, w: rlx_ir::WeightId) -> Option<u64> {
        self.bufs[w.0 as usize].as_ref().map(|b| self.device.ptr(b))
    }
}

#[cfg(test)]
mod tests;
