//! `rlx run`: a prompt in, streamed text out.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rlx_gemma::generate::{
    generate_constrained, Constraint, Finish, Generation, GenerationOptions, Piece,
};
use rlx_gemma::SessionOptions;
use rlx_tokenizer::{ChatMessage, ChatOptions, ChatTemplate, EncodeOptions, Tokenizer, Tuning};
use serde_json::json;

use super::common::{chat_template, tuning_note, ModelArgs, TemplateArgs};
use super::sample_args::{draft_session, SampleArgs};

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub template: TemplateArgs,
    /// The prompt (or use -p, -f, or stdin).
    pub prompt: Option<String>,
    /// The prompt, as a flag.
    #[arg(short = 'p', long = "prompt", conflicts_with = "prompt")]
    pub prompt_flag: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Do not apply the chat template: the model continues the prompt as
    /// it stands (what a base model does well).
    #[arg(long, conflicts_with = "chat_template")]
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
    /// Let a constrained output run into -n as it stands, instead of
    /// closing it by its shortest valid continuation (closing quotes and
    /// brackets, required keys with their shortest values) when the tokens
    /// left are about to be too few.
    #[arg(long)]
    pub no_close: bool,
    /// Soft limits on JSON values, so a sampled model cannot spend -n on
    /// one value: `digits=15,chars=256,items=32` (the defaults; any subset)
    /// or `off`. A limit gives way where the schema needs more.
    #[arg(long, value_name = "LIMITS", value_parser = parse_limits)]
    pub json_limits: Option<Limits>,
}

/// `--json-limits`: limits, or none.
#[derive(Clone, Debug)]
pub struct Limits(Option<rlx_guide::ValueLimits>);

fn parse_limits(text: &str) -> std::result::Result<Limits, String> {
    if text == "off" {
        return Ok(Limits(None));
    }
    let mut l = rlx_guide::ValueLimits::default();
    for part in text.split(',') {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: expected KEY=N (digits, chars, items) or `off`"))?;
        let n: usize = value
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("`{part}`: the limit must be a positive integer"))?;
        match key {
            "digits" => l.digits = n,
            "chars" => l.string_chars = n,
            "items" => l.array_items = n,
            _ => return Err(format!("`{key}`: expected digits, chars or items")),
        }
    }
    Ok(Limits(Some(l)))
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

