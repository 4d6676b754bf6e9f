//! rlx-ir: the graph IR that model builders emit and the runtime compiles.
//!
//! Knows nothing about devices or files. Shapes may be symbolic, so one graph
//! serves every sequence length.

mod dtype;
mod dump;
mod graph;
mod infer;
pub mod op;
pub mod passes;
mod shape;

pub use dtype::DType;
pub use graph::{Graph, IrError, Node, NodeId, Result, SlotLayout};
pub use op::{AttentionSpec, CacheSlot, KvSource, Mask, NormSpec, Op, RopeSpec, Start, WeightId};
pub use shape::{Bindings, Dim, Shape, Sym};
