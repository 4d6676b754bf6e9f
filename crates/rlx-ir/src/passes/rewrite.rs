//! Rebuilding a graph node by node, with substitutions.

use crate::graph::{Graph, Node, NodeId};
use crate::{Op, Result};

/// Copies nodes of `src` into a new graph in order. `map[old]` is the new id
/// of each copied (or substituted) node.
pub(crate) struct Rebuild<'a> {
    pub src: &'a Graph,
    pub dst: Graph,
    pub map: Vec<Option<NodeId>>,
}

impl<'a> Rebuild<'a> {
    pub fn new(src: &'a Graph) -> Self {
        Rebuild {
            src,
            dst: Graph::new(),
            map: vec![None; src.len()],
        }
    }

    pub fn mapped(&self, old: NodeId) -> NodeId {
        self.map[old.index()].expect("inputs are rebuilt before their users")
    }

    /// Copies node `old` with its inputs remapped.
    pub fn copy(&mut self, old: NodeId) -> Result<NodeId> {
        let n: &Node = self.src.node(old);
        let new = match &n.op {
            Op::Input { name } => self.dst.input(name, n.dtype, n.shape.clone()),
            Op::Weight { id, name } => {
                let crate::DType::Ggml(ty) = n.dtype else {
                    unreachable!("weights carry a ggml type")
                };
                self.dst.weight(*id, name, ty, n.shape.clone())
            }
            op => {
                let inputs = n.inputs.iter().map(|&i| self.mapped(i)).collect();
                self.dst.push(op.clone(), inputs)?
            }
        };
        if let Some(name) = &n.name {
            self.dst.set_name(new, name.clone());
        }
        self.map[old.index()] = Some(new);
        Ok(new)
    }

    /// Finishes: copies the outputs and validates.
    pub fn finish(mut self) -> Result<Graph> {
        for (name, id) in self.src.outputs() {
            let new = self.mapped(*id);
            self.dst.output(name, new);
        }
        self.dst.validate()?;
        Ok(self.dst)
    }
}

/// For each node, the nodes that use it as an input (with repeats).
pub(crate) fn users(g: &Graph) -> Vec<Vec<NodeId>> {
    let mut users = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for &i in &g.node(id).inputs {
            users[i.index()].push(id);
        }
    }
    users
}
