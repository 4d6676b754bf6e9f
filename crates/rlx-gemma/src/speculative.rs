//! Speculative decoding's parts that need no model: drafts proposed by
//! prompt lookup ([`NgramIndex`]: the tokens that followed the latest
//! earlier occurrence of the text's last few tokens), a draft length that
//! follows the recent acceptance rate and switches drafting off where it
//! does not pay ([`DraftControl`]), and the acceptance rule that keeps the
//! output distribution what plain sampling gives ([`verify`]).
//!
//! A verification step runs the last accepted token and the `k` drafted
//! ones as one sequence's rows; row `i`'s logits decide drafted token `i`.
//! Greedy decoding accepts a drafted token where it is the row's choice,
//! so its output is token for token plain decoding's.

use std::collections::HashMap;

/// Where prompt lookup looks: n-grams of `min_n ..= max_n` tokens, longest
/// first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramOptions {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for NgramOptions {
    fn default() -> Self {
        NgramOptions { min_n: 2, max_n: 4 }
    }
}

/// The most tokens an n-gram key holds.
const MAX_N: usize = 8;

/// Every n-gram of a growing token sequence (prompt and output) with the
/// latest position that something followed it: a lookup costs one hash
/// probe per n, whatever the length of the text.
#[derive(Clone, Debug)]
pub struct NgramIndex {
    opts: NgramOptions,
    tokens: Vec<u32>,
    /// Per n (index n - min_n): the n-gram's tokens → its latest start that
    /// has a following token.
    latest: Vec<HashMap<[u32; MAX_N], usize>>,
}

impl NgramIndex {
    /// An empty index; `opts.max_n` is at most 8 and at least `opts.min_n`
    /// (both taken into 1 ..= 8).
    pub fn new(opts: NgramOptions) -> NgramIndex {
        let min_n = opts.min_n.clamp(1, MAX_N);
        let opts = NgramOptions {
            min_n,
            max_n: opts.max_n.clamp(min_n, MAX_N),
        };
        NgramIndex {
            opts,
            tokens: Vec::new(),
            latest: vec![HashMap::new(); opts.max_n - opts.min_n + 1],
        }
    }

    /// The tokens so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn key(gram: &[u32]) -> [u32; MAX_N] {
        let mut k = [u32::MAX; MAX_N];
        k[..gram.len()].copy_from_slice(gram);
        k
    }

    /// Appends tokens (the prompt, then each accepted token).
    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            // The n-grams ending just before `t` now have a follower.
            let end = self.tokens.len();
            for n in self.opts.min_n..=self.opts.max_n {
                if n <= end {
                    let start = end - n;
                    let key = Self::key(&self.tokens[start..end]);
                    self.latest[n - self.opts.min_n].insert(key, start);
                }
            }
            self.tokens.push(t);
        }
    }

    /// Drops the tokens past the first `len` (a rewind); the index forgets
    /// the n-grams that reached past it.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.tokens.len() {
            return;
        }
        let tokens = self.tokens[..len].to_vec();
        *self = NgramIndex::new(self.opts);
        self.extend(&tokens);
    }

    /// Up to `max` tokens that followed the latest earlier occurrence of
    /// the text's last n tokens, for the longest n that occurred before;
    /// empty where none did.
    pub fn propose(&self, max: usize) -> &[u32] {
        let len = self.tokens.len();
        for n in (self.opts.min_n..=self.opts.max_n).rev() {
            if n > len {
                continue;
            }
            let key = Self::key(&self.tokens[len - n..]);
            if let Some(&start) = self.latest[n - self.opts.min_n].get(&key) {
                let from = start + n;
                return &self.tokens[from..(from + max).min(len)];
            }
        }
        &[]
    }
}

/// How long drafts are, from what verification costs and what the drafts
/// of late were worth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftOptions {
    /// The most tokens a draft holds.
    pub max_draft: usize,
    /// The fewest a draft holds when drafting is on.
    pub min_draft: usize,
    /// A verification step of `1 + k` rows costs `1 + k × row_cost` plain
    /// decode steps (small on a GPU, where a step reads the weights once
    /// whatever its rows; larger on a CPU): the estimate until steps have
    /// been timed ([`DraftControl::timed`]).
    pub row_cost: f64,
    /// Weight of the newest draft in the running acceptance estimate.
    pub decay: f64,
    /// Steps without drafting after drafting stopped paying, before a
    /// draft of `min_draft` tries again.
    pub cooldown: usize,
}

