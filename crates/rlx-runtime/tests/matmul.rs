//! Parity tests for the CPU matmul kernels.
//!
//! Reference: the weights dequantized by `rlx_gguf::dequantize` (bit-exact with
//! llama.cpp), then a naive f64 matmul. Exact precision must match it to f32
//! rounding; Quantized precision must stay inside llama.cpp's MUL_MAT budget
//! (NMSE ≤ 5e-4, as test-backend-ops uses) and inside a per-output bound on the
//! error activation rounding can cause.

use rlx_gguf::quant::{can_dequantize, can_quantize};
use rlx_gguf::GgmlType;
use rlx_runtime::cpu::features::Isa;
use rlx_runtime::cpu::matmul::{
    activation_type, matmul, MatmulError, MatmulOptions, MatmulScratch, Precision, WeightMatrix,
};
use rlx_runtime::cpu::pool::ThreadPool;

/// splitmix64: small, seedable, good enough for test data.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
}

/// A small finite f16 scale with a random sign.
fn small_scale(rng: &mut Rng) -> f32 {
    let mag = 0.002 + 0.02 * (rng.f32() + 1.0);
    if rng.below(2) == 0 {
        mag
    } else {
        -mag
    }
}

/// Overwrites the scale fields of one block of random bytes with small finite
/// values (layouts from gguf-and-quants.md §3).
fn fix_scales(ty: GgmlType, b: &mut [u8], rng: &mut Rng) {
    use GgmlType as T;
    match ty {
        T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ1_S
        | T::IQ4_NL
        | T::IQ4_XS
        | T::Q1_0
        | T::Q2_0 => put_f16(b, 0, small_scale(rng)),
        T::TQ1_0 => put_f16(b, 52, small_scale(rng)),
        T::TQ2_0 => put_f16(b, 64, small_scale(rng)),
        // The f16 super-scale lives in the top nibbles of the four u16 scales.
        T::IQ1_M => {
            let d = half::f16::from_f32(small_scale(rng)).to_bits();
            for i in 0..4 {
                let off = 48 + 2 * i;
                let s = u16::from_le_bytes([b[off], b[off + 1]]);
                let s = (s & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12);
                b[off..off + 2].copy_from_slice(&s.to_le_bytes());
            }
        }
        // E8M0 exponent near 2^0 (0xFF would be NaN).
        T::MXFP4 => b[0] = 120 + rng.below(10) as u8,
        // Four UE4M3 sub-block scales: no sign bit, exponent 3..9, never 0x7F.
        T::NVFP4 => {
            for s in &mut b[..4] {
                *s = ((3 + rng.below(7) as u8) << 3) | rng.below(8) as u8;
            }
        }
        _ => unreachable!("{ty} has a reference quantizer"),
    }
}

/// `rows × k` random weights of type `ty`.
fn random_weights(ty: GgmlType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    use GgmlType as T;
    let n = rows * k;
    if can_quantize(ty) {
        let x = rng.vec(n);
        return rlx_gguf::quantize_to_vec(ty, &x).unwrap();
    }
    let mut out = Vec::with_capacity(n / ty.block_elems() * ty.block_bytes());
    match ty {
        T::F32 => (0..n).for_each(|_| out.extend(rng.f32().to_le_bytes())),
        T::F16 => (0..n).for_each(|_| out.extend(half::f16::from_f32(rng.f32()).to_le_bytes())),
        T::BF16 => (0..n).for_each(|_| out.extend(half::bf16::from_f32(rng.f32()).to_le_bytes())),
        T::F64 => (0..n).for_each(|_| out.extend(f64::from(rng.f32()).to_le_bytes())),
        T::I8 => (0..n).for_each(|_| out.push((rng.below(255) as i32 - 127) as i8 as u8)),
        T::I16 => (0..n).for_each(|_| out.extend((rng.below(201) as i16 - 100).to_le_bytes())),
        T::I32 => (0..n).for_each(|_| out.extend((rng.below(201) as i32 - 100).to_le_bytes())),
        T::I64 => (0..n).for_each(|_| out.extend((rng.below(201) as i64 - 100).to_le_bytes())),
        _ => {
            for _ in 0..n / ty.block_elems() {
                let mut b: Vec<u8> = (0..ty.block_bytes())
                    .map(|_| rng.next_u64() as u8)
                    .collect();
                fix_scales(ty, &mut b, rng);
                out.extend(b);
            }
        }
    }
    out
}

