//! `rlx run`: a prompt in, streamed text out.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rlx_gemma::generate::{
    generate_constrained, Constraint, Finish, Generation, GenerationOptions, Piece,
};
use rlx_gemma::SessionOptions;
use rlx_tokenizer::{ChatMessage, ChatOptions, ChatTemplate, EncodeOptions, Tokenizer};
use serde_json::json;

use super::common::ModelArgs;
use super::sample_args::SampleArgs;

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// The prompt (or use -p, -f, or stdin).
    pub prompt: Option<String>,
    #[arg(short = 'p', long = "prompt", conflicts_with = "prompt")]
    pub prompt_flag: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Do not apply the chat template.
    #[arg(long)]
    pub raw: bool,
    /// System message (chat template only).
    #[arg(long)]
    pub system: Option<String>,
    /// Context length in tokens (default: prompt + -n).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<usize>,
    /// Print one JSON object (text, token ids, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// Output a JSON value valid under this JSON schema (a file, or the
    /// schema itself); `{}` or `'{"type": "object"}'` for any object.
    #[arg(long, value_name = "FILE|JSON", conflicts_with_all = ["regex", "grammar"])]
    pub json_schema: Option<String>,
    /// Output text matching this regular expression (whole).
    #[arg(long, value_name = "REGEX", conflicts_with = "grammar")]
    pub regex: Option<String>,
    /// Output text in the language of this Lark grammar file (llguidance's
    /// Lark dialect: rules, tokens as regular expressions, `%json{...}`).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

/// The constraint the flags ask for, if any.
fn spec(args: &RunArgs) -> Result<Option<rlx_guide::Spec>> {
    if let Some(s) = &args.json_schema {
        let text = if std::path::Path::new(s).is_file() {
            std::fs::read_to_string(s).with_context(|| format!("cannot read {s}"))?
        } else {
            s.clone()
        };
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("--json-schema: not a file or JSON: {s}"))?;
        return Ok(Some(rlx_guide::Spec::JsonSchema(v)));
    }
    if let Some(r) = &args.regex {
        return Ok(Some(rlx_guide::Spec::Regex(r.clone())));
    }
    if let Some(f) = &args.grammar {
        let g = std::fs::read_to_string(f)
            .with_context(|| format!("--grammar: cannot read {}", f.display()))?;
        return Ok(Some(rlx_guide::Spec::Lark(g)));
    }
    Ok(None)
}

/// Whether the file carries a chat template (instruction-tuned models do).
pub fn has_chat_template(file: &rlx_gguf::GgufFile) -> bool {
    file.get("tokenizer.chat_template").is_some()
}

/// Prompt tokens: through the chat template for instruction-tuned models,
/// else the raw text with BOS.
pub fn prompt_tokens(
    tok: &Tokenizer,
    file: &rlx_gguf::GgufFile,
    messages: &[ChatMessage],
    raw: bool,
) -> Result<Vec<u32>> {
    if raw || !has_chat_template(file) {
        let text: String = messages
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n\n");
        return Ok(tok.encode(&text, EncodeOptions::default()));
    }
    let template = ChatTemplate::from_gguf(file)?;
    let rendered = template.render(
        messages,
        &ChatOptions {
            add_generation_prompt: true,
            enable_thinking: None,
        },
    )?;
    Ok(tok.encode_chat(&rendered))
}

pub fn run(args: &RunArgs) -> Result<()> {
    let prompt = match (&args.prompt, &args.prompt_flag, &args.file) {
        (Some(p), _, _) | (None, Some(p), _) => p.clone(),
        (None, None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?
        }
        (None, None, None) => {
            if std::io::stdin().is_terminal() {
                bail!("give a prompt: rlx run \"...\", -p, -f FILE, or stdin");
            }
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
    };
    let spec = spec(args)?;
    let t_load = Instant::now();
    let spinner = super::progress::spinner("loading model");
    let model = args.model.load_for(args.ctx)?;
    let tok = std::sync::Arc::new(Tokenizer::from_gguf(model.file())?);
    let mut guide = match &spec {
        Some(spec) => Some(rlx_guide::Vocabulary::new(std::sync::Arc::clone(&tok))?.guide(spec)?),
        None => None,
    };
    let load_secs = t_load.elapsed().as_secs_f64();
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let mut messages = Vec::new();
    if let Some(sys) = &args.system {
        messages.push(ChatMessage::system(sys.clone()));
    }
    messages.push(ChatMessage::user(prompt));
    let ids = prompt_tokens(&tok, model.file(), &messages, args.raw)?;
    let mut session = model.session(SessionOptions {
        context: Some(args.ctx.unwrap_or(ids.len() + args.sample.n)),
        kv_types: args.model.kv_types(&model),
        ..SessionOptions::default()
    })?;
    let opts = GenerationOptions {
        max_tokens: args.sample.n,
        stop_tokens: if args.sample.ignore_eos {
            Vec::new()
        } else {
            tok.eog_ids().to_vec()
        },
        stop_strings: args.sample.stop.clone(),
        logprobs: None,
    };
    let mut generation = Generation::new(args.sample.sampler()?, &ids, opts);
    let mut text = String::new();
    let mut stdout = std::io::stdout().lock();
    let stream = !args.json;
    let bar = super::progress::prefill_bar(ids.len());
    let (tokens, reason, stats) = generate_constrained(
        &mut session,
        &ids,
        &mut generation,
        guide.as_mut().map(|g| g as &mut dyn Constraint),
        Some(&tok),
        &mut |piece| {
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            let (Piece::Text(piece) | Piece::Token { text: piece, .. }) = piece;
            text.push_str(&piece);
            if stream {
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            }
            true
        },
        &mut |done, _| {
            if let Some(b) = &bar {
                b.set_position(done as u64);
            }
        },
    )?;
    // Also when no text came out (an end-of-generation token first).
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let prefill_tps = stats.prefilled as f64 / stats.prefill_secs.max(1e-9);
    let decode_tps = stats.generated.saturating_sub(1) as f64 / stats.decode_secs.max(1e-9);
    if args.json {
        let v = json!({
            "text": text,
            "tokens": tokens,
            "prompt_tokens": ids.len(),
            "stop": match reason { Finish::StopToken => "eog", Finish::Length => "length", Finish::StopString => "stop_string", Finish::Complete => "complete", Finish::Cancelled => "cancelled" },
            "timings": {"load_s": load_secs, "prefill_s": stats.prefill_secs, "decode_s": stats.decode_secs,
                        "prefill_tokens_per_s": prefill_tps, "decode_tokens_per_s": decode_tps},
        });
        serde_json::to_writer(&mut stdout, &v)?;
    }
    writeln!(stdout)?;
    if let Some(g) = &guide {
        let (secs, n) = g.mask_seconds();
        if reason == Finish::Length {
            eprintln!(
                "warning: the output is incomplete: -n {} tokens ran out",
                args.sample.n
            );
        }
        eprintln!(
            "constraint: {n} masks, {:.2} ms each",
            1e3 * secs / n.max(1) as f64
        );
    }
    eprintln!(
        "prompt {} tokens, generated {} tokens | prefill {:.1} t/s, decode {:.1} t/s | load {:.0} ms",
        ids.len(),
        tokens.len(),
        prefill_tps,
        decode_tps,
        load_secs * 1e3
    );
    Ok(())
}
