//! The generation loop: sample, stop on end-of-generation tokens.

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
    for i in 0..max_tokens {
        let tok = sampler
            .sample(&logits)
            .map_err(|e| crate::model::ModelError::Sampling(e.to_string()))?;
        sampler.accept(tok);
        out.push(tok);
        let go_on = on_token(tok);
        let stop = if stop_tokens.contains(&tok) {
            Some(StopReason::StopToken)
        } else if !go_on {
            Some(StopReason::Caller)
        } else {
            None
        };
        if let Some(reason) = stop {
            stats.generated = out.len();
            stats.decode_secs = t1.elapsed().as_secs_f64();
            return Ok((out, reason, stats));
        }
        if i + 1 < max_tokens {
            logits = session.feed(&[tok])?;
        }
    }
    stats.generated = out.len();
    stats.decode_secs = t1.elapsed().as_secs_f64();
    Ok((out, StopReason::Length, stats))
}