/// Dequantized weights and, per output, the f64 reference and `Σ|w·x|`.
struct Reference {
    w: Vec<f32>,
    y: Vec<f64>,
    abs: Vec<f64>,
}

fn reference(ty: GgmlType, data: &[u8], rows: usize, k: usize, x: &[f32], m: usize) -> Reference {
    let mut w = vec![0f32; rows * k];
    rlx_gguf::dequantize(ty, data, &mut w).unwrap();
    let mut y = vec![0f64; m * rows];
    let mut abs = vec![0f64; m * rows];
    for i in 0..m {
        for r in 0..rows {
            let (mut s, mut a) = (0f64, 0f64);
            for (&wv, &xv) in w[r * k..(r + 1) * k].iter().zip(&x[i * k..(i + 1) * k]) {
                let p = f64::from(wv) * f64::from(xv);
                s += p;
                a += p.abs();
            }
            y[i * rows + r] = s;
            abs[i * rows + r] = a;
        }
    }
    Reference { w, y, abs }
}

/// Per output: `Σ_e |w_e| · amax(activation block of e) / 127`. Quantizing an
/// activation moves it by at most about half a step (`amax/127`, plus f16
/// rounding of the scale), so this bounds what activation rounding can do.
fn act_rounding_bound(
    w: &[f32],
    rows: usize,
    k: usize,
    x: &[f32],
    m: usize,
    block: usize,
) -> Vec<f64> {
    let mut out = vec![0f64; m * rows];
    for i in 0..m {
        let xi = &x[i * k..(i + 1) * k];
        let steps: Vec<f64> = xi
            .chunks(block)
            .map(|c| c.iter().fold(0f64, |a, &v| a.max(f64::from(v.abs()))) / 127.0)
            .collect();
        for r in 0..rows {
            out[i * rows + r] = w[r * k..(r + 1) * k]
                .iter()
                .enumerate()
                .map(|(e, &wv)| f64::from(wv.abs()) * steps[e / block])
                .sum();
        }
    }
    out
}

fn dequantizable() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .filter(|&t| can_dequantize(t))
        .collect()
}

/// k values to try: 1, 2 and 3 blocks, plus lengths that are not multiples of
/// any SIMD width for the one-element "block" types.
fn ks(ty: GgmlType) -> Vec<usize> {
    match ty.block_elems() {
        1 => vec![1, 2, 3, 17, 100],
        b => vec![b, 2 * b, 3 * b],
    }
}

const MS: [usize; 4] = [1, 3, 7, 13];
const ROWS: [usize; 3] = [1, 5, 33];

fn run(
    pool: &ThreadPool,
    precision: Precision,
    isa: Isa,
    x: &[f32],
    m: usize,
    weights: &[WeightMatrix],
) -> Vec<f32> {
    let cols: usize = weights.iter().map(|w| w.rows).sum();
    let mut y = vec![f32::NAN; m * cols];
    let mut scratch = MatmulScratch::default();
    let opts = MatmulOptions {
        precision,
        isa,
        batch_invariant: false,
        rows: rlx_runtime::cpu::matmul::RowChoice::WIDEST,
    };
    matmul(pool, &opts, x, m, weights, &mut y, &mut scratch).unwrap();
    y
}

/// A call's only weight.
fn one(ty: GgmlType, rows: usize, k: usize, data: &[u8]) -> [WeightMatrix<'_>; 1] {
    [WeightMatrix { ty, rows, k, data }]
}

/// [`run`] on one thread and on three: the outputs must agree bit for bit
/// (the task split changes nothing); returns them.
fn run_split_invariant(
    pools: &[ThreadPool; 2],
    precision: Precision,
    isa: Isa,
    x: &[f32],
    m: usize,
    weights: &[WeightMatrix],
    what: &str,
) -> Vec<f32> {
    let y = run(&pools[0], precision, isa, x, m, weights);
    let y3 = run(&pools[1], precision, isa, x, m, weights);
    assert!(
        y.iter().zip(&y3).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: 1 vs 3 threads differ"
    );
    y
}

