//! The GGUF reader: a validated, zero-copy view over a memory-mapped file.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{ErrorKind, GgufError, Result};
use crate::value::{Array, Value, ValueType};
use crate::GgmlType;

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Upper bound on tensor and key/value counts, string lengths and array
/// lengths (the limits gguf-py and llama.cpp use).
pub const MAX_COUNT: u64 = 1 << 30;
/// Longest tensor name the format allows, in bytes.
pub const MAX_TENSOR_NAME: usize = 64;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: u32 = 4;

/// One tensor record.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions in GGUF order: `dims[0]` is the contiguous row length.
    pub dims: Vec<u64>,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Row length (`dims[0]`) and number of rows (product of the rest).
    pub fn rows(&self) -> (u64, u64) {
        let ne0 = self.dims.first().copied().unwrap_or(1);
        let rows = self.dims.iter().skip(1).product();
        (ne0, rows)
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        let ne0 = self.dims.first().copied().unwrap_or(1);
        ne0 / self.ty.block_elems() as u64 * self.ty.block_bytes() as u64
    }
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    /// Tensors gathered from other files (a checkpoint's safetensors
    /// shards) or made in memory; each tensor's bytes are found through
    /// `GgufFile::locations`.
    Parts(Vec<TensorBytes>),
}

/// A tensor for [`GgufFile::from_parts`]: name, type, GGUF dims, bytes.
pub type TensorPart = (String, GgmlType, Vec<u64>, TensorBytes);

/// Where a tensor assembled with [`GgufFile::from_parts`] keeps its bytes.
pub enum TensorBytes {
    /// A range of a memory-mapped file, shared with the other tensors in it.
    Mapped {
        map: std::sync::Arc<memmap2::Mmap>,
        start: usize,
        len: usize,
    },
    /// Bytes made in memory (converted, or small).
    Owned(Vec<u8>),
}

impl TensorBytes {
    fn bytes(&self) -> &[u8] {
        match self {
            TensorBytes::Mapped { map, start, len } => &map[*start..*start + *len],
            TensorBytes::Owned(v) => v,
        }
    }
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
            Storage::Parts(_) => &[],
        }
    }
}

