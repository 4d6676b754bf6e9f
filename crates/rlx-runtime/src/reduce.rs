//! Logit rows reduced where they were computed: what a sampler needs of a
//! row — its best candidates, the softmax's denominator, or one token
//! drawn from it — instead of the whole row. A Gemma row is 262,144 f32
//! (1 MiB); a digest is a few hundred bytes, so a GPU step can leave its
//! logits where they are and send back only this.
//!
//! The adjusted logit of a token is the sampler's: the row's f32 value in
//! f64, each bias added in turn, then (for tokens the penalties count) the
//! repeat penalty (dividing a positive logit, multiplying a negative one)
//! and `count × frequency + presence` subtracted. A device computes it with
//! the same correctly rounded f64 operations, so a greedy choice is the
//! same token everywhere. Sums and draws may round differently (another
//! order of addition); they sample the same distribution.

/// Most candidates a digest lists.
pub const TOP_MAX: usize = 64;

/// The penalties of a row's counted tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// A positive logit is divided by it, a negative one multiplied.
    pub repeat: f64,
    /// Subtracted once per count.
    pub frequency: f64,
    /// Subtracted once.
    pub presence: f64,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties {
            repeat: 1.0,
            frequency: 0.0,
            presence: 0.0,
        }
    }
}

/// A change to one token's logit: `bias` added, then, where `count > 0`,
/// the row's penalties for a token seen `count` times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adjust {
    pub token: u32,
    pub bias: f64,
    pub count: u32,
}

/// One token drawn from a row: among the tokens whose adjusted logit is at
/// least the maximum plus `ln_min_p` (`-inf`: all), token i with
/// probability `w_i / Σ w`, `w_i = exp((logit_i − max) / temperature)`. The
/// draw is an exponential race, which needs no ordered pass over the row:
/// the token with the least `ln(E_i) − ln(w_i)` wins, `E_i = −ln U_i`, the
/// uniform `U_i` hashed from `u` (the row's seed) and `i` ([`race_uniform`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    pub temperature: f64,
    pub ln_min_p: f64,
    pub u: f64,
}

/// What one row's digest holds.
#[derive(Clone, Debug, PartialEq)]
pub struct RowReduce {
    /// The tokens that may come next (a constraint's mask), as a bitset:
    /// bit `i % 32` of word `i / 32` for token `i`; tokens it does not set,
    /// or beyond it, are banned before anything else. `None`: all may.
    pub allowed: Option<Vec<u32>>,
    /// Sorted by token (stably: a token's changes apply in this order).
    pub adjust: Vec<Adjust>,
    pub penalties: Penalties,
    /// Candidates to list, 1 to [`TOP_MAX`].
    pub top: usize,
    pub draw: Option<Draw>,
}

impl RowReduce {
    /// A row reduced to its best `top` candidates, nothing adjusted.
    pub fn top(top: usize) -> RowReduce {
        RowReduce {
            allowed: None,
            adjust: Vec::new(),
            penalties: Penalties::default(),
            top,
            draw: None,
        }
    }

    /// Why this request cannot be run, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=TOP_MAX).contains(&self.top) {
            return Err(format!(
                "a digest lists 1 to {TOP_MAX} candidates, not {}",
                self.top
            ));
        }
        if self.adjust.windows(2).any(|w| w[0].token > w[1].token) {
            return Err("logit changes must be sorted by token".into());
        }
        if let Some(d) = self.draw {
            if !(d.temperature > 0.0 && d.temperature.is_finite()) {
                return Err(format!(
                    "a draw needs a finite temperature above 0, not {}",
                    d.temperature
                ));
            }
            if !(0.0..1.0).contains(&d.u) {
                return Err(format!("a draw's uniform must be in [0, 1), not {}", d.u));
            }
            if d.ln_min_p.is_nan() || d.ln_min_p > 0.0 {
                return Err(format!(
                    "a draw's ln(min_p) must be at most 0, not {}",
                    d.ln_min_p
                ));
            }
        }
        Ok(())
    }
}

