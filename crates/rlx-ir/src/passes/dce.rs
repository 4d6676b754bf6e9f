//! Dead-code removal: keep what the outputs and the effects need.

use super::rewrite::Rebuild;
use crate::{Graph, Result};

pub fn dce(g: &Graph) -> Result<Graph> {
    let mut live = vec![false; g.len()];
    let mut stack: Vec<_> = g.outputs().iter().map(|(_, id)| *id).collect();
    stack.extend(g.ids().filter(|&id| g.node(id).op.has_effect()));
    while let Some(id) = stack.pop() {
        if !std::mem::replace(&mut live[id.index()], true) {
            stack.extend(g.node(id).inputs.iter().copied());
        }
    }
    let mut r = Rebuild::new(g);
    for id in g.ids().filter(|id| live[id.index()]) {
        r.copy(id)?;
    }
    r.finish()
}
