//! Helpers shared by the parity tests: fixture paths and a minimal .npy reader.

#![allow(dead_code)]

use std::path::PathBuf;

pub mod scenario;

/// The repository's `tests/fixtures` folder.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// One tiny model of each generation and variant (folders of
/// `tests/fixtures/tiny`), each with a `model-f32.gguf`.
pub const TINY_GENERATIONS: [&str; 7] = [
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3n",
    "gemma4-dense",
    "gemma4-ple",
    "gemma4-moe",
];

/// Tiny models whose widths are not multiples of 32 (hidden 40, FFN 72,
/// per-layer input 12, head sizes 20 and 40), committed as Hugging Face
/// checkpoints (`<name>/hf`) with transformers' logits (`<name>/hf-f32`) by
/// `scripts/tiny/make_odd_models.py`.
pub const ODD_SIZES: [&str; 2] = ["gemma4-odd", "gemma3-odd"];

#[path = "../../../../tests/support/real_model.rs"]
mod real_model;
// Not every test binary that includes this module reads the real file.
#[allow(unused_imports)]
pub use real_model::real_model;

/// A little-endian .npy array: its shape and raw element bytes.
pub struct Npy {
    pub shape: Vec<usize>,
    pub descr: String,
    pub data: Vec<u8>,
}

pub fn read_npy(path: &std::path::Path) -> Npy {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}: not .npy", path.display());
    let (hlen, start) = if bytes[6] == 1 {
        (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10)
    } else {
        (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        )
    };
    let header = std::str::from_utf8(&bytes[start..start + hlen]).unwrap();
    let field = |key: &str| -> &str {
        let at = header
            .find(key)
            .unwrap_or_else(|| panic!("no {key} in {header}"))
            + key.len();
        header[at..].trim_start_matches([':', ' ', '\''])
    };
    let descr = field("'descr'").split('\'').next().unwrap().to_owned();
    assert!(field("'fortran_order'").starts_with("False"));
    let shape_txt = field("'shape'");
    let shape_txt = &shape_txt[1..shape_txt.find(')').unwrap()];
    let shape = shape_txt
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    Npy {
        shape,
        descr,
        data: bytes[start + hlen..].to_vec(),
    }
}

impl Npy {
    pub fn f32s(&self) -> Vec<f32> {
        assert_eq!(self.descr, "<f4");
        self.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    pub fn i32s(&self) -> Vec<i32> {
        match self.descr.as_str() {
            "<i4" => self
                .data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            "<i8" => self
                .data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as i32)
                .collect(),
            d => panic!("unexpected dtype {d}"),
        }
    }
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// Index of the largest value (lowest index on ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}
