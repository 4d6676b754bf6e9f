//! Generation: one state machine ([`Generation`]) takes a step's logits to
//! the next tokens — masking within a [`Constraint`], sampling, tokens the
//! constraint forces, stop tokens and stop strings, the token budget,
//! streamed text and log-probabilities, and why it ended. `rlx run`, `rlx
//! chat` and the server's engine all drive it; [`generate_constrained`] is
//! the loop over one session that the command line uses.

use std::time::Instant;

use rlx_tokenizer::{StreamDecoder, Tokenizer};

use crate::model::{ModelError, Result};
use rlx_runtime::reduce::{mask_row, reduce_row, TOP_MAX};
use rlx_runtime::{LogitRows, RowDigest, RowReduce};

use crate::sampling::{Sampler, SamplingError};
use crate::sequences::Session;
use crate::speculative::{greedy_token, DraftControl, DraftOptions, NgramIndex, NgramOptions};
use crate::stop::StopFilter;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token was produced (it is among the tokens, not in the text).
    StopToken,
    /// A stop string appeared (the text ends before it).
    StopString,
    /// The token budget ran out.
    Length,
    /// The token budget was running out, and the constraint closed the
    /// output by its shortest valid continuation: it is complete, but
    /// shorter than the model would have written it.
    Closed,
    /// The constraint's output is complete.
    Complete,
    /// Whoever takes the output asked to stop (an interrupt, or a client
    /// that went away).
    Cancelled,
}

/// A step's logit row for [`Generation::next_row`].
pub enum Row<'a> {
    /// The whole row.
    Whole(&'a [f32]),
    /// The whole row, returned for a reduction request by a device that
    /// does not reduce (the CPU): the request's mask is applied here.
    Unreduced {
        req: &'a RowReduce,
        logits: &'a [f32],
    },
    /// Reduced on the device as `req` asked; the row itself stayed there.
    Reduced {
        req: &'a RowReduce,
        digest: &'a RowDigest,
        kept: &'a mut dyn KeptRow,
    },
}

/// A logit row that stayed on the device after a reduced step.
pub trait KeptRow {
    /// The whole row, read back.
    fn fetch(&mut self) -> std::result::Result<Vec<f32>, String>;
    /// The row reduced again as `req` asks.
    fn reduce(&mut self, req: &RowReduce) -> std::result::Result<RowDigest, String>;
    /// `token`'s logit.
    fn logit(&mut self, token: u32) -> std::result::Result<f32, String>;
}

/// What generated text must match (structured output): it rules out the
/// tokens that cannot continue a valid output before each sample, follows
/// the tokens chosen, and names tokens that are the only way on.
pub trait Constraint {
    /// Sets the logits of the tokens that cannot come next to −∞ (an
    /// end-of-generation token only where the output may end).
    fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), String>;
    /// The tokens that may come next as a bitset (bit `i % 32` of word
    /// `i / 32` for token `i`), which a device applies where the logits
    /// are; `None` where the constraint can only mask a whole row (which
    /// then comes back to the host).
    fn allowed(&mut self) -> std::result::Result<Option<Vec<u32>>, String> {
        Ok(None)
    }
    /// Records a token that was chosen or forced.
    fn accept(&mut self, token: u32) -> std::result::Result<(), String>;
    /// Tokens that must come next whatever the model says (empty while
    /// there is a choice): they are appended without sampling.
    fn forced(&mut self) -> Vec<u32>;
    /// Whether the output is complete and nothing more may follow.
    fn is_complete(&self) -> bool;
    /// How many of `tokens`, in order, could come next (none accepted):
    /// a draft is cut there, so that no step runs a drafted token the mask
    /// would rule out. A constraint that cannot tell says all of them
    /// (verification still masks each row).
    fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        tokens.len()
    }
    /// The tokens the output may still take, told after each token: a
    /// constraint that can close its output early (forcing the closing)
    /// starts when it must.
    fn budget(&mut self, _left: usize) {}
    /// Whether the constraint is closing the output early because the
    /// budget is running out.
    fn cut_short(&self) -> bool {
        false
    }
    /// The output's length in bytes when the constraint began closing it
    /// (for the budget, or because it started repeating itself), if it did:
    /// what came before is the model's.
    fn closed_at(&self) -> Option<usize> {
        None
    }
}

/// A token's log-probability under the model (before sampling's filters
/// and any constraint) and the likeliest alternatives at its place.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// `(token, bytes, logprob)`, likeliest first.
    pub top: Vec<(u32, Vec<u8>, f32)>,
}

/// Which mask a whole row takes before sampling.
#[derive(Clone, Copy)]
enum Mask<'a> {
    /// The constraint's, if there is one.
    Constraint,
    /// A request's bitset (see [`RowReduce::allowed`]).
    Bits(&'a [u32]),
}

/// What a log-probability is read from: a digest of the model's own row
/// (no penalties, no mask) listing at least `k` candidates, and the
/// sampled token's logit.
fn logprob_of(raw: &RowDigest, token: u32, logit: f32, k: usize, tok: &Tokenizer) -> TokenLogprob {
    let lse = raw.max() + raw.sum_exp.ln();
    let bytes = |t: u32| tok.decode_bytes(&[t], false);
    TokenLogprob {
        token,
        bytes: bytes(token),
        logprob: (f64::from(logit) - lse) as f32,
        top: raw
            .top
            .iter()
            .take(k)
            .map(|&(t, l)| (t, bytes(t), (l - lse) as f32))
            .collect(),
    }
}

