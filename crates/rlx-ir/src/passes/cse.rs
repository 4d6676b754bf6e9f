//! Common-subexpression removal: pure nodes with the same op and inputs are
//! computed once. Inputs, effects and attention (which reads mutable cache
//! state) are never merged.

use std::collections::HashMap;

use super::rewrite::Rebuild;
use crate::{Graph, NodeId, Op, Result};

pub fn cse(g: &Graph) -> Result<Graph> {
    let mut r = Rebuild::new(g);
    let mut seen: HashMap<(String, Vec<NodeId>), NodeId> = HashMap::new();
    for id in g.ids() {
        let n = g.node(id);
        let key = match &n.op {
            // Weights are equal when their handles are.
            Op::Weight { id: w, .. } => Some(format!("weight {}", w.0)),
            op => op.cse_key(),
        };
        if let Some(key) = key {
            let inputs: Vec<NodeId> = n.inputs.iter().map(|&i| r.mapped(i)).collect();
            if let Some(&existing) = seen.get(&(key.clone(), inputs.clone())) {
                r.map[id.index()] = Some(existing);
                continue;
            }
            let new = r.copy(id)?;
            seen.insert((key, inputs), new);
        } else {
            r.copy(id)?;
        }
    }
    r.finish()
}
