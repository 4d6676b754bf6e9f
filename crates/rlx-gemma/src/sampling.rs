//! Token sampling: turns a logit vector into the next token id.
//!
//! The chain follows llama.cpp's default order:
//! logit bias → penalties (repeat, frequency, presence) → [greedy stops here]
//! → top-k → typical-p → top-p → min-p → temperature → softmax → draw.
//!
//! Each stage is a small function over a candidate list. Work is done in
//! `f64` so that large biases, penalties or tiny temperatures cannot overflow.

use std::cmp::Ordering;
use std::collections::VecDeque;

use rlx_runtime::reduce::{Adjust, Draw, Penalties, RowDigest, RowReduce, TOP_MAX};

/// Errors from configuring or running the sampler.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("invalid sampler option `{option}`: got {value}, expected {expected}")]
    InvalidOption {
        option: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("cannot sample from empty logits")]
    EmptyLogits,
    #[error("logit of token {token} is {value}; logits must be finite or -inf")]
    InvalidLogit { token: usize, value: f32 },
    #[error("every token is banned (all logits are -inf after bias and penalties)")]
    AllBanned,
    #[error("vocabulary of {0} tokens does not fit u32 token ids")]
    VocabTooLarge(usize),
    #[error("reading a logit row back from the device: {0}")]
    Fetch(String),
}

/// Sampler options. Every option has an "off" value; see the field comments.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// `<= 0` means greedy (argmax after bias and penalties).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Nucleus sampling: smallest set with mass >= `top_p`; 1.0 = off.
    pub top_p: f32,
    /// Drop tokens with prob < `min_p` × max prob; 0.0 = off.
    pub min_p: f32,
    /// Locally typical sampling; 1.0 = off.
    pub typical_p: f32,
    /// CTRL-style: a seen token's logit > 0 is divided, otherwise multiplied; 1.0 = off.
    pub repeat_penalty: f32,
    /// Subtracted once from a seen token's logit; 0.0 = off.
    pub presence_penalty: f32,
    /// Subtracted `count` times from a seen token's logit; 0.0 = off.
    pub frequency_penalty: f32,
    /// How many of the most recently accepted tokens the penalties look at; 0 = none.
    pub penalty_last_n: usize,
    /// Added to the logit of a token; `f32::NEG_INFINITY` bans it. Ids outside
    /// the vocabulary are ignored, as in llama.cpp.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

fn invalid(option: &'static str, value: impl ToString, expected: &'static str) -> SamplingError {
    SamplingError::InvalidOption {
        option,
        value: value.to_string(),
        expected,
    }
}

fn check_unit(option: &'static str, v: f32) -> Result<(), SamplingError> {
    // `contains` is false for NaN, so NaN is rejected here too.
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(option, v, "a number in [0, 1]"))
    }
}

fn check_finite(option: &'static str, v: f32, expected: &'static str) -> Result<(), SamplingError> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(invalid(option, v, expected))
    }
}

impl SamplerConfig {
    /// Checks every option; the error names the offending one.
    pub fn validate(&self) -> Result<(), SamplingError> {
        check_finite(
            "temperature",
            self.temperature,
            "a finite number (<= 0 means greedy)",
        )?;
        check_unit("top_p", self.top_p)?;
        check_unit("min_p", self.min_p)?;
        check_unit("typical_p", self.typical_p)?;
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(invalid(
                "repeat_penalty",
                self.repeat_penalty,
                "a finite number > 0 (1.0 = off)",
            ));
        }
        // Negative values are allowed: they encourage repetition (OpenAI allows -2..2).
        check_finite(
            "presence_penalty",
            self.presence_penalty,
            "a finite number (0.0 = off)",
        )?;
        check_finite(
            "frequency_penalty",
            self.frequency_penalty,
            "a finite number (0.0 = off)",
        )?;
        for &(token, bias) in &self.logit_bias {
            if !(bias.is_finite() || bias == f32::NEG_INFINITY) {
                return Err(invalid(
                    "logit_bias",
                    format!("{bias} for token {token}"),
                    "a finite bias, or -inf to ban the token",
                ));
            }
        }
        Ok(())
    }

    fn penalties_enabled(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }
}

