//! GGUF files for rlx: a validated zero-copy reader, a writer, and the ggml
//! block formats with scalar reference (de)quantization.
//!
//! Knows nothing about models: names and meanings of keys and tensors belong
//! to the model crates.

pub mod blocks;
mod error;
pub mod quant;
mod reader;
mod types;
mod value;
mod writer;

pub use error::{ErrorKind, GgufError, Result};
pub use quant::{dequantize, dequantize_to_vec, quantize, quantize_to_vec, QuantError};
pub use reader::{
    parse_header, GgufFile, Header, TensorBytes, TensorInfo, TensorPart, DEFAULT_ALIGNMENT,
    MAX_COUNT, MAX_DIMS, MAX_TENSOR_NAME,
};
pub use types::{GgmlType, QK_K};
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;