/// The request for a digest that log-probabilities with `k` alternatives
/// are read from (at most [`TOP_MAX`] alternatives are listed).
fn logprob_request(k: usize) -> RowReduce {
    RowReduce::top(k.clamp(1, TOP_MAX))
}

/// What a generation is asked for, besides its sampler and constraint.
#[derive(Clone, Debug, Default)]
pub struct GenerationOptions {
    pub max_tokens: usize,
    /// Tokens that end it (end-of-generation; empty to go on past them).
    pub stop_tokens: Vec<u32>,
    /// Strings that end it: the text stops before the first to appear.
    /// They need a tokenizer (see [`Generation::next`]).
    pub stop_strings: Vec<String>,
    /// Send each sampled token with its log-probability and this many
    /// likeliest alternatives (at most [`TOP_MAX`]). Forced tokens are then
    /// sampled too (a forced token has no log-probability).
    pub logprobs: Option<usize>,
    /// Draft tokens by prompt lookup and verify them several a step
    /// ([`generate_constrained`]); `None` decodes one token a step.
    pub speculation: Option<Speculation>,
}

/// Speculative decoding: tokens drafted by prompt lookup (where the last
/// few tokens occurred before, the tokens that followed) or by a smaller
/// draft model of the same vocabulary (its greedy continuation) are run in
/// one step with the last sampled token, and each row's own sample decides
/// whether the drafted token stands. Sampling a row and keeping the drafted
/// token where the sample equals it is the speculative-sampling rule for a
/// proposal that is a single token, so the output is distributed as plain
/// decoding's (and with greedy sampling, is plain decoding's, where a step
/// of `1 + max_draft` rows computes each row as a one-row step does).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speculation {
    pub source: DraftSource,
    pub ngram: NgramOptions,
    pub draft: DraftOptions,
}

/// Where drafts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftSource {
    /// Prompt lookup over the prompt and the output so far.
    #[default]
    Ngram,
    /// The draft model's session handed to [`generate_constrained`].
    Model,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            source: DraftSource::Ngram,
            ngram: NgramOptions::default(),
            draft: DraftOptions {
                // Up to 7 rows a step: the CPU's products take the one-row
                // kernels below 8 rows.
                max_draft: 6,
                ..DraftOptions::default()
            },
        }
    }
}

/// A piece of output, as it becomes certain.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text (a stop string's possible start is held back until the next
    /// token shows whether it is one).
    Text(String),
    /// A sampled token with its log-probability, and the text it released
    /// (possibly none yet).
    Token { text: String, logprob: TokenLogprob },
}

/// Why a generation could not go on.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    #[error("structured output: {0}")]
    Constraint(String),
    #[error("sampling: {0}")]
    Sampling(String),
}

impl From<GenerationError> for ModelError {
    fn from(e: GenerationError) -> ModelError {
        ModelError::Sampling(e.to_string())
    }
}

/// One generation's state between steps: each step's logits go in
/// ([`next`](Self::next)), the tokens to run next come out
/// ([`pending`](Self::pending)), and the text and the finish reason go to
/// the caller.
pub struct Generation {
    sampler: Sampler,
    opts: GenerationOptions,
    decoder: StreamDecoder,
    filter: StopFilter,
    /// Every generated token, sampled or forced, the stop token included.
    tokens: Vec<u32>,
    /// Tokens to run in the next step: the last sampled one and any the
    /// constraint forced after it.
    pending: Vec<u32>,
    forced: usize,
    /// The logits masked by a constraint (a copy: log-probabilities are
    /// the model's own).
    masked: Vec<f32>,
}

impl Generation {
    /// A generation after `prompt` (which repetition penalties see).
    pub fn new(mut sampler: Sampler, prompt: &[u32], opts: GenerationOptions) -> Generation {
        for &t in prompt {
            sampler.accept(t);
        }
        Generation {
            sampler,
            decoder: StreamDecoder::new(false),
            filter: StopFilter::new(opts.stop_strings.clone()),
            opts,
            tokens: Vec::new(),
            pending: Vec::new(),
            forced: 0,
            masked: Vec::new(),
        }
    }

    /// Every token generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Tokens taken without sampling, because the constraint forced them.
    pub fn forced(&self) -> usize {
        self.forced
    }

    /// The tokens to run before the next [`next`](Self::next).
    pub fn pending(&self) -> &[u32] {
        &self.pending
    }

    /// The first `n` pending tokens have run (a step may carry fewer than
    /// all of them).
    pub fn ran(&mut self, n: usize) {
        self.pending.drain(..n.min(self.pending.len()));
    }

    /// Takes the logits after the pending tokens (or the prompt) ran:
    /// samples the next token within `constraint`, appends any it forces,
    /// and hands the text that became certain to `out` (which returns
    /// `false` to stop). `Some` when the generation ended. Text needs
    /// `tok`; without it only tokens come out (and stop strings never
    /// match).
    pub fn next(
        &mut self,
        logits: &[f32],
        constraint: Option<&mut dyn Constraint>,
        tok: Option<&Tokenizer>,
        out: &mut dyn FnMut(Piece) -> bool,
    ) -> std::result::Result<Option<Finish>, GenerationError> {
        self.next_row(Row::Whole(logits), constraint, tok, out)
    }