/// xoshiro256** (Blackman & Vigna, 2018), seeded with splitmix64 as its
/// authors recommend so that any `u64` seed, including 0, gives a good state.
#[derive(Clone, Debug)]
struct Xoshiro256StarStar {
    s: [u64; 4],
}

impl Xoshiro256StarStar {
    fn seed_from_u64(seed: u64) -> Self {
        // splitmix64 (Steele, Lea & Flood, 2014).
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) from the top 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One entry of the candidate list.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f64,
    /// Probability; valid only right after `softmax`.
    p: f64,
    /// Sort key for `keep_smallest_mass_prefix` (lower = kept first).
    score: f64,
}

/// Stateful sampler: holds the RNG and the penalty history.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Xoshiro256StarStar,
    /// The uniform of the next draw, taken by [`Sampler::request`].
    next_u: Option<f64>,
    /// The last `penalty_last_n` accepted tokens.
    history: VecDeque<u32>,
    /// Reused between calls; a Gemma vocabulary is 262,144 entries.
    candidates: Vec<Candidate>,
    counts: Vec<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Self, SamplingError> {
        cfg.validate()?;
        Ok(Self {
            rng: Xoshiro256StarStar::seed_from_u64(cfg.seed),
            next_u: None,
            history: VecDeque::with_capacity(cfg.penalty_last_n.min(4096)),
            cfg,
            candidates: Vec::new(),
            counts: Vec::new(),
        })
    }

    /// Chooses the next token from raw logits (len = vocab). Does not record it.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        let mut cands = std::mem::take(&mut self.candidates);
        let result = self.sample_with(logits, &mut cands);
        self.candidates = cands;
        if result.is_err() {
            self.next_u = None;
        }
        result
    }

    fn sample_with(
        &mut self,
        logits: &[f32],
        cands: &mut Vec<Candidate>,
    ) -> Result<u32, SamplingError> {
        load_logits(cands, logits)?;
        apply_logit_bias(cands, &self.cfg.logit_bias);
        if self.cfg.penalties_enabled() {
            count_history(&mut self.counts, &self.history);
            apply_penalties(cands, &self.counts, &self.cfg);
        }
        drop_banned(cands);
        if cands.is_empty() {
            return Err(SamplingError::AllBanned);
        }
        if self.cfg.temperature <= 0.0 {
            return Ok(greedy(cands));
        }
        top_k(cands, self.cfg.top_k);
        Ok(self.finish(cands))
    }

    /// The chain after top-k: typical, top-p, min-p, temperature, softmax,
    /// and the draw (with the uniform `request` took, if it took one).
    fn finish(&mut self, cands: &mut Vec<Candidate>) -> u32 {
        typical_p(cands, self.cfg.typical_p);
        top_p(cands, self.cfg.top_p);
        self.after_top_p(cands)
    }

    fn after_top_p(&mut self, cands: &mut Vec<Candidate>) -> u32 {
        min_p(cands, self.cfg.min_p);
        temperature(cands, self.cfg.temperature);
        softmax(cands);
        let u = self.next_u.take().unwrap_or_else(|| self.rng.next_f64());
        draw(cands, u)
    }

    /// What a device should reduce the next logit row to for this sampler
    /// (see [`rlx_runtime::reduce`]); takes the uniform the choice will
    /// use now, as [`Sampler::sample`] would take it later, so both give
    /// the same stream of tokens for a seed. Follow with
    /// [`Sampler::sample_digest`].
    pub fn request(&mut self) -> RowReduce {
        let cfg = &self.cfg;
        let mut adjust: Vec<Adjust> = cfg
            .logit_bias
            .iter()
            .map(|&(token, bias)| Adjust {
                token,
                bias: f64::from(bias),
                count: 0,
            })
            .collect();
        if cfg.penalties_enabled() {
            count_history(&mut self.counts, &self.history);
            adjust.extend(self.counts.chunks_exact(2).map(|p| Adjust {
                token: p[0],
                bias: 0.0,
                count: p[1],
            }));
        }
        // Stable: a token's biases in order, then its penalties.
        adjust.sort_by_key(|a| a.token);
        let penalties = Penalties {
            repeat: f64::from(cfg.repeat_penalty),
            frequency: f64::from(cfg.frequency_penalty),
            presence: f64::from(cfg.presence_penalty),
        };
        // The draw's uniform, taken now (as `sample` takes it later).
        let u = (cfg.temperature > 0.0).then(|| self.rng.next_f64());
        let (top, draw) = if cfg.temperature <= 0.0 {
            (1, None)
        } else if (1..=TOP_MAX).contains(&cfg.top_k) {
            (cfg.top_k, None)
        } else if cfg.top_k > TOP_MAX || cfg.typical_p < 1.0 {
            // More candidates than a digest lists, or typical sampling
            // (which ranks by distance from the entropy): the whole row
            // comes back.
            (1, None)
        } else if cfg.top_p < 1.0 {
            (TOP_MAX, None)
        } else {
            let ln_min_p = if cfg.min_p > 0.0 {
                f64::from(cfg.min_p).ln()
            } else {
                f64::NEG_INFINITY
            };
            let draw = Draw {
                temperature: f64::from(cfg.temperature),
                ln_min_p,
                u: u.expect("temperature above 0"),
            };
            (1, Some(draw))
        };
        self.next_u = u;
        RowReduce {
            allowed: None,
            adjust,
            penalties,
            top,
            draw,
        }
    }

    /// The next token from the digest of a row reduced as `req` (from
    /// [`Sampler::request`]) asked: the same token [`Sampler::sample`]
    /// gives on the whole row wherever the digest decides it (greedy, top-k
    /// up to [`TOP_MAX`], top-p whose mass the listed candidates reach) and
    /// a draw from the same distribution where the device drew; otherwise
    /// the whole row, which `full` reads back. Does not record the token.
    pub fn sample_digest(
        &mut self,
        req: &RowReduce,
        d: &RowDigest,
        full: &mut dyn FnMut() -> Result<Vec<f32>, SamplingError>,
    ) -> Result<u32, SamplingError> {
        if let Some((token, value)) = d.invalid {
            self.next_u = None;
            return Err(SamplingError::InvalidLogit {
                token: token as usize,
                value,
            });
        }
        if d.live == 0 {
            self.next_u = None;
            return Err(SamplingError::AllBanned);
        }
        if self.cfg.temperature <= 0.0 {
            return Ok(d.top[0].0);
        }
        let listed = |n: usize| -> Vec<Candidate> {
            d.top[..n]
                .iter()
                .map(|&(id, logit)| Candidate {
                    id,
                    logit,
                    p: 0.0,
                    score: 0.0,
                })
                .collect()
        };
        let k = self.cfg.top_k;
        if k > 0 && k < d.live {
            if k <= d.top.len() {
                let mut cands = listed(k);
                return Ok(self.finish(&mut cands));
            }
        } else if self.cfg.typical_p < 1.0 {
            // The whole row (below).
        } else if self.cfg.top_p < 1.0 {
            let mut cands = listed(d.top.len());
            let max = d.max();
            for c in &mut cands {
                c.p = (c.logit - max).exp() / d.sum_exp;
            }
            let mass: f64 = cands.iter().map(|c| c.p).sum();
            if mass >= f64::from(self.cfg.top_p) || d.top.len() == d.live {
                if cands.len() > 1 {
                    keep_by_logit_mass(&mut cands, self.cfg.top_p);
                }
                return Ok(self.after_top_p(&mut cands));
            }
        } else if let (Some(t), Some(_)) = (d.drawn, req.draw) {
            self.next_u = None;
            return Ok(t);
        }
        let row = full()?;
        self.sample(&row)
    }

    /// Records a token in the history the penalties look at (prompt tokens too).
    pub fn accept(&mut self, token: u32) {
        let n = self.cfg.penalty_last_n;
        if n == 0 {
            return;
        }
        while self.history.len() >= n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Clears the history and re-seeds the RNG, so the same calls replay the same tokens.
    pub fn reset(&mut self) {
        self.history.clear();
        self.next_u = None;
        self.rng = Xoshiro256StarStar::seed_from_u64(self.cfg.seed);
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }
}

