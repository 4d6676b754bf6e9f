//! Throughput of the hot CPU kernels: `cargo bench -p rlx-runtime --bench kernels`
//! (a filter after `--` picks benches, e.g. `-- matvec`).
//!
//! Counters: `BytesCount` is the memory a call must read (the weight bytes of
//! a matvec, K and V of a decode step), so bytes/s reads as achieved
//! bandwidth. For compute-bound benches `ItemsCount` counts FLOPs (multiply
//! and add counted apart, so 2·m·n·k for a matmul): divan's items/s there
//! reads as FLOP/s. For the norm and GELU benches items are elements.
//! `memory_read` is the matvecs' peer: plain reads of the same amount of
//! memory, the bandwidth a memory-bound matvec could reach.
//!
//! The default run takes under a minute on 2 cores; `--sample-count N`
//! overrides the groups' small sample counts for steadier figures.
//! Weights are valid GGUF blocks: random rows packed by rlx-gguf's reference
//! quantizers (F32 and F16 written directly).

use std::hint::black_box;

use divan::counter::{BytesCount, ItemsCount};
use divan::Bencher;
use rlx_gguf::GgmlType;
use rlx_ir::Mask;
use rlx_runtime::cpu::features::Isa;
use rlx_runtime::cpu::kernels::{attention, elementwise, norm};
use rlx_runtime::cpu::kv::RowsView;
use rlx_runtime::cpu::matmul::{matmul, MatmulOptions, MatmulScratch, Precision, WeightMatrix};
use rlx_runtime::cpu::pool::{split_range, ThreadPool};

fn main() {
    divan::main();
}

/// splitmix64: small, seedable, good enough for benchmark data.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `n` values uniform in [-1, 1).
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }
}

/// Distinct random rows per matrix; the rest repeat them. The values don't
/// change a kernel's speed, and quantizing every row of a large matrix with
/// the scalar reference quantizers would take longer than the benches.
const DISTINCT_ROWS: usize = 256;

/// `rows × k` weights of type `ty` in GGUF row-major blocks.
fn packed_weights(ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let distinct = rows.min(DISTINCT_ROWS);
    let values = Rng(0x5EED ^ ty as u64).vec(distinct * k);
    let block: Vec<u8> = match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => rlx_gguf::quantize_to_vec(ty, &values).expect("quantize benchmark rows"),
    };
    let row_bytes = block.len() / distinct;
    let mut out = Vec::with_capacity(rows * row_bytes);
    while out.len() < rows * row_bytes {
        let take = block.len().min(rows * row_bytes - out.len());
        out.extend_from_slice(&block[..take]);
    }
    out
}

fn all_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn options(precision: Precision) -> MatmulOptions {
    MatmulOptions {
        precision,
        isa: Isa::detect(),
        batch_invariant: false,
        rows: rlx_runtime::cpu::matmul::RowChoice::WIDEST,
    }
}

/// Size of the last-level cache from sysfs (260 MiB on the 2-core dev VM), or
/// 256 MiB where it can't be read.
fn last_level_cache_bytes() -> usize {
    let fallback = 256 << 20;
    let Ok(text) = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size") else {
        return fallback;
    };
    let text = text.trim();
    let (digits, unit) = match text.strip_suffix('K') {
        Some(d) => (d, 1 << 10),
        None => match text.strip_suffix('M') {
            Some(d) => (d, 1 << 20),
            None => (text, 1),
        },
    };
    digits.parse::<usize>().map_or(fallback, |n| n * unit)
}

/// Matrix-vector products (`m = 1`, decode) on a 16384 × 2048 matrix. Each
/// call reads the next of enough copies to span twice the last-level cache,
/// so the weights come from memory as they do in decode (one matrix is
/// smaller than this machine's 260 MiB L3 for every type).
#[divan::bench_group(sample_count = 30, sample_size = 2)]
mod matvec {
    use super::*;