/// Exact: every output within `1e-5 · Σ|w·x|` of the f64 reference — f32
/// rounding of a few-hundred-term sum, far below any quantization effect.
/// Also checks that the thread count does not change a single bit.
#[test]
fn exact_matches_f64_reference_for_every_type() {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut rng = Rng(1);
    for ty in dequantizable() {
        for k in ks(ty) {
            for rows in ROWS {
                let data = random_weights(ty, rows, k, &mut rng);
                for m in MS {
                    let x = rng.vec(m * k);
                    let r = reference(ty, &data, rows, k, &x, m);
                    let w = one(ty, rows, k, &data);
                    for isa in Isa::supported() {
                        let y1 = run_split_invariant(
                            &pools,
                            Precision::Exact,
                            isa,
                            &x,
                            m,
                            &w,
                            &format!("{ty} {isa} m={m} rows={rows} k={k}"),
                        );
                        assert_near_reference(
                            &y1,
                            &r,
                            &format!("{ty} {isa} m={m} rows={rows} k={k}"),
                        );
                    }
                }
            }
        }
    }
}

/// Quantized: over all shapes of one (type, ISA), NMSE ≤ 5e-4 (llama.cpp's
/// MUL_MAT threshold), and every output within the activation-rounding bound.
/// Types without a quantized kernel must give exactly the Exact result.
#[test]
fn quantized_stays_within_llama_budget_for_every_type() {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut rng = Rng(2);
    for ty in dequantizable() {
        let act = activation_type(ty);
        for isa in Isa::supported() {
            let (mut err2, mut ref2) = (0f64, 0f64);
            for k in ks(ty) {
                for rows in ROWS {
                    let data = random_weights(ty, rows, k, &mut rng);
                    for m in MS {
                        let x = rng.vec(m * k);
                        let r = reference(ty, &data, rows, k, &x, m);
                        let w = one(ty, rows, k, &data);
                        let y = run_split_invariant(
                            &pools,
                            Precision::Quantized,
                            isa,
                            &x,
                            m,
                            &w,
                            &format!("{ty} {isa}"),
                        );
                        let Some(act) = act else {
                            let exact = run(&pools[0], Precision::Exact, isa, &x, m, &w);
                            assert!(
                                y.iter()
                                    .zip(&exact)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{ty} {isa}: no quantized kernel, so Quantized must equal Exact"
                            );
                            continue;
                        };
                        let bound = act_rounding_bound(&r.w, rows, k, &x, m, act.block_elems());
                        for (o, &v) in y.iter().enumerate() {
                            let err = (f64::from(v) - r.y[o]).abs();
                            let tol = bound[o] + 1e-5 * r.abs[o] + 1e-30;
                            assert!(
                                err <= tol,
                                "{ty} {isa} m={m} rows={rows} k={k} out {o}: {v} vs {} (err {err:e}, bound {tol:e})",
                                r.y[o]
                            );
                            err2 += (f64::from(v) - r.y[o]).powi(2);
                            ref2 += r.y[o].powi(2);
                        }
                    }
                }
            }
            if act.is_some() {
                let nmse = err2 / ref2;
                assert!(nmse <= 5e-4, "{ty} {isa}: NMSE {nmse:e} > 5e-4");
            }
        }
    }
}