/// Fills `cands` with one entry per token, in id order (so index == id).
fn load_logits(cands: &mut Vec<Candidate>, logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    if u32::try_from(logits.len() - 1).is_err() {
        return Err(SamplingError::VocabTooLarge(logits.len()));
    }
    if let Some((token, &value)) = logits
        .iter()
        .enumerate()
        .find(|(_, l)| l.is_nan() || **l == f32::INFINITY)
    {
        return Err(SamplingError::InvalidLogit { token, value });
    }
    cands.clear();
    cands.extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
        id: i as u32,
        // `+ 0.0` turns -0.0 into +0.0 so that ties compare equal under total_cmp.
        logit: f64::from(l) + 0.0,
        p: 0.0,
        score: 0.0,
    }));
    Ok(())
}

/// Needs `cands` in id order (before any filtering).
fn apply_logit_bias(cands: &mut [Candidate], bias: &[(u32, f32)]) {
    for &(token, b) in bias {
        if let Some(c) = cands.get_mut(token as usize) {
            c.logit += f64::from(b);
        }
    }
}

/// Counts each token of the history: `counts` becomes sorted `[token, count, ...]` pairs.
fn count_history(counts: &mut Vec<u32>, history: &VecDeque<u32>) {
    let mut tokens: Vec<u32> = history.iter().copied().collect();
    tokens.sort_unstable();
    counts.clear();
    for t in tokens {
        match counts.len() {
            n if n >= 2 && counts[n - 2] == t => counts[n - 1] += 1,
            _ => counts.extend([t, 1]),
        }
    }
}