    /// What the device should reduce the next logit row to (see
    /// [`Sampler::request`]), the constraint's mask included; then
    /// [`Generation::next_row`] with its digest. A constraint that can only
    /// mask a whole row sends no bitset; its row is then read back.
    pub fn request(
        &mut self,
        constraint: Option<&mut dyn Constraint>,
    ) -> std::result::Result<RowReduce, GenerationError> {
        let allowed = match constraint {
            Some(c) => c.allowed().map_err(GenerationError::Constraint)?,
            None => None,
        };
        Ok(RowReduce {
            allowed,
            ..self.sampler.request()
        })
    }

    /// [`Generation::next`] on a row as the step returned it: whole, or
    /// reduced on the device as [`Generation::request`] asked (read back
    /// whole where the digest cannot decide; log-probabilities from a
    /// second digest of the row, the model's own).
    pub fn next_row(
        &mut self,
        row: Row<'_>,
        mut constraint: Option<&mut dyn Constraint>,
        tok: Option<&Tokenizer>,
        out: &mut dyn FnMut(Piece) -> bool,
    ) -> std::result::Result<Option<Finish>, GenerationError> {
        self.pending.clear();
        if self.tokens.len() >= self.opts.max_tokens {
            return Ok(Some(Finish::Length));
        }
        let sampling = |e: String| GenerationError::Sampling(e);
        let fetched;
        // The whole row where there is one (the model's own), whether a
        // mask is applied to it before sampling, and what stayed on the
        // device otherwise.
        // The request's bitset where it has one (the constraint's, computed
        // when the request was made), else the constraint's own mask.
        fn mask(req: &RowReduce) -> Mask<'_> {
            match &req.allowed {
                Some(bits) => Mask::Bits(bits),
                None => Mask::Constraint,
            }
        }
        let (logits, mask, mut reduced) = match row {
            Row::Whole(l) => (Some(l), Mask::Constraint, None),
            Row::Unreduced { req, logits } => (Some(logits), mask(req), None),
            Row::Reduced { req, digest, kept } => {
                if constraint.is_some() && req.allowed.is_none() {
                    // The constraint can only mask a whole row.
                    fetched = kept.fetch().map_err(sampling)?;
                    (Some(&fetched[..]), Mask::Constraint, None)
                } else {
                    (None, mask(req), Some((req, digest, kept)))
                }
            }
        };
        let sampled = match (logits, mask, &mut reduced) {
            (Some(logits), Mask::Constraint, _) if constraint.is_some() => {
                let c = constraint.as_deref_mut().expect("checked");
                self.masked.clear();
                self.masked.extend_from_slice(logits);
                c.mask(&mut self.masked)
                    .map_err(GenerationError::Constraint)?;
                self.sampler.sample(&self.masked)
            }
            (Some(logits), Mask::Bits(bits), _) => {
                self.masked.clear();
                self.masked.extend_from_slice(logits);
                mask_row(&mut self.masked, bits);
                self.sampler.sample(&self.masked)
            }
            (Some(logits), Mask::Constraint, _) => self.sampler.sample(logits),
            (None, _, Some((req, digest, kept))) => {
                // A row read back whole gets the mask the device applied.
                let mut full = || {
                    let mut row = kept.fetch().map_err(SamplingError::Fetch)?;
                    if let Some(allowed) = &req.allowed {
                        mask_row(&mut row, allowed);
                    }
                    Ok(row)
                };
                self.sampler.sample_digest(req, digest, &mut full)
            }
            (None, _, None) => unreachable!("a row is whole or reduced"),
        }
        .map_err(|e| GenerationError::Sampling(e.to_string()))?;
        let logprob = match (self.opts.logprobs, tok) {
            (Some(k), Some(tok)) => {
                let req = logprob_request(k);
                let (raw, logit) = match (logits, reduced) {
                    (Some(l), _) => (reduce_row(l, &req), l[sampled as usize]),
                    (None, Some((_, _, kept))) => {
                        let raw = kept.reduce(&req).map_err(sampling)?;
                        let listed = raw.top.iter().find(|t| t.0 == sampled);
                        let logit = match listed {
                            Some(&(_, l)) => l as f32,
                            None => kept.logit(sampled).map_err(sampling)?,
                        };
                        (raw, logit)
                    }
                    (None, None) => unreachable!("a row is whole or reduced"),
                };
                if let Some((token, value)) = raw.invalid {
                    return Err(sampling(format!(
                        "the model's logit for token {token} is {value}"
                    )));
                }
                Some(logprob_of(&raw, sampled, logit, k, tok))
            }
            _ => None,
        };
        if let Some(finish) = self.emit(sampled, logprob, &mut constraint, tok, out)? {
            return Ok(Some(finish));
        }
        self.pending.push(sampled);
        if self.opts.logprobs.is_some() {
            return Ok(None);
        }
        // Tokens the constraint forces next are taken without sampling, and
        // run together in the next step.
        while let Some(c) = constraint.as_deref_mut() {
            let forced = c.forced();
            if forced.is_empty() {
                break;
            }
            for t in forced {
                self.forced += 1;
                if let Some(finish) = self.emit(t, None, &mut constraint, tok, out)? {
                    return Ok(Some(finish));
                }
                self.pending.push(t);
            }
        }
        Ok(None)
    }

    /// Records a generated token (sampled, with its log-probability where
    /// asked for, or forced) and hands out its text; `Some` when the
    /// generation ends with it.
    fn emit(
        &mut self,
        t: u32,
        logprob: Option<TokenLogprob>,
        constraint: &mut Option<&mut dyn Constraint>,
        tok: Option<&Tokenizer>,
        out: &mut dyn FnMut(Piece) -> bool,
    ) -> std::result::Result<Option<Finish>, GenerationError> {
        self.sampler.accept(t);
        self.tokens.push(t);
        let cut_short = constraint.as_deref().is_some_and(|c| c.cut_short());
        if self.opts.stop_tokens.contains(&t) {
            let finish = if cut_short {
                Finish::Closed
            } else {
                Finish::StopToken
            };
            return Ok(Some(self.flush(tok, out).unwrap_or(finish)));
        }
        let mut complete = false;
        if let Some(c) = constraint.as_deref_mut() {
            c.accept(t).map_err(GenerationError::Constraint)?;
            complete = c.is_complete();
            c.budget(self.opts.max_tokens.saturating_sub(self.tokens.len()));
        }
        let (text, stopped) = match tok {
            Some(tok) => self.filter.push(&self.decoder.push(tok, t)),
            None => (String::new(), false),
        };
        let piece = match logprob {
            Some(logprob) => Some(Piece::Token { text, logprob }),
            None => (!text.is_empty()).then_some(Piece::Text(text)),
        };
        if piece.is_some_and(|p| !out(p)) {
            return Ok(Some(Finish::Cancelled));
        }
        if stopped {
            return Ok(Some(Finish::StopString));
        }
        if complete {
            let finish = if cut_short {
                Finish::Closed
            } else {
                Finish::Complete
            };
            return Ok(Some(self.flush(tok, out).unwrap_or(finish)));
        }
        if self.tokens.len() >= self.opts.max_tokens {
            return Ok(Some(self.flush(tok, out).unwrap_or(Finish::Length)));
        }
        Ok(None)
    }

    /// Hands out the bytes of an unfinished character and what the stop
    /// filter held back, as the output ends; the reason it ends instead,
    /// where that text holds a stop string or could not be handed out.
    fn flush(
        &mut self,
        tok: Option<&Tokenizer>,
        out: &mut dyn FnMut(Piece) -> bool,
    ) -> Option<Finish> {
        tok?;
        let (mut rest, stopped) = self.filter.push(&self.decoder.finish());
        rest.push_str(&self.filter.finish());
        if !rest.is_empty() && !out(Piece::Text(rest)) {
            return Some(Finish::Cancelled);
        }
        stopped.then_some(Finish::StopString)
    }
}

