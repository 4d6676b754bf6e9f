//! A loaded model: its config and the backend that holds its weights.
//! Sequences and sessions (in [`crate::sequences`]) run on it.

use std::path::Path;
use std::sync::Arc;

use rlx_gguf::GgufFile;
use rlx_ir::{Bindings, CacheSlot, Sym};
use rlx_runtime::cpu::features::Isa;
use rlx_runtime::{
    open, Backend, BackendOptions, CompileOptions, Device, Executable, KvDType, KvError,
    KvLayerSpec, KvPoolConfig, KvTypes, Placement, Precision, RunError, SplitBackend, WeightStore,
};

use crate::builder::{build_graph, BuildError};
use crate::config::{AttentionKind, ConfigError, GemmaConfig};
use crate::offload::{self, GpuLayers, Offload, Share, Split};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] rlx_gguf::GgufError),
    #[error(transparent)]
    Checkpoint(#[from] crate::hf::HfError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("{tokens} tokens do not fit the context of {context} tokens")]
    ContextFull { tokens: usize, context: usize },
    #[error("the session needs about {} (K/V cache {} + activations), more than the {} {what}", Bytes(*needed), Bytes(*kv), Bytes(*limit))]
    OutOfMemory {
        needed: usize,
        kv: usize,
        limit: usize,
        /// "allowed" (the caller's limit) or what the device has available.
        what: String,
    },
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("no tokens given")]
    Empty,
    #[error("sampling: {0}")]
    Sampling(String),
    #[error("{0}")]
    Device(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// A byte count for people: `1.5 GiB`.
struct Bytes(usize);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [&str; 6] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut v = self.0 as f64;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} bytes", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[unit])
        }
    }
}

/// The most CPU threads a model accepts: a pool of more would only fail to
/// start.
pub const MAX_THREADS: usize = 1024;

impl ModelError {
    /// The K/V pool has no room for a step (nothing was taken).
    pub fn is_pool_full(&self) -> bool {
        matches!(
            self,
            ModelError::Kv(KvError::Full { .. })
                | ModelError::Run(RunError::Kv(KvError::Full { .. }))
        )
    }
}

/// How to run a model.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// CPU threads (on a GPU: for loading and sampling only).
    pub threads: usize,
    /// Matmul arithmetic (on a GPU, `Quantized` means bf16 tensor-core
    /// products for steps of many tokens).
    pub precision: Precision,
    pub device: Device,
    /// Each sequence's logits do not depend on what else is in a step (the
    /// CPU's `Quantized` products then take the row kernels at every batch
    /// size); `Exact` is batch-invariant already.
    pub batch_invariant: bool,
    /// On an accelerator: which layers and experts stay on the CPU.
    pub offload: Offload,
    /// Where a GPU backend keeps its compiled kernels between runs (`None`:
    /// compiled at every start).
    pub kernel_cache: Option<std::path::PathBuf>,
    /// The highest instruction set the CPU's kernels may use (lowered to
    /// what the CPU has); `None`: the best it has.
    pub isa: Option<Isa>,
    /// Time the CPU's decode kernels at start and keep the faster per
    /// weight type (see `BackendOptions::measure_kernels`).
    pub measure_kernels: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            precision: Precision::Exact,
            device: Device::Cpu,
            batch_invariant: false,
            offload: Offload::default(),
            kernel_cache: None,
            isa: None,
            measure_kernels: false,
        }
    }
}

/// A model loaded for inference: its config and the backend holding its
/// weights.
pub struct Model {
    config: GemmaConfig,
    backend: Arc<dyn Backend>,
    options: ModelOptions,
    /// How the model was split between devices, when it was.
    split: Option<Split>,
}

/// Opens the backend of a device for a store: [`rlx_runtime::open`], or
/// in tests another backend standing for a device.
pub type Opener<'a> = &'a dyn Fn(
    Device,
    &Arc<WeightStore>,
    &BackendOptions,
) -> std::result::Result<Arc<dyn Backend>, RunError>;

/// A GGUF file, or a Hugging Face checkpoint directory read as one.
pub fn open_file(path: &Path) -> Result<GgufFile> {
    if crate::hf::is_checkpoint(path) {
        return Ok(crate::hf::open(path)?);
    }
    Ok(GgufFile::open(path)?)
}

impl Model {
    /// A model from a GGUF file or a Hugging Face checkpoint directory.
    pub fn load(path: impl AsRef<Path>, options: ModelOptions) -> Result<Model> {
        Self::from_file(open_file(path.as_ref())?, options)
    }

    pub fn from_file(file: GgufFile, options: ModelOptions) -> Result<Model> {
        Self::from_file_with(file, options, &open)
    }