impl Default for DraftOptions {
    fn default() -> Self {
        DraftOptions {
            max_draft: 8,
            min_draft: 1,
            row_cost: 0.1,
            decay: 0.2,
            cooldown: 16,
        }
    }
}

/// The draft length from the recent per-token acceptance rate α: the k
/// that gives the most tokens per unit of cost, `(1 − α^(k+1)) / (1 − α)`
/// tokens a step for `1 + k·(row_cost + draft_cost)`, and none (plain decoding, for
/// `cooldown` steps) where no k beats a plain step.
#[derive(Clone, Debug)]
pub struct DraftControl {
    opts: DraftOptions,
    /// Running estimate of a drafted token's chance to be accepted.
    alpha: f64,
    /// Plain steps left before drafting tries again.
    resting: usize,
    /// Running means of a one-row step's seconds and of what each further
    /// row of a verification step adds, once timed.
    step_secs: Option<f64>,
    row_secs: Option<f64>,
    /// A one-row step's seconds as verification steps suggest, while no
    /// one-row step has been timed.
    step_guess: Option<f64>,
    /// Running mean of the seconds drafting took a drafted token (a draft
    /// model's steps; prompt lookup is not timed: it costs next to nothing).
    draft_secs: Option<f64>,
    /// Row counts whose first step has been seen (and not timed: a first
    /// step of a shape may build its plan).
    warm: u64,
    /// Whether the next step probes with the shortest draft, whatever the
    /// estimates say (the rest is over).
    probe: bool,
}

impl DraftControl {
    /// Starts optimistic (α = 0.5), so that drafting is tried.
    pub fn new(opts: DraftOptions) -> DraftControl {
        DraftControl {
            opts,
            alpha: 0.5,
            resting: 0,
            step_secs: None,
            row_secs: None,
            step_guess: None,
            draft_secs: None,
            warm: 0,
            probe: false,
        }
    }

    /// What a verification row costs, in one-row steps: measured where
    /// both kinds of step have been timed, else the options' estimate.
    pub fn row_cost(&self) -> f64 {
        match (self.step_secs, self.row_secs) {
            (Some(step), Some(row)) if step > 0.0 => (row / step).clamp(0.0, 4.0),
            _ => self.opts.row_cost,
        }
    }

    /// What drafting a token costs, in one-row steps of the target: zero
    /// until drafting has been timed ([`DraftControl::drafting_timed`]) and
    /// a step of the target too.
    pub fn draft_cost(&self) -> f64 {
        match (self.step_secs.or(self.step_guess), self.draft_secs) {
            (Some(step), Some(draft)) if step > 0.0 => (draft / step).clamp(0.0, 4.0),
            _ => 0.0,
        }
    }

    /// Records that drafting `tokens` tokens took `secs`.
    pub fn drafting_timed(&mut self, tokens: usize, secs: f64) {
        if tokens > 0 {
            let x = secs / tokens as f64;
            self.draft_secs = Some(self.draft_secs.map_or(x, |m| m + 0.2 * (x - m)));
        }
    }

    /// Records how long a step of `rows` rows of one sequence took (one
    /// row: a plain step; more: a verification step).
    pub fn timed(&mut self, rows: usize, secs: f64) {
        let bit = 1u64 << rows.min(63);
        if self.warm & bit == 0 {
            self.warm |= bit;
            return;
        }
        let mean = |m: Option<f64>, x: f64| Some(m.map_or(x, |m| m + 0.2 * (x - m)));
        if rows <= 1 {
            self.step_secs = mean(self.step_secs, secs);
        } else if let Some(step) = self.step_secs {
            let per_row = (secs - step).max(0.0) / (rows - 1) as f64;
            self.row_secs = mean(self.row_secs, per_row);
        } else {
            // No one-row step timed yet (drafts were found every step):
            // what one would take at the estimated row cost, the scale of
            // drafting's cost until one is timed.
            let guess = secs / (1.0 + (rows - 1) as f64 * self.opts.row_cost);
            self.step_guess = mean(self.step_guess, guess);
        }
    }

