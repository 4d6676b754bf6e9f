//! `rlx`: run Gemma models from GGUF files.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod cmd;
// docs/CLI.md and docs/SERVER.md against the definitions.
#[cfg(test)]
mod docs_check;

#[derive(Parser)]
#[command(name = "rlx", version, about = "Gemma inference from GGUF files")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF file's header, metadata and tensor table.
    #[command(after_help = INFO_EXAMPLES)]
    Info(cmd::info::InfoArgs),
    /// Logits of every position of a token sequence (for parity scripts).
    #[command(after_help = SCORE_EXAMPLES)]
    Score(cmd::score::ScoreArgs),
    /// Continue a token sequence and print the generated ids.
    #[command(after_help = GENERATE_EXAMPLES)]
    Generate(cmd::generate::GenerateArgs),
    /// Prompt-processing and generation speed, like llama-bench.
    #[command(after_help = BENCH_EXAMPLES)]
    Bench(cmd::bench::BenchArgs),
    /// Generate text from a prompt (streamed).
    ///
    /// The chat template wraps the prompt when the model has one (its
    /// file's, or Gemma's built-in one for an instruction-tuned file
    /// without); a base model continues the text as it stands.
    #[command(after_help = RUN_EXAMPLES)]
    Run(cmd::run::RunArgs),
    /// An interactive conversation in the terminal.
    ///
    /// Lines from stdin are turns; /reset, /system TEXT, /save FILE, /help
    /// and /quit are commands. The K/V cache is kept between turns.
    #[command(after_help = CHAT_EXAMPLES)]
    Chat(cmd::chat::ChatArgs),
    /// An OpenAI-compatible HTTP server (chat and text completions, streaming).
    ///
    /// Also Ollama's and Anthropic's APIs and a chat page at `/`;
    /// docs/SERVER.md lists every route and field.
    #[command(after_help = SERVE_EXAMPLES)]
    Serve(cmd::serve::ServeArgs),
    /// List the models found by name: rlx's cache ($RLX_HOME or
    /// ~/.cache/rlx/models), Ollama, LM Studio, the Hugging Face cache.
    #[command(after_help = MODELS_EXAMPLES)]
    Models,
    /// Download a model from Hugging Face into its hub cache, or from
    /// Ollama's registry into Ollama's store.
    ///
    /// `hf.co/ORG/REPO[:QUANT]` or `ORG/REPO[:QUANT]` (a name with a slash)
    /// is a Hugging Face repo: its .gguf whose name has QUANT, Q4_K_M when
    /// none is given, or `ORG/REPO/FILE.gguf` exactly; the repo's image
    /// projector (mmproj) comes with it. It lands in the hub cache
    /// ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub) as
    /// huggingface_hub lays it out. `NAME[:TAG]` (no slash) or
    /// `ollama.com/[USER/]NAME[:TAG]` is Ollama's (tag `latest` when none is
    /// given; a user's model needs `ollama.com/` before it), with every
    /// layer of its manifest, into $OLLAMA_MODELS or ~/.ollama/models as
    /// `ollama pull` lays it out. A cut download continues where it
    /// stopped, also when run again; every file's SHA-256 is checked. `rlx
    /// models` lists it afterwards, and `-m` takes the name printed.
    /// `HF_TOKEN` is sent to Hugging Face; `HF_ENDPOINT` and
    /// `OLLAMA_REGISTRY` change the hubs.
    #[command(after_help = PULL_EXAMPLES)]
    Pull(cmd::pull::PullArgs),
    /// Requantize a GGUF file as llama-quantize does (its type mixes).
    #[command(after_help = QUANTIZE_EXAMPLES)]
    Quantize(cmd::quantize::QuantizeArgs),
    /// Perplexity of a text file, computed as llama-perplexity does.
    #[command(after_help = PERPLEXITY_EXAMPLES)]
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Text to token ids.
    #[command(after_help = TOKENIZE_EXAMPLES)]
    Tokenize(cmd::tokenize::TokenizeArgs),
    /// Token ids to text.
    #[command(after_help = DETOKENIZE_EXAMPLES)]
    Detokenize(cmd::tokenize::DetokenizeArgs),
}

// Each subcommand's help ends with a few commands people run.
const RUN_EXAMPLES: &str = "Examples:
  rlx run --raw \"Once upon a time, in a village by the sea,\" -n 64 --repeat-penalty 1.3
  rlx run -m unsloth/gemma-3-270m-it-GGUF \"Write a haiku about the sea\" --temp 0.7 --seed 1
  rlx run -m unsloth/gemma-3-270m-it-GGUF --json-schema '{\"type\": \"object\"}' \"A cat as JSON\"";

