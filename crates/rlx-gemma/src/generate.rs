//! Generation: one state machine ([`Generation`]) takes a step's logits to
//! the next tokens — masking within a [`Constraint`], sampling, tokens the
//! constraint forces, stop tokens and stop strings, the token budget,
//! streamed text and log-probabilities, and why it ended. `rlx run`, `rlx
//! chat` and the server's engine all drive it; [`generate_constrained`] is
//! the loop over one session that the command line uses.

use std::time::Instant;

use rlx_tokenizer::{StreamDecoder, Tokenizer};

use crate::model::{ModelError, Result};
use rlx_runtime::{LogitRows, RowDigest, RowReduce};

use crate::sampling::{Sampler, SamplingError};
use crate::sequences::Session;
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
    /// The whole row with the constraint's mask already applied (the
    /// bitset of the request it was run for).
    Masked(&'a [f32]),
    /// Reduced on the device as `req` asked; `fetch` reads the row back.
    Reduced {
        req: &'a RowReduce,
        digest: &'a RowDigest,
        fetch: &'a mut dyn FnMut() -> std::result::Result<Vec<f32>, String>,
    },
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

/// Log-probability of `token` and the `k` likeliest tokens from `logits`.
fn logprobs(logits: &[f32], token: u32, k: usize, tok: &Tokenizer) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if top.len() < k || l > top[top.len() - 1].1 {
                let at = top.partition_point(|&(_, x)| x >= l);
                top.insert(at, (i as u32, l));
                top.truncate(k);
            }
        }
    }
    let bytes = |t: u32| tok.decode_bytes(&[t], false);
    TokenLogprob {
        token,
        bytes: bytes(token),
        logprob: logits[token as usize] - lse,
        top: top
            .into_iter()
            .map(|(t, l)| (t, bytes(t), l - lse))
            .collect(),
    }
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
    /// likeliest alternatives. Forced tokens are then sampled too (a forced
    /// token has no log-probability).
    pub logprobs: Option<usize>,
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
    /// [`Generation::next_row`] with its digest. `None` where the row must
    /// come back whole: log-probabilities read it, or the constraint can
    /// only mask a whole row.
    pub fn request(
        &mut self,
        constraint: Option<&mut dyn Constraint>,
    ) -> std::result::Result<Option<RowReduce>, GenerationError> {
        if self.opts.logprobs.is_some() {
            return Ok(None);
        }
        let allowed = match constraint {
            Some(c) => match c.allowed().map_err(GenerationError::Constraint)? {
                Some(bits) => Some(bits),
                None => return Ok(None),
            },
            None => None,
        };
        Ok(Some(RowReduce {
            allowed,
            ..self.sampler.request()
        }))
    }

    /// [`Generation::next`] on a row as the step returned it: whole, or
    /// reduced on the device as [`Generation::request`] asked (read back
    /// whole where the digest cannot decide).
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
        let fetched;
        let (logits, digest, masked) = match row {
            Row::Whole(l) => (Some(l), None, false),
            Row::Masked(l) => (Some(l), None, true),
            Row::Reduced { req, digest, fetch } => {
                let masked_there = constraint.is_none() || req.allowed.is_some();
                if self.opts.logprobs.is_some() || !masked_there {
                    fetched = fetch().map_err(GenerationError::Sampling)?;
                    (Some(&fetched[..]), None, false)
                } else {
                    (None, Some((req, digest, fetch)), true)
                }
            }
        };
        let sampled = match (constraint.as_deref_mut(), logits, digest) {
            (Some(c), Some(logits), _) if !masked => {
                self.masked.clear();
                self.masked.extend_from_slice(logits);
                c.mask(&mut self.masked)
                    .map_err(GenerationError::Constraint)?;
                self.sampler.sample(&self.masked)
            }
            (_, Some(logits), _) => self.sampler.sample(logits),
            (_, None, Some((req, digest, fetch))) => {
                // A row read back whole gets the mask the device applied.
                let mut full = || {
                    let mut row = fetch().map_err(SamplingError::Fetch)?;
                    if let Some(allowed) = &req.allowed {
                        rlx_runtime::reduce::mask_row(&mut row, allowed);
                    }
                    Ok(row)
                };
                self.sampler.sample_digest(req, digest, &mut full)
            }
            (_, None, None) => unreachable!("a row is whole or reduced"),
        }
        .map_err(|e| GenerationError::Sampling(e.to_string()))?;
        if let Some(finish) = self.emit(sampled, logits, &mut constraint, tok, out)? {
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

    /// Records a generated token (sampled from `logits`, or forced) and
    /// hands out its text; `Some` when the generation ends with it.
    fn emit(
        &mut self,
        t: u32,
        logits: Option<&[f32]>,
        constraint: &mut Option<&mut dyn Constraint>,
        tok: Option<&Tokenizer>,
        out: &mut dyn FnMut(Piece) -> bool,
    ) -> std::result::Result<Option<Finish>, GenerationError> {
        self.sampler.accept(t);
        self.tokens.push(t);
        if self.opts.stop_tokens.contains(&t) {
            return Ok(Some(self.flush(tok, out).unwrap_or(Finish::StopToken)));
        }
        let mut complete = false;
        if let Some(c) = constraint.as_deref_mut() {
            c.accept(t).map_err(GenerationError::Constraint)?;
            complete = c.is_complete();
        }
        let (text, stopped) = match tok {
            Some(tok) => self.filter.push(&self.decoder.push(tok, t)),
            None => (String::new(), false),
        };
        let piece = match (self.opts.logprobs, logits, tok) {
            (Some(k), Some(logits), Some(tok)) => Some(Piece::Token {
                text,
                logprob: logprobs(logits, t, k, tok),
            }),
            _ => (!text.is_empty()).then_some(Piece::Text(text)),
        };
        if piece.is_some_and(|p| !out(p)) {
            return Ok(Some(Finish::Cancelled));
        }
        if stopped {
            return Ok(Some(Finish::StopString));
        }
        if complete {
            return Ok(Some(self.flush(tok, out).unwrap_or(Finish::Complete)));
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
    let mut generation = Generation::new(sampler, prompt, opts);
    generate_constrained(
        session,
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
/// Returns every generated token, why it ended, and what it cost.
pub fn generate_constrained(
    session: &mut Session<'_>,
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
    let mut row = LogitRows::Full(std::mem::take(&mut logits));
    let mut req: Option<RowReduce> = None;
    loop {
        let c = constraint.as_mut().map(|c| &mut **c as &mut dyn Constraint);
        let step = match (&mut row, &req) {
            // Rows that came back whole for a request: its mask on the host.
            (LogitRows::Full(l), Some(req)) => {
                if let Some(allowed) = &req.allowed {
                    rlx_runtime::reduce::mask_row(l, allowed);
                }
                generation.next_row(Row::Masked(l), c, tok, out)?
            }
            (LogitRows::Reduced(d), Some(req)) => {
                let mut fetch = || session.fetch_last().map_err(|e| e.to_string());
                let row = Row::Reduced {
                    req,
                    digest: &d[0],
                    fetch: &mut fetch,
                };
                generation.next_row(row, c, tok, out)?
            }
            (LogitRows::Full(l), None) => generation.next(l, c, tok, out)?,
            (LogitRows::Reduced(_), None) => unreachable!("reduced rows were asked for"),
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
            generation.request(c)?
        };
        row = match &req {
            Some(r) => session.feed_reduced(generation.pending(), r)?,
            None => LogitRows::Full(session.feed(generation.pending())?),
        };
    }
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

    /// Allows only token 3, as a bitset a device applies.
    struct OnlyThree;

    impl Constraint for OnlyThree {
        fn mask(&mut self, _: &mut [f32]) -> std::result::Result<(), String> {
            unreachable!("the mask goes to the device")
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
            let mut c = OnlyThree;
            let req = g.request(Some(&mut c)).unwrap().expect("reducible");
            assert_eq!(req.allowed.as_deref(), Some(&[1u32 << 3][..]));
            let row = pick(7);
            let digest = rlx_runtime::reduce::reduce_row(&row, &req);
            let mut fetch = || Ok(row.clone());
            let r = Row::Reduced {
                req: &req,
                digest: &digest,
                fetch: &mut fetch,
            };
            assert_eq!(
                g.next_row(r, Some(&mut c), None, &mut |_| true).unwrap(),
                None
            );
            assert_eq!(g.tokens(), &[3]);
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
