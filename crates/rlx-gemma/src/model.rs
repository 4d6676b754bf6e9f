//! A loaded model: its config and the backend that holds its weights.
//! Sequences and sessions (in [`crate::sequences`]) run on it.

use std::path::Path;
use std::sync::Arc;

use rlx_gguf::GgufFile;
use rlx_ir::{Bindings, CacheSlot, Sym};
use rlx_runtime::{
    open, Backend, BackendOptions, CompileOptions, Device, Executable, KvDType, KvError,
    KvLayerSpec, KvPoolConfig, KvTypes, Precision, RunError, WeightStore,
};

use crate::builder::{build_graph, BuildError};
use crate::config::{AttentionKind, ConfigError, GemmaConfig};

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
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            precision: Precision::Exact,
            device: Device::Cpu,
            batch_invariant: false,
        }
    }
}

/// A model loaded for inference: its config and the backend holding its
/// weights.
pub struct Model {
    config: GemmaConfig,
    backend: Arc<dyn Backend>,
    options: ModelOptions,
}

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
        if !(1..=MAX_THREADS).contains(&options.threads) {
            return Err(ModelError::Invalid(format!(
                "{} threads; between 1 and {MAX_THREADS}",
                options.threads
            )));
        }
        let config = GemmaConfig::from_gguf(&file)?;
        let store = Arc::new(WeightStore::new(Arc::new(file)));
        let backend = open(
            options.device,
            &store,
            &BackendOptions {
                threads: options.threads,
            },
        )?;
        Ok(Model {
            config,
            backend,
            options,
        })
    }

    /// A model on an existing backend (which holds its weights).
    pub fn with_backend(backend: Arc<dyn Backend>, options: ModelOptions) -> Result<Model> {
        let config = GemmaConfig::from_gguf(backend.store().file())?;
        Ok(Model {
            config,
            backend,
            options,
        })
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
        self.device().default_kv_dtype(self.options.precision)
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
                    b.device().kind(),
                    b.describe(),
                    n.op.name()
                )));
            }
            if let rlx_ir::DType::Ggml(ty) = n.dtype {
                if !b.supports_weight(ty) {
                    return Err(ModelError::Device(format!(
                        "weight {name:?} is {ty}, which the {} kernels ({}) do not read",
                        b.device().kind(),
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
        KvPoolConfig {
            layers: self
                .config
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

    /// Bytes of activations a step of `tokens` rows and `logit_rows` logits
    /// needs: a few rows of the widest values, plus the logits.
    pub(crate) fn activation_bytes(&self, tokens: usize, logit_rows: usize) -> usize {
        let widest = self
            .config
            .layers
            .iter()
            .map(|s| s.n_ff.max(s.n_head * s.head_dim) * 3)
            .max()
            .unwrap_or(0)
            .max(self.config.n_embd * 4);
        tokens * widest * 4 + (logit_rows + 1) * self.config.n_vocab * 4
    }
}
