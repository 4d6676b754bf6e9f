//! The generation loop: sample, stop on end-of-generation tokens.

use crate::model::{Result, Session};
use crate::sampling::Sampler;

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
) -> Result<(Vec<u32>, StopReason)> {
    for &t in prompt {
        sampler.accept(t);
    }
    let mut logits = session.feed_prompt(prompt)?;
    let mut out = Vec::new();
    for i in 0..max_tokens {
        let tok = sampler
            .sample(&logits)
            .map_err(|e| crate::model::ModelError::Sampling(e.to_string()))?;
        sampler.accept(tok);
        out.push(tok);
        let go_on = on_token(tok);
        if stop_tokens.contains(&tok) {
            return Ok((out, StopReason::StopToken));
        }
        if !go_on {
            return Ok((out, StopReason::Caller));
        }
        if i + 1 < max_tokens {
            logits = session.feed(&[tok])?;
        }
    }
    Ok((out, StopReason::Length))
}