/// What a generation cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenerateStats {
    /// Prompt tokens actually run (a reused cached prefix is not counted).
    pub prefilled: usize,
    pub prefill_secs: f64,
    pub generated: usize,
    pub decode_secs: f64,
    /// Tokens drafted by speculation, and how many of them were kept.
    pub drafted: usize,
    pub accepted: usize,
    /// Steps that verified a draft.
    pub verify_steps: usize,
    /// Drafted tokens a constraint ruled out before they ran (not in
    /// `drafted`).
    pub masked: usize,
}

/// Feeds `prompt` (reusing any cached prefix) and generates up to
/// `max_tokens` tokens, ending at any of `stop_tokens` (tokens only: no
/// text, no stop strings).
pub fn generate(
    session: &mut Session<'_>,
    prompt: &[u32],
    max_tokens: usize,
    sampler: Sampler,
    stop_tokens: &[u32],
) -> Result<(Vec<u32>, Finish, GenerateStats)> {
    let opts = GenerationOptions {
        max_tokens,
        stop_tokens: stop_tokens.to_vec(),
        ..GenerationOptions::default()
    };
    generate_with(session, None, prompt, sampler, opts)
}

/// Feeds `prompt` (reusing any cached prefix) and generates as `opts` asks,
/// tokens only (no text, no stop strings, no constraint); `draft` as
/// [`generate_constrained`] takes it.
pub fn generate_with(
    session: &mut Session<'_>,
    draft: Option<&mut Session<'_>>,
    prompt: &[u32],
    sampler: Sampler,
    opts: GenerationOptions,
) -> Result<(Vec<u32>, Finish, GenerateStats)> {
    let mut generation = Generation::new(sampler, prompt, opts);
    generate_constrained(
        session,
        draft,
        prompt,
        &mut generation,
        None,
        None,
        &mut |_| true,
        &mut |_, _| {},
    )
}