/// Repeat, then frequency and presence penalties, as llama.cpp applies them.
/// Needs `cands` in id order; `counts` as built by `count_history`.
fn apply_penalties(cands: &mut [Candidate], counts: &[u32], cfg: &SamplerConfig) {
    let repeat = f64::from(cfg.repeat_penalty);
    let freq = f64::from(cfg.frequency_penalty);
    let presence = f64::from(cfg.presence_penalty);
    for pair in counts.chunks_exact(2) {
        let (token, count) = (pair[0], pair[1]);
        let Some(c) = cands.get_mut(token as usize) else {
            continue;
        };
        // Dividing a negative logit would make the token more likely, so multiply instead.
        if c.logit > 0.0 {
            c.logit /= repeat;
        } else {
            c.logit *= repeat;
        }
        c.logit -= f64::from(count) * freq + presence;
    }
}

fn drop_banned(cands: &mut Vec<Candidate>) {
    cands.retain(|c| c.logit != f64::NEG_INFINITY);
}

/// Argmax; ties go to the lowest id because `cands` is still in id order.
fn greedy(cands: &[Candidate]) -> u32 {
    let mut best = cands[0];
    for c in &cands[1..] {
        if c.logit > best.logit {
            best = *c;
        }
    }
    best.id
}

/// Higher logit first; the id breaks ties so results do not depend on input order.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

fn by_score(a: &Candidate, b: &Candidate) -> Ordering {
    a.score.total_cmp(&b.score).then(a.id.cmp(&b.id))
}

fn top_k(cands: &mut Vec<Candidate>, k: usize) {
    if k == 0 || k >= cands.len() {
        return;
    }
    // Partial selection: O(n) instead of sorting the whole vocabulary.
    cands.select_nth_unstable_by(k - 1, by_logit_desc);
    cands.truncate(k);
    cands.sort_unstable_by(by_logit_desc);
}

/// Locally typical sampling (Meister et al., 2022): keep the tokens whose
/// surprisal is closest to the entropy until their mass reaches `p`.
fn typical_p(cands: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 {
        return;
    }
    softmax(cands);
    let entropy: f64 = cands
        .iter()
        .filter(|c| c.p > 0.0) // 0 · ln 0 is 0, not NaN
        .map(|c| -c.p * c.p.ln())
        .sum();
    for c in cands.iter_mut() {
        c.score = (-c.p.ln() - entropy).abs();
    }
    keep_smallest_mass_prefix(cands, f64::from(p));
}

/// Nucleus sampling: the smallest set of most likely tokens with mass >= `p`.
fn top_p(cands: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 {
        return;
    }
    softmax(cands);
    keep_by_logit_mass(cands, p);
}