/// Many activation rows (the prefill GEMM where the CPU has it): every
/// output equals the f64 product of the dequantized weights and the Q8_0
/// activations to `1e-5 · Σ|w·x|`, and an activation row gives the same bits
/// whatever its position in the batch, the batch size and the thread count.
#[test]
fn many_activation_rows_match_the_q8_0_activation_reference() {
    use GgmlType as T;
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut rng = Rng(9);
    let types = [
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q5_1,
        T::Q8_0,
        T::IQ4_NL,
        T::Q2_K,
        T::Q3_K,
        T::Q4_K,
        T::Q5_K,
        T::Q6_K,
    ];
    for ty in types {
        for isa in Isa::supported() {
            let (rows, k, m) = (37, 512, 100);
            let data = random_weights(ty, rows, k, &mut rng);
            let x = rng.vec(m * k);
            let xq = rlx_gguf::dequantize_to_vec(
                GgmlType::Q8_0,
                &rlx_gguf::quantize_to_vec(GgmlType::Q8_0, &x).unwrap(),
            )
            .unwrap();
            let w = one(ty, rows, k, &data);
            let y = run_split_invariant(
                &pools,
                Precision::Quantized,
                isa,
                &x,
                m,
                &w,
                &format!("{ty} {isa}"),
            );
            // Rows 17.. alone (still a GEMM-sized batch): the same bits as
            // inside the full batch.
            let tail = run(
                &pools[0],
                Precision::Quantized,
                isa,
                &x[17 * k..],
                m - 17,
                &w,
            );
            assert!(
                tail.iter()
                    .zip(&y[17 * rows..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty} {isa}: an activation row's result depends on the batch"
            );
            // The GEMM and the Q8_0-activation row kernels see exactly the
            // Q8_0-rounded activations (Q8_1 rounds its sum, Q8_K has other
            // blocks).
            if rlx_runtime::cpu::matmul::has_prefill_gemm(isa)
                || activation_type(ty) == Some(GgmlType::Q8_0)
            {
                let r = reference(ty, &data, rows, k, &xq, m);
                assert_near_reference(&y, &r, &format!("{ty} {isa}"));
            }
        }
    }
}

/// Every output within `1e-5 · Σ|w·x|` of the f64 reference `r`.
fn assert_near_reference(y: &[f32], r: &Reference, what: &str) {
    for (o, &v) in y.iter().enumerate() {
        let err = (f64::from(v) - r.y[o]).abs();
        let tol = 1e-5 * r.abs[o] + 1e-30;
        assert!(
            err <= tol,
            "{what} out {o}: {v} vs {} (err {err:e}, tol {tol:e})",
            r.y[o]
        );
    }
}

/// Batches of a few to a few dozen activation rows (a decode step of many
/// sequences: the panel kernels where the CPU has them, else the row
/// kernels): every output equals the f64 product of the dequantized weights
/// and the Q8_0 activations to `1e-5 · Σ|w·x|`, whatever the thread count,
/// and a row gives the same bits wherever it sits in a batch of the same
/// size.
#[test]
fn decode_batches_match_the_q8_0_activation_reference() {
    use GgmlType as T;
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut rng = Rng(21);
    for ty in [T::Q4_0, T::Q5_0, T::Q8_0] {
        for isa in Isa::supported() {
            for m in [4, 5, 15, 16, 17, 31] {
                let (rows, k) = (13, 320);
                let data = random_weights(ty, rows, k, &mut rng);
                let x = rng.vec(m * k);
                let xq = rlx_gguf::dequantize_to_vec(
                    GgmlType::Q8_0,
                    &rlx_gguf::quantize_to_vec(GgmlType::Q8_0, &x).unwrap(),
                )
                .unwrap();
                let w = one(ty, rows, k, &data);
                let y = run_split_invariant(
                    &pools,
                    Precision::Quantized,
                    isa,
                    &x,
                    m,
                    &w,
                    &format!("{ty} {isa} m={m}"),
                );
                // The first row moved to the end: its outputs keep their bits.
                let mut moved = x[k..].to_vec();
                moved.extend_from_slice(&x[..k]);
                let ym = run(&pools[0], Precision::Quantized, isa, &moved, m, &w);
                assert!(
                    ym[(m - 1) * rows..]
                        .iter()
                        .zip(&y[..rows])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty} {isa} m={m}: a row's result depends on its place"
                );
                let r = reference(ty, &data, rows, k, &xq, m);
                assert_near_reference(&y, &r, &format!("{ty} {isa} m={m}"));
            }
        }
    }
}

