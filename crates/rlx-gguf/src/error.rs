//! Errors of the GGUF reader and writer. Every variant names what is wrong and
//! where (byte offset, key or tensor name).

use std::path::PathBuf;

use crate::{GgmlType, ValueType};

/// A GGUF error, with the file it came from when there is one.
#[derive(Debug, thiserror::Error)]
#[error("{}{kind}", path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
pub struct GgufError {
    pub path: Option<PathBuf>,
    #[source]
    pub kind: ErrorKind,
}

impl GgufError {
    pub(crate) fn with_path(mut self, path: &std::path::Path) -> Self {
        self.path = Some(path.to_owned());
        self
    }
}

impl From<ErrorKind> for GgufError {
    fn from(kind: ErrorKind) -> Self {
        GgufError { path: None, kind }
    }
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    #[error(
        "big-endian GGUF (version field reads {raw:#010x}); only little-endian files are supported"
    )]
    BigEndian { raw: u32 },
    #[error("unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion { version: u32 },
    #[error("truncated file: {what} at byte offset {offset} needs {needed} bytes, but the file has {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("{what} at byte offset {offset}: count {count} is larger than the limit {limit}")]
    CountTooLarge {
        what: String,
        offset: u64,
        count: u64,
        limit: u64,
    },
    #[error("{what} at byte offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("metadata key at byte offset {offset} is empty")]
    EmptyKey { offset: u64 },
    #[error("metadata key {key:?} (byte offset {offset}): unknown value type id {id}")]
    UnknownValueType { key: String, id: u32, offset: u64 },
    #[error("metadata key {key:?} (byte offset {offset}): arrays of arrays are not supported")]
    NestedArray { key: String, offset: u64 },
    #[error("duplicate metadata key {key:?} at byte offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("general.alignment: {reason}")]
    BadAlignment { reason: String },
    #[error("tensor {name:?} (byte offset {offset}): name is {len} bytes, the limit is 64")]
    TensorNameTooLong {
        name: String,
        len: usize,
        offset: u64,
    },
    #[error("duplicate tensor name {name:?} at byte offset {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("tensor {name:?}: {n_dims} dimensions, at most 4 are supported")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("tensor {name:?}: unknown ggml type id {id}")]
    UnknownTensorType { name: String, id: u32 },
    #[error("tensor {name:?}: element count of shape {dims:?} overflows")]
    ElementCountOverflow { name: String, dims: Vec<u64> },
    #[error("tensor {name:?}: row length {ne0} is not a multiple of the {ty} block size {block}")]
    PartialBlock {
        name: String,
        ty: GgmlType,
        ne0: u64,
        block: usize,
    },
    #[error(
        "tensor {name:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {name:?}: data at file bytes {start}..{end} runs past the end of the file ({file_len} bytes)")]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("tensor {name:?} (data {start}..{end}) overlaps tensor {other:?}")]
    TensorOverlap {
        name: String,
        other: String,
        start: u64,
        end: u64,
    },
    #[error("metadata key {key:?} not found")]
    MissingKey { key: String },
    #[error("metadata key {key:?} is {found}, expected {expected}")]
    WrongValueType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("tensor {name:?} not found")]
    MissingTensor { name: String },
    #[error("writer: {0}")]
    Writer(String),
    #[error("value type {ty} cannot be used here: {reason}")]
    BadValueType { ty: ValueType, reason: &'static str },
}
