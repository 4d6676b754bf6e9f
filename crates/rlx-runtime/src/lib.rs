//! rlx-runtime: compiles rlx graphs into plans and runs them.
//!
//! - [`WeightStore`]: one per model and device; every plan refers to it.
//! - [`compile`] → [`Plan`]: schedule, kernel choice, arena by liveness.
//! - [`KvCache`]: per-layer K/V with ring buffers for sliding layers.
//! - [`cpu`]: the CPU backend (thread pool, SIMD matmuls, kernels).
//! - `cuda` (feature `cuda`): the same graphs on an NVIDIA GPU.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod kv;
pub mod memory;
mod plan;
pub mod weights;

pub use kv::{KvCache, KvCacheConfig, KvDType, KvError, KvLayerSpec};
pub use plan::{compile, CompileOptions, HostTensor, Plan, RunError, Tap};
pub use weights::{WeightError, WeightInfo, WeightStore};