/// One row, reduced.
#[derive(Clone, Debug, PartialEq)]
pub struct RowDigest {
    /// The best candidates by adjusted logit (ties: the lower token
    /// first), banned (`-inf`) tokens left out: `min(top, live)` of them.
    pub top: Vec<(u32, f64)>,
    /// Tokens not banned.
    pub live: usize,
    /// `Σ exp(logit − max)` over the tokens not banned.
    pub sum_exp: f64,
    /// The token drawn, where the request asked for one and a token is live.
    pub drawn: Option<u32>,
    /// The first token whose logit is NaN or +inf, and that value; the
    /// rest of the digest is then empty.
    pub invalid: Option<(u32, f32)>,
}

impl RowDigest {
    /// The largest adjusted logit (`-inf` when every token is banned).
    pub fn max(&self) -> f64 {
        self.top.first().map_or(f64::NEG_INFINITY, |t| t.1)
    }
}

/// A step's logit rows as they came back.
#[derive(Clone, Debug, PartialEq)]
pub enum LogitRows {
    /// Every row whole (`[rows × vocab]`): the device did not reduce them.
    Full(Vec<f32>),
    /// One digest per row; the rows stay on the device until its next
    /// step ([`crate::Executable::fetch_row`]).
    Reduced(Vec<RowDigest>),
}

/// Whether `allowed` (see [`RowReduce::allowed`]) lets token `i` come next.
pub fn is_allowed(allowed: &[u32], i: usize) -> bool {
    allowed.get(i / 32).is_some_and(|w| w >> (i % 32) & 1 == 1)
}