    const ROWS: usize = 16384;
    const K: usize = 2048;
    const TYPES: [GgmlType; 7] = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
        GgmlType::F32,
    ];

    fn run(bencher: Bencher, ty: GgmlType, precision: Precision, threads: usize) {
        let matrix = packed_weights(ty, ROWS, K);
        let matrix_bytes = matrix.len();
        let copies = (2 * last_level_cache_bytes()).div_ceil(matrix_bytes).max(2);
        let all = matrix.repeat(copies);
        drop(matrix);
        let weights: Vec<[WeightMatrix; 1]> = all
            .chunks_exact(matrix_bytes)
            .map(|data| {
                [WeightMatrix {
                    ty,
                    rows: ROWS,
                    k: K,
                    data,
                }]
            })
            .collect();
        let x = Rng(1).vec(K);
        let mut y = vec![0f32; ROWS];
        let pool = ThreadPool::new(threads);
        let opts = options(precision);
        let mut scratch = MatmulScratch::default();
        let mut next = 0;
        bencher
            .counter(BytesCount::new(matrix_bytes))
            .bench_local(|| {
                matmul(&pool, &opts, &x, 1, &weights[next], &mut y, &mut scratch).expect("matvec");
                next = (next + 1) % weights.len();
                black_box(&mut y);
            });
    }

    #[divan::bench(args = TYPES)]
    fn exact_1_thread(bencher: Bencher, ty: GgmlType) {
        run(bencher, ty, Precision::Exact, 1);
    }

    #[divan::bench(args = TYPES)]
    fn exact_all_threads(bencher: Bencher, ty: GgmlType) {
        run(bencher, ty, Precision::Exact, all_threads());
    }

    #[divan::bench(args = TYPES)]
    fn quantized_1_thread(bencher: Bencher, ty: GgmlType) {
        run(bencher, ty, Precision::Quantized, 1);
    }

    #[divan::bench(args = TYPES)]
    fn quantized_all_threads(bencher: Bencher, ty: GgmlType) {
        run(bencher, ty, Precision::Quantized, all_threads());
    }
}

/// Plain reads from memory, the matvec figures' roofline: each call sums
/// the next 64 MiB of a buffer twice the last-level cache, split over the
/// pool as a matvec is. A matvec's bytes/s over this one's, same thread
/// count, is the fraction of the read bandwidth it reaches.
#[divan::bench_group(sample_count = 30, sample_size = 2)]
mod memory_read {
    use super::*;

    const CHUNK_WORDS: usize = (64 << 20) / std::mem::size_of::<u64>();

    /// Wrapping sum in 8 lanes, so it compiles to wide vector adds.
    fn sum_words(words: &[u64]) -> u64 {
        let mut lanes = [0u64; 8];
        for c in words.chunks_exact(8) {
            for (l, &w) in lanes.iter_mut().zip(c) {
                *l = l.wrapping_add(w);
            }
        }
        lanes.iter().fold(0, |a, &l| a.wrapping_add(l))
    }

    fn run(bencher: Bencher, threads: usize) {
        let words = (2 * last_level_cache_bytes() / std::mem::size_of::<u64>())
            .next_multiple_of(CHUNK_WORDS);
        let buf: Vec<u64> = (0..words as u64).collect();
        let chunks: Vec<&[u64]> = buf.chunks_exact(CHUNK_WORDS).collect();
        let pool = ThreadPool::new(threads);
        let tasks = if threads == 1 { 1 } else { 4 * threads };
        let mut next = 0;
        bencher
            .counter(BytesCount::of_slice(chunks[0]))
            .bench_local(|| {
                let chunk = chunks[next];
                pool.for_each(tasks, &|t| {
                    let part = &chunk[split_range(chunk.len(), tasks, t)];
                    black_box(sum_words(part));
                });
                next = (next + 1) % chunks.len();
            });
    }

    #[divan::bench]
    fn sum_1_thread(bencher: Bencher) {
        run(bencher, 1);
    }

    #[divan::bench]
    fn sum_all_threads(bencher: Bencher) {
        run(bencher, all_threads());
    }
}