    /// A model whose backends `opener` opens. On an accelerator the
    /// model is split with the CPU as `options.offload` asks, or where it
    /// does not fit in the device's free memory; a split that does not fit
    /// is refused before any weight is copied.
    pub fn from_file_with(file: GgufFile, options: ModelOptions, opener: Opener) -> Result<Model> {
        if !(1..=MAX_THREADS).contains(&options.threads) {
            return Err(ModelError::Invalid(format!(
                "{} threads; between 1 and {MAX_THREADS}",
                options.threads
            )));
        }
        let config = GemmaConfig::from_gguf(&file)?;
        let store = Arc::new(WeightStore::new(Arc::new(file)));
        let threads = BackendOptions {
            kernel_cache: options.kernel_cache.clone(),
            isa: options.isa,
            measure_kernels: options.measure_kernels,
            ..BackendOptions::threads(options.threads)
        };
        let off = &options.offload;
        let model = |backend, split| Model {
            config: config.clone(),
            backend,
            options: options.clone(),
            split,
        };
        if options.device == Device::Cpu {
            if off.gpu_layers != GpuLayers::Auto || off.cpu_moe_layers > 0 {
                return Err(ModelError::Invalid(
                    "GPU layers and experts on the CPU are for an accelerator device (--device cuda)"
                        .into(),
                ));
            }
            return Ok(model(opener(Device::Cpu, &store, &threads)?, None));
        }
        let n = config.layers.len();
        let graph = build_graph(&config, &store)?;
        // A backend holding no weights yet says what the device has free
        // and which K/V type it keeps by default. It lives until the real
        // one is open, so a device shared per process (its context, its
        // compiled kernels) is set up once.
        let probe = opener(
            options.device,
            &store,
            &BackendOptions {
                weights: Some(vec![false; store.len()]),
                ..threads.clone()
            },
        )?;
        let available = probe.memory().available;
        let default_kv = probe.default_kv_dtype(options.precision);
        let types = off.kv_types.resolve(default_kv);
        let kv = kv_config_of(&config, off.kv_tokens.max(1), 1, 512, types);
        let scratch = offload::scratch_bytes(&store, activation_bytes_of(&config, 512, 1));
        let moe = off.cpu_moe_layers.min(n);
        let whole = offload::all_weights_bytes(&store) + kv.memory_bytes() + scratch;
        let fits = |b: usize| available.is_none_or(|a| b <= a);
        let share = |layers: usize| -> Result<(Placement, [Share; 2])> {
            let p = offload::placement(&config, &store, layers, moe);
            let shares = offload::estimate(&graph, &store, &p, &kv, scratch)?;
            Ok((p, shares))
        };
        let layers = match off.gpu_layers {
            GpuLayers::Count(c) => c.min(n),
            GpuLayers::Auto if moe == 0 && fits(whole) => n,
            GpuLayers::Auto => {
                let mut best = 0;
                for c in (1..=n).rev() {
                    if fits(share(c)?.1[offload::GPU].total()) {
                        best = c;
                        break;
                    }
                }
                best
            }
        };
        let refuse = |what: String, need: usize| -> ModelError {
            ModelError::Device(format!(
                "{what} needs about {} MiB on {}, {} MiB are free",
                need >> 20,
                options.device,
                available.unwrap_or(0) >> 20
            ))
        };
        if layers == n && moe == 0 {
            if !fits(whole) {
                return Err(refuse(
                    format!(
                        "the whole model (weights {} MiB, K/V for {} tokens {} MiB, scratch {} MiB)",
                        offload::all_weights_bytes(&store) >> 20,
                        off.kv_tokens,
                        kv.memory_bytes() >> 20,
                        scratch >> 20
                    ),
                    whole,
                ));
            }
            return Ok(model(opener(options.device, &store, &threads)?, None));
        }
        let (placement, shares) = share(layers)?;
        let split = Split {
            device: options.device,
            layers: n,
            gpu_layers: layers,
            cpu_moe_layers: moe.min(layers),
            shares,
        };
        if layers == 0 {
            return Ok(model(opener(Device::Cpu, &store, &threads)?, Some(split)));
        }
        if !fits(shares[offload::GPU].total()) {
            return Err(refuse(
                format!("the split {split}"),
                shares[offload::GPU].total(),
            ));
        }
        let read = placement.weights_read(&graph, 2, store.len())?;
        let gpu = opener(
            options.device,
            &store,
            &BackendOptions {
                weights: Some(read[offload::GPU].clone()),
                ..threads.clone()
            },
        )?;
        let cpu = opener(Device::Cpu, &store, &threads)?;
        let backend: Arc<dyn Backend> = Arc::new(SplitBackend::new(vec![gpu, cpu], placement)?);
        Ok(model(backend, Some(split)))
    }

