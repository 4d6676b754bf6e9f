//! A GGUF with the tensors and metadata of a model (a GGUF, or a checkpoint
//! directory such as `scripts/make-shaped-checkpoint.py` writes, whose
//! shards may be holes) and random weights, in llama-quantize's type mix
//! for a file type: benchmark files of a released model's shapes without
//! its weights, which both rlx and llama.cpp load.
//!
//! ```sh
//! random_weights /tmp/26b /tmp/26b-Q4_K_M.gguf --type Q4_K_M [--seed 1] [-t 16]
//! ```
//!
//! Matrices get N(0, 1/k) for rows of k (activations keep their scale
//! through a layer), vectors (norms, scales) U(0.5, 1.5). The values depend
//! on the seed and the tensor, not on the thread count.

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use rlx_gemma::model::open_file;
use rlx_gemma::quantize::{encode_f32, plan, write_planned, FileType, QuantizeOptions};

struct Args {
    input: PathBuf,
    output: PathBuf,
    file_type: FileType,
    seed: u64,
    threads: usize,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut pos = Vec::new();
    let mut file_type = None;
    let (mut seed, mut threads) = (1u64, 0usize);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--type" => {
                let v = value()?;
                file_type = Some(FileType::from_name(&v).ok_or(format!("unknown --type {v}"))?)
            }
            "--seed" => seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "-t" | "--threads" => threads = value()?.parse().map_err(|e| format!("-t: {e}"))?,
            _ => pos.push(PathBuf::from(a)),
        }
    }
    let [input, output] = <[PathBuf; 2]>::try_from(pos)
        .map_err(|_| "usage: random_weights IN OUT.gguf --type TYPE [--seed N] [-t N]")?;
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    Ok(Args {
        input,
        output,
        file_type: file_type.ok_or("--type is required (Q4_K_M, Q8_0, BF16, …)")?,
        seed,
        threads,
    })
}

/// SplitMix64: seeds one generator per (tensor, chunk).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [0, 1) from the generator state.
fn uniform(s: &mut u64) -> f64 {
    *s = mix(*s);
    (*s >> 11) as f64 / (1u64 << 53) as f64
}

/// Values of one tensor: chunks of a fixed size, each from its own seed.
fn values(n: usize, k: usize, matrix: bool, seed: u64, threads: usize) -> Vec<f32> {
    const CHUNK: usize = 1 << 20;
    let mut v = vec![0f32; n];
    let scale = 1.0 / (k as f64).sqrt();
    let chunks: Vec<(usize, &mut [f32])> = v.chunks_mut(CHUNK).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [f32])>> = Vec::new();
    let mut it = chunks.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per).collect());
    }
    std::thread::scope(|s| {
        for group in groups {
            s.spawn(move || {
                for (c, out) in group {
                    let mut st = mix(seed ^ mix(c as u64));
                    if matrix {
                        // Box–Muller, two values per pair of uniforms.
                        for pair in out.chunks_mut(2) {
                            let (u1, u2) = (uniform(&mut st).max(1e-300), uniform(&mut st));
                            let r = (-2.0 * u1.ln()).sqrt() * scale;
                            let t = std::f64::consts::TAU * u2;
                            pair[0] = (r * t.cos()) as f32;
                            if let Some(x) = pair.get_mut(1) {
                                *x = (r * t.sin()) as f32;
                            }
                        }
                    } else {
                        for x in out.iter_mut() {
                            *x = (0.5 + uniform(&mut st)) as f32;
                        }
                    }
                }
            });
        }
    });
    v
}

fn run() -> Result<(), String> {
    let a = args()?;
    let file = open_file(&a.input).map_err(|e| format!("{}: {e}", a.input.display()))?;
    let opts = QuantizeOptions {
        file_type: a.file_type,
        pure: false,
        threads: a.threads,
    };
    let plan = plan(&file, &opts).map_err(|e| e.to_string())?;
    let out =
        std::fs::File::create(&a.output).map_err(|e| format!("{}: {e}", a.output.display()))?;
    let total = plan.len();
    write_planned(&file, &plan, &opts, BufWriter::new(out), &mut |i, p| {
        let k = p.dims[0] as usize;
        let n: usize = p.dims.iter().product::<u64>() as usize;
        eprint!("\r{}/{total} {:<48}", i + 1, p.name);
        let v = values(
            n,
            k,
            p.dims.len() > 1,
            mix(a.seed ^ mix(i as u64)),
            a.threads,
        );
        encode_f32(&v, p, a.threads).map_err(|e| {
            rlx_gguf::GgufError::from(rlx_gguf::ErrorKind::Writer(format!("{}: {e}", p.name)))
        })
    })
    .map_err(|e| e.to_string())?;
    eprintln!();
    let bytes = std::fs::metadata(&a.output).map_or(0, |m| m.len());
    eprintln!(
        "{}: {} tensors, {:.2} GiB",
        a.output.display(),
        total,
        bytes as f64 / (1u64 << 30) as f64
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("random_weights: {e}");
            ExitCode::FAILURE
        }
    }
}