/// Weights of different types in one call (a fused projection) may each
/// take another path at the same row count (the GEMM for K-quants, panel
/// kernels for the 32-element formats): every weight's columns equal a call
/// with that weight alone, bit for bit, and every output is written.
#[test]
fn fused_weights_of_mixed_paths_equal_separate_calls() {
    use GgmlType as T;
    let pool = ThreadPool::new(2);
    let mut rng = Rng(33);
    let (k, parts) = (
        512,
        [(T::Q4_K, 16), (T::Q8_0, 13), (T::Q6_K, 17), (T::Q5_0, 7)],
    );
    let data: Vec<Vec<u8>> = parts
        .iter()
        .map(|&(ty, rows)| random_weights(ty, rows, k, &mut rng))
        .collect();
    let ws: Vec<WeightMatrix> = parts
        .iter()
        .zip(&data)
        .map(|(&(ty, rows), d)| WeightMatrix {
            ty,
            rows,
            k,
            data: d,
        })
        .collect();
    let cols: usize = parts.iter().map(|p| p.1).sum();
    for isa in Isa::supported() {
        for m in [3, 20, 70, 130] {
            let x = rng.vec(m * k);
            let fused = run(&pool, Precision::Quantized, isa, &x, m, &ws);
            assert!(
                fused.iter().all(|v| v.is_finite()),
                "{isa} m={m}: unwritten"
            );
            let mut col0 = 0;
            for w in &ws {
                let alone = run(
                    &pool,
                    Precision::Quantized,
                    isa,
                    &x,
                    m,
                    std::slice::from_ref(w),
                );
                for i in 0..m {
                    let got = &fused[i * cols + col0..][..w.rows];
                    let want = &alone[i * w.rows..][..w.rows];
                    assert!(
                        got.iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa} m={m} {}: row {i} differs when fused",
                        w.ty
                    );
                }
                col0 += w.rows;
            }
        }
    }
}

/// The SIMD integer kernels form the same integer sums as the scalar ones, so
/// outputs may differ only by f32 rounding of the per-block scaling:
/// `|simd − scalar| ≤ 1e-6 · Σ|w·x|`.
#[test]
fn scalar_and_simd_quantized_kernels_agree() {
    let pool = ThreadPool::new(1);
    let mut rng = Rng(3);
    let simd: Vec<Isa> = Isa::supported()
        .into_iter()
        .filter(|&i| i > Isa::Scalar)
        .collect();
    for ty in dequantizable()
        .into_iter()
        .filter(|&t| activation_type(t).is_some())
    {
        for k in ks(ty).into_iter().chain([8 * ty.block_elems().max(32)]) {
            let (rows, m) = (9, 3);
            let data = random_weights(ty, rows, k, &mut rng);
            let x = rng.vec(m * k);
            let r = reference(ty, &data, rows, k, &x, m);
            let w = one(ty, rows, k, &data);
            let base = run(&pool, Precision::Quantized, Isa::Scalar, &x, m, &w);
            for &isa in &simd {
                let y = run(&pool, Precision::Quantized, isa, &x, m, &w);
                for (o, (&a, &b)) in base.iter().zip(&y).enumerate() {
                    let diff = f64::from((a - b).abs());
                    let tol = 1e-6 * r.abs[o];
                    assert!(
                        diff <= tol,
                        "{ty} {isa} k={k} out {o}: scalar {a} vs {b} (diff {diff:e}, tol {tol:e})"
                    );
                }
            }
        }
    }
}