/// An open GGUF file: parsed header, metadata and tensor table, with the
/// tensor data left in place (memory-mapped) and handed out as byte views.
pub struct GgufFile {
    path: Option<PathBuf>,
    storage: Storage,
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and validates a GGUF file. The file is not read into memory; tensor
    /// views point into the mapping.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file =
            File::open(path).map_err(|e| GgufError::from(ErrorKind::Io(e)).with_path(path))?;
        // SAFETY: the mapping is read-only and private to this process. If another
        // process truncates the file while it is mapped, reads may fault; that is
        // the accepted contract of every mmap-based model loader (llama.cpp too).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| GgufError::from(ErrorKind::Io(e)).with_path(path))?;
        let mut g = Self::parse(Storage::Mapped(map)).map_err(|e| e.with_path(path))?;
        g.path = Some(path.to_owned());
        Ok(g)
    }

    /// Validates a GGUF image held in memory (tests, fuzzing, small files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self> {
        let header = parse_header(storage.bytes())?;
        let key_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path: None,
            storage,
            version: header.version,
            metadata: header.metadata,
            key_index,
            tensors: header.tensors,
            tensor_index,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where tensor data starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file's bytes (mapped).
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Bytes of the file, or of all tensors when assembled from parts.
    pub fn file_len(&self) -> u64 {
        match &self.storage {
            Storage::Parts(parts) => parts.iter().map(|p| p.bytes().len() as u64).sum(),
            s => s.bytes().len() as u64,
        }
    }

    /// True if the file is memory-mapped rather than held in a buffer.
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped(_))
    }

    /// A file assembled from metadata and tensors whose bytes live
    /// elsewhere (memory-mapped checkpoint shards, converted buffers), for
    /// formats that are not GGUF but load as if they were. The tensors are
    /// checked as the reader checks a file's: names unique, sizes matching
    /// their type and shape.
    pub fn from_parts(
        path: Option<PathBuf>,
        metadata: Vec<(String, Value)>,
        tensors: Vec<TensorPart>,
    ) -> Result<Self> {
        let bad = |msg: String| GgufError::from(ErrorKind::Writer(msg));
        let mut key_index = HashMap::new();
        for (i, (k, _)) in metadata.iter().enumerate() {
            if key_index.insert(k.clone(), i).is_some() {
                return Err(bad(format!("duplicate key {k:?}")));
            }
        }
        let mut infos = Vec::with_capacity(tensors.len());
        let mut parts = Vec::with_capacity(tensors.len());
        let mut tensor_index = HashMap::new();
        for (i, (name, ty, dims, bytes)) in tensors.into_iter().enumerate() {
            let n_elements: u64 = dims.iter().product();
            let n_bytes = ty
                .bytes_for(n_elements)
                .filter(|&n| n == bytes.bytes().len() as u64);
            let Some(n_bytes) = n_bytes else {
                return Err(bad(format!(
                    "tensor {name:?}: {ty} {dims:?} does not fit its {} bytes",
                    bytes.bytes().len()
                )));
            };
            if tensor_index.insert(name.clone(), i).is_some() {
                return Err(bad(format!("duplicate tensor {name:?}")));
            }
            infos.push(TensorInfo {
                name,
                ty,
                dims,
                offset: 0,
                n_elements,
                n_bytes,
            });
            parts.push(bytes);
        }
        let alignment = DEFAULT_ALIGNMENT;
        Ok(GgufFile {
            path,
            storage: Storage::Parts(parts),
            version: 3,
            metadata,
            key_index,
            tensors: infos,
            tensor_index,
            alignment,
            data_offset: 0,
        })
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| {
            self.err(ErrorKind::MissingKey {
                key: key.to_owned(),
            })
        })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, v: &Value) -> GgufError {
        self.err(ErrorKind::WrongValueType {
            key: key.to_owned(),
            expected,
            found: v.type_description(),
        })
    }

    fn err(&self, kind: ErrorKind) -> GgufError {
        GgufError {
            path: self.path.clone(),
            kind,
        }
    }

    /// A string value; missing or non-string is an error naming the key.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong_type(key, "string", v))
    }

    /// A non-negative integer of any width.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| self.wrong_type(key, "non-negative integer", v))
    }

    /// A float (or integer) value as f64.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| self.wrong_type(key, "number", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| self.wrong_type(key, "bool", v))
    }

    pub fn get_array(&self, key: &str) -> Result<&Array> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong_type(key, "array", v))
    }

    /// Tensor records in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's packed bytes, borrowed from the mapping.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        if let Storage::Parts(parts) = &self.storage {
            return self
                .tensor_index
                .get(&info.name)
                .map_or(&[][..], |&i| parts[i].bytes());
        }
        let start = (self.data_offset + info.offset) as usize;
        &self.bytes()[start..start + info.n_bytes as usize]
    }

    /// The bytes of the `i`-th tensor of [`GgufFile::tensors`].
    pub fn tensor_data_at(&self, i: usize) -> &[u8] {
        match &self.storage {
            Storage::Parts(parts) => parts[i].bytes(),
            _ => self.tensor_data(&self.tensors[i]),
        }
    }

    /// The named tensor's record and bytes.
    pub fn tensor_by_name(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let info = self.tensor(name).ok_or_else(|| {
            self.err(ErrorKind::MissingTensor {
                name: name.to_owned(),
            })
        })?;
        Ok((info, self.tensor_data(info)))
    }
}

