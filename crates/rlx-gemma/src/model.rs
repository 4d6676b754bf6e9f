//! A loaded model and its sessions: chunked prefill, decode with the KV
//! cache, prefix reuse and rewind.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use rlx_gguf::GgufFile;
use rlx_ir::{Bindings, CacheSlot, Sym};
use rlx_runtime::cpu::matmul::Precision;
use rlx_runtime::cpu::CpuDevice;
use rlx_runtime::{
    compile, CompileOptions, HostTensor, KvCache, KvCacheConfig, KvDType, KvError, KvLayerSpec,
    Plan, RunError, WeightStore,
};

#[cfg(feature = "cuda")]
use rlx_runtime::cuda::{compile_cuda, CudaDevice, CudaError, CudaKvCache, CudaPlan, CudaWeights};

use crate::builder::{build_graph, BuildError, Logits};
use crate::config::{AttentionKind, ConfigError, GemmaConfig};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] rlx_gguf::GgufError),
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
    #[error("the session needs about {needed} bytes (KV cache {kv} + activations), more than the {limit} allowed")]
    OutOfMemory {
        needed: usize,
        kv: usize,
        limit: usize,
    },
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("no tokens given")]
    Empty,
    #[error("sampling: {0}")]
    Sampling(String),
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error("{0}")]
    Device(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
    /// A rewind past what a sliding layer still holds (the prefix must run
    /// again).
    fn is_rewind_too_far(&self) -> bool {
        match self {
            ModelError::Kv(KvError::RewindTooFar { .. }) => true,
            #[cfg(feature = "cuda")]
            ModelError::Cuda(CudaError::Kv(KvError::RewindTooFar { .. })) => true,
            _ => false,
        }
    }
}

/// Where a model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    #[default]
    Cpu,
    /// The GPU of this ordinal (needs the `cuda` feature).
    Cuda(usize),
}

/// How to run a model.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// CPU threads (on a GPU: for loading and sampling only).
    pub threads: usize,
    /// CPU matmul arithmetic; the GPU computes `exact`.
    pub precision: Precision,
    pub device: Device,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            precision: Precision::Exact,
            device: Device::Cpu,
        }
    }
}

/// A model loaded for inference: config, weights (mapped) and device.
pub struct Model {
    config: GemmaConfig,
    store: Arc<WeightStore>,
    device: CpuDevice,
    /// The weights on the GPU, when the model runs there.
    #[cfg(feature = "cuda")]
    cuda: Option<Arc<CudaWeights>>,
    options: ModelOptions,
}

impl Model {
    pub fn load(path: impl AsRef<Path>, options: ModelOptions) -> Result<Model> {
        let file = GgufFile::open(path)?;
        Self::from_file(file, options)
    }

    pub fn from_file(file: GgufFile, options: ModelOptions) -> Result<Model> {
        let config = GemmaConfig::from_gguf(&file)?;
        let store = Arc::new(WeightStore::new(Arc::new(file)));
        let device = CpuDevice::new(options.threads);
        #[cfg(feature = "cuda")]
        let cuda = match options.device {
            Device::Cpu => None,
            Device::Cuda(ordinal) => {
                let gpu = CudaDevice::new(ordinal)?;
                Some(Arc::new(CudaWeights::upload(&gpu, &store)?))
            }
        };
        #[cfg(not(feature = "cuda"))]
        if let Device::Cuda(_) = options.device {
            return Err(ModelError::Device(
                "this build has no CUDA backend (build with the `cuda` feature)".into(),
            ));
        }
        Ok(Model {
            config,
            store,
            device,
            #[cfg(feature = "cuda")]
            cuda,
            options,
        })
    }

    /// Where the model runs.
    pub fn device(&self) -> Device {
        self.options.device
    }

    pub fn config(&self) -> &GemmaConfig {
        &self.config
    }

    pub fn store(&self) -> &Arc<WeightStore> {
        &self.store
    }

    pub fn file(&self) -> &GgufFile {
        self.store.file()
    }

    fn plan(&self, logits: Logits, max_seq: usize) -> Result<Plan> {
        let graph = build_graph(&self.config, &self.store, logits)?;
        Ok(compile(
            &graph,
            &self.store,
            &self.device,
            &self.compile_options(max_seq),
        )?)
    }

    fn compile_options(&self, max_seq: usize) -> CompileOptions {
        let mut opts = CompileOptions::new(Bindings::new().with(Sym::SEQ, max_seq));
        opts.precision = self.options.precision;
        opts
    }

    #[cfg(feature = "cuda")]
    fn cuda_plan(
        &self,
        weights: &Arc<CudaWeights>,
        logits: Logits,
        max_seq: usize,
    ) -> Result<CudaPlan> {
        let graph = build_graph(&self.config, &self.store, logits)?;
        Ok(compile_cuda(
            &graph,
            &self.store,
            weights,
            &self.compile_options(max_seq),
        )?)
    }