    /// A model on an existing backend (which holds its weights).
    pub fn with_backend(backend: Arc<dyn Backend>, options: ModelOptions) -> Result<Model> {
        let config = GemmaConfig::from_gguf(backend.store().file())?;
        Ok(Model {
            config,
            backend,
            options,
            split: None,
        })
    }

    /// How the model is split between an accelerator and the CPU, when it
    /// is (layers, and each device's estimated share).
    pub fn split(&self) -> Option<&Split> {
        self.split.as_ref()
    }

    /// Where the model runs.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    pub fn options(&self) -> &ModelOptions {
        &self.options
    }

    pub fn config(&self) -> &GemmaConfig {
        &self.config
    }

    pub fn store(&self) -> &Arc<WeightStore> {
        self.backend.store()
    }

    pub fn file(&self) -> &GgufFile {
        self.store().file()
    }

    /// The K/V type used when none is asked for on this device and precision.
    pub fn default_kv_dtype(&self) -> KvDType {
        self.backend.default_kv_dtype(self.options.precision)
    }

    /// A plan for steps of up to `max_tokens` rows, `max_logit_rows` of
    /// them wanting logits.
    pub(crate) fn plan(
        &self,
        max_tokens: usize,
        max_logit_rows: usize,
    ) -> Result<Box<dyn Executable>> {
        let graph = build_graph(&self.config, self.store())?;
        self.check_support(&graph)?;
        let mut opts = CompileOptions::new(
            Bindings::new()
                .with(Sym::SEQ, max_tokens)
                .with(Sym::ROWS, max_logit_rows),
        );
        opts.precision = self.options.precision;
        opts.batch_invariant = self.options.batch_invariant;
        Ok(self.backend.compile(&graph, &opts)?)
    }

    /// Every op and weight type of `graph` runs on this model's backend, or
    /// an error names the first that does not.
    fn check_support(&self, graph: &rlx_ir::Graph) -> Result<()> {
        let b = &self.backend;
        for id in graph.ids() {
            let n = graph.node(id);
            let name = n.name.as_deref().unwrap_or("");
            if !b.supports_op(&n.op) {
                return Err(ModelError::Device(format!(
                    "the {} backend ({}) has no kernel for {} (node {id} {name})",
                    b.kind(),
                    b.describe(),
                    n.op.name()
                )));
            }
            if let rlx_ir::DType::Ggml(ty) = n.dtype {
                if !b.supports_weight(ty) {
                    return Err(ModelError::Device(format!(
                        "weight {name:?} is {ty}, which the {} kernels ({}) do not read",
                        b.kind(),
                        b.describe()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The K/V pool layout of this model: `tokens` for full-attention
    /// layers over all sequences, `max_seqs` sliding windows, steps of up to
    /// `max_chunk` tokens per sequence.
    pub fn kv_config(
        &self,
        tokens: usize,
        max_seqs: usize,
        max_chunk: usize,
        types: KvTypes,
    ) -> KvPoolConfig {
        kv_config_of(&self.config, tokens, max_seqs, max_chunk, types)
    }

    /// Bytes of activations a step of `tokens` rows and `logit_rows` logits
    /// needs: a few rows of the widest values, plus the logits.
    pub(crate) fn activation_bytes(&self, tokens: usize, logit_rows: usize) -> usize {
        activation_bytes_of(&self.config, tokens, logit_rows)
    }
}

/// The K/V pool layout of a model; see [`Model::kv_config`].
fn kv_config_of(
    config: &GemmaConfig,
    tokens: usize,
    max_seqs: usize,
    max_chunk: usize,
    types: KvTypes,
) -> KvPoolConfig {
    KvPoolConfig {
        layers: config
            .layers
            .iter()
            .map(|s| KvLayerSpec {
                kv_heads: s.n_head_kv,
                head_dim: s.head_dim,
                v_head_dim: s.head_dim,
                window: match s.attention {
                    AttentionKind::Sliding { window } => Some(window),
                    AttentionKind::Global => None,
                },
                shares: s.kv_source.map(|src| CacheSlot(src as u32)),
            })
            .collect(),
        types,
        tokens,
        max_seqs,
        max_chunk,
    }
}

/// See [`Model::activation_bytes`].
fn activation_bytes_of(config: &GemmaConfig, tokens: usize, logit_rows: usize) -> usize {
    let widest = config
        .layers
        .iter()
        .map(|s| s.n_ff.max(s.n_head * s.head_dim) * 3)
        .max()
        .unwrap_or(0)
        .max(config.n_embd * 4);
    tokens * widest * 4 + (logit_rows + 1) * config.n_vocab * 4
}
