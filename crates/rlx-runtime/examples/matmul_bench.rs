//! Weight-read throughput of `cpu::matmul` on Gemma 3 270M shapes.
//!
//! `cargo run --release -p rlx-runtime --example matmul_bench [-- FILTER [M]]`
//! prints GB/s of packed weight bytes for every (shape, threads, precision);
//! FILTER keeps shapes whose name contains it, M (default 1) is the number of
//! activation rows; with M > 1 it prints GFLOP/s (2·M·rows·k per call) instead,
//! since prefill is compute-bound.

use std::time::{Duration, Instant};

use rlx_gguf::GgmlType;
use rlx_runtime::cpu::features::Isa;
use rlx_runtime::cpu::matmul::{matmul, MatmulOptions, MatmulScratch, Precision, WeightMatrix};
use rlx_runtime::cpu::pool::ThreadPool;

/// xorshift64*: the bench needs bytes, not quality.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Random blocks with every f16 scale field small and finite.
fn weights(ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (rows * k) as u64);
    let n = rows * k / ty.block_elems() * ty.block_bytes();
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        out.extend(rng.next().to_le_bytes());
    }
    out.truncate(n);
    let fields: &[usize] = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    };
    for (i, b) in out.chunks_exact_mut(ty.block_bytes()).enumerate() {
        for &off in fields {
            let v = half::f16::from_f32(0.001 + 0.0001 * (i % 13) as f32);
            b[off..off + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Best seconds per call over several short batches: the machine is shared.
fn best_time(call: &mut dyn FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let (mut n, t0) = (0u32, Instant::now());
        while n < 2 || t0.elapsed() < Duration::from_millis(40) {
            call();
            n += 1;
        }
        best = best.min(t0.elapsed().as_secs_f64() / f64::from(n));
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.first().cloned().unwrap_or_default();
    let m: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let shapes = [
        ("q8_0 262144x640 (lm head)", GgmlType::Q8_0, 262_144, 640),
        ("q5_0 2048x640", GgmlType::Q5_0, 2048, 640),
        ("q5_0 640x2048", GgmlType::Q5_0, 640, 2048),
        ("q4_k 640x1024", GgmlType::Q4_K, 640, 1024),
        ("q6_k 640x2048", GgmlType::Q6_K, 640, 2048),
        ("q4_0 2048x640", GgmlType::Q4_0, 2048, 640),
        ("q8_0 2048x640", GgmlType::Q8_0, 2048, 640),
    ];
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let unit = if m > 1 { "GFLOP/s" } else { "GB/s" };
    println!("m = {m}, isa = {}, {unit}", Isa::detect());
    println!(
        "{:<28} {:>4} {:>10} {:>10}",
        "shape (rows x k)", "thr", "exact", "quant"
    );
    for (name, ty, rows, k) in shapes {
        // A prefill-sized LM head call takes seconds; skip it.
        if !name.contains(filter.as_str()) || (m > 8 && rows > 100_000) {
            continue;
        }
        let data = weights(ty, rows, k);
        let mut rng = Rng(7);
        let x: Vec<f32> = (0..m * k)
            .map(|_| (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect();
        let w = [WeightMatrix {
            ty,
            rows,
            k,
            data: &data,
        }];
        let mut y = vec![0f32; m * rows];
        // What plain reading of the same bytes reaches right now, one thread.
        let words: Vec<u64> = data
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut sink = 0u64;
        let read = best_time(&mut || {
            sink ^= words.iter().fold(0u64, |a, &w| a.wrapping_add(w));
        });
        std::hint::black_box(sink);
        println!(
            "{:<28} {:>4} {:>10.2} (plain read)",
            name,
            1,
            data.len() as f64 / read / 1e9
        );
        for pool in &pools {
            let mut cells = Vec::new();
            for precision in [Precision::Exact, Precision::Quantized] {
                let opts = MatmulOptions {
                    precision,
                    isa: Isa::detect(),
                    batch_invariant: false,
                    rows: rlx_runtime::cpu::matmul::RowChoice::WIDEST,
                };
                let mut scratch = MatmulScratch::default();
                let mut call = || matmul(pool, &opts, &x, m, &w, &mut y, &mut scratch).unwrap();
                call();
                let work = if m > 1 {
                    2.0 * (m * rows * k) as f64
                } else {
                    data.len() as f64
                };
                cells.push(work / best_time(&mut call) / 1e9);
            }
            println!(
                "{:<28} {:>4} {:>10.2} {:>10.2}",
                name,
                pool.threads(),
                cells[0],
                cells[1]
            );
        }
    }
}
