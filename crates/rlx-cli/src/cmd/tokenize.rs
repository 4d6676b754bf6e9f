//! `rlx tokenize` and `rlx detokenize`.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rlx_tokenizer::{EncodeOptions, Tokenizer};
use serde_json::json;

use super::common::{parse_tokens, resolve_model};

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// Model: a GGUF path or the name of a cached model.
    #[arg(short = 'm', long = "model", default_value = super::common::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Text to tokenize (default: stdin).
    #[arg(long, conflicts_with = "file")]
    pub text: Option<String>,
    /// Read the text from a file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Print only the ids, comma-separated.
    #[arg(long, conflicts_with = "json")]
    pub ids: bool,
    /// Print ids and pieces as JSON.
    #[arg(long)]
    pub json: bool,
    /// Do not add BOS.
    #[arg(long)]
    pub no_bos: bool,
    /// Parse special-token text such as `<start_of_turn>`.
    #[arg(long)]
    pub special: bool,
    /// Read one JSON string per line on stdin, write one JSON array of ids per line.
    #[arg(long, conflicts_with_all = ["text", "file", "ids", "json"])]
    pub jsonl: bool,
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    #[arg(short = 'm', long = "model", default_value = super::common::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Comma-separated token ids (default: read them from stdin).
    #[arg(long)]
    pub tokens: Option<String>,
    /// Render control tokens such as `<bos>`.
    #[arg(long)]
    pub special: bool,
}

pub fn load_tokenizer(model: &std::path::Path) -> Result<Tokenizer> {
    let path = resolve_model(model)?;
    let file = rlx_gemma::model::open_file(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Tokenizer::from_gguf(&file)
        .with_context(|| format!("no usable tokenizer in {}", path.display()))
}

pub fn run_tokenize(args: &TokenizeArgs) -> Result<()> {
    let tok = load_tokenizer(&args.model)?;
    let opts = EncodeOptions {
        add_bos: !args.no_bos,
        parse_special: args.special,
    };
    let mut out = std::io::stdout().lock();
    if args.jsonl {
        for (i, line) in std::io::stdin().lock().lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let text: String = serde_json::from_str(&line)
                .with_context(|| format!("stdin line {}: expected a JSON string", i + 1))?;
            serde_json::to_writer(&mut out, &tok.encode(&text, opts))?;
            writeln!(out)?;
        }
        return Ok(());
    }
    let bytes = match (&args.text, &args.file) {
        (Some(t), _) => t.clone().into_bytes(),
        (None, Some(f)) => {
            std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?
        }
        (None, None) => {
            let mut b = Vec::new();
            std::io::stdin().read_to_end(&mut b)?;
            b
        }
    };
    let ids = tok.encode_bytes(&bytes, opts);
    if args.ids {
        let s: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        writeln!(out, "{}", s.join(","))?;
    } else if args.json {
        let items: Vec<_> = ids
            .iter()
            .map(|&id| json!({"id": id, "piece": tok.piece(id).unwrap_or("")}))
            .collect();
        serde_json::to_writer(&mut out, &json!({"ids": ids, "tokens": items}))?;
        writeln!(out)?;
    } else {
        for &id in &ids {
            writeln!(out, "{id:>8} -> {:?}", tok.piece(id).unwrap_or(""))?;
        }
    }
    Ok(())
}

pub fn run_detokenize(args: &DetokenizeArgs) -> Result<()> {
    let tok = load_tokenizer(&args.model)?;
    let text = match &args.tokens {
        Some(t) => t.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
    };
    let ids = parse_tokens(text.trim().trim_start_matches('[').trim_end_matches(']'))?;
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= tok.vocab_size()) {
        bail!(
            "token id {bad} is outside the vocabulary of {}",
            tok.vocab_size()
        );
    }
    let mut out = std::io::stdout().lock();
    out.write_all(&tok.decode_bytes(&ids, args.special))?;
    writeln!(out)?;
    Ok(())
}
