//! `rlx generate`: continue a token sequence.

use std::io::Write;

use anyhow::{Context, Result};
use rlx_gemma::generate::generate;
use rlx_gemma::sampling::{Sampler, SamplerConfig};
use rlx_gemma::SessionOptions;
use serde_json::json;

use super::common::{parse_tokens, ModelArgs};

#[derive(clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated prompt token ids (BOS included if wanted).
    #[arg(long)]
    pub tokens: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 32)]
    pub n: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep going past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print `{"tokens": [...]}`.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    let prompt = parse_tokens(&args.tokens)?;
    let model = args.model.load()?;
    let mut session = model.session(SessionOptions {
        context: Some(prompt.len() + args.n),
        kv_types: args.model.kv_types(&model),
        ..SessionOptions::default()
    })?;
    let cfg = SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed: args.seed,
        ..SamplerConfig::default()
    };
    let sampler = Sampler::new(cfg).context("bad sampling options")?;
    let stops = if args.ignore_eos {
        Vec::new()
    } else {
        eog_tokens(model.file())
    };
    let (tokens, _, _) = generate(&mut session, &prompt, args.n, sampler, &stops)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &json!({ "tokens": tokens }))?;
        writeln!(out)?;
    } else {
        let ids: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
        writeln!(out, "{}", ids.join(","))?;
    }
    Ok(())
}

/// End-of-generation ids: EOS and, when present, the end-of-turn token.
pub fn eog_tokens(file: &rlx_gguf::GgufFile) -> Vec<u32> {
    let mut ids = Vec::new();
    if let Ok(eos) = file.get_u64("tokenizer.ggml.eos_token_id") {
        ids.push(eos as u32);
    }
    if let Ok(eot) = file.get_u64("tokenizer.ggml.eot_token_id") {
        ids.push(eot as u32);
    }
    if let Some(tokens) = file
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .and_then(|a| a.as_strings())
    {
        for name in ["<end_of_turn>", "<turn|>"] {
            if let Some(i) = tokens.iter().position(|t| t == name) {
                ids.push(i as u32);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}