/// Runs `generation` on `session`: feeds `prompt` (reusing any cached
/// prefix; `progress` hears `(done, total)` of it), then each step's
/// pending tokens, until it ends; text goes to `out` (given a tokenizer).
/// `draft` is the draft model's session where the generation's
/// speculation drafts with one ([`DraftSource::Model`]): it is fed what
/// `session` holds as drafts need it. Returns every generated token, why
/// it ended, and what it cost.
#[allow(clippy::too_many_arguments)]
pub fn generate_constrained(
    session: &mut Session<'_>,
    draft: Option<&mut Session<'_>>,
    prompt: &[u32],
    generation: &mut Generation,
    mut constraint: Option<&mut dyn Constraint>,
    tok: Option<&Tokenizer>,
    out: &mut dyn FnMut(Piece) -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Vec<u32>, Finish, GenerateStats)> {
    let mut stats = GenerateStats::default();
    let before = session.computed_tokens();
    let t0 = Instant::now();
    let mut logits = session.feed_prompt_with_progress(prompt, progress)?;
    stats.prefill_secs = t0.elapsed().as_secs_f64();
    stats.prefilled = session.computed_tokens() - before;
    let t1 = Instant::now();
    let mut spec = match generation.opts.speculation {
        Some(o) => Some(Speculator::new(o, prompt, draft, session)?),
        None => None,
    };
    let mut row = LogitRows::Full(std::mem::take(&mut logits));
    let mut req: Option<RowReduce> = None;
    loop {
        let c = constraint.as_mut().map(|c| &mut **c as &mut dyn Constraint);
        let step = match (&row, &req) {
            (LogitRows::Full(logits), Some(req)) => {
                generation.next_row(Row::Unreduced { req, logits }, c, tok, out)?
            }
            (LogitRows::Reduced(d), Some(req)) => {
                let row = Row::Reduced {
                    req,
                    digest: &d[0],
                    kept: &mut session.kept_last(),
                };
                generation.next_row(row, c, tok, out)?
            }
            (LogitRows::Full(l), None) => generation.next(l, c, tok, out)?,
            (LogitRows::Reduced(_), None) => unreachable!("reduced rows were asked for"),
        };
        // Where it goes on, verification steps while drafts are found.
        let step = match (step, spec.as_mut()) {
            (None, Some(spec)) => {
                let c = constraint.as_mut().map(|c| &mut **c as &mut dyn Constraint);
                spec.run(session, generation, c, tok, out, &mut stats)?
            }
            (step, _) => step,
        };
        if let Some(finish) = step {
            stats.generated = generation.tokens().len();
            stats.decode_secs = t1.elapsed().as_secs_f64();
            return Ok((generation.tokens().to_vec(), finish, stats));
        }
        req = if generation.pending().len() > session.max_step_tokens() {
            None
        } else {
            let c = constraint.as_mut().map(|c| &mut **c as &mut dyn Constraint);
            Some(generation.request(c)?)
        };
        let t = Instant::now();
        row = match &req {
            Some(r) => session.feed_reduced(generation.pending(), r)?,
            None => LogitRows::Full(session.feed(generation.pending())?),
        };
        if let Some(spec) = spec.as_mut() {
            let rows = generation.pending().len();
            spec.control.timed(rows, t.elapsed().as_secs_f64());
        }
    }
}

/// A generation's speculation: where its drafts come from, and the draft
/// length.
struct Speculator<'d, 'm> {
    source: Source<'d, 'm>,
    control: DraftControl,
}

enum Source<'d, 'm> {
    /// The index over the prompt and the tokens so far, and how many
    /// generated tokens it holds.
    Ngram { index: NgramIndex, indexed: usize },
    /// The draft model's session.
    Model(&'d mut Session<'m>),
}

impl<'d, 'm> Speculator<'d, 'm> {
    fn new(
        opts: Speculation,
        prompt: &[u32],
        draft: Option<&'d mut Session<'m>>,
        target: &Session<'_>,
    ) -> Result<Speculator<'d, 'm>> {
        let source = match (opts.source, draft) {
            (DraftSource::Ngram, _) => {
                let mut index = NgramIndex::new(opts.ngram);
                index.extend(prompt);
                Source::Ngram { index, indexed: 0 }
            }
            (DraftSource::Model, None) => {
                return Err(ModelError::Invalid(
                    "speculation with a draft model needs the draft model's session".into(),
                ))
            }
            (DraftSource::Model, Some(d)) => {
                let (want, have) = (target.model().config().n_vocab, d.model().config().n_vocab);
                if want != have {
                    return Err(ModelError::Invalid(format!(
                        "the draft model has {have} tokens in its vocabulary, the model {want}: drafts need the same vocabulary"
                    )));
                }
                Source::Model(d)
            }
        };
        Ok(Speculator {
            source,
            control: DraftControl::new(opts.draft),
        })
    }

    /// Up to `k` tokens to follow what `session` holds and `pending`.
    fn propose(
        &mut self,
        session: &Session<'_>,
        generated: &[u32],
        pending: &[u32],
        k: usize,
    ) -> Result<Vec<u32>> {
        match &mut self.source {
            Source::Ngram { index, indexed } => {
                index.extend(&generated[*indexed..]);
                *indexed = generated.len();
                Ok(index.propose(k).to_vec())
            }
            Source::Model(d) => {
                let t = Instant::now();
                let mut want = session.tokens().to_vec();
                want.extend_from_slice(pending);
                // The draft holds what it feeds, all but its last token.
                let k = k.min((d.context() + 1).saturating_sub(want.len()));
                let mut out = Vec::with_capacity(k);
                if k > 0 {
                    let mut logits = d.feed_prompt(&want)?;
                    loop {
                        out.push(greedy_token(&logits));
                        if out.len() == k {
                            break;
                        }
                        logits = d.feed(&out[out.len() - 1..])?;
                    }
                }
                self.control
                    .drafting_timed(out.len(), t.elapsed().as_secs_f64());
                Ok(out)
            }
        }
    }

