//! A readable text form of a graph, one node per line.

use std::fmt;

use crate::graph::Graph;
use crate::Op;

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for id in self.ids() {
            let n = self.node(id);
            write!(f, "{id} = {}", n.op)?;
            if !n.inputs.is_empty() {
                let args: Vec<String> = n.inputs.iter().map(|i| i.to_string()).collect();
                write!(f, "({})", args.join(", "))?;
            }
            write!(f, " : {} {}", n.dtype, n.shape)?;
            match (&n.name, &n.op) {
                (Some(_), Op::Input { .. } | Op::Weight { .. }) | (None, _) => {}
                (Some(name), _) => write!(f, "  # {name}")?,
            }
            writeln!(f)?;
        }
        for (name, id) in self.outputs() {
            writeln!(f, "output {name:?} = {id}")?;
        }
        Ok(())
    }
}
