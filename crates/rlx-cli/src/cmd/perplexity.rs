//! `rlx perplexity`: llama-perplexity's method, so figures compare directly:
//! chunks of `c` tokens, BOS in place of each chunk's first token, and the
//! second half of every chunk scored.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rlx_gemma::SessionOptions;
use rlx_tokenizer::{EncodeOptions, Tokenizer};

use super::common::ModelArgs;

#[derive(clap::Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
}

/// −log softmax(logits)[tok], in f64 as llama.cpp does.
fn nll(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    -(logits[tok] as f64 - max - sum.ln())
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    let n_ctx = args.ctx;
    if n_ctx < 4 {
        bail!("-c must be at least 4");
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let model = args.model.load()?;
    let tok = Tokenizer::from_gguf(model.file())?;
    let tokens = tok.encode(&text, EncodeOptions::default());
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} tokenizes to {} tokens; a context of {n_ctx} needs at least {}",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let n_chunk = (tokens.len() / n_ctx).min(args.chunks.unwrap_or(usize::MAX));
    let vocab = model.config().n_vocab;
    let mut session = model.session(SessionOptions {
        context: Some(n_ctx),
        prefill_chunk: n_ctx,
        kv_types: args.model.kv_types(&model),
        ..SessionOptions::default()
    })?;
    let first = n_ctx / 2;
    let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
    let mut err = std::io::stderr().lock();
    for i in 0..n_chunk {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let mut input = chunk.to_vec();
        if let (true, Some(bos)) = (tok.add_bos(), tok.bos_id()) {
            input[0] = bos;
        }
        session.reset();
        let logits = session.score(&input)?;
        for j in first..n_ctx - 1 {
            let v = nll(&logits[j * vocab..(j + 1) * vocab], chunk[j + 1] as usize);
            sum += v;
            sum2 += v * v;
        }
        count += n_ctx - 1 - first;
        write!(err, "[{}]{:.4},", i + 1, (sum / count as f64).exp())?;
        err.flush()?;
    }
    writeln!(err)?;
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let stderr_ppl = if var > 0.0 {
        (var / (count as f64 - 1.0)).sqrt() * ppl
    } else {
        0.0
    };
    println!("Final estimate: PPL = {ppl:.4} +/- {stderr_ppl:.5}");
    Ok(())
}
