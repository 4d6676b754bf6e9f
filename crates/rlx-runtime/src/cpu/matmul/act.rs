//! Activation rows quantized into a weight type's `vec_dot` partner format.

use std::sync::Mutex;

use rlx_gguf::GgmlType;

use super::super::features::Isa;
use super::super::pool::{split_range, ThreadPool};
use super::scalar::Q8_0_BYTES;
use crate::cpu::simd::table::f16_table;

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

/// Quantizes the `m` rows of `x` (each `k` long) into `buf`, byte-identical
/// to ggml's reference quantizer (and so to llama.cpp's blocks); Q8_0 has a
/// SIMD version at `isa` ≥ AVX2 and on NEON.
pub(super) fn quantize_rows(
    pool: &ThreadPool,
    isa: Isa,
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
        if fmt == ActFormat::Q8_0 && q8_0_simd(isa, xs, out) {
            return;
        }
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

/// Q8_0-quantizes `x` into `out` with SIMD if `isa` allows; false if not.
fn q8_0_simd(isa: Isa, x: &[f32], out: &mut [u8]) -> bool {
    assert!(x.len().is_multiple_of(32) && out.len() == x.len() / 32 * 34);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's `isa` is at most `Isa::detect()` (checked by
        // `matmul`), and the lengths are asserted above.
        Isa::Avx512 => unsafe { q8_0_avx512(x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { q8_0_avx2(x, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: NEON is every AArch64 CPU's; lengths asserted above.
        Isa::Neon => unsafe { super::neon::q8_0(x, out) },
        _ => return false,
    }
    true
}

/// `roundf` (half away from zero) for |v| < 2²³: adding the largest float
/// below ½ with `v`'s sign and truncating rounds exactly like `roundf`.
#[cfg(target_arch = "x86_64")]
const JUST_BELOW_HALF: f32 = 0.499_999_97;

/// The reference `d` and `1/d` of a block with absolute maximum `amax`.
#[inline]
pub(super) fn scale(amax: f32) -> (u16, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (half::f16::from_f32(d).to_bits(), id)
}

/// # Safety
/// The CPU has AVX-512 F + BW; `out.len() == x.len() / 32 * 34`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q8_0_avx512(x: &[f32], out: &mut [u8]) {
    // SAFETY: the CPU has this function's features (the caller's promise), and every load and store
    // stays inside one 32-float chunk of `x` or one block of `out`.
    unsafe {
        use std::arch::x86_64::*;
        let half = _mm512_set1_ps(JUST_BELOW_HALF);
        let sign = _mm512_set1_ps(-0.0);
        for (xb, b) in x
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(GgmlType::Q8_0.block_bytes()))
        {
            let v0 = _mm512_loadu_ps(xb.as_ptr());
            let v1 = _mm512_loadu_ps(xb.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let (d, id) = scale(amax);
            b[..2].copy_from_slice(&d.to_le_bytes());
            let id = _mm512_set1_ps(id);
            for (h, v) in [v0, v1].into_iter().enumerate() {
                let s = _mm512_mul_ps(v, id);
                let r = _mm512_add_ps(s, _mm512_or_ps(_mm512_and_ps(s, sign), half));
                let q = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r));
                _mm_storeu_si128(b.as_mut_ptr().add(2 + 16 * h).cast(), q);
            }
        }
    }
}

/// # Safety
/// The CPU has AVX2; `out.len() == x.len() / 32 * 34`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q8_0_avx2(x: &[f32], out: &mut [u8]) {
    // SAFETY: the CPU has this function's features (the caller's promise), and every load and store
    // stays inside one 32-float chunk of `x` or one block of `out`.
    unsafe {
        use std::arch::x86_64::*;
        let half = _mm256_set1_ps(JUST_BELOW_HALF);
        let sign = _mm256_set1_ps(-0.0);
        for (xb, b) in x
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(GgmlType::Q8_0.block_bytes()))
        {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xb.as_ptr().add(8 * i)));
            let mut m = _mm256_setzero_ps();
            for &v in &v {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m1 = _mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1));
            let (d, id) = scale(_mm_cvtss_f32(m1));
            b[..2].copy_from_slice(&d.to_le_bytes());
            let id = _mm256_set1_ps(id);
            let q: [__m256i; 4] = v.map(|v| {
                let s = _mm256_mul_ps(v, id);
                _mm256_cvttps_epi32(_mm256_add_ps(s, _mm256_or_ps(_mm256_and_ps(s, sign), half)))
            });
            // i32 → i16 → i8 packs interleave 128-bit lanes; the permute restores
            // element order.
            let p01 = _mm256_packs_epi32(q[0], q[1]);
            let p23 = _mm256_packs_epi32(q[2], q[3]);
            let p = _mm256_packs_epi16(p01, p23);
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(b.as_mut_ptr().add(2).cast(), p);
        }
    }
}