/// Prompt tokens: through `template` when there is one, else the raw
/// text with BOS.
pub fn prompt_tokens(
    tok: &Tokenizer,
    template: Option<&ChatTemplate>,
    messages: &[ChatMessage],
) -> Result<Vec<u32>> {
    let Some(template) = template else {
        let text: String = messages
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n\n");
        return Ok(tok.encode(&text, EncodeOptions::default()));
    };
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
    let chosen = args.template.chosen()?;
    let t_load = Instant::now();
    let spinner = super::progress::spinner("loading model");
    let model = args.model.load_for(args.ctx)?;
    let tok = std::sync::Arc::new(Tokenizer::from_gguf(model.file())?);
    let draft = args.sample.draft_model(&args.model, &tok, args.ctx)?;
    let mut guide = match &spec {
        Some(spec) => {
            let opts = rlx_guide::GuideOptions {
                close: !args.no_close,
                limits: match &args.json_limits {
                    Some(Limits(l)) => *l,
                    None => Some(rlx_guide::ValueLimits::default()),
                },
                end_on_repeat: false,
            };
            Some(rlx_guide::Vocabulary::new(std::sync::Arc::clone(&tok))?.guide(spec, &opts)?)
        }
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
    // A base model continues the raw text unless a template is asked for.
    let chosen_given = chosen.is_some();
    let base = Tuning::of(model.file()) == Tuning::Base;
    let template = if args.raw || (base && !chosen_given) {
        None
    } else {
        Some(chat_template(chosen, model.file())?)
    };
    if let Some(t) = &template {
        if let Some(note) = tuning_note(model.file(), &args.model.model, t, chosen_given) {
            eprintln!("{note}");
        }
    }
    let ids = prompt_tokens(&tok, template.as_ref(), &messages)?;
    let context = Some(args.ctx.unwrap_or(ids.len() + args.sample.n));
    let mut session = model.session(SessionOptions {
        context,
        kv_types: args.model.kv_types(&model),
        ..SessionOptions::default()
    })?;
    let mut draft_session = draft_session(draft.as_ref(), context, &args.model)?;
    let opts = GenerationOptions {
        max_tokens: args.sample.n,
        stop_tokens: if args.sample.ignore_eos {
            Vec::new()
        } else {
            tok.eog_ids().to_vec()
        },
        stop_strings: args.sample.stop.clone(),
        logprobs: None,
        speculation: args.sample.speculation(
            args.model.batch_invariant,
            model.device() != rlx_gemma::Device::Cpu,
        )?,
    };
    let mut generation = Generation::new(args.sample.sampler()?, &ids, opts);
    let mut text = String::new();
    let mut stdout = std::io::stdout().lock();
    let stream = !args.json;
    let bar = super::progress::prefill_bar(ids.len());
    let (tokens, reason, stats) = generate_constrained(
        &mut session,
        draft_session.as_mut(),
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
    // Whether the output stops short of its end: the budget ran out, or
    // (under a constraint, whose mask allows the end token only where the
    // output may end) a stop string cut it.
    let cut = match reason {
        Finish::Length | Finish::Cancelled => true,
        Finish::StopString => guide.is_some(),
        Finish::StopToken | Finish::Complete | Finish::Closed => false,
    };
    let prefill_tps = stats.prefilled as f64 / stats.prefill_secs.max(1e-9);
    let decode_tps = stats.generated.saturating_sub(1) as f64 / stats.decode_secs.max(1e-9);
    if args.json {
        let v = json!({
            "text": text,
            "tokens": tokens,
            "prompt_tokens": ids.len(),
            "stop": match reason { Finish::StopToken => "eog", Finish::Length => "length", Finish::StopString => "stop_string", Finish::Complete => "complete", Finish::Closed => "closed", Finish::Cancelled => "cancelled" },
            "finish_reason": match reason { Finish::Length | Finish::Closed => "length", Finish::Cancelled => "cancelled", _ => "stop" },
            "complete": !cut,
            "timings": {"load_s": load_secs, "prefill_s": stats.prefill_secs, "decode_s": stats.decode_secs,
                        "prefill_tokens_per_s": prefill_tps, "decode_tokens_per_s": decode_tps},
            "speculation": {"drafted": stats.drafted, "accepted": stats.accepted, "verify_steps": stats.verify_steps, "masked": stats.masked},
        });
        serde_json::to_writer(&mut stdout, &v)?;
    }
    writeln!(stdout)?;
    if let Some(g) = &guide {
        let (secs, n) = g.mask_seconds();
        eprintln!(
            "constraint: {n} masks, {:.2} ms each",
            1e3 * secs / n.max(1) as f64
        );
        if reason == Finish::Closed {
            eprintln!(
                "note: -n {} was about to run out, so the output was closed early by its shortest valid continuation",
                args.sample.n
            );
        }
    }
    eprintln!(
        "prompt {} tokens, generated {} tokens | prefill {:.1} t/s, decode {:.1} t/s | load {:.0} ms",
        ids.len(),
        tokens.len(),
        prefill_tps,
        decode_tps,
        load_secs * 1e3
    );
    if stats.drafted > 0 {
        eprintln!(
            "speculation: {} of {} drafted tokens kept ({:.0} %) in {} verification steps",
            stats.accepted,
            stats.drafted,
            100.0 * stats.accepted as f64 / stats.drafted as f64,
            stats.verify_steps
        );
    }
    if guide.is_some() && cut {
        bail!(
            "output incomplete: stopped by -n after {} tokens, before the output was valid{}",
            tokens.len(),
            if args.no_close {
                " (without --no-close it would have been closed where it could)"
            } else {
                " (no valid ending fitted in the tokens left)"
            }
        );
    }
    Ok(())
}
