//! safetensors files, memory-mapped: an 8-byte header length, a JSON header
//! naming each tensor's dtype, shape and byte range, then the data.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use rlx_gguf::GgmlType;
use serde_json::Value;

use super::HfError;

/// One tensor of a shard.
pub struct Tensor {
    pub ty: GgmlType,
    /// Row-major shape, outermost first (as PyTorch writes it).
    pub shape: Vec<u64>,
    pub map: Arc<memmap2::Mmap>,
    pub start: usize,
    pub len: usize,
}

impl Tensor {
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

/// The tensors of one file, by name.
pub fn read(path: &Path) -> Result<BTreeMap<String, Tensor>, HfError> {
    let bad = |msg: String| HfError::File {
        path: path.to_owned(),
        msg,
    };
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    // SAFETY: a read-only private mapping; a file truncated by another
    // process while mapped may fault, the contract every mmap loader has.
    let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?);
    if map.len() < 8 {
        return Err(bad("shorter than its header length".into()));
    }
    let n = u64::from_le_bytes(map[..8].try_into().expect("8 bytes")) as usize;
    let header = map
        .get(8..8usize.saturating_add(n))
        .filter(|_| n <= 100 << 20)
        .ok_or_else(|| bad(format!("a header of {n} bytes does not fit the file")))?;
    let header: Value =
        serde_json::from_slice(header).map_err(|e| bad(format!("the header is not JSON: {e}")))?;
    let entries = header
        .as_object()
        .ok_or_else(|| bad("the header is not a JSON object".into()))?;
    let data = 8 + n;
    let mut out = BTreeMap::new();
    for (name, t) in entries {
        if name == "__metadata__" {
            continue;
        }
        let what = |msg: &str| bad(format!("tensor {name}: {msg}"));
        let ty = match t["dtype"].as_str() {
            Some("F32") => GgmlType::F32,
            Some("F16") => GgmlType::F16,
            Some("BF16") => GgmlType::BF16,
            Some(other) => {
                return Err(what(&format!(
                    "dtype {other} (F32, F16 and BF16 checkpoints are read)"
                )))
            }
            None => return Err(what("no dtype")),
        };
        let shape: Vec<u64> = t["shape"]
            .as_array()
            .and_then(|s| s.iter().map(Value::as_u64).collect())
            .ok_or_else(|| what("no shape"))?;
        let offsets: Vec<usize> = t["data_offsets"]
            .as_array()
            .and_then(|s| s.iter().map(|v| v.as_u64().map(|x| x as usize)).collect())
            .filter(|o: &Vec<usize>| o.len() == 2 && o[0] <= o[1])
            .ok_or_else(|| what("no data_offsets"))?;
        let (start, end) = (data + offsets[0], data.saturating_add(offsets[1]));
        let elems = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let expected = elems.and_then(|n| ty.bytes_for(n));
        if end > map.len() || expected != Some((end - start) as u64) {
            return Err(what(&format!(
                "{} bytes at {start}..{end} do not hold {ty} {shape:?} in a {}-byte file",
                end.saturating_sub(start),
                map.len()
            )));
        }
        out.insert(
            name.clone(),
            Tensor {
                ty,
                shape,
                map: Arc::clone(&map),
                start,
                len: end - start,
            },
        );
    }
    Ok(out)
}