/// The most likely tokens whose probabilities (`p`, set) reach `p`.
fn keep_by_logit_mass(cands: &mut Vec<Candidate>, p: f32) {
    for c in cands.iter_mut() {
        c.score = -c.logit;
    }
    keep_smallest_mass_prefix(cands, f64::from(p));
}

/// Orders `cands` by `score` and keeps the shortest prefix whose probability
/// mass is >= `target` (at least one token). Selects a growing prefix instead of
/// sorting everything, since the kept set is usually small.
fn keep_smallest_mass_prefix(cands: &mut Vec<Candidate>, target: f64) {
    let n = cands.len();
    let mut k = n.min(64);
    loop {
        if k < n {
            cands.select_nth_unstable_by(k - 1, by_score);
        }
        let mass: f64 = cands[..k].iter().map(|c| c.p).sum();
        if mass >= target || k == n {
            cands[..k].sort_unstable_by(by_score);
            let mut cum = 0.0;
            // If rounding keeps the sorted sum just below `target`, keep all k.
            let mut keep = k;
            for (i, c) in cands[..k].iter().enumerate() {
                cum += c.p;
                if cum >= target {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep);
            return;
        }
        k = n.min(k.saturating_mul(8));
    }
}

/// Keeps tokens with prob >= `p` × max prob, compared in log space (no softmax needed).
fn min_p(cands: &mut Vec<Candidate>, p: f32) {
    if p <= 0.0 || cands.len() <= 1 {
        return;
    }
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f64::NEG_INFINITY, f64::max);
    let threshold = max + f64::from(p).ln();
    cands.retain(|c| c.logit >= threshold);
}

/// `t > 0`; done in f64 so tiny temperatures cannot overflow.
fn temperature(cands: &mut [Candidate], t: f32) {
    let t = f64::from(t);
    for c in cands.iter_mut() {
        c.logit /= t;
    }
}

/// Fills `p` with max-subtracted softmax probabilities. `cands` must be non-empty
/// and hold no -inf logits.
fn softmax(cands: &mut [Candidate]) {
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for c in cands.iter_mut() {
        c.p = (c.logit - max).exp();
        sum += c.p;
    }
    // sum >= 1 because the max term is exp(0).
    for c in cands.iter_mut() {
        c.p /= sum;
    }
}