/// Prefill-sized matmuls (`m = 512`) at Gemma 3 270M's FFN shapes, all
/// threads; items are FLOPs (2·m·rows·k). The up/gate shape has k = 640, not
/// a multiple of the K-quants' 256-element block (llama.cpp stores those
/// tensors as 32-element types), so only down runs Q4_K and Q6_K.
#[divan::bench_group(sample_count = 20, sample_size = 1)]
mod matmul_m512 {
    use super::*;

    const M: usize = 512;
    const BLOCK32_TYPES: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0];
    const ALL_TYPES: [GgmlType; 5] = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];

    fn run(bencher: Bencher, ty: GgmlType, precision: Precision, rows: usize, k: usize) {
        let data = packed_weights(ty, rows, k);
        let weights = [WeightMatrix {
            ty,
            rows,
            k,
            data: &data,
        }];
        let x = Rng(2).vec(M * k);
        let mut y = vec![0f32; M * rows];
        let pool = ThreadPool::new(all_threads());
        let opts = options(precision);
        let mut scratch = MatmulScratch::default();
        bencher
            .counter(ItemsCount::new(2 * M * rows * k))
            .bench_local(|| {
                matmul(&pool, &opts, &x, M, &weights, &mut y, &mut scratch).expect("matmul");
                black_box(&mut y);
            });
    }

    /// `[512, 640] · [2048, 640]ᵀ` (gate or up).
    #[divan::bench(args = BLOCK32_TYPES)]
    fn up_2048x640_exact(bencher: Bencher, ty: GgmlType) {
        run(bencher, ty, Precision::Exact, 2048, 640);
    }

    #[divan::bench(args = BLOCK32_TYPES)]
    fn up_2048x640_quantized(bencher: Bencher, ty: GgmlType) {
        run(bencher, ty, Precision::Quantized, 2048, 640);
    }

    /// `[512, 2048] · [640, 2048]ᵀ` (down).
    #[divan::bench(args = ALL_TYPES)]
    fn down_640x2048_exact(bencher: Bencher, ty: GgmlType) {
        run(bencher, ty, Precision::Exact, 640, 2048);
    }

    #[divan::bench(args = ALL_TYPES)]
    fn down_640x2048_quantized(bencher: Bencher, ty: GgmlType) {
        run(bencher, ty, Precision::Quantized, 640, 2048);
    }
}

/// Attention with Gemma 3 270M's heads (4 query heads sharing 1 KV head,
/// head_dim 256), causal, f32 K/V, all threads. Items are FLOPs of the two
/// products (q·k and the weighted sum of v: 4·head_dim per visible
/// query-key pair and head; the softmax is not counted).
#[divan::bench_group(sample_count = 20, sample_size = 1)]
mod attention_f32 {
    use super::*;

    const HEADS: usize = 4;
    const KV_HEADS: usize = 1;
    const HEAD_DIM: usize = 256;

    /// `queries` queries at the last positions of `rows` cached rows.
    fn run(bencher: Bencher, queries: usize, rows: usize) {
        run_typed(bencher, queries, rows, false)
    }