const CHAT_EXAMPLES: &str = "Examples:
  rlx chat -m unsloth/gemma-3-270m-it-GGUF --system \"Answer briefly.\"
  echo \"Name three colours.\" | rlx chat -m unsloth/gemma-3-270m-it-GGUF -n 64
  rlx chat -m ./my-finetune.gguf --chat-template ./my-template.jinja";

const SERVE_EXAMPLES: &str = "Examples:
  rlx serve --port 8080 -c 8192
  curl localhost:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'
  rlx serve -m unsloth/gemma-3-270m-it-GGUF --host 0.0.0.0 --api-key \"$KEY\" --parallel 4";

const BENCH_EXAMPLES: &str = "Examples:
  rlx bench -p 512 -n 128 -r 5 -t 2
  rlx bench --batch 1,4,16 -p 128 -n 64
  rlx bench -m model.gguf --device cuda -p 512,2048 -n 128 --json";

const PERPLEXITY_EXAMPLES: &str = "Examples:
  rlx perplexity -f tests/fixtures/text/ppl.txt -c 128
  rlx perplexity -m model-q4_k_m.gguf -f wiki.test.raw -c 512 --chunks 20";

const QUANTIZE_EXAMPLES: &str = "Examples:
  rlx quantize model-f16.gguf model-q4_k_m.gguf --type Q4_K_M
  rlx quantize ./gemma-3-1b-it/ gemma-3-1b-it-q8_0.gguf --type Q8_0
  rlx quantize model-f16.gguf model-q4_0.gguf --type Q4_0 --pure -t 8";

const MODELS_EXAMPLES: &str = "Examples:
  rlx models
  rlx run -m gemma3:270m \"Hello\"    (a name from the list)";

const PULL_EXAMPLES: &str = "Examples:
  rlx pull hf.co/unsloth/gemma-3-270m-it-GGUF:Q8_0
  rlx pull ggml-org/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q8_0.gguf
  rlx pull gemma3:270m
  rlx run -m ggml-org/gemma-3-1b-it-GGUF --pull \"Hello\"";

const TOKENIZE_EXAMPLES: &str = "Examples:
  rlx tokenize --text \"Hello world\" --ids
  rlx tokenize --text \"<start_of_turn>user\" --special --json
  printf '\"Hello\"\\n\"world\"\\n' | rlx tokenize --jsonl";

const DETOKENIZE_EXAMPLES: &str = "Examples:
  rlx detokenize --tokens 2,9259,1902
  rlx detokenize --tokens 2,105,2364 --special
  rlx tokenize --text \"Hello world\" --ids | rlx detokenize";

const SCORE_EXAMPLES: &str = "Examples:
  rlx score --tokens 2,818,5279 --out logits.npy
  rlx score -m model.gguf --tokens 2,818,5279 --top 5 --json";

const GENERATE_EXAMPLES: &str = "Examples:
  rlx generate --tokens 2,818,5279,529,7001,563 -n 16 --temp 0 --json
  rlx generate -m model.gguf --tokens 2,818 -n 32 --temp 0.8 --seed 1";

const INFO_EXAMPLES: &str = "Examples:
  rlx info ~/.cache/rlx/models/gemma-3-270m-q4_k_m.gguf
  rlx info model.gguf --json | jq '.metadata[\"general.name\"]'
  rlx info ./gemma-3-1b-it/";

/// llama.cpp's single-dash flags of several letters (which clap's short
/// flags cannot spell) as rlx's long ones, so its users' commands work.
const LLAMA_SPELLINGS: [(&str, &str); 3] = [
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-ngl", "--gpu-layers"),
];

fn args() -> Vec<std::ffi::OsString> {
    std::env::args_os()
        .map(|a| {
            LLAMA_SPELLINGS
                .iter()
                .find(|(short, _)| a == *short)
                .map_or(a, |(_, long)| long.into())
        })
        .collect()
}

impl Command {
    /// The model options of a command that loads one.
    fn model_args(&mut self) -> Option<&mut cmd::common::ModelArgs> {
        match self {
            Command::Score(a) => Some(&mut a.model),
            Command::Generate(a) => Some(&mut a.model),
            Command::Bench(a) => Some(&mut a.model),
            Command::Run(a) => Some(&mut a.model),
            Command::Chat(a) => Some(&mut a.model),
            Command::Serve(a) => Some(&mut a.model),
            Command::Perplexity(a) => Some(&mut a.model),
            _ => None,
        }
    }
}