/// `row` with every token that `allowed` does not let come next at −∞: a
/// constraint's mask, as the device applies it.
pub fn mask_row(row: &mut [f32], allowed: &[u32]) {
    for (i, l) in row.iter_mut().enumerate() {
        if !is_allowed(allowed, i) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// `logit` adjusted by `changes` (the row's entries for this token, in
/// order): the sampler's arithmetic, in f64.
pub fn adjusted(logit: f32, changes: &[Adjust], p: &Penalties) -> f64 {
    // `+ 0.0` turns -0.0 into +0.0, as the sampler does.
    let mut v = f64::from(logit) + 0.0;
    for a in changes {
        v += a.bias;
        if a.count > 0 {
            if v > 0.0 {
                v /= p.repeat;
            } else {
                v *= p.repeat;
            }
            v -= f64::from(a.count) * p.frequency + p.presence;
        }
    }
    v
}

/// Every token's adjusted logit under `r`, in token order: `-inf` where
/// the mask bans it (see [`adjusted`]).
fn adjusted_row<'a>(logits: &'a [f32], r: &'a RowReduce) -> impl Iterator<Item = (u32, f64)> + 'a {
    let mut at = 0;
    logits.iter().enumerate().map(move |(i, &l)| {
        while at < r.adjust.len() && (r.adjust[at].token as usize) < i {
            at += 1;
        }
        let end = at
            + r.adjust[at..]
                .iter()
                .take_while(|a| a.token as usize == i)
                .count();
        let changes = &r.adjust[at..end];
        at = end;
        let banned = r.allowed.as_ref().is_some_and(|a| !is_allowed(a, i));
        let l = if banned { f32::NEG_INFINITY } else { l };
        (i as u32, adjusted(l, changes, &r.penalties))
    })
}

/// The digest of one row, on the host: the reference every device's
/// reduction is checked against. Streams the row (three passes, nothing
/// the size of the row allocated): a 262,144-token row's log-probabilities
/// are read from it every token.
pub fn reduce_row(logits: &[f32], r: &RowReduce) -> RowDigest {
    let mut digest = RowDigest {
        top: Vec::new(),
        live: 0,
        sum_exp: 0.0,
        drawn: None,
        invalid: None,
    };
    if let Some((i, &l)) = logits
        .iter()
        .enumerate()
        .find(|(_, l)| l.is_nan() || **l == f32::INFINITY)
    {
        digest.invalid = Some((i as u32, l));
        return digest;
    }
    // The best `r.top` by adjusted logit, ties to the lower token: tokens
    // come in order, so an equal value goes after those listed.
    let mut best: Vec<(u32, f64)> = Vec::with_capacity(r.top + 1);
    for (t, x) in adjusted_row(logits, r) {
        if x == f64::NEG_INFINITY {
            continue;
        }
        digest.live += 1;
        let beats_last = best.last().is_none_or(|l| x.total_cmp(&l.1).is_gt());
        if best.len() < r.top || beats_last {
            let at = best.partition_point(|e| e.1.total_cmp(&x).is_ge());
            best.insert(at, (t, x));
            best.truncate(r.top);
        }
    }
    digest.top = best;
    if digest.live == 0 {
        return digest;
    }
    let max = digest.max();
    let live = || adjusted_row(logits, r).filter(|&(_, x)| x != f64::NEG_INFINITY);
    digest.sum_exp = live().map(|(_, x)| (x - max).exp()).sum();
    if let Some(d) = r.draw {
        digest.drawn = race(live(), max, &d).map(|(t, _)| t);
    }
    digest
}

/// The uniform in (0, 1) of token `i` in a race seeded by `u`: splitmix64's
/// mix of the seed and the token, its top 24 bits.
pub fn race_uniform(u: f64, i: u32) -> f32 {
    let seed = (u * 9_007_199_254_740_992.0) as u64;
    let mut z = seed.wrapping_add(u64::from(i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

/// The winner of `d`'s race over the live tokens (token, adjusted logit)
/// whose maximum is `max`, and its key (f32, as the GPU computes it).
pub fn race(live: impl IntoIterator<Item = (u32, f64)>, max: f64, d: &Draw) -> Option<(u32, f32)> {
    let floor = max + d.ln_min_p;
    let inv_temp = 1.0 / d.temperature;
    let mut best: Option<(u32, f32)> = None;
    for (t, x) in live.into_iter().filter(|&(_, x)| x >= floor) {
        let e = -race_uniform(d.u, t).ln();
        let key = e.ln() - ((x - max) * inv_temp) as f32;
        if best.is_none_or(|(bt, bk)| key < bk || (key == bk && t < bt)) {
            best = Some((t, key));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_best_with_ties_to_the_lower_token() {
        let row = [1.0, 3.0, 3.0, f32::NEG_INFINITY, 2.0, 3.0];
        let d = reduce_row(&row, &RowReduce::top(4));
        assert_eq!(d.top, vec![(1, 3.0), (2, 3.0), (5, 3.0), (4, 2.0)]);
        assert_eq!(d.live, 5);
        let want: f64 = [-2.0f64, 0.0, 0.0, -1.0, 0.0].iter().map(|x| x.exp()).sum();
        assert_eq!(d.sum_exp, want);
        assert_eq!(d.invalid, None);
    }

    #[test]
    fn adjusts_as_the_sampler_does() {
        let p = Penalties {
            repeat: 2.0,
            frequency: 0.5,
            presence: 0.25,
        };
        let changes = [
            Adjust {
                token: 0,
                bias: 1.0,
                count: 0,
            },
            Adjust {
                token: 0,
                bias: 0.0,
                count: 2,
            },
        ];
        // (1.5 + 1) / 2 − (2 × 0.5 + 0.25)
        assert_eq!(adjusted(1.5, &changes, &p), 0.0);
        // −1 × 2 − 1.25
        assert_eq!(adjusted(-1.0, &changes[1..], &p), -3.25);
        let banned = [Adjust {
            token: 1,
            bias: f64::NEG_INFINITY,
            count: 0,
        }];
        let r = RowReduce {
            adjust: banned.to_vec(),
            ..RowReduce::top(2)
        };
        let d = reduce_row(&[0.0, 9.0, 1.0], &r);
        assert_eq!(d.top, vec![(2, 1.0), (0, 0.0)]);
        assert_eq!(d.live, 2);
    }

    #[test]
    fn a_mask_bans_before_anything_else() {
        // Tokens 1 and 33 allowed; a bias cannot bring token 0 back.
        let allowed = vec![0b10, 0b10];
        let r = RowReduce {
            allowed: Some(allowed.clone()),
            adjust: vec![Adjust {
                token: 0,
                bias: 100.0,
                count: 0,
            }],
            ..RowReduce::top(4)
        };
        let row: Vec<f32> = (0..40).map(|i| i as f32).collect();
        let d = reduce_row(&row, &r);
        assert_eq!(d.top, vec![(33, 33.0), (1, 1.0)]);
        assert_eq!(d.live, 2);
        assert!(is_allowed(&allowed, 33) && !is_allowed(&allowed, 32) && !is_allowed(&allowed, 64));
    }

    #[test]
    fn reports_the_first_invalid_logit() {
        let d = reduce_row(&[0.0, f32::INFINITY, f32::NAN], &RowReduce::top(1));
        assert_eq!(d.invalid, Some((1, f32::INFINITY)));
        let d = reduce_row(&[f32::NEG_INFINITY; 3], &RowReduce::top(1));
        assert_eq!((d.live, d.top.len(), d.invalid), (0, 0, None));
    }

    #[test]
    fn races_draw_in_proportion_to_the_weights() {
        // Weights 1, 1, 2 at temperature 1 (logits 0, 0, ln 2), and a
        // banned token.
        let row = [0.0, 0.0, std::f32::consts::LN_2, f32::NEG_INFINITY];
        let draw = |u: f64, ln_min_p: f64| {
            let r = RowReduce {
                draw: Some(Draw {
                    temperature: 1.0,
                    ln_min_p,
                    u,
                }),
                ..RowReduce::top(1)
            };
            reduce_row(&row, &r).drawn.unwrap()
        };
        let n = 40_000;
        let mut counts = [0usize; 4];
        for k in 0..n {
            counts[draw(k as f64 / n as f64, f64::NEG_INFINITY) as usize] += 1;
        }
        assert_eq!(counts[3], 0);
        // Expected 10,000 / 10,000 / 20,000; 5 standard deviations ≈ 500.
        for (c, want) in counts.iter().zip([10_000, 10_000, 20_000]) {
            assert!(c.abs_diff(want) < 500, "{counts:?}");
        }
        // min_p 0.75 keeps only the largest.
        assert!((0..100).all(|k| draw(k as f64 / 100.0, 0.75f64.ln()) == 2));
        let u = [
            race_uniform(0.5, 0),
            race_uniform(0.5, 1),
            race_uniform(0.25, 0),
        ];
        assert!(u.iter().all(|&x| x > 0.0 && x < 1.0));
        assert!(u[0] != u[1] && u[0] != u[2]);
    }

    #[test]
    fn checks_requests() {
        assert!(RowReduce::top(0).check().is_err());
        assert!(RowReduce::top(TOP_MAX + 1).check().is_err());
        let unsorted = RowReduce {
            adjust: vec![
                Adjust {
                    token: 2,
                    bias: 0.0,
                    count: 1,
                },
                Adjust {
                    token: 1,
                    bias: 0.0,
                    count: 1,
                },
            ],
            ..RowReduce::top(1)
        };
        assert!(unsorted.check().is_err());
        let hot = RowReduce {
            draw: Some(Draw {
                temperature: 0.0,
                ln_min_p: f64::NEG_INFINITY,
                u: 0.5,
            }),
            ..RowReduce::top(1)
        };
        assert!(hot.check().is_err());
        assert!(RowReduce::top(TOP_MAX).check().is_ok());
    }
}