/// The K-quant dots (Q2_K..Q6_K, IQ4_XS against Q8_K activations) give the
/// scalar reference's bits on every instruction set: each block's exact
/// integer sums, scaled and added in block order as the reference does.
#[test]
fn k_quant_dots_give_the_references_bits_on_every_instruction_set() {
    let pool = ThreadPool::new(1);
    let mut rng = Rng(5);
    let mut checked = 0;
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ] {
        for k in [256, 2048] {
            let (rows, m) = (9, 3);
            let data = random_weights(ty, rows, k, &mut rng);
            let x = rng.vec(m * k);
            let w = one(ty, rows, k, &data);
            let base = run(&pool, Precision::Quantized, Isa::Scalar, &x, m, &w);
            for isa in Isa::supported() {
                let y = run(&pool, Precision::Quantized, isa, &x, m, &w);
                for (o, (&a, &b)) in base.iter().zip(&y).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{ty} {isa} k={k} out {o}: {a} vs {b}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 12);
}

/// A fused call writes weight i's outputs into column block i, and each block
/// is bit-identical to calling that weight alone (activation formats are shared
/// but quantized identically).
#[test]
fn fused_weights_fill_concatenated_column_blocks() {
    let mut rng = Rng(4);
    let cases: [&[(GgmlType, usize)]; 3] = [
        &[
            (GgmlType::Q4_K, 5),
            (GgmlType::Q8_0, 33),
            (GgmlType::Q6_K, 7),
        ],
        &[
            (GgmlType::Q5_0, 4),
            (GgmlType::Q8_0, 9),
            (GgmlType::Q4_1, 3),
        ],
        &[
            (GgmlType::F16, 6),
            (GgmlType::IQ2_XXS, 2),
            (GgmlType::Q5_K, 11),
        ],
    ];
    for threads in [1, 3] {
        let pool = ThreadPool::new(threads);
        for case in cases {
            let (k, m) = (256, 3);
            let datas: Vec<Vec<u8>> = case
                .iter()
                .map(|&(ty, rows)| random_weights(ty, rows, k, &mut rng))
                .collect();
            let weights: Vec<WeightMatrix> = case
                .iter()
                .zip(&datas)
                .map(|(&(ty, rows), data)| WeightMatrix { ty, rows, k, data })
                .collect();
            let cols: usize = weights.iter().map(|w| w.rows).sum();
            let x = rng.vec(m * k);
            for precision in [Precision::Exact, Precision::Quantized] {
                for isa in Isa::supported() {
                    let fused = run(&pool, precision, isa, &x, m, &weights);
                    let mut col0 = 0;
                    for w in &weights {
                        let alone = run(&pool, precision, isa, &x, m, std::slice::from_ref(w));
                        let r = reference(w.ty, w.data, w.rows, k, &x, m);
                        for i in 0..m {
                            for c in 0..w.rows {
                                let f = fused[i * cols + col0 + c];
                                assert_eq!(
                                    f.to_bits(),
                                    alone[i * w.rows + c].to_bits(),
                                    "{precision:?} {isa} {}: row {i} col {c}",
                                    w.ty
                                );
                                let o = i * w.rows + c;
                                let tol = 0.05 * r.abs[o] + 1e-30;
                                assert!((f64::from(f) - r.y[o]).abs() <= tol, "{} misplaced", w.ty);
                            }
                        }
                        col0 += w.rows;
                    }
                }
            }
        }
    }
}

/// A scratch reused across calls of different sizes and formats gives the same
/// bits as a fresh one.
#[test]
fn reused_scratch_gives_identical_results() {
    let pool = ThreadPool::new(3);
    let mut rng = Rng(5);
    let mut scratch = MatmulScratch::default();
    for (ty, rows, k, m) in [
        (GgmlType::Q4_0, 40, 512, 9),
        (GgmlType::Q6_K, 3, 256, 1),
        (GgmlType::Q5_1, 17, 64, 4),
        (GgmlType::BF16, 21, 300, 2),
        (GgmlType::Q4_0, 40, 512, 9),
    ] {
        let data = random_weights(ty, rows, k, &mut rng);
        let w = one(ty, rows, k, &data);
        let x = rng.vec(m * k);
        for precision in [Precision::Exact, Precision::Quantized] {
            let opts = MatmulOptions {
                precision,
                isa: Isa::detect(),
                batch_invariant: false,
                rows: rlx_runtime::cpu::matmul::RowChoice::WIDEST,
            };
            let mut y = vec![0f32; m * rows];
            matmul(&pool, &opts, &x, m, &w, &mut y, &mut scratch).unwrap();
            let fresh = run(&pool, precision, Isa::detect(), &x, m, &w);
            assert!(
                y.iter()
                    .zip(&fresh)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty} {precision:?}"
            );
        }
    }
}

/// F32 weights are read in place when aligned and copied when not; both give
/// the same bits.
#[test]
fn misaligned_f32_weights_give_the_same_result() {
    let pool = ThreadPool::new(1);
    let mut rng = Rng(6);
    let (rows, k, m) = (7, 45, 2);
    let data = random_weights(GgmlType::F32, rows, k, &mut rng);
    let mut shifted = vec![0u8; data.len() + 1];
    shifted[1..].copy_from_slice(&data);
    let x = rng.vec(m * k);
    for isa in Isa::supported() {
        let aligned = [WeightMatrix {
            ty: GgmlType::F32,
            rows,
            k,
            data: &data,
        }];
        let misaligned = [WeightMatrix {
            ty: GgmlType::F32,
            rows,
            k,
            data: &shifted[1..],
        }];
        let a = run(&pool, Precision::Exact, isa, &x, m, &aligned);
        let b = run(&pool, Precision::Exact, isa, &x, m, &misaligned);
        assert!(
            a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{isa}"
        );
    }
}

