//! rlx-gemma: Gemma models on the rlx runtime.
//!
//! File → [`GemmaConfig`] (every per-layer fact resolved once) →
//! [`build_graph`] (one layer builder for every phase) → [`Model`] and
//! [`Sequences`] (many sequences per step over a paged K/V pool) and
//! [`Session`] (one conversation: chunked prefill, decode, prefix reuse)
//! → [`sampling`].

mod altup;
pub mod builder;
pub mod config;
pub mod generate;
pub mod hf;
pub mod model;
pub mod offload;
pub mod quantize;
pub mod sampling;
pub mod sequences;
pub mod speculative;
pub mod stop;

pub use builder::build_graph;
pub use config::{Arch, AttentionKind, ConfigError, GemmaConfig, LayerSpec, MoeSpec};
pub use model::{Model, ModelError, ModelOptions, Opener};
pub use offload::{GpuLayers, Offload, Split};
pub use rlx_runtime::{
    Device, KvDType, KvTypes, LogitRows, Precision, RowDigest, RowReduce, SeqId,
};
pub use sequences::{Feed, Sequences, SequencesOptions, Session, SessionOptions, StepLogits, Want};