    /// Verification steps while a draft is found: each runs the one
    /// pending token and its draft, samples row by row, keeps the drafted
    /// tokens up to the first whose row sampled another, and forgets the
    /// K/V of the rest. Returns with the next token(s) pending (to run as a
    /// plain step), or `Some` where the generation ended.
    fn run(
        &mut self,
        session: &mut Session<'_>,
        generation: &mut Generation,
        mut constraint: Option<&mut dyn Constraint>,
        tok: Option<&Tokenizer>,
        out: &mut dyn FnMut(Piece) -> bool,
        stats: &mut GenerateStats,
    ) -> Result<Option<Finish>> {
        loop {
            let generated = generation.tokens().len();
            let left = generation.opts.max_tokens.saturating_sub(generated);
            // Drafts fit the step and the context (a plain step would
            // still run where no draft fits).
            let room = session
                .max_step_tokens()
                .min(session.context().saturating_sub(session.tokens().len()))
                .saturating_sub(1);
            let k = self.control.length().min(left).min(room);
            // Log-probabilities sample forced tokens too; one token a step
            // keeps that simple.
            let plain = generation.pending().len() != 1 || generation.opts.logprobs.is_some();
            let mut draft = if k == 0 || plain {
                Vec::new()
            } else {
                self.propose(session, generation.tokens(), generation.pending(), k)?
            };
            if let Some(c) = constraint.as_mut() {
                let valid = c.valid_prefix(&draft);
                stats.masked += draft.len() - valid;
                draft.truncate(valid);
            }
            if draft.is_empty() {
                self.control.record(0, 0);
                return Ok(None);
            }
            let base = session.tokens().len();
            let mut run = generation.pending().to_vec();
            run.extend_from_slice(&draft);
            let t = Instant::now();
            let rows = session.score(&run)?;
            self.control.timed(run.len(), t.elapsed().as_secs_f64());
            stats.verify_steps += 1;
            stats.drafted += draft.len();
            let v = keep_drafted(generation, &rows, &draft, |g, row| {
                let c = constraint.as_mut().map(|c| &mut **c as &mut dyn Constraint);
                g.next(row, c, tok, out)
            })?;
            // The session holds what ran: the pending token and the drafted
            // tokens kept.
            session.rewind(base + 1 + v.kept)?;
            stats.accepted += v.accepted;
            if let Some(finish) = v.end {
                return Ok(Some(finish));
            }
            self.control.record(draft.len(), v.accepted);
        }
    }
}

/// What a verification step's rows gave ([`keep_drafted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified<E> {
    /// Drafted tokens that stand and ran: the sequence keeps the pending
    /// token and these, and forgets the rest of the draft.
    pub kept: usize,
    /// Drafted tokens that stand, the one the generation ended on (which
    /// need not run) included.
    pub accepted: usize,
    /// How the generation ended, where it did.
    pub end: Option<E>,
}