/// Activation rows per panel: one per 32-bit lane of a zmm register.
pub(super) const LANES: usize = 16;
/// Groups of 4 elements in a block.
pub(super) const QUADS: usize = 8;
/// Q8_0 activation rows transposed into panels of [`LANES`] rows, for the
/// kernels that broadcast weight codes against many activation rows: per
/// block and per group of 4 elements, one 64-byte line holds those 4 bytes
/// of every row of the panel.
#[derive(Default)]
pub(super) struct ActPanels {
    /// `[panel][block][quad][lane][4]` codes.
    pub(super) codes: Vec<i8>,
    /// `[panel][block][lane]` scales (0 for padding lanes).
    pub(super) scales: Vec<f32>,
    /// `[panel][block][lane]` sums of the block's codes.
    pub(super) sums: Vec<i32>,
    pub(super) rows: usize,
    pub(super) blocks: usize,
}

/// Transposes `m` Q8_0 activation rows (`act_row_bytes` apart, `blocks`
/// blocks each) into `out`.
pub(super) fn pack_panels(
    acts: &[u8],
    m: usize,
    act_row_bytes: usize,
    blocks: usize,
    out: &mut ActPanels,
) {
    let panels = m.div_ceil(LANES);
    let table = f16_table();
    out.rows = m;
    out.blocks = blocks;
    out.codes.clear();
    out.codes.resize(panels * blocks * QUADS * LANES * 4, 0);
    out.scales.clear();
    out.scales.resize(panels * blocks * LANES, 0.0);
    out.sums.clear();
    out.sums.resize(panels * blocks * LANES, 0);
    for i in 0..m {
        let (p, lane) = (i / LANES, i % LANES);
        let row = &acts[i * act_row_bytes..];
        for b in 0..blocks {
            let block = &row[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
            let at = (p * blocks + b) * LANES + lane;
            out.scales[at] = table[usize::from(u16::from_le_bytes([block[0], block[1]]))];
            out.sums[at] = block[2..].iter().map(|&c| i32::from(c as i8)).sum();
            for q in 0..QUADS {
                let dst = (((p * blocks + b) * QUADS + q) * LANES + lane) * 4;
                for (d, &c) in out.codes[dst..dst + 4].iter_mut().zip(&block[2 + 4 * q..]) {
                    *d = c as i8;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every SIMD level gives the reference bytes, ties and zero blocks included.
    #[test]
    fn simd_q8_0_is_byte_identical_to_the_reference() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut x: Vec<f32> = (0..32 * 400)
            .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0)
            .collect();
        // A block whose amax is 127, so x·id = x and halves are exact ties.
        for (i, v) in x[..32].iter_mut().enumerate() {
            *v = if i == 0 { 127.0 } else { i as f32 - 15.5 };
        }
        x[32..64].fill(0.0);
        for (i, v) in x[64..96].iter_mut().enumerate() {
            *v = -(i as f32) * 1e-3;
        }
        let want = rlx_gguf::quantize_to_vec(rlx_gguf::GgmlType::Q8_0, &x).unwrap();
        for isa in Isa::supported() {
            let mut got = vec![0u8; want.len()];
            if q8_0_simd(isa, &x, &mut got) {
                assert_eq!(got, want, "{isa}");
            }
        }
    }
}
