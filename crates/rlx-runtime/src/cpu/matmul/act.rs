//! Activation rows quantized into a weight type's `vec_dot` partner format.

use std::sync::Mutex;

use rlx_gguf::GgmlType;

use super::super::pool::{split_range, ThreadPool};

/// The activation block formats of llama.cpp's CPU dot products.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ActFormat {
    /// f16 `d`, 32 × i8.
    Q8_0,
    /// f16 `d`, f16 `s = d·Σq`, 32 × i8.
    Q8_1,
    /// f32 `d`, 256 × i8, 16 × i16 sums of each run of 16.
    Q8_K,
}

impl ActFormat {
    pub const COUNT: usize = 3;
    pub const ALL: [ActFormat; Self::COUNT] = [Self::Q8_0, Self::Q8_1, Self::Q8_K];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn ty(self) -> GgmlType {
        match self {
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q8_1 => GgmlType::Q8_1,
            Self::Q8_K => GgmlType::Q8_K,
        }
    }

    /// Bytes of one quantized row of `k` elements (`k` a multiple of the block).
    pub fn row_bytes(self, k: usize) -> usize {
        let ty = self.ty();
        k / ty.block_elems() * ty.block_bytes()
    }
}

/// Rows per quantization task; small enough to spread a prefill batch, large
/// enough that decode (m = 1) runs inline.
const ROWS_PER_TASK: usize = 8;

/// Quantizes the `m` rows of `x` (each `k` long) into `buf` with ggml's
/// reference quantizer, so the blocks are byte-identical to llama.cpp's.
pub(super) fn quantize_rows(
    pool: &ThreadPool,
    fmt: ActFormat,
    x: &[f32],
    m: usize,
    k: usize,
    buf: &mut Vec<u8>,
) {
    let row_bytes = fmt.row_bytes(k);
    let len = m * row_bytes;
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let buf = &mut buf[..len];
    if k == 0 {
        return;
    }
    let quantize = |xs: &[f32], out: &mut [u8]| {
        rlx_gguf::quantize(fmt.ty(), xs, out).expect("k was checked against the block size");
    };
    let n_tasks = m.div_ceil(ROWS_PER_TASK).min(pool.threads());
    if n_tasks <= 1 {
        quantize(x, buf);
        return;
    }
    // Hand each task its own contiguous band of rows.
    let mut bands = Vec::with_capacity(n_tasks);
    let mut rest = &mut *buf;
    for t in 0..n_tasks {
        let rows = split_range(m, n_tasks, t);
        let (band, tail) = rest.split_at_mut(rows.len() * row_bytes);
        bands.push(Mutex::new(band));
        rest = tail;
    }
    pool.for_each(n_tasks, &|t| {
        let rows = split_range(m, n_tasks, t);
        let mut band = bands[t].lock().expect("band lock");
        quantize(&x[rows.start * k..rows.end * k], &mut band);
    });
}
