//! `rlx chat`: an interactive conversation. The KV cache is kept between
//! turns: each turn re-renders the conversation and runs only the tokens
//! after the prefix the cache already holds.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use rlx_gemma::generate::{generate_constrained, Generation, GenerationOptions, Piece};
use rlx_gemma::{ModelError, SessionOptions};
use rlx_tokenizer::{ChatMessage, ChatOptions, Tokenizer};

use super::common::{chat_template, tuning_note, ModelArgs, TemplateArgs};
use super::sample_args::{draft_session, SampleArgs};

#[derive(clap::Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub template: TemplateArgs,
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    /// Context length in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
}

const HELP: &str =
    "commands: /reset (new conversation), /system TEXT (set the system message and reset), \
/save FILE (write the conversation as JSON), /help, /quit; Ctrl-C stops a reply";

pub fn run(args: &ChatArgs) -> Result<()> {
    let chosen = args.template.chosen()?;
    let chosen_given = chosen.is_some();
    let model = args.model.load_for(Some(args.ctx))?;
    let tok = Tokenizer::from_gguf(model.file())?;
    let template = chat_template(chosen, model.file())?;
    let mut session = model.session(SessionOptions {
        context: Some(args.ctx),
        kv_types: args.model.kv_types(&model),
        ..SessionOptions::default()
    })?;
    // A draft model's session follows the conversation's as drafts need it.
    let draft = args.sample.draft_model(&args.model, &tok, Some(args.ctx))?;
    let mut draft_session = draft_session(draft.as_ref(), Some(args.ctx), &args.model)?;
    // Ctrl-C during a reply stops the reply; at the prompt it ends the program.
    let generating = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (g, i) = (Arc::clone(&generating), Arc::clone(&interrupted));
        ctrlc::set_handler(move || {
            if g.load(Ordering::SeqCst) {
                i.store(true, Ordering::SeqCst);
            } else {
                std::process::exit(130);
            }
        })
        .context("cannot install the Ctrl-C handler")?;
    }
    let mut system = args.system.clone();
    let mut history: Vec<ChatMessage> = Vec::new();
    let mut err = std::io::stderr();
    if let Some(note) = tuning_note(model.file(), &args.model.model, &template, chosen_given) {
        writeln!(err, "{note}")?;
    }
    writeln!(err, "rlx chat — {HELP}")?;
    let stdin = std::io::stdin();
    loop {
        write!(err, "> ")?;
        err.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(cmd) = line.strip_prefix('/') {
            let (name, rest) = cmd.split_once(' ').unwrap_or((cmd, ""));
            match name {
                "quit" | "exit" => break,
                "help" => writeln!(err, "{HELP}")?,
                "reset" => {
                    history.clear();
                    session.reset();
                    writeln!(err, "(new conversation)")?;
                }
                "system" => {
                    system = (!rest.trim().is_empty()).then(|| rest.trim().to_owned());
                    history.clear();
                    session.reset();
                    writeln!(err, "(system message set; new conversation)")?;
                }
                "save" => {
                    let msgs: Vec<_> = system
                        .iter()
                        .map(|s| serde_json::json!({"role": "system", "content": s}))
                        .chain(
                            history
                                .iter()
                                .map(|m| serde_json::json!({"role": m.role, "content": m.content})),
                        )
                        .collect();
                    std::fs::write(rest.trim(), serde_json::to_string_pretty(&msgs)?)
                        .with_context(|| format!("cannot write {}", rest.trim()))?;
                    writeln!(err, "(saved {} messages to {})", msgs.len(), rest.trim())?;
                }
                other => writeln!(err, "unknown command /{other}; {HELP}")?,
            }
            continue;
        }
        history.push(ChatMessage::user(line.to_owned()));
        let mut messages: Vec<ChatMessage> = system
            .iter()
            .map(|s| ChatMessage::system(s.clone()))
            .collect();
        messages.extend(history.iter().cloned());
        let rendered = template.render(
            &messages,
            &ChatOptions {
                add_generation_prompt: true,
                enable_thinking: None,
            },
        )?;
        let ids = tok.encode_chat(&rendered);
        let opts = GenerationOptions {
            max_tokens: args.sample.n,
            stop_tokens: tok.eog_ids().to_vec(),
            stop_strings: args.sample.stop.clone(),
            logprobs: None,
            speculation: args.sample.speculation(
                args.model.batch_invariant,
                model.device() != rlx_gemma::Device::Cpu,
            )?,
        };
        let mut generation = Generation::new(args.sample.sampler()?, &ids, opts);
        let mut reply = String::new();
        let mut out = std::io::stdout().lock();
        interrupted.store(false, Ordering::SeqCst);
        generating.store(true, Ordering::SeqCst);
        let result = generate_constrained(
            &mut session,
            draft_session.as_mut(),
            &ids,
            &mut generation,
            None,
            Some(&tok),
            &mut |piece| {
                let (Piece::Text(piece) | Piece::Token { text: piece, .. }) = piece;
                reply.push_str(&piece);
                let _ = out.write_all(piece.as_bytes());
                let _ = out.flush();
                !interrupted.load(Ordering::SeqCst)
            },
            &mut |_, _| {},
        );
        generating.store(false, Ordering::SeqCst);
        writeln!(out)?;
        match result {
            Ok((_, _, stats)) => {
                writeln!(
                    err,
                    "[prompt {} tokens, {} run ({} reused from the cache), {} generated, {:.1} t/s]",
                    ids.len(),
                    stats.prefilled,
                    ids.len() - stats.prefilled,
                    stats.generated,
                    stats.generated as f64 / stats.decode_secs.max(1e-9)
                )?;
                if stats.drafted > 0 {
                    writeln!(
                        err,
                        "[speculation: {} of {} drafted tokens kept]",
                        stats.accepted, stats.drafted
                    )?;
                }
                history.push(ChatMessage::assistant(reply.trim().to_owned()));
            }
            Err(ModelError::ContextFull { tokens, context }) => {
                history.pop();
                writeln!(
                    err,
                    "context is full ({tokens} of {context} tokens); /reset to start over or use a larger -c"
                )?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
