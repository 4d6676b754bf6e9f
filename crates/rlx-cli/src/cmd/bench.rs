//! `rlx bench`: prompt-processing and generation speed, reported like
//! llama-bench (mean ± std of tokens/s over repetitions).

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use rlx_gemma::{Model, SessionOptions};
use serde_json::json;

use super::common::ModelArgs;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to time (comma-separated); 0 skips.
    #[arg(
        short = 'p',
        long = "n-prompt",
        default_value = "512",
        value_delimiter = ','
    )]
    pub prompt: Vec<usize>,
    /// Generated lengths to time (comma-separated); 0 skips.
    #[arg(
        short = 'n',
        long = "n-gen",
        default_value = "128",
        value_delimiter = ','
    )]
    pub gen: Vec<usize>,
    /// Tokens already in the context before each test.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub depth: usize,
    /// Repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Print a JSON array instead of a markdown table.
    #[arg(long)]
    pub json: bool,
}

struct Row {
    test: String,
    tps: Vec<f64>,
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Deterministic token ids spread over the vocabulary (BOS first).
fn tokens(model: &Model, n: usize, salt: usize) -> Vec<u32> {
    let vocab = model.config().n_vocab;
    (0..n)
        .map(|i| {
            if i == 0 && salt == 0 {
                2
            } else {
                ((i * 7919 + salt * 104_729) % (vocab - 16) + 16) as u32
            }
        })
        .collect()
}

fn time_one(model: &Model, depth: usize, prompt: usize, gen: usize) -> Result<f64> {
    let mut s = model.session(SessionOptions {
        context: Some(depth + prompt + gen + 1),
        prefill_chunk: prompt.max(512),
        ..Default::default()
    })?;
    if depth > 0 {
        s.feed(&tokens(model, depth, 0))?;
    }
    let start = Instant::now();
    if prompt > 0 {
        s.feed(&tokens(model, prompt, 1 + depth))?;
    } else {
        for t in tokens(model, gen, 2 + depth) {
            s.feed(&[t])?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((prompt + if prompt > 0 { 0 } else { gen }) as f64 / secs)
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("-r must be at least 1");
    }
    let model = args.model.load()?;
    let threads = args
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut rows = Vec::new();
    let suffix = |name: String| {
        if args.depth > 0 {
            format!("{name} @ d{}", args.depth)
        } else {
            name
        }
    };
    for &p in args.prompt.iter().filter(|&&p| p > 0) {
        // One untimed warm-up run, as llama-bench does.
        time_one(&model, args.depth, p, 0)?;
        let tps = (0..args.reps)
            .map(|_| time_one(&model, args.depth, p, 0))
            .collect::<Result<Vec<_>>>()?;
        rows.push(Row {
            test: suffix(format!("pp{p}")),
            tps,
        });
    }
    for &n in args.gen.iter().filter(|&&n| n > 0) {
        time_one(&model, args.depth, 0, n.min(8))?;
        let tps = (0..args.reps)
            .map(|_| time_one(&model, args.depth, 0, n))
            .collect::<Result<Vec<_>>>()?;
        rows.push(Row {
            test: suffix(format!("tg{n}")),
            tps,
        });
    }
    let mut out = std::io::stdout().lock();
    let file_bytes = model.file().file_len();
    let name = args.model.model.display().to_string();
    if args.json {
        let arr: Vec<_> = rows
            .iter()
            .map(|r| {
                let (mean, std) = mean_std(&r.tps);
                json!({
                    "model": name,
                    "test": r.test,
                    "tokens_per_second": mean,
                    "stddev": std,
                    "threads": threads,
                    "repetitions": r.tps.len(),
                    "precision": args.model.precision,
                    "model_bytes": file_bytes,
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &arr)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "| model | size | backend | threads | precision | test | t/s |"
        )?;
        writeln!(out, "| --- | ---: | --- | ---: | --- | ---: | ---: |")?;
        for r in &rows {
            let (mean, std) = mean_std(&r.tps);
            writeln!(
                out,
                "| {name} | {:.2} MiB | CPU | {threads} | {} | {} | {mean:.2} ± {std:.2} |",
                file_bytes as f64 / (1024.0 * 1024.0),
                args.model.precision,
                r.test
            )?;
        }
    }
    Ok(())
}