/// `--pull`: the model fetched before the command looks for it, and then
/// looked for by the name that finds it.
fn pull_first(command: &mut Command) -> anyhow::Result<()> {
    match command.model_args() {
        Some(m) if m.pull => {
            m.model = cmd::pull::ensure_local(&m.model)?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The subcommands by heading, in the order people work: what they run
/// first, then the tools for scripts and parity checks. (clap lists every
/// subcommand under one heading, so `rlx --help` lists them from here.)
const GROUPS: [(&str, &[&str]); 2] = [
    (
        "Commands",
        &[
            "run",
            "chat",
            "serve",
            "bench",
            "perplexity",
            "quantize",
            "models",
            "pull",
        ],
    ),
    (
        "Scripting and parity tools",
        &[
            "tokenize",
            "detokenize",
            "score",
            "generate",
            "info",
            "help",
        ],
    ),
];

/// The command line, its top-level help listing the subcommands by group.
fn command() -> clap::Command {
    let cmd = Cli::command();
    let width = GROUPS
        .iter()
        .flat_map(|g| g.1)
        .map(|n| n.len())
        .max()
        .unwrap_or(0);
    let mut listing = String::new();
    for (heading, names) in GROUPS {
        listing.push_str(&format!("{heading}:\n"));
        for name in names {
            let about = match cmd.find_subcommand(name).and_then(|c| c.get_about()) {
                Some(about) => about.to_string(),
                None => "Print this message or the help of the given subcommand(s)".into(),
            };
            listing.push_str(&format!("  {name:<width$}  {about}\n"));
        }
        listing.push('\n');
    }
    cmd.help_template(format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{listing}Options:\n{{options}}{{after-help}}"
    ))
}

fn main() -> ExitCode {
    let mut cli = match Cli::from_arg_matches(&command().get_matches_from(args())) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = pull_first(&mut cli.command).and_then(|()| match cli.command {
        Command::Info(args) => cmd::info::run(&args),
        Command::Score(args) => cmd::score::run(&args),
        Command::Generate(args) => cmd::generate::run(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Run(args) => cmd::run::run(&args),
        Command::Chat(args) => cmd::chat::run(&args),
        Command::Serve(args) => cmd::serve::run(&args),
        Command::Models => cmd::models::run(),
        Command::Pull(args) => cmd::pull::run(&args),
        Command::Quantize(args) => cmd::quantize::run(&args),
        Command::Perplexity(args) => cmd::perplexity::run(&args),
        Command::Tokenize(args) => cmd::tokenize::run_tokenize(&args),
        Command::Detokenize(args) => cmd::tokenize::run_detokenize(&args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A closed stdout (`rlx info x.gguf | head`) is not an error worth reporting.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_is_listed_once_under_a_heading() {
        let cmd = Cli::command();
        let mut listed: Vec<&str> = GROUPS.iter().flat_map(|g| g.1.iter().copied()).collect();
        listed.sort();
        let mut names: Vec<&str> = cmd
            .get_subcommands()
            .map(|c| c.get_name())
            .chain(["help"])
            .collect();
        names.sort();
        assert_eq!(listed, names, "GROUPS against the subcommands");
        let help = command().render_help().to_string();
        let at = |line: &str| {
            help.find(line)
                .unwrap_or_else(|| panic!("no {line:?} in {help}"))
        };
        assert!(
            at("  run ") < at("  chat ") && at("  pull ") < at("Scripting"),
            "{help}"
        );
        assert!(at("Scripting and parity tools:") < at("  info "), "{help}");
    }

    #[test]
    fn every_subcommand_help_ends_with_examples() {
        for sub in Cli::command().get_subcommands() {
            let name = sub.get_name();
            let examples = sub
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            let commands = examples
                .lines()
                .filter(|l| l.starts_with("  ") && l.contains("rlx "))
                .count();
            // clap wraps help at 100 columns where it knows no terminal's.
            let long = examples.lines().find(|l| l.chars().count() > 98);
            assert!(
                long.is_none(),
                "rlx {name}: an example wider than 98: {long:?}"
            );
            assert!(
                examples.starts_with("Examples:\n") && commands >= 2,
                "rlx {name} --help should end with two or three examples, not {examples:?}"
            );
            let help = sub.clone().render_long_help().to_string();
            let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(words(&help).ends_with(&words(&examples)), "{help}");
        }
    }
}
