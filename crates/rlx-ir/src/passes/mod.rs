//! Graph passes. Each returns a new, validated graph; none changes what the
//! graph computes beyond float rounding.

mod cse;
mod dce;
mod fuse;
mod rewrite;

pub use cse::cse;
pub use dce::dce;
pub use fuse::{fuse, FuseOptions};

use crate::{Graph, Result};

/// The standard pipeline: CSE, fusion, then dead-code removal.
pub fn optimize(g: &Graph, fuse_opts: &FuseOptions) -> Result<Graph> {
    let g = cse(g)?;
    let g = fuse(&g, fuse_opts)?;
    dce(&g)
}