    /// Plans and cache of a new session on this model's device.
    fn exec(&self, kv_config: KvCacheConfig, chunk: usize) -> Result<Exec> {
        #[cfg(feature = "cuda")]
        if let Some(w) = &self.cuda {
            return Ok(Exec::Cuda {
                prefill: self.cuda_plan(w, Logits::Last, chunk)?,
                decode: self.cuda_plan(w, Logits::Last, 1)?,
                score: None,
                kv: CudaKvCache::new(w.device(), kv_config)?,
            });
        }
        Ok(Exec::Cpu {
            prefill: self.plan(Logits::Last, chunk)?,
            decode: self.plan(Logits::Last, 1)?,
            score: None,
            kv: KvCache::new(kv_config)?,
        })
    }

    /// The KV-cache layout of this model for a context of `context` tokens.
    pub fn kv_config(&self, context: usize, chunk: usize, dtype: KvDType) -> KvCacheConfig {
        KvCacheConfig {
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
            max_context: context,
            max_chunk: chunk,
            dtype,
        }
    }

    /// Starts a session; its memory is estimated and checked before anything
    /// is allocated.
    pub fn session(&self, opts: SessionOptions) -> Result<Session<'_>> {
        let context = opts.context.unwrap_or(self.config.context_length).max(1);
        let chunk = opts.prefill_chunk.clamp(1, context);
        let kv_config = self.kv_config(context, chunk, opts.kv_dtype);
        let kv_bytes = kv_config.memory_bytes();
        // Activations of a chunk: a few rows of the widest values, plus logits.
        let widest = self
            .config
            .layers
            .iter()
            .map(|s| s.n_ff.max(s.n_head * s.head_dim) * 3)
            .max()
            .unwrap_or(0)
            .max(self.config.n_embd * 4);
        let act_bytes = chunk * (widest + self.config.n_vocab) * 4 + self.config.n_vocab * 4;
        let needed = kv_bytes + act_bytes;
        if let Some(limit) = opts.memory_limit_bytes {
            if needed > limit {
                return Err(ModelError::OutOfMemory {
                    needed,
                    kv: kv_bytes,
                    limit,
                });
            }
        }
        Ok(Session {
            model: self,
            exec: self.exec(kv_config, chunk)?,
            tokens: Vec::new(),
            chunk,
            context,
            computed: 0,
        })
    }
}

/// Options of one session.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Context length in tokens (default: the model's).
    pub context: Option<usize>,
    /// Tokens per prefill step.
    pub prefill_chunk: usize,
    pub kv_dtype: KvDType,
    /// Refuse to start when the estimate exceeds this.
    pub memory_limit_bytes: Option<usize>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            context: None,
            prefill_chunk: 512,
            kv_dtype: KvDType::F32,
            memory_limit_bytes: None,
        }
    }
}

/// A session's plans and KV cache on one device. One per session, made
/// once and never moved on a hot path, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Exec {
    Cpu {
        prefill: Plan,
        decode: Plan,
        /// Compiled on first use: logits at every position.
        score: Option<Plan>,
        kv: KvCache,
    },
    #[cfg(feature = "cuda")]
    Cuda {
        prefill: CudaPlan,
        decode: CudaPlan,
        score: Option<CudaPlan>,
        kv: CudaKvCache,
    },
}

/// Which plan a step runs.
#[derive(Clone, Copy)]
enum Phase {
    Prefill,
    Decode,
    Score,
}

/// The plan of `phase`; the scoring plan is compiled on first use.
fn pick<'a, P>(
    phase: Phase,
    prefill: &'a mut P,
    decode: &'a mut P,
    score: &'a mut Option<P>,
    compile_score: impl FnOnce() -> Result<P>,
) -> Result<&'a mut P> {
    Ok(match phase {
        Phase::Prefill => prefill,
        Phase::Decode => decode,
        Phase::Score => match score {
            Some(p) => p,
            None => score.insert(compile_score()?),
        },
    })
}

/// One conversation's state: the tokens so far and their KV cache.
pub struct Session<'m> {
    model: &'m Model,
    exec: Exec,
    tokens: Vec<u32>,
    chunk: usize,
    context: usize,
    /// Tokens run through the model since the session started.
    computed: usize,
}

