//! CPU kernels for every op but matmul (see `cpu::matmul`). Each is the plain
//! f32 computation of its op, with the float operations in the order the
//! reference implementations (transformers in float32) use.

pub mod attention;
pub mod elementwise;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod shape;