    /// As [`run`], the cache in f16 when `half` (what `q8` keeps).
    fn run_typed(bencher: Bencher, queries: usize, rows: usize, half: bool) {
        let mut rng = Rng(3);
        let q = rng.vec(queries * HEADS * HEAD_DIM);
        let k = rng.vec(rows * KV_HEADS * HEAD_DIM);
        let v = rng.vec(rows * KV_HEADS * HEAD_DIM);
        let k16: Vec<half::f16> = k.iter().map(|&x| half::f16::from_f32(x)).collect();
        let v16: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
        let kpos: Vec<i64> = (0..rows as i64).collect();
        let kspan = vec![0i32; rows];
        let qpos: Vec<i64> = ((rows - queries) as i64..rows as i64).collect();
        let (kview, vview) = if half {
            (RowsView::F16(&k16), RowsView::F16(&v16))
        } else {
            (RowsView::F32(&k), RowsView::F32(&v))
        };
        let elem = if half { 2 } else { 4 };
        let kv = attention::KvRows {
            k: kview,
            v: vview,
            pos: &kpos,
            span: &kspan,
            kv_heads: KV_HEADS,
            head_dim: HEAD_DIM,
            v_head_dim: HEAD_DIM,
        };
        let qs = attention::Queries {
            q: &q,
            pos: &qpos,
            span: None,
            heads: HEADS,
        };
        let params = attention::Params {
            mask: Mask::Causal,
            scale: 1.0 / (HEAD_DIM as f32).sqrt(),
            softcap: None,
            split_keys: true,
        };
        // Query i sees rows 0..=rows - queries + i.
        let visible_pairs: usize = (0..queries).map(|i| rows - queries + i + 1).sum();
        let flops = HEADS * visible_pairs * 4 * HEAD_DIM;
        let kv_bytes = 2 * rows * KV_HEADS * HEAD_DIM * elem;
        let pool = ThreadPool::new(all_threads());
        let isa = Isa::detect();
        let mut out = vec![0f32; queries * HEADS * HEAD_DIM];
        let mut bencher = bencher.counter(ItemsCount::new(flops));
        if queries == 1 {
            // A decode step reads all of K and V once; prefill reuses them.
            bencher = bencher.counter(BytesCount::new(kv_bytes));
        }
        bencher.bench_local(|| {
            attention::attention(
                &pool,
                isa,
                params,
                &qs,
                &kv,
                &attention::Segment::all(queries),
                &mut out,
            );
            black_box(&mut out);
        });
    }

    /// 512 queries against themselves.
    #[divan::bench]
    fn prefill_512(bencher: Bencher) {
        run(bencher, 512, 512);
    }

    /// One query against `rows` cached rows.
    #[divan::bench(args = [1024, 4096])]
    fn decode(bencher: Bencher, rows: usize) {
        run(bencher, 1, rows);
    }

    /// One query against `rows` cached rows in f16 (512: a full sliding
    /// window of Gemma 3 270M).
    #[divan::bench(args = [512, 1024, 4096])]
    fn decode_f16(bencher: Bencher, rows: usize) {
        run_typed(bencher, 1, rows, true);
    }
}

/// Single-threaded elementwise kernels over one prefill chunk; items are
/// elements, bytes are what is read and written.
mod elementwise_f32 {
    use super::*;

    const TOKENS: usize = 512;
    const HIDDEN: usize = 640;
    const FFN: usize = 2048;
    const F32_BYTES: usize = std::mem::size_of::<f32>();

    /// RMSNorm of `[512, 640]` with a gain.
    #[divan::bench]
    fn rms_norm_512x640(bencher: Bencher) {
        let mut rng = Rng(4);
        let x = rng.vec(TOKENS * HIDDEN);
        let gamma = rng.vec(HIDDEN);
        let mut out = vec![0f32; x.len()];
        bencher
            .counter(ItemsCount::new(x.len()))
            .counter(BytesCount::new(2 * x.len() * F32_BYTES))
            .bench_local(|| {
                norm::rms_norm(Isa::detect(), &x, HIDDEN, Some(&gamma), 1e-6, &mut out);
                black_box(&mut out);
            });
    }

    /// tanh-GELU of `[512, 2048]`.
    #[divan::bench]
    fn gelu_512x2048(bencher: Bencher) {
        let x = Rng(5).vec(TOKENS * FFN);
        let mut out = vec![0f32; x.len()];
        bencher
            .counter(ItemsCount::new(x.len()))
            .counter(BytesCount::new(2 * x.len() * F32_BYTES))
            .bench_local(|| {
                elementwise::gelu(Isa::detect(), &x, &mut out);
                black_box(&mut out);
            });
    }

    /// `gelu(gate) · up` over `[512, 2048]`.
    #[divan::bench]
    fn geglu_512x2048(bencher: Bencher) {
        let mut rng = Rng(6);
        let gate = rng.vec(TOKENS * FFN);
        let up = rng.vec(TOKENS * FFN);
        let mut out = vec![0f32; gate.len()];
        bencher
            .counter(ItemsCount::new(gate.len()))
            .counter(BytesCount::new(3 * gate.len() * F32_BYTES))
            .bench_local(|| {
                elementwise::geglu(Isa::detect(), &gate, &up, &mut out);
                black_box(&mut out);
            });
    }
}