    /// The running acceptance estimate.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Expected tokens a verification step of `k` drafts gives.
    fn tokens(alpha: f64, k: usize) -> f64 {
        (0..=k).map(|i| alpha.powi(i as i32)).sum()
    }

    /// How many tokens to draft for the next step (0: a plain step).
    pub fn length(&self) -> usize {
        if self.resting > 0 || self.opts.max_draft == 0 {
            return 0;
        }
        if self.probe {
            return self.opts.min_draft.max(1);
        }
        let o = &self.opts;
        let cost = self.row_cost() + self.draft_cost();
        let gain = |k: usize| Self::tokens(self.alpha, k) / (1.0 + k as f64 * cost);
        let best = (o.min_draft.max(1)..=o.max_draft.max(o.min_draft.max(1)))
            .max_by(|&a, &b| gain(a).total_cmp(&gain(b)))
            .unwrap_or(0);
        if gain(best) > 1.0 {
            best
        } else {
            0
        }
    }

    /// Records a step: `drafted` tokens proposed (0 for a plain step or
    /// when no draft was found), `accepted` of them taken.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            if self.resting > 0 {
                self.resting -= 1;
                // The rest is over: the next draft is tried whatever the
                // estimates, which only drafts can change.
                self.probe = self.resting == 0;
            }
            return;
        }
        self.probe = false;
        // Per-token acceptance of this draft: accepted tokens over
        // accepted tokens plus the one rejection, if any.
        let rejected = usize::from(accepted < drafted);
        let seen = accepted as f64 / (accepted + rejected) as f64;
        self.alpha += self.opts.decay * (seen - self.alpha);
        if self.length() == 0 {
            self.resting = self.opts.cooldown;
        }
    }
}

/// What [`verify`] decided for one drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The drafted token stands.
    Accept,
    /// The draft ends here; this token replaces the drafted one.
    Replace(u32),
}