/// Everything before the tensor data, parsed and validated.
pub struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Parses and validates a complete GGUF image (header and tensor bounds).
pub fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.take(4, "magic")?;
    if magic != b"GGUF" {
        return Err(ErrorKind::BadMagic {
            found: magic.to_vec(),
        }
        .into());
    }
    let version = c.u32("version")?;
    if version & 0xFFFF == 0 && version != 0 {
        return Err(ErrorKind::BigEndian { raw: version }.into());
    }
    if !(2..=3).contains(&version) {
        return Err(ErrorKind::UnsupportedVersion { version }.into());
    }
    let n_tensors = c.count("tensor count", 24)?;
    let n_kv = c.count("metadata key/value count", 13)?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut seen_keys = HashMap::with_capacity(n_kv as usize);
    for _ in 0..n_kv {
        let key_offset = c.pos as u64;
        let key = c.string("metadata key")?;
        if key.is_empty() {
            return Err(ErrorKind::EmptyKey { offset: key_offset }.into());
        }
        if seen_keys.insert(key.clone(), ()).is_some() {
            return Err(ErrorKind::DuplicateKey {
                key,
                offset: key_offset,
            }
            .into());
        }
        let value = c.value(&key)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => u64::from(*a),
        Some((_, Value::U32(a))) => {
            return Err(ErrorKind::BadAlignment {
                reason: format!("{a} is not a non-zero power of two"),
            }
            .into())
        }
        Some((_, v)) => {
            return Err(ErrorKind::BadAlignment {
                reason: format!("must be u32, found {}", v.type_description()),
            }
            .into())
        }
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut seen_tensors = HashMap::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let rec_offset = c.pos as u64;
        let name = c.string("tensor name")?;
        if name.len() > MAX_TENSOR_NAME {
            return Err(ErrorKind::TensorNameTooLong {
                len: name.len(),
                name,
                offset: rec_offset,
            }
            .into());
        }
        if seen_tensors.insert(name.clone(), ()).is_some() {
            return Err(ErrorKind::DuplicateTensor {
                name,
                offset: rec_offset,
            }
            .into());
        }
        let n_dims = c.u32("tensor dimension count")?;
        if n_dims > MAX_DIMS {
            return Err(ErrorKind::TooManyDims { name, n_dims }.into());
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64("tensor dimension")?);
        }
        let type_id = c.u32("tensor type")?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| ErrorKind::UnknownTensorType {
            name: name.clone(),
            id: type_id,
        })?;
        let offset = c.u64("tensor data offset")?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| {
                acc.checked_mul(d).filter(|&n| n <= i64::MAX as u64)
            })
            .ok_or_else(|| ErrorKind::ElementCountOverflow {
                name: name.clone(),
                dims: dims.clone(),
            })?;
        let ne0 = dims.first().copied().unwrap_or(1);
        let block = ty.block_elems();
        if !ne0.is_multiple_of(block as u64) {
            return Err(ErrorKind::PartialBlock {
                name,
                ty,
                ne0,
                block,
            }
            .into());
        }
        let n_bytes = ty
            .bytes_for(n_elements)
            .ok_or_else(|| ErrorKind::ElementCountOverflow {
                name: name.clone(),
                dims: dims.clone(),
            })?;
        if offset % alignment != 0 {
            return Err(ErrorKind::MisalignedTensor {
                name,
                offset,
                alignment,
            }
            .into());
        }
        tensors.push(TensorInfo {
            name,
            ty,
            dims,
            offset,
            n_elements,
            n_bytes,
        });
    }

    let end_of_infos = c.pos as u64;
    let data_offset = end_of_infos.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for t in &tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(ErrorKind::TensorOutOfBounds {
                    name: t.name.clone(),
                    start: data_offset.saturating_add(t.offset),
                    end: data_offset
                        .saturating_add(t.offset)
                        .saturating_add(t.n_bytes),
                    file_len,
                }
                .into())
            }
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.offset + a.n_bytes > b.offset {
            return Err(ErrorKind::TensorOverlap {
                name: b.name.clone(),
                other: a.name.clone(),
                start: data_offset + b.offset,
                end: data_offset + b.offset + b.n_bytes,
            }
            .into());
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(ErrorKind::Truncated {
                what: what.to_owned(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.buf.len() as u64,
            }
            .into());
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("took N bytes"))
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of records, each at least `min_record_bytes` long, checked
    /// against both the global limit and the bytes left in the file.
    fn count(&mut self, what: &str, min_record_bytes: u64) -> Result<u64> {
        let offset = self.pos as u64;
        let n = self.u64(what)?;
        if n > MAX_COUNT {
            return Err(ErrorKind::CountTooLarge {
                what: what.to_owned(),
                offset,
                count: n,
                limit: MAX_COUNT,
            }
            .into());
        }
        self.check_fits(what, offset, n, min_record_bytes)?;
        Ok(n)
    }

    fn check_fits(&self, what: &str, offset: u64, n: u64, elem_bytes: u64) -> Result<()> {
        let needed = n.saturating_mul(elem_bytes);
        if needed > self.remaining() {
            return Err(ErrorKind::Truncated {
                what: format!("{what} ({n} entries)"),
                offset,
                needed,
                file_len: self.buf.len() as u64,
            }
            .into());
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let offset = self.pos as u64;
        let len = self.u64(what)?;
        if len > MAX_COUNT {
            return Err(ErrorKind::CountTooLarge {
                what: format!("{what} length"),
                offset,
                count: len,
                limit: MAX_COUNT,
            }
            .into());
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            ErrorKind::InvalidUtf8 {
                what: what.to_owned(),
                offset,
            }
            .into()
        })
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType> {
        let offset = self.pos as u64;
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or_else(|| {
            ErrorKind::UnknownValueType {
                key: key.to_owned(),
                id,
                offset,
            }
            .into()
        })
    }

    fn value(&mut self, key: &str) -> Result<Value> {
        let ty = self.value_type(key)?;
        self.value_of(ty, key)
    }

    fn value_of(&mut self, ty: ValueType, key: &str) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(key)?),
            ValueType::I8 => Value::I8(self.u8(key)? as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            ValueType::U32 => Value::U32(self.u32(key)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            ValueType::Bool => Value::Bool(self.u8(key)? != 0),
            ValueType::String => Value::String(self.string(key)?),
            ValueType::U64 => Value::U64(self.u64(key)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            ValueType::Array => Value::Array(self.array_value(key)?),
        })
    }

    fn array_value(&mut self, key: &str) -> Result<Array> {
        let type_offset = self.pos as u64;
        let elem = self.value_type(key)?;
        if elem == ValueType::Array {
            return Err(ErrorKind::NestedArray {
                key: key.to_owned(),
                offset: type_offset,
            }
            .into());
        }
        let count_offset = self.pos as u64;
        let n = self.u64(key)?;
        if n > MAX_COUNT {
            return Err(ErrorKind::CountTooLarge {
                what: format!("array length of {key:?}"),
                offset: count_offset,
                count: n,
                limit: MAX_COUNT,
            }
            .into());
        }
        // Strings take at least their 8-byte length prefix.
        let min_elem = elem.fixed_size().unwrap_or(8) as u64;
        self.check_fits(&format!("array {key:?}"), count_offset, n, min_elem)?;
        let n = n as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let raw = self.take((n * std::mem::size_of::<$t>()) as u64, key)?;
                Array::$variant(
                    raw.chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk size")))
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(n as u64, key)?.to_vec()),
            ValueType::I8 => {
                Array::I8(self.take(n as u64, key)?.iter().map(|&b| b as i8).collect())
            }
            ValueType::Bool => {
                Array::Bool(self.take(n as u64, key)?.iter().map(|&b| b != 0).collect())
            }
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(key)?);
                }
                Array::String(v)
            }
            ValueType::Array => unreachable!("rejected above"),
        })
    }
}