/// The rows of a verification step — one for the pending token, then one
/// for each token of `draft` — sampled in turn by `sample` (a row to the
/// generation's next tokens; `Some` where it ended): the drafted tokens
/// stand up to the first whose row sampled another, the token sampled there
/// stays pending, and where a constraint forces tokens after a drafted one,
/// they run next. The one acceptance rule of every caller (a session's
/// [`generate_constrained`], the server's steps).
pub fn keep_drafted<E, X>(
    generation: &mut Generation,
    rows: &[f32],
    draft: &[u32],
    mut sample: impl FnMut(&mut Generation, &[f32]) -> std::result::Result<Option<E>, X>,
) -> std::result::Result<Verified<E>, X> {
    let vocab = rows.len() / (draft.len() + 1);
    let mut kept = 0;
    for (i, row) in rows.chunks_exact(vocab).enumerate() {
        let before = generation.tokens().len();
        if let Some(end) = sample(generation, row)? {
            // The last token may be the drafted one: it stands, though it
            // need not run.
            let last = generation.tokens().get(before);
            let on_draft = usize::from(last.is_some() && last == draft.get(i));
            return Ok(Verified {
                kept,
                accepted: kept + on_draft,
                end: Some(end),
            });
        }
        let pending = generation.pending();
        if i == draft.len() || pending[0] != draft[i] {
            break;
        }
        // The drafted token stands: its K/V and its row are right.
        kept += 1;
        if pending.len() > 1 {
            // Tokens the constraint forces follow it: they run next.
            generation.ran(1);
            break;
        }
    }
    Ok(Verified {
        kept,
        accepted: kept,
        end: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplerConfig;

    fn greedy() -> Sampler {
        Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        })
        .unwrap()
    }

    /// Logits whose greedy choice is `t`.
    fn pick(t: u32) -> Vec<f32> {
        let mut l = vec![0.0; 16];
        l[t as usize] = 5.0;
        l
    }

    /// Allows only token 3, then forces 4 and 5, then is complete.
    struct Script {
        seen: Vec<u32>,
    }

    impl Constraint for Script {
        fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), String> {
            for (i, l) in logits.iter_mut().enumerate() {
                if i != 3 {
                    *l = f32::NEG_INFINITY;
                }
            }
            Ok(())
        }
        fn accept(&mut self, token: u32) -> std::result::Result<(), String> {
            self.seen.push(token);
            Ok(())
        }
        fn forced(&mut self) -> Vec<u32> {
            if self.seen == [3] {
                vec![4, 5]
            } else {
                Vec::new()
            }
        }
        fn is_complete(&self) -> bool {
            self.seen.len() == 3
        }
    }

    fn run(
        g: &mut Generation,
        picks: &[u32],
        mut c: Option<&mut dyn Constraint>,
    ) -> (Vec<Vec<u32>>, Option<Finish>) {
        let mut steps = Vec::new();
        for &p in picks {
            let cc = c.as_mut().map(|c| &mut **c as &mut dyn Constraint);
            let f = g.next(&pick(p), cc, None, &mut |_| true).unwrap();
            steps.push(g.pending().to_vec());
            if f.is_some() {
                return (steps, f);
            }
        }
        (steps, None)
    }

    #[test]
    fn stop_tokens_and_the_budget_end_it() {
        let opts = |max_tokens| GenerationOptions {
            max_tokens,
            stop_tokens: vec![9],
            ..GenerationOptions::default()
        };
        let mut g = Generation::new(greedy(), &[1, 2], opts(10));
        let (_, f) = run(&mut g, &[7, 8, 9, 7], None);
        assert_eq!((g.tokens(), f), (&[7, 8, 9][..], Some(Finish::StopToken)));
        let mut g = Generation::new(greedy(), &[1], opts(2));
        let (_, f) = run(&mut g, &[7, 8, 7], None);
        assert_eq!((g.tokens(), f), (&[7, 8][..], Some(Finish::Length)));
        let mut g = Generation::new(greedy(), &[1], opts(0));
        let (_, f) = run(&mut g, &[7], None);
        assert_eq!((g.tokens(), f), (&[][..], Some(Finish::Length)));
    }

    #[test]
    fn a_constraint_masks_forces_and_completes() {
        let mut c = Script { seen: Vec::new() };
        let opts = GenerationOptions {
            max_tokens: 10,
            ..GenerationOptions::default()
        };
        let mut g = Generation::new(greedy(), &[1], opts);
        // The model prefers 7; the constraint allows only 3, then forces
        // 4 and 5, which complete the output in the same step.
        let (steps, f) = run(&mut g, &[7, 7], Some(&mut c));
        assert_eq!(f, Some(Finish::Complete));
        assert_eq!(g.tokens(), [3, 4, 5]);
        assert_eq!(g.forced(), 2);
        assert_eq!(steps.len(), 1);
        // With a budget of two, the forced run is cut at the budget.
        let mut c = Script { seen: Vec::new() };
        let opts = GenerationOptions {
            max_tokens: 2,
            ..GenerationOptions::default()
        };
        let mut g = Generation::new(greedy(), &[1], opts);
        let (_, f) = run(&mut g, &[7], Some(&mut c));
        assert_eq!((g.tokens(), f), (&[3, 4][..], Some(Finish::Length)));
    }

    /// Allows only token 3, as a bitset a device applies, or as a mask of
    /// a whole row (counted).
    #[derive(Default)]
    struct OnlyThree {
        masked: usize,
    }

    impl Constraint for OnlyThree {
        fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), String> {
            self.masked += 1;
            for (i, l) in logits.iter_mut().enumerate() {
                if i != 3 {
                    *l = f32::NEG_INFINITY;
                }
            }
            Ok(())
        }
        fn allowed(&mut self) -> std::result::Result<Option<Vec<u32>>, String> {
            Ok(Some(vec![1 << 3]))
        }
        fn accept(&mut self, _: u32) -> std::result::Result<(), String> {
            Ok(())
        }
        fn forced(&mut self) -> Vec<u32> {
            Vec::new()
        }
        fn is_complete(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_constraints_bitset_goes_with_the_reduced_row() {
        use crate::sampling::SamplerConfig;
        // Greedy from the digest, and typical sampling from the row read
        // back whole: both see the mask.
        for typical_p in [1.0, 0.5] {
            let cfg = SamplerConfig {
                temperature: if typical_p < 1.0 { 1.0 } else { 0.0 },
                typical_p,
                ..SamplerConfig::default()
            };
            let mut g = Generation::new(
                Sampler::new(cfg).unwrap(),
                &[],
                GenerationOptions {
                    max_tokens: 4,
                    ..GenerationOptions::default()
                },
            );
            let mut c = OnlyThree::default();
            let req = g.request(Some(&mut c)).unwrap();
            assert_eq!(req.allowed.as_deref(), Some(&[1u32 << 3][..]));
            let mut kept = HostRow::new(pick(7));
            let digest = reduce_row(&kept.row, &req);
            let r = Row::Reduced {
                req: &req,
                digest: &digest,
                kept: &mut kept,
            };
            assert_eq!(
                g.next_row(r, Some(&mut c), None, &mut |_| true).unwrap(),
                None
            );
            assert_eq!(g.tokens(), &[3]);
            assert_eq!(c.masked, 0, "the mask went with the request");
        }
    }

    /// A row "kept on a device" that is in host memory, counting what is
    /// read of it.
    struct HostRow {
        row: Vec<f32>,
        fetched: usize,
        reduced: usize,
        logits: usize,
    }

    impl HostRow {
        fn new(row: Vec<f32>) -> HostRow {
            HostRow {
                row,
                fetched: 0,
                reduced: 0,
                logits: 0,
            }
        }
    }

    impl KeptRow for HostRow {
        fn fetch(&mut self) -> std::result::Result<Vec<f32>, String> {
            self.fetched += 1;
            Ok(self.row.clone())
        }
        fn reduce(&mut self, req: &RowReduce) -> std::result::Result<RowDigest, String> {
            self.reduced += 1;
            Ok(reduce_row(&self.row, req))
        }
        fn logit(&mut self, token: u32) -> std::result::Result<f32, String> {
            self.logits += 1;
            Ok(self.row[token as usize])
        }
    }

    /// A tokenizer whose 16 tokens are four specials and the letters a–l.
    fn letters() -> Tokenizer {
        let mut w = rlx_gguf::GgufWriter::new();
        let mut pieces: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
            .map(String::from)
            .to_vec();
        pieces.extend(('a'..='l').map(String::from));
        let types: Vec<i32> = (0..16).map(|i| if i < 4 { 3 } else { 1 }).collect();
        w.add("general.architecture", "gemma3").unwrap();
        w.add("tokenizer.ggml.model", "llama").unwrap();
        w.add("tokenizer.ggml.tokens", pieces).unwrap();
        w.add("tokenizer.ggml.scores", vec![0.0f32; 16]).unwrap();
        w.add("tokenizer.ggml.token_type", types).unwrap();
        let file = rlx_gguf::GgufFile::from_bytes(w.to_bytes()).unwrap();
        Tokenizer::from_gguf(&file).unwrap()
    }

    /// Every log-probability a generation of `steps` tokens reports from
    /// `rows` (cycled), given whole or reduced, and what the reduced rows
    /// read back.
    fn logprobs_from(
        cfg: crate::sampling::SamplerConfig,
        rows: &[Vec<f32>],
        reduced: bool,
        constraint: bool,
    ) -> (Vec<TokenLogprob>, [usize; 3]) {
        let tok = letters();
        let opts = GenerationOptions {
            max_tokens: 6,
            logprobs: Some(3),
            ..GenerationOptions::default()
        };
        let mut g = Generation::new(Sampler::new(cfg).unwrap(), &[], opts);
        let mut got = Vec::new();
        let mut reads = [0; 3];
        for row in rows.iter().cycle().take(6) {
            let mut c = OnlyThree::default();
            let c = constraint.then_some(&mut c as &mut dyn Constraint);
            let mut out = |p: Piece| {
                if let Piece::Token { logprob, .. } = p {
                    got.push(logprob);
                }
                true
            };
            if reduced {
                let mut c = c;
                let req = g
                    .request(c.as_mut().map(|c| &mut **c as &mut dyn Constraint))
                    .unwrap();
                let mut kept = HostRow::new(row.clone());
                let digest = reduce_row(row, &req);
                let r = Row::Reduced {
                    req: &req,
                    digest: &digest,
                    kept: &mut kept,
                };
                g.next_row(r, c, Some(&tok), &mut out).unwrap();
                reads[0] += kept.fetched;
                reads[1] += kept.reduced;
                reads[2] += kept.logits;
            } else {
                g.next(row, c, Some(&tok), &mut out).unwrap();
            }
        }
        (got, reads)
    }

    #[test]
    fn log_probabilities_come_from_a_second_digest_of_a_kept_row() {
        use crate::sampling::SamplerConfig;
        let rows: Vec<Vec<f32>> = (0..3)
            .map(|r| {
                (0..16)
                    .map(|i| ((i * 7 + r * 2) % 16) as f32 * 0.25)
                    .collect()
            })
            .collect();
        let greedy = SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        };
        let warm = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            seed: 5,
            ..SamplerConfig::default()
        };
        for (cfg, constraint) in [(greedy.clone(), false), (warm, false), (greedy, true)] {
            let (whole, _) = logprobs_from(cfg.clone(), &rows, false, constraint);
            let (reduced, reads) = logprobs_from(cfg.clone(), &rows, true, constraint);
            assert_eq!(whole.len(), 6);
            assert_eq!(whole, reduced, "{cfg:?}");
            // One second digest a token, no row read back whole.
            assert_eq!((reads[0], reads[1]), (0, 6), "{cfg:?}");
            for t in &whole {
                assert_eq!(t.top.len(), 3);
                assert!(t.top.windows(2).all(|w| w[0].2 >= w[1].2));
                assert!(t.logprob <= 0.0);
            }
        }
        // Under a constraint the log-probabilities are still the model's:
        // token 3 (allowed) sampled, the model's likeliest listed first.
        let (lp, reads) = logprobs_from(greedy_cfg(), &rows, true, true);
        assert!(lp.iter().all(|t| t.token == 3 && t.top[0].0 != 3));
        // Token 3 (at most 9 of 15 quarters) is never among the three
        // likeliest: its logit is read.
        assert_eq!(reads[2], 6);
        let row = &rows[0];
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        let lse = f64::from(max)
            + row
                .iter()
                .map(|&l| f64::from(l - max).exp())
                .sum::<f64>()
                .ln();
        assert!((f64::from(lp[0].logprob) - (f64::from(row[3]) - lse)).abs() < 1e-6);
    }

    fn greedy_cfg() -> crate::sampling::SamplerConfig {
        crate::sampling::SamplerConfig {
            temperature: 0.0,
            ..crate::sampling::SamplerConfig::default()
        }
    }

    #[test]
    fn pending_tokens_run_in_parts() {
        let opts = GenerationOptions {
            max_tokens: 10,
            ..GenerationOptions::default()
        };
        let mut g = Generation::new(greedy(), &[1], opts);
        assert_eq!(g.next(&pick(7), None, None, &mut |_| true).unwrap(), None);
        assert_eq!(g.pending(), [7]);
        g.ran(1);
        assert!(g.pending().is_empty());
        // The receiver going away ends it.
        let opts = GenerationOptions {
            max_tokens: 10,
            ..GenerationOptions::default()
        };
        let mut c = Script { seen: Vec::new() };
        let mut g = Generation::new(greedy(), &[1], opts);
        let f = g
            .next(&pick(7), Some(&mut c), None, &mut |_| false)
            .unwrap();
        // Without a tokenizer there is no text to hand out, so nothing asks
        // to stop: the constraint completes.
        assert_eq!(f, Some(Finish::Complete));
    }
}