/// Inverse-CDF draw with one uniform `u` in [0, 1).
fn draw(cands: &[Candidate], u: f64) -> u32 {
    let total: f64 = cands.iter().map(|c| c.p).sum();
    let target = u * total;
    let mut cum = 0.0;
    for c in cands {
        cum += c.p;
        if cum > target {
            return c.id;
        }
    }
    // Only reachable through rounding: fall back to the last token that has mass.
    cands
        .iter()
        .rev()
        .find(|c| c.p > 0.0)
        .unwrap_or(&cands[cands.len() - 1])
        .id
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cands_from(logits: &[f32]) -> Vec<Candidate> {
        let mut c = Vec::new();
        load_logits(&mut c, logits).unwrap();
        c
    }

    fn cands_from_probs(probs: &[f64]) -> Vec<Candidate> {
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        cands_from(&logits)
    }

    fn ids(cands: &[Candidate]) -> Vec<u32> {
        let mut v: Vec<u32> = cands.iter().map(|c| c.id).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn xoshiro_matches_reference_and_splitmix_seeding() {
        // splitmix64 from 0: first output of the reference implementation.
        let rng = Xoshiro256StarStar::seed_from_u64(0);
        assert_eq!(rng.s[0], 0xE220_A839_7B1D_CDAF);
        // xoshiro256** reference: state [1, 2, 3, 4] gives 11520 then 0.
        let mut rng = Xoshiro256StarStar { s: [1, 2, 3, 4] };
        assert_eq!(rng.next_u64(), 11520);
        assert_eq!(rng.next_u64(), 0);
        assert_eq!(rng.next_u64(), 1_509_978_240);
    }

    #[test]
    fn uniform_is_in_unit_interval_and_spread() {
        let mut rng = Xoshiro256StarStar::seed_from_u64(7);
        let mut buckets = [0u32; 10];
        for _ in 0..10_000 {
            let u = rng.next_f64();
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&b| (800..1200).contains(&b)),
            "{buckets:?}"
        );
    }

    #[test]
    fn top_k_keeps_k_best_sorted() {
        let mut c = cands_from(&[0.1, 3.0, -1.0, 2.0, 2.0, 5.0]);
        top_k(&mut c, 3);
        let got: Vec<u32> = c.iter().map(|c| c.id).collect();
        // 2.0 tie between ids 3 and 4: the lower id wins.
        assert_eq!(got, vec![5, 1, 3]);
        let mut c = cands_from(&[1.0, 2.0]);
        top_k(&mut c, 0);
        assert_eq!(c.len(), 2);
        top_k(&mut c, 10);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn top_p_keeps_smallest_set_reaching_mass() {
        let probs = [0.5, 0.3, 0.15, 0.05];
        let cases: [(f32, &[u32]); 5] = [
            (0.0, &[0]),
            (0.4, &[0]),
            (0.75, &[0, 1]),
            (0.85, &[0, 1, 2]),
            (0.99, &[0, 1, 2, 3]),
        ];
        for (p, want) in cases {
            let mut c = cands_from_probs(&probs);
            top_p(&mut c, p);
            assert_eq!(ids(&c), want, "top_p {p}");
        }
    }

    #[test]
    fn min_p_drops_tokens_below_fraction_of_max() {
        let probs = [0.5, 0.3, 0.15, 0.05];
        let cases: [(f32, &[u32]); 4] = [
            (0.05, &[0, 1, 2, 3]),
            (0.2, &[0, 1, 2]),
            (0.5, &[0, 1]),
            (1.0, &[0]),
        ];
        for (p, want) in cases {
            let mut c = cands_from_probs(&probs);
            min_p(&mut c, p);
            assert_eq!(ids(&c), want, "min_p {p}");
        }
    }

    #[test]
    fn typical_p_keeps_tokens_closest_to_entropy() {
        // H ≈ 1.280; surprisals 0.916, 1.204, 1.609, 2.303 → order 1, 2, 0, 3.
        let probs = [0.4, 0.3, 0.2, 0.1];
        let cases: [(f32, &[u32]); 5] = [
            (0.0, &[1]),
            (0.25, &[1]),
            (0.45, &[1, 2]),
            (0.6, &[0, 1, 2]),
            (0.95, &[0, 1, 2, 3]),
        ];
        for (p, want) in cases {
            let mut c = cands_from_probs(&probs);
            typical_p(&mut c, p);
            assert_eq!(ids(&c), want, "typical_p {p}");
        }
    }

    #[test]
    fn penalties_follow_llama_cpp_formula() {
        let cfg = SamplerConfig {
            repeat_penalty: 2.0,
            frequency_penalty: 0.25,
            presence_penalty: 0.5,
            ..SamplerConfig::default()
        };
        let mut c = cands_from(&[4.0, -4.0, 1.0, 0.0]);
        let history: VecDeque<u32> = [0, 1, 1, 3, 9].into_iter().collect();
        let mut counts = Vec::new();
        count_history(&mut counts, &history);
        assert_eq!(counts, vec![0, 1, 1, 2, 3, 1, 9, 1]);
        apply_penalties(&mut c, &counts, &cfg);
        // 4/2 - 1·0.25 - 0.5; -4·2 - 2·0.25 - 0.5; unseen; 0·2 - 0.25 - 0.5.
        let got: Vec<f64> = c.iter().map(|c| c.logit).collect();
        assert_eq!(got, vec![1.25, -9.0, 1.0, -0.75]);
    }

    #[test]
    fn draw_inverts_the_cdf() {
        let mut c = cands_from_probs(&[0.25, 0.5, 0.25]);
        softmax(&mut c);
        assert_eq!(draw(&c, 0.0), 0);
        assert_eq!(draw(&c, 0.3), 1);
        assert_eq!(draw(&c, 0.74), 1);
        assert_eq!(draw(&c, 0.76), 2);
        assert_eq!(draw(&c, 0.999_999_999), 2);
    }

    /// Reference: sort everything, then take the prefix.
    fn reference_prefix(mut c: Vec<Candidate>, target: f64) -> Vec<u32> {
        c.sort_by(by_score);
        let mut cum = 0.0;
        let mut keep = c.len();
        for (i, x) in c.iter().enumerate() {
            cum += x.p;
            if cum >= target {
                keep = i + 1;
                break;
            }
        }
        ids(&c[..keep])
    }

    proptest! {
        #[test]
        fn partial_top_p_matches_full_sort(
            logits in prop::collection::vec(-20.0f32..20.0, 1..3000),
            p in 0.0f32..1.0,
        ) {
            let mut c = cands_from(&logits);
            softmax(&mut c);
            for x in c.iter_mut() {
                x.score = -x.logit;
            }
            let want = reference_prefix(c.clone(), f64::from(p));
            keep_smallest_mass_prefix(&mut c, f64::from(p));
            prop_assert_eq!(ids(&c), want);
        }

        #[test]
        fn partial_typical_matches_full_sort(
            logits in prop::collection::vec(-20.0f32..20.0, 1..3000),
            p in 0.0f32..1.0,
        ) {
            let mut c = cands_from(&logits);
            let mut reference = c.clone();
            typical_p(&mut c, p);
            // Reference computed independently of the stage function.
            softmax(&mut reference);
            let h: f64 = reference.iter().filter(|x| x.p > 0.0).map(|x| -x.p * x.p.ln()).sum();
            for x in reference.iter_mut() {
                x.score = (-x.p.ln() - h).abs();
            }
            let want = if p >= 1.0 || logits.len() <= 1 {
                ids(&reference)
            } else {
                reference_prefix(reference, f64::from(p))
            };
            prop_assert_eq!(ids(&c), want);
        }

        #[test]
        fn top_k_matches_full_sort(
            logits in prop::collection::vec(-5.0f32..5.0, 1..500),
            k in 0usize..600,
        ) {
            let mut c = cands_from(&logits);
            let mut reference = c.clone();
            top_k(&mut c, k);
            reference.sort_by(by_logit_desc);
            if k > 0 {
                reference.truncate(k);
            }
            prop_assert_eq!(ids(&c), ids(&reference));
        }

        /// A row reduced as the sampler asks (by the host reference every
        /// device is checked against) gives the token the whole row gives,
        /// step after step, for every kind of chain but the device's draw;
        /// rows the digest cannot decide are read whole.
        #[test]
        fn digests_sample_as_whole_rows(
            rows in prop::collection::vec(prop::collection::vec(-6.0f32..6.0, 300), 6),
            coarse in any::<bool>(),
            chain in 0usize..7,
            seed in any::<u64>(),
            bias in prop::collection::vec((0u32..320, prop_oneof![Just(f32::NEG_INFINITY), -3.0f32..3.0]), 0..6),
        ) {
            let cfg = SamplerConfig {
                temperature: if chain == 0 { 0.0 } else { 0.8 },
                top_k: [0, 40, 0, 0, 0, 100, 40][chain],
                top_p: [1.0, 0.95, 0.9, 1.0, 1.0, 1.0, 1.0][chain],
                min_p: [0.0, 0.05, 0.0, 0.1, 0.0, 0.0, 0.0][chain],
                typical_p: if chain == 4 { 0.9 } else { 1.0 },
                repeat_penalty: 1.2,
                presence_penalty: 0.3,
                frequency_penalty: 0.1,
                penalty_last_n: 16,
                logit_bias: bias,
                seed,
            };
            let mut whole = Sampler::new(cfg.clone()).unwrap();
            let mut reduced = Sampler::new(cfg).unwrap();
            for row in &rows {
                // A coarse grid makes ties.
                let row: Vec<f32> = row.iter().map(|&x| if coarse { (x * 2.0).round() / 2.0 } else { x }).collect();
                let want = whole.sample(&row);
                let req = reduced.request();
                let digest = rlx_runtime::reduce::reduce_row(&row, &req);
                let mut fetch = || Ok(row.clone());
                let got = reduced.sample_digest(&req, &digest, &mut fetch);
                if req.draw.is_some() && digest.live > 0 {
                    // The device's race: another draw from the same
                    // distribution (see rlx-runtime's reduce tests).
                    prop_assert_eq!(got.clone().ok(), digest.drawn);
                } else {
                    prop_assert_eq!(&got, &want);
                }
                if let Ok(t) = want {
                    whole.accept(t);
                    reduced.accept(t);
                }
            }
        }
    }
}