/// The first of the largest logits (NaN counts as smallest): a draft
/// model's greedy choice.
pub fn greedy_token(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() && !l.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The speculative-sampling rule for one drafted token `token`, proposed
/// with probabilities `q` (the draft's distribution; `None` for a
/// deterministic proposal such as prompt lookup, a point mass on `token`),
/// against the target's probabilities `p`: accepted with probability
/// min(1, p/q), else replaced by a draw from the normalized residual
/// max(0, p − q). `u` and `v` are uniform draws in [0, 1) (`v` only used on
/// a rejection), so the output token is distributed as `p` exactly.
pub fn verify(p: &[f32], q: Option<&[f32]>, token: u32, u: f64, v: f64) -> Verdict {
    let t = token as usize;
    let pt = f64::from(p.get(t).copied().unwrap_or(0.0));
    let qt = q.map_or(1.0, |q| f64::from(q.get(t).copied().unwrap_or(0.0)));
    if qt > 0.0 && u * qt < pt {
        return Verdict::Accept;
    }
    let residual = |i: usize| -> f64 {
        let qi = match q {
            Some(q) => f64::from(q.get(i).copied().unwrap_or(0.0)),
            None => f64::from(u8::from(i == t)),
        };
        (f64::from(p[i]) - qi).max(0.0)
    };
    let total: f64 = (0..p.len()).map(residual).sum();
    if total <= 0.0 {
        // p = q: a rejection has probability 0; rounding got here.
        return Verdict::Accept;
    }
    let mut left = v * total;
    let mut last = t;
    for i in 0..p.len() {
        let r = residual(i);
        if r > 0.0 {
            last = i;
            if left < r {
                return Verdict::Replace(i as u32);
            }
            left -= r;
        }
    }
    Verdict::Replace(last as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The brute-force lookup [`NgramIndex::propose`] must agree with.
    fn propose_slow(tokens: &[u32], opts: NgramOptions, max: usize) -> Vec<u32> {
        let len = tokens.len();
        for n in (opts.min_n..=opts.max_n).rev() {
            if n > len {
                continue;
            }
            let suffix = &tokens[len - n..];
            if let Some(start) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == suffix) {
                return tokens[start + n..(start + n + max).min(len)].to_vec();
            }
        }
        Vec::new()
    }

    proptest! {
        #[test]
        fn lookup_matches_a_brute_force_search(
            tokens in proptest::collection::vec(0u32..4, 0..80),
            max in 1usize..10,
            cut in 0usize..80,
        ) {
            let opts = NgramOptions::default();
            let mut index = NgramIndex::new(opts);
            for (i, &t) in tokens.iter().enumerate() {
                index.extend(&[t]);
                prop_assert_eq!(index.propose(max), &propose_slow(&tokens[..=i], opts, max)[..]);
            }
            // A rewind forgets what came after it.
            let cut = cut.min(tokens.len());
            index.truncate(cut);
            prop_assert_eq!(index.propose(max), &propose_slow(&tokens[..cut], opts, max)[..]);
        }
    }

    #[test]
    fn lookup_prefers_the_longest_and_latest_match() {
        let mut index = NgramIndex::new(NgramOptions::default());
        // "1 2 3 9" early, "2 3 7" later: the suffix "1 2 3" matches only
        // the first (the longer n-gram wins over the later "2 3").
        index.extend(&[1, 2, 3, 9, 8, 2, 3, 7, 6, 1, 2, 3]);
        assert_eq!(index.propose(3), &[9, 8, 2]);
        // Of the suffix only "2 3" occurred before, at 0 and 3: the latest
        // (the suffix itself has no follower and does not count).
        let mut index = NgramIndex::new(NgramOptions::default());
        index.extend(&[2, 3, 7, 2, 3, 9, 5, 2, 3]);
        assert_eq!(index.propose(2), &[9, 5]);
        assert_eq!(index.propose(1), &[9]);
        // Nothing repeats: no draft.
        let mut index = NgramIndex::new(NgramOptions::default());
        index.extend(&[1, 2, 3, 4, 5]);
        assert!(index.propose(4).is_empty());
    }

    #[test]
    fn a_costly_drafter_drafts_less_or_not_at_all() {
        let opts = DraftOptions {
            max_draft: 8,
            ..DraftOptions::default()
        };
        let timed = |draft_secs: f64| {
            let mut c = DraftControl::new(opts);
            for _ in 0..3 {
                // One-row steps of 10 ms, verification rows of 1 ms.
                c.timed(1, 0.010);
                c.timed(5, 0.014);
            }
            for _ in 0..20 {
                c.record(4, 3);
            }
            c.drafting_timed(4, 4.0 * draft_secs);
            c
        };
        let free = timed(0.0);
        assert_eq!(free.draft_cost(), 0.0);
        let cheap = timed(0.001);
        assert!((cheap.draft_cost() - 0.1).abs() < 1e-9);
        assert!(free.length() >= cheap.length() && cheap.length() > 0);
        // A drafter as slow as the target: no draft pays.
        assert_eq!(timed(0.010).length(), 0);
    }

    #[test]
    fn draft_length_follows_acceptance_and_rests_where_it_does_not_pay() {
        let opts = DraftOptions::default();
        let mut c = DraftControl::new(opts);
        // Every draft accepted whole: the longest drafts.
        for _ in 0..30 {
            let k = c.length();
            assert!(k > 0);
            c.record(k, k);
        }
        assert_eq!(c.length(), opts.max_draft);
        // Every draft rejected at once: drafting stops for the cooldown,
        // then tries again.
        let (mut rested, mut probes) = (0, 0);
        for _ in 0..200 {
            let k = c.length();
            if k == 0 {
                rested += 1;
            } else if rested > 0 {
                probes += 1;
                assert_eq!(k, opts.min_draft, "a probe is the shortest draft");
            }
            c.record(k, 0);
        }
        assert!(rested >= 150, "rested {rested} of 200 steps");
        assert!(probes >= 5, "{probes} probes in 200 steps");
        // A moderate rate: drafts of a moderate length.
        let mut c = DraftControl::new(opts);
        for _ in 0..100 {
            let k = c.length();
            // Half of the drafted tokens accepted, one rejection each.
            c.record(k, k / 2);
        }
        let k = c.length();
        assert!((1..opts.max_draft).contains(&k), "{k} at α {}", c.alpha());
        // A costly verification (a CPU): shorter drafts for the same rate.
        let dear = DraftControl {
            opts: DraftOptions {
                row_cost: 0.6,
                ..opts
            },
            ..c.clone()
        };
        assert!(dear.length() < k);
    }

    #[test]
    fn measured_step_times_set_the_row_cost() {
        let mut c = DraftControl::new(DraftOptions::default());
        assert_eq!(c.row_cost(), 0.1);
        // The first step of each row count is not timed (it may build a
        // plan), nor a verification step before any plain one.
        c.timed(5, 0.5);
        c.timed(1, 0.5);
        c.timed(5, 0.02);
        assert_eq!(c.row_cost(), 0.1);
        c.timed(1, 0.010);
        c.timed(5, 0.030);
        // (30 - 10) / 4 = 5 ms a row, half a plain step.
        assert!((c.row_cost() - 0.5).abs() < 1e-9, "{}", c.row_cost());
        // Dearer rows, shorter drafts at the same acceptance.
        c.alpha = 0.7;
        let dear = c.length();
        c.row_secs = Some(0.0005);
        assert!(c.length() > dear, "{} vs {dear}", c.length());
    }

    /// xorshift64*: uniform draws for the tests.
    struct Draws(u64);
    impl Draws {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn draw(probs: &[f32], u: f64) -> u32 {
        let mut left = u * probs.iter().map(|&p| f64::from(p)).sum::<f64>();
        for (i, &p) in probs.iter().enumerate() {
            if left < f64::from(p) {
                return i as u32;
            }
            left -= f64::from(p);
        }
        probs.len() as u32 - 1
    }

    /// Chi-square statistic of `counts` against `probs`.
    fn chi_square(counts: &[usize], probs: &[f32]) -> f64 {
        let n: usize = counts.iter().sum();
        counts
            .iter()
            .zip(probs)
            .filter(|(_, &p)| p > 0.0)
            .map(|(&c, &p)| {
                let e = n as f64 * f64::from(p);
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn verified_tokens_are_distributed_as_the_target() {
        let p = [0.4f32, 0.25, 0.2, 0.1, 0.05, 0.0];
        let q = [0.1f32, 0.1, 0.5, 0.1, 0.1, 0.1];
        let mut r = Draws(0x9E3779B97F4A7C15);
        let n = 40_000;
        for draft in [Some(&q[..]), None] {
            let mut counts = [0usize; 6];
            for i in 0..n {
                // A draft model draws from q; prompt lookup proposes a
                // fixed token (here cycling through the vocabulary).
                let token = match draft {
                    Some(q) => draw(q, r.next()),
                    None => (i % 6) as u32,
                };
                let (u, v) = (r.next(), r.next());
                let out = match verify(&p, draft, token, u, v) {
                    Verdict::Accept => token,
                    Verdict::Replace(t) => t,
                };
                counts[out as usize] += 1;
            }
            // 4 degrees of freedom (five tokens of nonzero probability):
            // 18.47 is the 0.999 quantile.
            let x2 = chi_square(&counts, &p);
            assert!(x2 < 18.47, "{draft:?}: χ² {x2:.2}, counts {counts:?}");
            assert_eq!(counts[5], 0, "a token the target rules out");
        }
    }

    #[test]
    fn greedy_targets_accept_exactly_their_choice() {
        let p = [0.0f32, 1.0, 0.0];
        assert_eq!(verify(&p, None, 1, 0.999, 0.5), Verdict::Accept);
        assert_eq!(verify(&p, None, 2, 0.0, 0.5), Verdict::Replace(1));
        let q = [0.2f32, 0.3, 0.5];
        assert_eq!(verify(&p, Some(&q), 0, 0.0, 0.7), Verdict::Replace(1));
    }
}
