//! `rlx pull`, and `-m NAME --pull`: a model fetched from Hugging Face into
//! the hub cache, or from an Ollama registry into Ollama's store, each in
//! its owner's layout, so that `rlx models` lists it, `-m` finds it and the
//! other tools that read those stores do too.

mod download;
mod hf;
mod ollama;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::common::human_bytes;
use super::remote::{self, Remote, NAME_RULE};
use super::stores::{self, Roots};
use download::Outcome;

#[derive(clap::Args)]
pub struct PullArgs {
    /// hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT], ORG/REPO/FILE.gguf,
    /// NAME[:TAG], ollama.com/[USER/]NAME[:TAG] or HOST/NAMESPACE/NAME[:TAG].
    pub name: String,
}

/// Where to fetch from and to (not `Debug`: it holds the token).
#[derive(Clone)]
pub struct Options {
    /// The Hugging Face hub cache (`Roots::hf`), where a repo's files land.
    pub hf_cache: Option<PathBuf>,
    /// Ollama's store (the first of `Roots::ollama`), where its models land.
    pub ollama_models: Option<PathBuf>,
    /// The Hugging Face hub, `https://huggingface.co`.
    pub hf_endpoint: String,
    /// Sent to the hub as `Authorization: Bearer`.
    pub hf_token: Option<String>,
    /// Ollama's registry, `https://registry.ollama.ai`.
    pub ollama_registry: String,
    /// A progress bar on stderr.
    pub progress: bool,
}

impl Options {
    /// The hubs and token from the environment (the one place that reads
    /// it): `HF_ENDPOINT`, `HF_TOKEN` (else the token `hf auth login`
    /// saved), `OLLAMA_REGISTRY`.
    pub fn from_env(roots: &Roots) -> Options {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let saved_token = || {
            let path = var("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .or_else(|| var("HF_HOME").map(|h| Path::new(&h).join("token")))
                .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache/huggingface/token")))?;
            let token = std::fs::read_to_string(path).ok()?;
            Some(token.trim().to_owned()).filter(|t| !t.is_empty())
        };
        let endpoint = |k: &str, default: &str| {
            var(k)
                .unwrap_or_else(|| default.to_owned())
                .trim_end_matches('/')
                .to_owned()
        };
        Options {
            hf_cache: roots.hf.clone(),
            ollama_models: roots.ollama.first().cloned(),
            hf_endpoint: endpoint("HF_ENDPOINT", "https://huggingface.co"),
            hf_token: var("HF_TOKEN")
                .map(|t| t.trim().to_owned())
                .or_else(saved_token),
            ollama_registry: endpoint("OLLAMA_REGISTRY", "https://registry.ollama.ai"),
            progress: std::io::stderr().is_terminal(),
        }
    }
}

/// A model pulled.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// A name `-m` takes.
    pub name: String,
    /// The model's GGUF file.
    pub path: PathBuf,
    /// The image projector fetched with it, when the repo or manifest has
    /// one (rlx does not read it yet; other tools do).
    pub projector: Option<PathBuf>,
    /// What became of the model's file.
    pub outcome: Outcome,
}

/// Fetches the model `name` means into its store, unless it is there.
pub fn pull(name: &str, opts: &Options) -> Result<Pulled> {
    let remote = Remote::parse(name)?;
    let agent = download::agent();
    match &remote {
        Remote::HuggingFace { repo, quant, file } => hf::pull(
            &agent,
            opts,
            repo,
            quant.as_deref(),
            file.as_deref(),
            remote::split_host(name).0.is_some(),
        ),
        Remote::Ollama {
            host,
            namespace,
            model,
            tag,
        } => ollama::pull(&agent, opts, host.as_deref(), namespace, model, tag),
    }
}

pub fn run(args: &PullArgs) -> Result<()> {
    let roots = Roots::from_env();
    let pulled = pull(&args.name, &Options::from_env(&roots))?;
    report(&pulled, &mut std::io::stdout().lock())
}

/// `-m NAME --pull`: fetches NAME when no store has it; the name that
/// finds the model now (NAME, or the one the pull printed where NAME does
/// not, as for a model of a registry `OLLAMA_REGISTRY` names).
pub fn ensure_local(given: &Path) -> Result<PathBuf> {
    let roots = Roots::from_env();
    if stores::find(given, &roots)?.is_some() {
        return Ok(given.to_owned());
    }
    let name = given.to_string_lossy();
    if Remote::parse(&name).is_err() {
        anyhow::bail!("model {name} not found, and --pull fetches only {NAME_RULE}");
    }
    let pulled = pull(&name, &Options::from_env(&roots))?;
    // Stdout is the command's own.
    report(&pulled, &mut std::io::stderr().lock())?;
    Ok(PathBuf::from(pulled.name))
}

/// Where the files are and the name that finds the model.
fn report(p: &Pulled, out: &mut dyn Write) -> Result<()> {
    let size = |path: &Path| human_bytes(std::fs::metadata(path).map_or(0, |m| m.len()), 1);
    let what = match p.outcome {
        Outcome::AlreadyThere => "already there",
        Outcome::Fetched => "saved",
    };
    writeln!(out, "{what}: {} ({})", p.path.display(), size(&p.path))?;
    if let Some(proj) = &p.projector {
        writeln!(out, "projector: {} ({})", proj.display(), size(proj))?;
    }
    writeln!(out, "run it with: rlx run -m {}", p.name)?;
    Ok(())
}
