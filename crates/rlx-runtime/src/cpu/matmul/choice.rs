//! Which instruction set each weight type's decode kernels use. By default
//! the widest the options allow; [`RowChoice::measure`] instead times the
//! 256-bit and 512-bit kernels of each type on this CPU and keeps the
//! faster, because the widest is not the fastest everywhere (Zen 4 issues
//! a 512-bit operation in two halves, and its shuffles and reductions cost
//! differently from Intel's). Every choice gives the same bits: the decode
//! kernels of a type sum in the same order on every instruction set.

use std::time::Instant;

use rlx_gguf::GgmlType;

use super::super::features::Isa;
use super::super::pool::ThreadPool;
use super::{matmul, MatmulOptions, MatmulScratch, Precision, WeightMatrix};

/// The types whose decode kernels differ between AVX2 and AVX-512.
const TYPES: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// A lower instruction set than the options' for some types' decode
/// (one-row and few-row) kernels; the panel and prefill kernels keep the
/// options' own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowChoice {
    lowered: [Option<Isa>; TYPES.len()],
    /// Chosen by [`RowChoice::measure`]'s timings.
    measured: bool,
}

impl RowChoice {
    /// The widest kernels the options allow, for every type.
    pub const WIDEST: RowChoice = RowChoice {
        lowered: [None; TYPES.len()],
        measured: false,
    };

    /// The instruction set `ty`'s decode kernels use where the options
    /// allow `isa`.
    pub fn isa_for(&self, ty: GgmlType, isa: Isa) -> Isa {
        TYPES
            .iter()
            .position(|&t| t == ty)
            .and_then(|i| self.lowered[i])
            .map_or(isa, |low| low.min(isa))
    }

    /// `ty`'s decode kernels at `low` (or the widest again with `None`).
    pub fn with(mut self, ty: GgmlType, low: Option<Isa>) -> Self {
        if let Some(i) = TYPES.iter().position(|&t| t == ty) {
            self.lowered[i] = low;
        }
        self
    }

    /// Each type's lowered choice, for reports: `q8_0 avx2`, …
    pub fn lowered(&self) -> Vec<(GgmlType, Isa)> {
        TYPES
            .iter()
            .zip(self.lowered)
            .filter_map(|(&t, low)| low.map(|l| (t, l)))
            .collect()
    }

    /// Times each type's decode kernels at `isa` and at AVX2 on one thread,
    /// one activation row against 128 rows of 2,048 (in cache: what is
    /// timed is the kernel, not memory), alternating, the best of five
    /// rounds each, and keeps AVX2 where it is at least 3 % faster. Below
    /// AVX-512 there is nothing to choose. About 10 ms.
    pub fn measure(isa: Isa) -> RowChoice {
        let mut choice = Self::WIDEST;
        if isa < Isa::Avx512 || Isa::detect() < Isa::Avx512 {
            return choice;
        }
        choice.measured = true;
        let pool = ThreadPool::new(1);
        let mut scratch = MatmulScratch::default();
        let (rows, k) = (128, 2048);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let x: Vec<f32> = (0..k).map(|_| next()).collect();
        let values: Vec<f32> = (0..rows * k).map(|_| next()).collect();
        let mut y = vec![0f32; rows];
        for &ty in &TYPES {
            let Ok(data) = rlx_gguf::quantize_to_vec(ty, &values) else {
                continue;
            };
            let w = [WeightMatrix {
                ty,
                rows,
                k,
                data: &data,
            }];
            let mut time = |low: Option<Isa>| -> f64 {
                let opts = MatmulOptions {
                    precision: Precision::Quantized,
                    isa,
                    batch_invariant: false,
                    rows: Self::WIDEST.with(ty, low),
                };
                let start = Instant::now();
                for _ in 0..16 {
                    if matmul(&pool, &opts, &x, 1, &w, &mut y, &mut scratch).is_err() {
                        return f64::INFINITY;
                    }
                }
                start.elapsed().as_secs_f64()
            };
            let (mut wide, mut avx2) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..5 {
                wide = wide.min(time(None));
                avx2 = avx2.min(time(Some(Isa::Avx2)));
            }
            if avx2 < 0.97 * wide {
                choice = choice.with(ty, Some(Isa::Avx2));
            }
        }
        choice
    }
}

impl std::fmt::Display for RowChoice {
    /// `widest`, or after timing `measured: widest` or the lowered types,
    /// `measured: q8_0 avx2, q6_k avx2`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.measured {
            f.write_str("measured: ")?;
        }
        let low = self.lowered();
        if low.is_empty() {
            return f.write_str("widest");
        }
        let parts: Vec<String> = low.iter().map(|(t, i)| format!("{t} {i}")).collect();
        f.write_str(&parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `measure` picks on this CPU is a kernel it has, and every
    /// choice it could make gives the widest kernels' bits at decode sizes.
    #[test]
    fn each_choice_is_valid_and_gives_the_same_bits() {
        let isa = Isa::detect();
        let choice = RowChoice::measure(isa);
        for ty in TYPES {
            let got = choice.isa_for(ty, isa);
            assert!(got == isa || got == Isa::Avx2, "{ty}: {got} under {isa}");
        }
        if isa < Isa::Avx512 {
            assert_eq!(choice, RowChoice::WIDEST);
            return;
        }
        assert!(choice.to_string().starts_with("measured: "), "{choice}");
        let pool = ThreadPool::new(2);
        let mut scratch = MatmulScratch::default();
        let (rows, k) = (37, 512);
        let values: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919) % 613) as f32 / 300.0 - 1.0)
            .collect();
        for ty in TYPES {
            let data = rlx_gguf::quantize_to_vec(ty, &values).unwrap();
            let w = [WeightMatrix {
                ty,
                rows,
                k,
                data: &data,
            }];
            for m in [1, 2, 3, 4, 5, 8] {
                let x: Vec<f32> = (0..m * k)
                    .map(|i| ((i * 104_729) % 997) as f32 / 500.0 - 1.0)
                    .collect();
                let run = |rows_choice: RowChoice, scratch: &mut MatmulScratch| {
                    let opts = MatmulOptions {
                        precision: Precision::Quantized,
                        isa,
                        batch_invariant: false,
                        rows: rows_choice,
                    };
                    let mut y = vec![0f32; m * rows];
                    matmul(&pool, &opts, &x, m, &w, &mut y, scratch).unwrap();
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                let wide = run(RowChoice::WIDEST, &mut scratch);
                let low = run(RowChoice::WIDEST.with(ty, Some(Isa::Avx2)), &mut scratch);
                assert_eq!(wide, low, "{ty}, {m} rows: AVX2 and {isa} differ");
            }
        }
    }
}
