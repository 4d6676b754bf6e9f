//! rlx-gemma: Gemma models on the rlx runtime.
//!
//! File → [`GemmaConfig`] (every per-layer fact resolved once) →
//! [`build_graph`] (one layer builder for every phase) → [`Model`] and
//! [`Session`] (chunked prefill, decode, prefix reuse) → [`sampling`].

mod altup;
pub mod builder;
pub mod config;
pub mod generate;
pub mod model;
pub mod sampling;

pub use builder::{build_graph, Logits};
pub use config::{Arch, AttentionKind, ConfigError, GemmaConfig, LayerSpec, MoeSpec};
pub use model::{Device, Model, ModelError, ModelOptions, Session, SessionOptions};