impl Session<'_> {
    /// Tokens run through the model so far (prefix reuse keeps this low).
    pub fn computed_tokens(&self) -> usize {
        self.computed
    }

    pub fn model(&self) -> &Model {
        self.model
    }

    /// Tokens whose K/V the cache holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn context(&self) -> usize {
        self.context
    }

    pub fn kv_bytes(&self) -> usize {
        match &self.exec {
            Exec::Cpu { kv, .. } => kv.memory_bytes(),
            #[cfg(feature = "cuda")]
            Exec::Cuda { kv, .. } => kv.memory_bytes(),
        }
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        let vocab = self.model.config.n_vocab;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::BadToken { token: t, vocab });
        }
        if self.tokens.len() + tokens.len() > self.context {
            return Err(ModelError::ContextFull {
                tokens: self.tokens.len() + tokens.len(),
                context: self.context,
            });
        }
        Ok(())
    }

    /// Runs `tokens` through the plan of `phase` at the cache's end and
    /// returns the logits it outputs.
    fn step(&mut self, phase: Phase, tokens: &[u32]) -> Result<Vec<f32>> {
        let n = tokens.len();
        let input = |start: usize| {
            HashMap::from([
                (
                    "tokens".to_string(),
                    HostTensor::i32(tokens.iter().map(|&t| t as i32).collect(), &[n]),
                ),
                (
                    "pos".to_string(),
                    HostTensor::i32((start as i32..(start + n) as i32).collect(), &[n]),
                ),
            ])
        };
        let (model, chunk) = (self.model, self.chunk);
        let mut out = match &mut self.exec {
            Exec::Cpu {
                prefill,
                decode,
                score,
                kv,
            } => {
                let plan = pick(phase, prefill, decode, score, || {
                    model.plan(Logits::All, chunk)
                })?;
                plan.run(&input(kv.len()), Some(kv))?
            }
            #[cfg(feature = "cuda")]
            Exec::Cuda {
                prefill,
                decode,
                score,
                kv,
            } => {
                let plan = pick(phase, prefill, decode, score, || {
                    let w = model.cuda.as_ref().expect("a CUDA session");
                    model.cuda_plan(w, Logits::All, chunk)
                })?;
                plan.run(&input(kv.len()), Some(kv))?
            }
        };
        let (_, t) = out.swap_remove(0);
        match t {
            HostTensor::F32 { data, .. } => Ok(data),
            HostTensor::I32 { .. } => unreachable!("logits are f32"),
        }
    }

    /// Appends `tokens` (prefilled in chunks) and returns the logits of the
    /// last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.feed_with_progress(tokens, &mut |_, _| {})
    }

    /// Like [`Session::feed`], calling `progress(done, total)` after each chunk.
    pub fn feed_with_progress(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let mut last = Vec::new();
        let mut done = 0;
        for chunk in tokens.chunks(self.chunk) {
            let phase = if chunk.len() == 1 {
                Phase::Decode
            } else {
                Phase::Prefill
            };
            last = self.step(phase, chunk)?;
            self.tokens.extend_from_slice(chunk);
            self.computed += chunk.len();
            done += chunk.len();
            progress(done, tokens.len());
        }
        Ok(last)
    }

    /// Appends `tokens` and returns the logits of every one of them,
    /// `[tokens.len() × vocab]`.
    pub fn score(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let mut all = Vec::with_capacity(tokens.len() * self.model.config.n_vocab);
        for chunk in tokens.chunks(self.chunk) {
            all.extend(self.step(Phase::Score, chunk)?);
            self.tokens.extend_from_slice(chunk);
            self.computed += chunk.len();
        }
        Ok(all)
    }

    /// Forgets everything after the first `len` tokens.
    pub fn rewind(&mut self, len: usize) -> Result<()> {
        if len >= self.tokens.len() {
            return Ok(());
        }
        let truncated: Result<()> = match &mut self.exec {
            Exec::Cpu { kv, .. } => kv.truncate(len).map_err(Into::into),
            #[cfg(feature = "cuda")]
            Exec::Cuda { kv, .. } => kv.truncate(len).map_err(Into::into),
        };
        match truncated {
            Ok(()) => self.tokens.truncate(len),
            Err(e) if e.is_rewind_too_far() => {
                // A sliding layer lost the window; re-run the kept prefix.
                let keep: Vec<u32> = self.tokens[..len].to_vec();
                self.reset();
                if !keep.is_empty() {
                    self.feed(&keep)?;
                }
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Continues from `tokens`, reusing the cached prefix they share with
    /// what the session holds; returns the logits of the last token.
    pub fn feed_prompt(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.feed_prompt_with_progress(tokens, &mut |_, _| {})
    }

    /// Like [`Session::feed_prompt`], reporting prefill progress.
    pub fn feed_prompt_with_progress(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<f32>> {
        let common = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        // At least one token must run to produce logits.
        let keep = common.min(tokens.len().saturating_sub(1));
        self.rewind(keep)?;
        let keep = self.tokens.len();
        self.feed_with_progress(&tokens[keep..], progress)
    }

    pub fn reset(&mut self) {
        match &mut self.exec {
            Exec::Cpu { kv, .. } => kv.clear(),
            // Clearing only uploads the emptied row positions; if even that
            // fails the next step reports the device error.
            #[cfg(feature = "cuda")]
            Exec::Cuda { kv, .. } => {
                let _ = kv.clear();
            }
        }
        self.tokens.clear();
    }
}