#[test]
fn bad_sizes_are_errors() {
    let pool = ThreadPool::new(2);
    let mut scratch = MatmulScratch::default();
    let opts = MatmulOptions {
        precision: Precision::Quantized,
        isa: Isa::Scalar,
        batch_invariant: false,
        rows: rlx_runtime::cpu::matmul::RowChoice::WIDEST,
    };
    let q4 = [0u8; 2 * 18 * 2]; // 2 rows of 64 Q4_0 elements
    let q8 = [0u8; 3 * 34 * 2]; // 3 rows of 64 Q8_0 elements
    let w = |ty, rows, k, data| WeightMatrix { ty, rows, k, data };
    let x = vec![0f32; 2 * 64];
    let mut y = vec![0f32; 2 * 5];
    let mut call = |x: &[f32], m, ws: &[WeightMatrix], y: &mut [f32]| {
        matmul(&pool, &opts, x, m, ws, y, &mut scratch)
    };

    let ok = [
        w(GgmlType::Q4_0, 2, 64, &q4[..]),
        w(GgmlType::Q8_0, 3, 64, &q8[..]),
    ];
    assert_eq!(call(&x, 2, &ok, &mut y), Ok(()));
    assert_eq!(
        call(&x[1..], 2, &ok, &mut y),
        Err(MatmulError::XLength {
            m: 2,
            k: 64,
            expected: 128,
            actual: 127
        })
    );
    assert_eq!(
        call(&x, 2, &ok, &mut y[1..]),
        Err(MatmulError::YLength {
            m: 2,
            cols: 5,
            expected: 10,
            actual: 9
        })
    );
    let k_mismatch = [
        w(GgmlType::Q4_0, 2, 64, &q4[..]),
        w(GgmlType::Q8_0, 6, 32, &q8[..]),
    ];
    assert_eq!(
        call(&x, 2, &k_mismatch, &mut y),
        Err(MatmulError::KMismatch {
            index: 1,
            k: 32,
            expected: 64
        })
    );
    let partial = [w(GgmlType::Q4_0, 1, 48, &q4[..27])];
    assert!(matches!(
        call(&x[..96], 2, &partial, &mut y[..2]),
        Err(MatmulError::PartialBlock {
            index: 0,
            block: 32,
            ..
        })
    ));
    let short = [w(GgmlType::Q4_0, 2, 64, &q4[..71])];
    assert_eq!(
        call(&x, 2, &short, &mut y[..4]),
        Err(MatmulError::WeightBytes {
            index: 0,
            ty: GgmlType::Q4_0,
            rows: 2,
            k: 64,
            expected: 72,
            actual: 71
        })
    );
    let huge = [w(GgmlType::F32, usize::MAX / 2, 64, &q4[..])];
    assert!(matches!(
        call(&x, 2, &huge, &mut y),
        Err(MatmulError::Overflow { .. })
    ));
    // Nothing to do is not an error.
    assert_eq!(call(&[], 0, &ok, &mut []), Ok(()));
    assert_eq!(call(&x, 2, &[], &mut []), Ok(()));

    let err = call(&x[1..], 2, &ok, &mut y).unwrap_err().to_string();
    assert!(err.contains("127") && err.contains("128"), "{err}");
}

#[test]
fn isa_beyond_the_cpu_is_an_error() {
    let pool = ThreadPool::new(1);
    let mut scratch = MatmulScratch::default();
    let best = Isa::detect();
    let Some(&beyond) = [Isa::Avx2, Isa::Avx512].iter().find(|&&i| i > best) else {
        return; // This CPU runs every level.
    };
    let opts = MatmulOptions {
        precision: Precision::Exact,
        isa: beyond,
        batch_invariant: false,
        rows: rlx_runtime::cpu::matmul::RowChoice::WIDEST,
    };
    let data = vec![0u8; 4 * 8];
    let w = [WeightMatrix {
        ty: GgmlType::F32,
        rows: 1,
        k: 8,
        data: &data,
    }];
    let mut y = [0f32];
    assert_eq!(
        matmul(&pool, &opts, &[0.0; 8], 1, &w, &mut y, &mut scratch),
        Err(MatmulError::IsaUnsupported {
            requested: beyond,
            available: best
        })
    );
}
