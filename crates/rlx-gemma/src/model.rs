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
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// How to run a model.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    pub threads: usize,
    pub precision: Precision,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            precision: Precision::Exact,
        }
    }
}

/// A model loaded for inference: config, weights (mapped) and device.
pub struct Model {
    config: GemmaConfig,
    store: Arc<WeightStore>,
    device: CpuDevice,
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
        Ok(Model {
            config,
            store,
            device,
            options,
        })
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
        let mut opts = CompileOptions::new(Bindings::new().with(Sym::SEQ, max_seq));
        opts.precision = self.options.precision;
        Ok(compile(&graph, &self.store, &self.device, &opts)?)
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
            prefill: self.plan(Logits::Last, chunk)?,
            decode: self.plan(Logits::Last, 1)?,
            score: None,
            kv: KvCache::new(kv_config)?,
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

/// One conversation's state: the tokens so far and their KV cache.
pub struct Session<'m> {
    model: &'m Model,
    prefill: Plan,
    decode: Plan,
    /// Compiled on first use: logits at every position.
    score: Option<Plan>,
    kv: KvCache,
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
        self.kv.memory_bytes()
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

    fn step(plan: &mut Plan, kv: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let start = kv.len() as i32;
        let n = tokens.len();
        let inputs = HashMap::from([
            (
                "tokens".to_string(),
                HostTensor::i32(tokens.iter().map(|&t| t as i32).collect(), &[n]),
            ),
            (
                "pos".to_string(),
                HostTensor::i32((start..start + n as i32).collect(), &[n]),
            ),
        ]);
        let mut out = plan.run(&inputs, Some(kv))?;
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
            let plan = if chunk.len() == 1 {
                &mut self.decode
            } else {
                &mut self.prefill
            };
            last = Self::step(plan, &mut self.kv, chunk)?;
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
        if self.score.is_none() {
            self.score = Some(self.model.plan(Logits::All, self.chunk)?);
        }
        let plan = self.score.as_mut().expect("compiled above");
        let mut all = Vec::with_capacity(tokens.len() * self.model.config.n_vocab);
        for chunk in tokens.chunks(self.chunk) {
            all.extend(Self::step(plan, &mut self.kv, chunk)?);
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
        match self.kv.truncate(len) {
            Ok(()) => self.tokens.truncate(len),
            Err(KvError::RewindTooFar { .. }) => {
                // A sliding layer lost the window; re-run the kept prefix.
                let keep: Vec<u32> = self.tokens[..len].to_vec();
                self.reset();
                if !keep.is_empty() {
                    self.feed(&keep)?;
                }
            }
            Err(e) => return Err(e.into()),
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
        self.kv.clear();
        self.tokens.clear();
    }
}
