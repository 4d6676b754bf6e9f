//! rlx-runtime: compiles rlx graphs into plans and runs them, many
//! sequences per step, on any device behind one interface.
//!
//! - [`Backend`] (and [`open`]): a device — its weights, plans and K/V
//!   storage. [`cpu`] is one implementation, `cuda` (feature `cuda`) another.
//! - [`Batch`]: one step's tokens, each with its sequence and position.
//! - [`KvPool`]: paged K/V for every sequence (blocks, block tables,
//!   reference counts, sliding windows).
//! - [`compile`](mod@compile): what backends share — passes, schedule,
//!   arena layout, binding.
//! - [`SplitBackend`]: one graph over several backends, by a [`Placement`].
//! - [`WeightStore`]: one per model; every backend refers to it.

pub mod backend;
pub mod batch;
pub mod compile;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod kv;
pub mod memory;
pub mod reduce;
pub mod split;
pub mod weights;

pub use backend::{
    host_memory, open, Backend, BackendOptions, Device, Executable, KernelTime, MemoryReport,
    PreparedKv, StepProfile,
};
pub use batch::{Batch, BatchError, SeqId, SeqRun};
pub use compile::{
    CompileOptions, HostTensor, Precision, RunError, StepInput, StepInputs, StepOutputs, Tap,
};
pub use kv::{
    KvChoice, KvDType, KvError, KvGroup, KvLayerSpec, KvPool, KvPoolConfig, KvStorage, KvTypes,
    SlotSet, StepLayout, BLOCK_TOKENS,
};
pub use reduce::{LogitRows, RowDigest, RowReduce};
pub use split::{Placement, SplitBackend};
pub use weights::{WeightError, WeightInfo, WeightStore};
