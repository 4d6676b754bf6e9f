//! The weight store: every weight of a model, once per device. Plans refer
//! to it by `WeightId`; none copies a weight.

use std::collections::HashMap;
use std::sync::Arc;

use rlx_gguf::{GgmlType, GgufFile};
use rlx_ir::{Graph, NodeId, Shape, WeightId};

/// One weight's record.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightInfo {
    pub name: String,
    pub ty: GgmlType,
    /// IR shape: `[rows, row_len]` for matrices (GGUF dims reversed), `[len]`
    /// for vectors, higher ranks likewise reversed.
    pub shape: Vec<usize>,
    /// Index in the file's tensor table.
    index: usize,
    len: usize,
}

/// Weights of one model on the CPU: the memory-mapped GGUF file itself.
/// Tensor bytes are views into the mapping; nothing is copied.
pub struct WeightStore {
    file: Arc<GgufFile>,
    weights: Vec<WeightInfo>,
    by_name: HashMap<String, WeightId>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightError {
    #[error("weight {name:?} not found in the model")]
    Missing { name: String },
    #[error(transparent)]
    Graph(#[from] rlx_ir::IrError),
}

impl WeightStore {
    /// Registers every tensor of the file, in file order.
    pub fn new(file: Arc<GgufFile>) -> Self {
        let weights: Vec<WeightInfo> = file
            .tensors()
            .iter()
            .enumerate()
            .map(|(i, t)| WeightInfo {
                name: t.name.clone(),
                ty: t.ty,
                shape: t.dims.iter().rev().map(|&d| d as usize).collect(),
                index: i,
                len: t.n_bytes as usize,
            })
            .collect();
        let by_name = weights
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.clone(), WeightId(i as u32)))
            .collect();
        WeightStore {
            file,
            weights,
            by_name,
        }
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub fn len(&self) -> usize {
        self.weights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    pub fn id(&self, name: &str) -> Option<WeightId> {
        self.by_name.get(name).copied()
    }

    pub fn info(&self, id: WeightId) -> &WeightInfo {
        &self.weights[id.0 as usize]
    }

    /// The weight's packed bytes, borrowed from the mapping.
    pub fn bytes(&self, id: WeightId) -> &[u8] {
        let w = &self.weights[id.0 as usize];
        self.file.tensor_data_at(w.index)
    }

    /// Heap bytes this store owns beyond the mapping (repacked layouts would
    /// live here); plans own none.
    pub fn owned_bytes(&self) -> usize {
        0
    }

    /// Bytes of weights it serves (mapped).
    pub fn mapped_bytes(&self) -> usize {
        self.weights.iter().map(|w| w.len).sum()
    }

    /// Adds a weight node for `name` to a graph, with its type and shape.
    pub fn node(&self, g: &mut Graph, name: &str) -> Result<NodeId, WeightError> {
        let id = self.id(name).ok_or_else(|| WeightError::Missing {
            name: name.to_owned(),
        })?;
        let w = self.info(id);
        Ok(g.weight(id, name, w.ty, Shape::fixed(&w.shape)))
    }
}
