//! Element types of graph values.

use std::fmt;

use rlx_gguf::GgmlType;

/// The element type of a value. Activations are f32; weights keep their file
/// type, packed blocks included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    I32,
    /// A weight in any ggml type (F32, F16, BF16 or packed blocks).
    Ggml(GgmlType),
    /// No data: the result of an effect such as a KV-cache write, used only
    /// to order later reads after it.
    Effect,
}

impl DType {
    /// Bytes per element of an activation type; `None` for weights and effects.
    pub fn activation_bytes(self) -> Option<usize> {
        match self {
            DType::F32 | DType::I32 => Some(4),
            DType::Ggml(_) | DType::Effect => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DType::F32 => f.write_str("f32"),
            DType::I32 => f.write_str("i32"),
            DType::Ggml(t) => write!(f, "{t}"),
            DType::Effect => f.write_str("effect"),
        }
    }
}
