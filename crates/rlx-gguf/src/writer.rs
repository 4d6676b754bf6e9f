//! The GGUF v3 writer. Lays tensors out contiguously in record order, each
//! padded to the alignment, which is the layout llama.cpp requires.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use crate::error::{ErrorKind, GgufError, Result};
use crate::reader::{DEFAULT_ALIGNMENT, MAX_DIMS, MAX_TENSOR_NAME};
use crate::value::{Array, Value};
use crate::GgmlType;

struct PendingTensor {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    bytes: u64,
    /// `None` for a tensor declared to be written by
    /// [`GgufWriter::write_streamed`].
    data: Option<Vec<u8>>,
}

/// Builds a GGUF file in memory and writes it out; or writes the header and
/// then each tensor's bytes as they are made, for files larger than memory.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
    keys: HashSet<String>,
    names: HashSet<String>,
}

fn writer_err(msg: String) -> GgufError {
    ErrorKind::Writer(msg).into()
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata entry. Keys must be unique and non-empty;
    /// `general.alignment` must be a u32 power of two.
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self> {
        let value = value.into();
        if key.is_empty() {
            return Err(writer_err("empty metadata key".into()));
        }
        if self.keys.contains(key) {
            return Err(writer_err(format!("duplicate metadata key {key:?}")));
        }
        if key == "general.alignment" {
            match value {
                Value::U32(a) if a != 0 && a.is_power_of_two() => {}
                _ => {
                    return Err(writer_err(format!(
                        "general.alignment must be a u32 power of two, got {value}"
                    )))
                }
            }
        }
        self.keys.insert(key.to_owned());
        self.metadata.push((key.to_owned(), value));
        Ok(self)
    }

    /// Adds a tensor of any type. `dims` are in GGUF order (`dims[0]` is the
    /// row length); `data` must be exactly the packed bytes for that shape.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let bytes = self.check_tensor(name, ty, dims)?;
        if bytes != data.len() as u64 {
            return Err(writer_err(format!(
                "tensor {name:?}: {ty} shape {dims:?} needs {bytes} bytes, got {}",
                data.len()
            )));
        }
        self.push_tensor(name, ty, dims, bytes, Some(data));
        Ok(self)
    }

    /// Declares a tensor whose bytes [`GgufWriter::write_streamed`] asks
    /// for when it gets to it.
    pub fn declare_tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<&mut Self> {
        let bytes = self.check_tensor(name, ty, dims)?;
        self.push_tensor(name, ty, dims, bytes, None);
        Ok(self)
    }

    fn push_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        bytes: u64,
        data: Option<Vec<u8>>,
    ) {
        self.names.insert(name.to_owned());
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            ty,
            dims: dims.to_vec(),
            bytes,
            data,
        });
    }

    /// The byte size of a tensor of this type and shape, after checking the
    /// name and shape.
    fn check_tensor(&self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64> {
        if name.len() > MAX_TENSOR_NAME {
            return Err(writer_err(format!(
                "tensor name {name:?} is longer than {MAX_TENSOR_NAME} bytes"
            )));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS as usize {
            return Err(writer_err(format!(
                "tensor {name:?}: {} dimensions, expected 1 to {MAX_DIMS}",
                dims.len()
            )));
        }
        if self.names.contains(name) {
            return Err(writer_err(format!("duplicate tensor name {name:?}")));
        }
        if !dims[0].is_multiple_of(ty.block_elems() as u64) {
            return Err(writer_err(format!(
                "tensor {name:?}: row length {} is not a multiple of the {ty} block size {}",
                dims[0],
                ty.block_elems()
            )));
        }
        let n: Option<u64> = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        n.and_then(|n| ty.bytes_for(n)).ok_or_else(|| {
            writer_err(format!(
                "tensor {name:?}: {ty} shape {dims:?} has no byte size"
            ))
        })
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", Value::U32(a)) => Some(u64::from(*a)),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The header: metadata and tensor records, padded to the alignment.
    fn header(&self) -> Vec<u8> {
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += t.bytes.div_ceil(align) * align;
        }
        pad_to(&mut out, align);
        out
    }

    /// Serialises the whole file. A tensor only declared (its bytes to come
    /// through [`GgufWriter::write_streamed`]) is written as zeros.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment();
        let mut out = self.header();
        for t in &self.tensors {
            match &t.data {
                Some(d) => out.extend_from_slice(d),
                None => out.resize(out.len() + t.bytes as usize, 0),
            }
            pad_to(&mut out, align);
        }
        out
    }

    pub fn write_to(&self, mut w: impl Write) -> Result<()> {
        w.write_all(&self.to_bytes())
            .map_err(|e| GgufError::from(ErrorKind::Io(e)))
    }

    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes())
            .map_err(|e| GgufError::from(ErrorKind::Io(e)).with_path(path))
    }

    /// Writes the header, then every tensor in order: the bytes it was
    /// added with, or for a declared one what `data(index)` returns (which
    /// must be its exact size).
    pub fn write_streamed(
        &self,
        mut w: impl Write,
        mut data: impl FnMut(usize) -> Result<Vec<u8>>,
    ) -> Result<()> {
        let io = |e| GgufError::from(ErrorKind::Io(e));
        let align = self.alignment();
        w.write_all(&self.header()).map_err(io)?;
        for (i, t) in self.tensors.iter().enumerate() {
            let made;
            let bytes = match &t.data {
                Some(d) => d.as_slice(),
                None => {
                    made = data(i)?;
                    made.as_slice()
                }
            };
            if bytes.len() as u64 != t.bytes {
                return Err(writer_err(format!(
                    "tensor {:?}: {} bytes given for {} declared",
                    t.name,
                    bytes.len(),
                    t.bytes
                )));
            }
            w.write_all(bytes).map_err(io)?;
            let pad = t.bytes.div_ceil(align) * align - t.bytes;
            w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        }
        Ok(())
    }
}

fn pad_to(out: &mut Vec<u8>, align: u64) {
    let len = out.len() as u64;
    out.resize((len.div_ceil(align) * align) as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            match a {
                Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
                _ => (0..a.len()).for_each(|i| put_value(out, &a.get(i).expect("in range"))),
            }
        }
    }
}
