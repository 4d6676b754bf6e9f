//! `rlx score`: logits of every position of a token sequence.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use rlx_gemma::SessionOptions;
use serde_json::json;

use super::common::{parse_tokens, ModelArgs};

#[derive(clap::Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids, e.g. 2,818,5279 (BOS included if wanted).
    #[arg(long)]
    pub tokens: String,
    /// Write float32 logits `[positions, vocab]` to this .npy file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the K best tokens of every position.
    #[arg(long)]
    pub top: Option<usize>,
    /// With --top: print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Tokens per prefill chunk.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
}

pub fn run(args: &ScoreArgs) -> Result<()> {
    if args.out.is_none() && args.top.is_none() {
        bail!("give --out FILE.npy and/or --top K");
    }
    let tokens = parse_tokens(&args.tokens)?;
    let model = args.model.load()?;
    let vocab = model.config().n_vocab;
    let mut session = model.session(SessionOptions {
        context: Some(tokens.len().max(1)),
        prefill_chunk: args.chunk,
        kv_types: args.model.kv_types(&model),
        ..SessionOptions::default()
    })?;
    let logits = session.score(&tokens)?;
    if let Some(path) = &args.out {
        write_npy(path, &logits, &[tokens.len(), vocab])?;
    }
    if let Some(k) = args.top {
        let rows: Vec<Vec<(usize, f32)>> = logits.chunks(vocab).map(|row| top_k(row, k)).collect();
        let mut out = std::io::stdout().lock();
        if args.json {
            let positions: Vec<_> = rows
                .iter()
                .map(|r| {
                    json!(r
                        .iter()
                        .map(|(t, l)| json!({"token": t, "logit": l}))
                        .collect::<Vec<_>>())
                })
                .collect();
            serde_json::to_writer(&mut out, &json!({"tokens": tokens, "top": positions}))?;
            writeln!(out)?;
        } else {
            for (i, r) in rows.iter().enumerate() {
                let items: Vec<String> = r.iter().map(|(t, l)| format!("{t}:{l:.4}")).collect();
                writeln!(out, "{i}\t{}\t{}", tokens[i], items.join(" "))?;
            }
        }
    }
    Ok(())
}

/// The `k` largest logits, best first (ties to the lower id).
pub fn top_k(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    idx.into_iter().take(k).map(|i| (i, row[i])).collect()
}

/// Writes a little-endian float32 C-order .npy file (format version 1.0).
pub fn write_npy(path: &std::path::Path, data: &[f32], shape: &[usize]) -> Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Magic (6) + version (2) + length (2) + header + newline, padded to 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.div_ceil(64) * 64 - total));
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len() * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes)?;
    Ok(())
}
