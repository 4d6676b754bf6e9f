//! Fusions that pay for Gemma:
//! - matmuls that read the same activation become one `MatMul` over all their
//!   weights (fused QKV, fused gate/up), followed by `Narrow`s — the
//!   activation is read (and quantized) once, whatever each weight's type;
//! - an `RmsNorm` whose every user is a matmul is folded into those matmuls;
//! - `Mul(Gelu(gate), up)` becomes `GeGlu(gate, up)`.
//!
//! All three compute the same values as the unfused graph (the same float
//! operations per element), so results agree to rounding.

use std::collections::HashMap;

use super::dce;
use super::rewrite::{users, Rebuild};
use crate::graph::NodeId;
use crate::{Graph, Op, Result, Start};

/// Which fusions to apply.
#[derive(Clone, Copy, Debug)]
pub struct FuseOptions {
    pub group_matmuls: bool,
    pub fold_norms: bool,
    pub geglu: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            group_matmuls: true,
            fold_norms: true,
            geglu: true,
        }
    }
}

impl FuseOptions {
    pub fn none() -> Self {
        FuseOptions {
            group_matmuls: false,
            fold_norms: false,
            geglu: false,
        }
    }
}

pub fn fuse(g: &Graph, opts: &FuseOptions) -> Result<Graph> {
    let g = group_and_geglu(g, opts)?;
    let g = if opts.fold_norms { fold_norms(&g)? } else { g };
    dce(&g)
}

fn is_plain_matmul(op: &Op) -> bool {
    matches!(op, Op::MatMul { norm: None })
}

/// Copies leaves (inputs and weights) first so a fused matmul placed at its
/// group's first member can refer to every member's weight.
fn copy_leaves(r: &mut Rebuild) -> Result<()> {
    for id in r.src.ids() {
        if r.src.node(id).inputs.is_empty() {
            r.copy(id)?;
        }
    }
    Ok(())
}

fn group_and_geglu(g: &Graph, opts: &FuseOptions) -> Result<Graph> {
    let users = users(g);
    // Matmul groups keyed by their activation input.
    let mut groups: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    if opts.group_matmuls {
        for id in g.ids() {
            let n = g.node(id);
            // Only weights that are leaves can be grouped: the fused node is
            // placed at the first member, where later-built inputs do not exist.
            let leaf_weight = n.inputs.len() == 2 && g.node(n.inputs[1]).inputs.is_empty();
            if is_plain_matmul(&n.op) && leaf_weight {
                groups.entry(n.inputs[0]).or_default().push(id);
            }
        }
    }
    let mut r = Rebuild::new(g);
    copy_leaves(&mut r)?;
    // For grouped members: (fused node, start column, width).
    let mut placed: HashMap<NodeId, NodeId> = HashMap::new();
    for id in g.ids() {
        let n = g.node(id);
        if n.inputs.is_empty() {
            continue;
        }
        if let Some(group) = groups
            .get(&n.inputs[0])
            .filter(|grp| grp.len() > 1 && grp.contains(&id))
        {
            let fused = match placed.get(&n.inputs[0]) {
                Some(&f) => f,
                None => {
                    let mut inputs = vec![r.mapped(n.inputs[0])];
                    inputs.extend(group.iter().map(|&m| r.mapped(g.node(m).inputs[1])));
                    let f = r.dst.push(Op::MatMul { norm: None }, inputs)?;
                    placed.insert(n.inputs[0], f);
                    f
                }
            };
            let mut start = 0;
            for &m in group.iter().take_while(|&&m| m != id) {
                start += rows_of(g, g.node(m).inputs[1]);
            }
            let width = rows_of(g, n.inputs[1]);
            let axis = n.shape.rank() - 1;
            let narrowed = r.dst.narrow(fused, axis, Start::FromStart(start), width)?;
            if let Some(name) = &n.name {
                r.dst.set_name(narrowed, name.clone());
            }
            r.map[id.index()] = Some(narrowed);
            continue;
        }
        if opts.geglu && matches!(n.op, Op::Mul) {
            let (a, b) = (n.inputs[0], n.inputs[1]);
            let gelu_of = |x: NodeId| -> Option<NodeId> {
                let xn = g.node(x);
                (matches!(xn.op, Op::Gelu) && users[x.index()].len() == 1 && xn.shape == n.shape)
                    .then(|| xn.inputs[0])
            };
            let pair = match (gelu_of(a), gelu_of(b)) {
                (Some(gate), _) if g.node(b).shape == n.shape => Some((gate, b)),
                (_, Some(gate)) if g.node(a).shape == n.shape => Some((gate, a)),
                _ => None,
            };
            if let Some((gate, up)) = pair {
                let new = r.dst.geglu(r.mapped(gate), r.mapped(up))?;
                if let Some(name) = &n.name {
                    r.dst.set_name(new, name.clone());
                }
                r.map[id.index()] = Some(new);
                continue;
            }
        }
        r.copy(id)?;
    }
    r.finish()
}

fn rows_of(g: &Graph, w: NodeId) -> usize {
    g.node(w).shape.0[0].fixed().expect("weight rows are fixed")
}

fn fold_norms(g: &Graph) -> Result<Graph> {
    let users = users(g);
    let foldable = |id: NodeId| -> bool {
        let n = g.node(id);
        matches!(n.op, Op::RmsNorm(_))
            && !users[id.index()].is_empty()
            && !g.outputs().iter().any(|(_, o)| *o == id)
            && users[id.index()].iter().all(|&u| {
                let un = g.node(u);
                is_plain_matmul(&un.op)
                    && un.inputs[0] == id
                    && un.inputs[1..].iter().all(|&w| w != id)
            })
    };
    let mut r = Rebuild::new(g);
    for id in g.ids() {
        let n = g.node(id);
        if is_plain_matmul(&n.op) && foldable(n.inputs[0]) {
            let norm = g.node(n.inputs[0]);
            let Op::RmsNorm(spec) = norm.op else {
                unreachable!()
            };
            let mut inputs: Vec<NodeId> = norm.inputs.iter().map(|&i| r.mapped(i)).collect();
            inputs.extend(n.inputs[1..].iter().map(|&w| r.mapped(w)));
            let new = r.dst.push(Op::MatMul { norm: Some(spec) }, inputs)?;
            if let Some(name) = &n.name {
                r.dst.set_name(new, name.clone());
            }
            r.map[id.index()] = Some(new);
            continue;
        }
        r.copy(id)?;
    }
    r.finish()
}
