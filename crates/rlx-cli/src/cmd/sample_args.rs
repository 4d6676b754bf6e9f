//! Sampling flags shared by `run` and `chat`, llama.cpp-style.

use anyhow::{bail, Context, Result};
use rlx_gemma::generate::{DraftSource, Speculation};
use rlx_gemma::sampling::{Sampler, SamplerConfig};
use rlx_gemma::speculative::DraftOptions;
use rlx_gemma::{Model, Session, SessionOptions};
use rlx_tokenizer::Tokenizer;

use super::common::ModelArgs;

/// How tokens are drafted for speculative decoding.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// One token a step.
    None,
    /// Prompt lookup: the tokens that followed the last few tokens where
    /// they occurred before (in the prompt or the output); no extra weights.
    Ngram,
}

impl Spec {
    /// Where `--spec` takes drafts from (`None`: no speculation).
    pub fn source(self) -> Option<DraftSource> {
        match self {
            Spec::None => None,
            Spec::Ngram => Some(DraftSource::Ngram),
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct SampleArgs {
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub typical_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// History the penalties look at, in tokens.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (sampled output is reproducible for a given seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Speculative decoding: draft tokens and verify several in one step.
    /// The output is the same as without (greedy: token for token; with a
    /// seed: the same draws); it pays where the text repeats its prompt or
    /// itself (code, edits, summaries, lists).
    #[arg(long, value_enum, default_value_t = Spec::None)]
    pub spec: Spec,
    /// The most tokens a draft holds (its length follows the recent
    /// acceptance rate; at most 6 keeps a step's products on the one-row
    /// kernels, so each row is computed as a one-token step computes it;
    /// more needs --batch-invariant).
    #[arg(long, default_value_t = 6)]
    pub draft_max: usize,
    /// The fewest tokens a draft holds while drafting is on.
    #[arg(long, default_value_t = 1)]
    pub draft_min: usize,
    /// A smaller model of the same vocabulary (a path or a name, as -m
    /// takes) whose greedy continuation is the draft: speculative decoding
    /// as --spec gives, with this model's drafts instead of prompt lookup.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<std::path::PathBuf>,
}

impl SampleArgs {
    pub fn sampler(&self) -> Result<Sampler> {
        Sampler::new(self.sampler_config()).context("bad sampling options")
    }

    /// The speculation `--spec`, `--draft-max` and `--draft-min` ask for
    /// (see [`speculation`]).
    pub fn speculation(&self, batch_invariant: bool, gpu: bool) -> Result<Option<Speculation>> {
        let source = draft_source(self.spec, self.draft_model.is_some())?;
        speculation(source, self.draft_max, self.draft_min, batch_invariant, gpu)
    }

    /// The `--draft-model` ([`load_draft`]).
    pub fn draft_model(
        &self,
        model: &ModelArgs,
        tok: &Tokenizer,
        kv_tokens: Option<usize>,
    ) -> Result<Option<Model>> {
        self.draft_model
            .as_deref()
            .map(|path| load_draft(path, model, tok, kv_tokens))
            .transpose()
    }

    pub fn sampler_config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            logit_bias: Vec::new(),
            seed: self.seed,
        }
    }
}

/// The speculation `--spec` or `--draft-model`, `--draft-max` and
/// `--draft-min` ask for (`source` `None` for none); drafts longer than a step of one-row products holds need
/// `--batch-invariant` (`batch_invariant`), or the output could differ
/// from plain decoding's where two tokens are nearly tied.
pub fn speculation(
    source: Option<DraftSource>,
    draft_max: usize,
    draft_min: usize,
    batch_invariant: bool,
    gpu: bool,
) -> Result<Option<Speculation>> {
    let Some(source) = source else {
        return Ok(None);
    };
    if gpu {
        eprintln!(
            "note: on a GPU a verification step's products are not yet shown to round as a one-token step's do, so a nearly tied greedy choice may differ from plain decoding"
        );
    }
    let one_row = Speculation::default().draft.max_draft;
    if draft_max > one_row && !batch_invariant {
        bail!(
            "--draft-max {} needs --batch-invariant: a verification step of more than {} rows takes other matmul kernels than a one-token step, which could change a nearly tied greedy choice",
            draft_max,
            one_row + 1
        );
    }
    if draft_min == 0 || draft_min > draft_max {
        bail!(
            "--draft-min {} must be at least 1 and at most --draft-max {}",
            draft_min,
            draft_max
        );
    }
    let default = Speculation::default();
    Ok(Some(Speculation {
        source,
        draft: DraftOptions {
            max_draft: draft_max,
            min_draft: draft_min,
            ..default.draft
        },
        ..default
    }))
}

/// The draft model at `path`, loaded as `model` loads the model (device,
/// precision, threads), once its vocabulary is checked to be `tok`'s.
pub fn load_draft(
    path: &std::path::Path,
    model: &ModelArgs,
    tok: &Tokenizer,
    kv_tokens: Option<usize>,
) -> Result<Model> {
    let name = path.display();
    let args = ModelArgs {
        model: path.to_path_buf(),
        quantize: None,
        ..model.clone()
    };
    let draft = args
        .load_for(kv_tokens)
        .with_context(|| format!("--draft-model {name}"))?;
    let theirs = Tokenizer::from_gguf(draft.file())
        .with_context(|| format!("--draft-model {name}: its tokenizer"))?;
    let n = tok.vocab_size().max(theirs.vocab_size()) as u32;
    if let Some(id) = (0..n).find(|&i| tok.piece(i) != theirs.piece(i)) {
        bail!(
            "--draft-model {name}: its vocabulary differs from the model's at token {id} ({:?} against {:?}); drafts need the same vocabulary",
            theirs.piece(id),
            tok.piece(id)
        );
    }
    Ok(draft)
}

/// Where drafts come from for `--spec` and whether `--draft-model` was
/// given (`None`: no speculation).
pub fn draft_source(spec: Spec, draft_model: bool) -> Result<Option<DraftSource>> {
    Ok(match (spec, draft_model) {
        (Spec::Ngram, true) => {
            bail!("--spec ngram and --draft-model each say how drafts are made: give one of them")
        }
        (_, true) => Some(DraftSource::Model),
        (spec, false) => spec.source(),
    })
}

/// A session of `draft` beside the model's, of the same context, its K/V
/// types as `model` asks.
pub fn draft_session<'m>(
    draft: Option<&'m Model>,
    context: Option<usize>,
    model: &ModelArgs,
) -> Result<Option<Session<'m>>> {
    let Some(d) = draft else {
        return Ok(None);
    };
    Ok(Some(d.session(SessionOptions {
        context,
        kv_types: model.kv_types(d),
        ..SessionOptions::default()
    })?))
}
