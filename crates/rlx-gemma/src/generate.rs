//! The generation loop: sample (within a [`Constraint`], if any), stop on
//! end-of-generation tokens.

use std::time::Instant;

use crate::model::Result;
use crate::sampling::Sampler;
use crate::sequences::Session;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token was produced (it is included in the output).
    StopToken,
    /// The token budget ran out.
    Length,
    /// The caller's callback asked to stop (e.g. a stop string appeared).
    Caller,
    /// The constraint's output is complete.
    Complete,
}

/// What generated text must match (structured output): it rules out the
/// tokens that cannot continue a valid output before each sample, follows
/// the tokens chosen, and names tokens that are the only way on.
pub trait Constraint {
    /// Sets the logits of the tokens that cannot come next to −∞ (an
    /// end-of-generation token only where the output may end).
    fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), String>;
    /// Records a token that was chosen or forced.
    fn accept(&mut self, token: u32) -> std::result::Result<(), String>;
    /// Tokens that must come next whatever the model says (empty while
    /// there is a choice): they are appended without sampling.
    fn forced(&mut self) -> Vec<u32>;
    /// Whether the output is complete and nothing more may follow.
    fn is_complete(&self) -> bool;
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
/// `max_tokens`, calling `on_token` for each; it returns `false` to stop
/// (stop strings live with the caller, who has the text). Prompt tokens are
/// recorded in the sampler's history so repetition penalties see them.
pub fn generate(
    session: &mut Session<'_>,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop_tokens: &[u32],
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, StopReason, GenerateStats)> {
    generate_with_progress(
        session,
        prompt,
        max_tokens,
        sampler,
        stop_tokens,
        on_token,
        &mut |_, _| {},
    )
}

/// [`generate`], reporting prompt prefill progress as `(done, total)`.
pub fn generate_with_progress(
    session: &mut Session<'_>,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop_tokens: &[u32],
    on_token: &mut dyn FnMut(u32) -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Vec<u32>, StopReason, GenerateStats)> {
    generate_constrained(
        session,
        prompt,
        max_tokens,
        sampler,
        stop_tokens,
        None,
        on_token,
        progress,
    )
}

/// [`generate_with_progress`] within `constraint`: each token is sampled
/// among those it allows, tokens it forces are taken without sampling (and
/// run together in one step), and generation ends once its output is
/// complete.
#[allow(clippy::too_many_arguments)]
pub fn generate_constrained(
    session: &mut Session<'_>,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop_tokens: &[u32],
    mut constraint: Option<&mut dyn Constraint>,
    on_token: &mut dyn FnMut(u32) -> bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Vec<u32>, StopReason, GenerateStats)> {
    let constraint_err = |e: String| crate::model::ModelError::Sampling(e);
    for &t in prompt {
        sampler.accept(t);
    }
    let mut stats = GenerateStats::default();
    let before = session.computed_tokens();
    let t0 = Instant::now();
    let mut logits = session.feed_prompt_with_progress(prompt, progress)?;
    stats.prefill_secs = t0.elapsed().as_secs_f64();
    stats.prefilled = session.computed_tokens() - before;
    let t1 = Instant::now();
    let mut out = Vec::new();
    if max_tokens == 0 {
        return Ok((out, StopReason::Length, stats));
    }
    loop {
        if let Some(c) = constraint.as_deref_mut() {
            c.mask(&mut logits).map_err(constraint_err)?;
        }
        let tok = sampler
            .sample(&logits)
            .map_err(|e| crate::model::ModelError::Sampling(e.to_string()))?;
        // The sampled token, then any the constraint forces after it: all
        // emitted, then run in one step.
        let mut run = vec![tok];
        let mut i = 0;
        let mut stop = None;
        while i < run.len() {
            let t = run[i];
            sampler.accept(t);
            out.push(t);
            let go_on = on_token(t);
            stop = if stop_tokens.contains(&t) {
                Some(StopReason::StopToken)
            } else if !go_on {
                Some(StopReason::Caller)
            } else if out.len() >= max_tokens {
                Some(StopReason::Length)
            } else {
                None
            };
            if let Some(c) = constraint.as_deref_mut() {
                if stop != Some(StopReason::StopToken) {
                    c.accept(t).map_err(constraint_err)?;
                }
                if stop.is_none() && c.is_complete() {
                    stop = Some(StopReason::Complete);
                }
                if stop.is_none() && i + 1 == run.len() {
                    run.extend(c.forced());
                }
            }
            if stop.is_some() {
                break;
            }
            i += 1;
        }
        if let Some(reason) = stop {
            stats.generated = out.len();
            stats.decode_secs = t1.elapsed().as_secs_f64();
            return Ok((out, reason, stats));
        }
        logits = session.feed(&run)?;
    }
}
