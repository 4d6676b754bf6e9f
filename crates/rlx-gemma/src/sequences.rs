//! Many sequences on one model: a paged K/V pool, and steps that run
//! prefill chunks of some sequences and decode tokens of others together.
//! [`Session`] is the one-conversation wrapper over it.

use std::collections::BTreeMap;

use rlx_runtime::{
    Batch as StepBatch, Executable, KvPool, KvTypes, LogitRows, RowDigest, RowReduce, SeqId,
};

use crate::generate::KeptRow;
use crate::model::{Model, ModelError, Result};

/// Which logits a sequence's tokens in a step want.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// None (a prompt chunk before the last).
    None,
    /// The last token's (generation).
    Last,
    /// Every token's (scoring).
    All,
}

impl Want {
    /// Whether token `i` of `n` wants its logits.
    fn row(self, i: usize, n: usize) -> bool {
        match self {
            Want::None => false,
            Want::Last => i + 1 == n,
            Want::All => true,
        }
    }

    /// How many of `n` tokens want logits.
    fn rows(self, n: usize) -> usize {
        match self {
            Want::None => 0,
            Want::Last => n.min(1),
            Want::All => n,
        }
    }
}

/// Tokens of one sequence in a step.
#[derive(Clone, Copy, Debug)]
pub struct Feed<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub logits: Want,
}

/// The logits of one step: for each feed, in feed order, the rows it asked
/// for (`[rows × vocab]`), held in the one buffer the step returned.
#[derive(Clone, Debug, Default)]
pub struct StepLogits {
    data: Vec<f32>,
    /// Each feed's range of `data`.
    feeds: Vec<std::ops::Range<usize>>,
}

impl StepLogits {
    /// Feeds in the step.
    pub fn len(&self) -> usize {
        self.feeds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.feeds.is_empty()
    }

    /// The logits feed `i` asked for (empty for [`Want::None`]).
    pub fn get(&self, i: usize) -> &[f32] {
        &self.data[self.feeds[i].clone()]
    }

    /// Feed `i`'s logits as an owned vector (no copy when it is the only
    /// feed that asked for any).
    pub fn into_feed(mut self, i: usize) -> Vec<f32> {
        let range = self.feeds[i].clone();
        if range.len() == self.data.len() {
            std::mem::take(&mut self.data)
        } else {
            self.data[range].to_vec()
        }
    }
}

/// What a [`Sequences`] is sized for.
#[derive(Clone, Debug)]
pub struct SequencesOptions {
    /// Most sequences alive at once.
    pub max_seqs: usize,
    /// Tokens of K/V the full-attention layers hold over all sequences
    /// (default: `max_seqs` × the context, rounded up to whole blocks).
    pub kv_tokens: Option<usize>,
    /// Longest sequence in tokens (default: the model's context).
    pub context: Option<usize>,
    /// Most tokens in one step, over all sequences (the prefill chunk).
    pub max_step_tokens: usize,
    /// K/V storage types (default: the device's for the model's precision,
    /// for keys and values).
    pub kv_types: Option<KvTypes>,
    /// Refuse to start when the estimate exceeds this.
    pub memory_limit_bytes: Option<usize>,
}

impl Default for SequencesOptions {
    fn default() -> Self {
        SequencesOptions {
            max_seqs: 1,
            kv_tokens: None,
            context: None,
            max_step_tokens: 512,
            kv_types: None,
            memory_limit_bytes: None,
        }
    }
}

/// The plans of a [`Sequences`]: one for single decode tokens, one for
/// steps of up to `max_step_tokens` rows with a logit row per sequence, and
/// one (compiled on first use) with a logit row per token.
struct Plans {
    decode: Box<dyn Executable>,
    step: Box<dyn Executable>,
    score: Option<Box<dyn Executable>>,
}

/// The plan of the last step.
#[derive(Clone, Copy, Debug)]
enum Last {
    Decode,
    Step,
    Score,
}

/// Sequences sharing one model and one K/V pool.
pub struct Sequences<'m> {
    model: &'m Model,
    pool: KvPool,
    plans: Plans,
    tokens: BTreeMap<SeqId, Vec<u32>>,
    max_seqs: usize,
    max_step_tokens: usize,
    context: usize,
    /// Tokens run through the model so far.
    computed: usize,
    batch: StepBatch,
    last: Option<Last>,
}

impl Model {
    /// A pool and plans for up to `opts.max_seqs` sequences; memory is
    /// estimated and checked before anything is allocated.
    pub fn sequences(&self, opts: SequencesOptions) -> Result<Sequences<'_>> {
        let max_seqs = opts.max_seqs.max(1);
        let context = opts.context.unwrap_or(self.config().context_length).max(1);
        // Each sequence holds whole blocks.
        let per_seq = KvPool::held_tokens(context);
        let kv_tokens = opts.kv_tokens.unwrap_or(per_seq * max_seqs).max(1);
        let context = context.min(kv_tokens);
        let step_tokens = opts.max_step_tokens.clamp(1, kv_tokens);
        let types = opts
            .kv_types
            .unwrap_or_else(|| KvTypes::both(self.default_kv_dtype()));
        let kv_config = self.kv_config(kv_tokens, max_seqs, step_tokens.min(context), types);
        let kv = kv_config.memory_bytes();
        let needed = kv + self.activation_bytes(step_tokens, max_seqs);
        if let Some(limit) = opts.memory_limit_bytes {
            if needed > limit {
                return Err(ModelError::OutOfMemory {
                    needed,
                    kv,
                    limit,
                    what: "allowed".into(),
                });
            }
        }
        if let Some(available) = self.backend().memory().available {
            if needed > available {
                return Err(ModelError::OutOfMemory {
                    needed,
                    kv,
                    limit: available,
                    what: format!("available on {}", self.device()),
                });
            }
        }
        let plans = Plans {
            decode: self.plan(1, 1)?,
            step: self.plan(step_tokens, max_seqs.min(step_tokens))?,
            score: None,
        };
        Ok(Sequences {
            model: self,
            pool: self.backend().kv_pool(kv_config)?,
            plans,
            tokens: BTreeMap::new(),
            max_seqs,
            max_step_tokens: step_tokens,
            context,
            computed: 0,
            batch: StepBatch::new(),
            last: None,
        })
    }
}

impl<'m> Sequences<'m> {
    pub fn model(&self) -> &'m Model {
        self.model
    }

    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Longest sequence in tokens.
    pub fn context(&self) -> usize {
        self.context
    }

    pub fn max_seqs(&self) -> usize {
        self.max_seqs
    }

    /// Most tokens one step may carry.
    pub fn max_step_tokens(&self) -> usize {
        self.max_step_tokens
    }

    /// Tokens run through the model so far (prefix reuse keeps this low).
    pub fn computed_tokens(&self) -> usize {
        self.computed
    }

    /// A new, empty sequence.
    pub fn add(&mut self) -> Result<SeqId> {
        Ok(self.add_cached(&[])?.0)
    }

    /// A new sequence continuing from what `seq` holds, sharing its K/V
    /// blocks (copied only where one of them writes).
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        let tokens = self.tokens(seq)?.to_vec();
        if self.tokens.len() >= self.max_seqs {
            return Err(ModelError::Invalid(format!(
                "cannot fork {seq}: {} sequences are alive, the most this pool was sized for",
                self.max_seqs
            )));
        }
        let id = self.pool.fork(seq)?;
        self.tokens.insert(id, tokens);
        Ok(id)
    }

    /// A new sequence starting with the longest prefix of `tokens` (whole
    /// blocks) that the pool's prefix cache holds, and that prefix's length:
    /// those tokens' K/V are shared, not computed again.
    pub fn add_cached(&mut self, tokens: &[u32]) -> Result<(SeqId, usize)> {
        if self.tokens.len() >= self.max_seqs {
            return Err(ModelError::Invalid(format!(
                "{} sequences are alive, the most this pool was sized for",
                self.max_seqs
            )));
        }
        let (id, n) = self.pool.add_cached(tokens);
        self.tokens.insert(id, tokens[..n].to_vec());
        Ok((id, n))
    }

    /// Tokens at the start of `tokens` that [`Sequences::add_cached`] would
    /// take from the cache.
    pub fn cached_prefix(&self, tokens: &[u32]) -> usize {
        self.pool.cached_prefix(tokens)
    }

    /// Offers a sequence's full blocks to the prefix cache, for later
    /// sequences that start with the same tokens (the cache keeps them
    /// after the sequence is removed, until the pool needs the room).
    pub fn publish(&mut self, seq: SeqId) -> Result<()> {
        let tokens = self
            .tokens
            .get(&seq)
            .ok_or(ModelError::Kv(rlx_runtime::KvError::UnknownSeq(seq)))?;
        self.pool.publish(seq, tokens)?;
        Ok(())
    }

    /// Ends a sequence; its blocks go back to the pool.
    pub fn remove(&mut self, seq: SeqId) -> Result<()> {
        self.pool.free(seq)?;
        self.tokens.remove(&seq);
        Ok(())
    }

    /// The tokens a sequence holds.
    pub fn tokens(&self, seq: SeqId) -> Result<&[u32]> {
        self.tokens
            .get(&seq)
            .map(Vec::as_slice)
            .ok_or(ModelError::Kv(rlx_runtime::KvError::UnknownSeq(seq)))
    }

    /// Forgets everything after the first `len` tokens of a sequence if the
    /// pool still holds what continuing from there needs; `false` (and
    /// nothing changed) when a sliding layer no longer holds that window.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<bool> {
        let held = self.tokens(seq)?.len();
        if len >= held {
            return Ok(true);
        }
        match self.pool.truncate(seq, len) {
            Ok(()) => {
                self.tokens.get_mut(&seq).expect("checked").truncate(len);
                Ok(true)
            }
            Err(rlx_runtime::KvError::RewindTooFar { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Forgets everything after the first `len` tokens of a sequence. When a
    /// sliding layer no longer holds the window that needs, the kept prefix
    /// runs again.
    pub fn rewind(&mut self, seq: SeqId, len: usize) -> Result<()> {
        if self.truncate(seq, len)? {
            return Ok(());
        }
        let keep = self.tokens[&seq][..len].to_vec();
        self.truncate(seq, 0)?;
        for chunk in keep.chunks(self.max_step_tokens) {
            self.step(&[Feed {
                seq,
                tokens: chunk,
                logits: Want::None,
            }])?;
        }
        Ok(())
    }

    /// Runs one step: every feed's tokens appended to its sequence, all in
    /// one pass over the weights. Returns, per feed, the logits it asked for
    /// (`[rows × vocab]`: none, its last token's, or all of its tokens').
    pub fn step(&mut self, feeds: &[Feed]) -> Result<StepLogits> {
        match self.run_step(feeds, None)? {
            LogitRows::Full(data) => Ok(self.split_rows(feeds, data)),
            LogitRows::Reduced(_) => unreachable!("no reduction was asked for"),
        }
    }

    /// Like [`Sequences::step`], with every logit row (in feed order) reduced
    /// as `rows` asks where the device can (a GPU: the rows stay there,
    /// and [`Sequences::fetch_row`] reads one back until the next step);
    /// elsewhere the rows come back whole, in one `[rows × vocab]` buffer.
    pub fn step_reduced(&mut self, feeds: &[Feed], rows: &[RowReduce]) -> Result<LogitRows> {
        self.run_step(feeds, Some(rows))
    }

    /// Logit row `row` of the last [`Sequences::step_reduced`], whose rows
    /// stayed on the device.
    pub fn fetch_row(&mut self, row: usize) -> Result<Vec<f32>> {
        Ok(self.last_plan()?.fetch_row("logits", row)?)
    }

    /// Logit row `row` of the last [`Sequences::step_reduced`] reduced
    /// again as `req` asks, where it stayed on the device.
    pub fn reduce_row(&mut self, row: usize, req: &RowReduce) -> Result<RowDigest> {
        Ok(self.last_plan()?.reduce_kept("logits", row, req)?)
    }

    /// `token`'s logit in row `row` of the last [`Sequences::step_reduced`],
    /// where it stayed on the device.
    pub fn fetch_logit(&mut self, row: usize, token: u32) -> Result<f32> {
        Ok(self.last_plan()?.fetch_logit("logits", row, token)?)
    }

    /// Row `row` of the last [`Sequences::step_reduced`], where it stayed on
    /// the device.
    pub fn kept(&mut self, row: usize) -> Kept<'_, 'm> {
        Kept { seqs: self, row }
    }

    /// The plan of the last step, whose logit rows it keeps.
    fn last_plan(&mut self) -> Result<&mut Box<dyn Executable>> {
        match self.last {
            Some(Last::Decode) => Ok(&mut self.plans.decode),
            Some(Last::Step) => Ok(&mut self.plans.step),
            Some(Last::Score) => Ok(self.plans.score.as_mut().expect("ran a step")),
            None => Err(ModelError::Invalid(
                "no step has kept its logit rows".into(),
            )),
        }
    }

    fn split_rows(&self, feeds: &[Feed], logits: Vec<f32>) -> StepLogits {
        let vocab = self.model.config().n_vocab;
        let mut feeds_at = Vec::with_capacity(feeds.len());
        let mut at = 0;
        for f in feeds {
            let n = f.logits.rows(f.tokens.len());
            feeds_at.push(at..at + n * vocab);
            at += n * vocab;
        }
        debug_assert_eq!(at, logits.len());
        StepLogits {
            data: logits,
            feeds: feeds_at,
        }
    }

    fn run_step(&mut self, feeds: &[Feed], reduce: Option<&[RowReduce]>) -> Result<LogitRows> {
        let vocab = self.model.config().n_vocab;
        let total: usize = feeds.iter().map(|f| f.tokens.len()).sum();
        if total == 0 {
            return Err(ModelError::Empty);
        }
        if total > self.max_step_tokens {
            return Err(ModelError::Invalid(format!(
                "{total} tokens in one step, more than the {} this pool was sized for",
                self.max_step_tokens
            )));
        }
        self.batch.clear();
        let mut logit_rows = 0;
        for f in feeds {
            let held = self.tokens(f.seq)?.len();
            if let Some(&t) = f.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(ModelError::BadToken { token: t, vocab });
            }
            if held + f.tokens.len() > self.context {
                return Err(ModelError::ContextFull {
                    tokens: held + f.tokens.len(),
                    context: self.context,
                });
            }
            let n = f.tokens.len();
            logit_rows += f.logits.rows(n);
            self.batch
                .push_run(f.seq, held, f.tokens, |i| f.logits.row(i, n));
        }
        if let Some(rows) = reduce.filter(|r| r.len() != logit_rows) {
            return Err(ModelError::Invalid(format!(
                "{} reductions for a step of {logit_rows} logit rows",
                rows.len()
            )));
        }
        let (last, plan) = if total == 1 && logit_rows <= 1 {
            (Last::Decode, &mut self.plans.decode)
        } else if logit_rows <= self.max_seqs.min(self.max_step_tokens) {
            (Last::Step, &mut self.plans.step)
        } else {
            let plan = match &mut self.plans.score {
                Some(p) => p,
                slot => slot.insert(
                    self.model
                        .plan(self.max_step_tokens, self.max_step_tokens)?,
                ),
            };
            (Last::Score, plan)
        };
        self.last = None;
        let rows = match reduce {
            Some(rows) => {
                plan.run_reduced(&self.batch, Some(&mut self.pool), "logits", rows)?
                    .1
            }
            None => LogitRows::Full(
                plan.run(&self.batch, Some(&mut self.pool))?
                    .take_f32("logits")?,
            ),
        };
        self.last = Some(last);
        for f in feeds {
            self.tokens
                .get_mut(&f.seq)
                .expect("checked")
                .extend_from_slice(f.tokens);
            self.computed += f.tokens.len();
        }
        Ok(rows)
    }
}

/// Options of one session.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Context length in tokens (default: the model's).
    pub context: Option<usize>,
    /// Tokens per prefill step.
    pub prefill_chunk: usize,
    /// K/V storage types (default: the device's for the model's precision,
    /// for keys and values).
    pub kv_types: Option<KvTypes>,
    /// Refuse to start when the estimate exceeds this.
    pub memory_limit_bytes: Option<usize>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            context: None,
            prefill_chunk: 512,
            kv_types: None,
            memory_limit_bytes: None,
        }
    }
}

/// One conversation: a single sequence with chunked prefill, decode,
/// prefix reuse and rewind.
pub struct Session<'m> {
    seqs: Sequences<'m>,
    id: SeqId,
}

impl Model {
    /// Starts a session; its memory is estimated and checked before anything
    /// is allocated.
    pub fn session(&self, opts: SessionOptions) -> Result<Session<'_>> {
        let context = opts.context.unwrap_or(self.config().context_length).max(1);
        let mut seqs = self.sequences(SequencesOptions {
            max_seqs: 1,
            kv_tokens: Some(context),
            context: Some(context),
            max_step_tokens: opts.prefill_chunk.clamp(1, context),
            kv_types: opts.kv_types,
            memory_limit_bytes: opts.memory_limit_bytes,
        })?;
        let id = seqs.add()?;
        Ok(Session { seqs, id })
    }
}

impl<'m> Session<'m> {
    /// Tokens run through the model so far (prefix reuse keeps this low).
    pub fn computed_tokens(&self) -> usize {
        self.seqs.computed_tokens()
    }

    pub fn model(&self) -> &Model {
        self.seqs.model()
    }

    /// Tokens whose K/V the cache holds.
    pub fn tokens(&self) -> &[u32] {
        self.seqs.tokens(self.id).expect("the session's sequence")
    }

    pub fn context(&self) -> usize {
        self.seqs.context()
    }

    /// Most tokens one step carries (the prefill chunk).
    pub fn max_step_tokens(&self) -> usize {
        self.seqs.max_step_tokens()
    }

    /// Bytes of K/V storage allocated.
    pub fn kv_bytes(&self) -> usize {
        self.seqs.pool().memory_bytes()
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        let vocab = self.model().config().n_vocab;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::BadToken { token: t, vocab });
        }
        let held = self.tokens().len();
        if held + tokens.len() > self.context() {
            return Err(ModelError::ContextFull {
                tokens: held + tokens.len(),
                context: self.context(),
            });
        }
        Ok(())
    }

    /// Appends `tokens` (prefilled in chunks) and returns the logits of the
    /// last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.feed_with_progress(tokens, &mut |_, _| {})
    }

    /// Like [`Session::feed`], calling `progress(done, total)` after each chunk.
    pub fn feed_with_progress(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let mut last = Vec::new();
        let mut done = 0;
        let chunk = self.seqs.max_step_tokens();
        for part in tokens.chunks(chunk) {
            let logits = if done + part.len() == tokens.len() {
                Want::Last
            } else {
                Want::None
            };
            last = self.run(part, logits)?;
            done += part.len();
            progress(done, tokens.len());
        }
        Ok(last)
    }

    fn run(&mut self, tokens: &[u32], logits: Want) -> Result<Vec<f32>> {
        let feed = Feed {
            seq: self.id,
            tokens,
            logits,
        };
        Ok(self.seqs.step(&[feed])?.into_feed(0))
    }

    /// Appends `tokens` (one step's worth at most) and returns the last
    /// one's logit row reduced as `row` asks where the device can
    /// ([`Sequences::step_reduced`]), whole elsewhere.
    pub fn feed_reduced(&mut self, tokens: &[u32], row: &RowReduce) -> Result<LogitRows> {
        self.check(tokens)?;
        if tokens.len() > self.seqs.max_step_tokens() {
            return Err(ModelError::Invalid(format!(
                "{} tokens in one step, more than the {} this session was sized for",
                tokens.len(),
                self.seqs.max_step_tokens()
            )));
        }
        let feed = Feed {
            seq: self.id,
            tokens,
            logits: Want::Last,
        };
        self.seqs.step_reduced(&[feed], std::slice::from_ref(row))
    }

    /// The last [`Session::feed_reduced`]'s logit row, read back whole.
    pub fn fetch_last(&mut self) -> Result<Vec<f32>> {
        self.seqs.fetch_row(0)
    }

    /// The row of the last [`Session::feed_reduced`], where it stayed on
    /// the device.
    pub fn kept_last(&mut self) -> Kept<'_, 'm> {
        self.seqs.kept(0)
    }

    /// Appends `tokens` and returns the logits of every one of them,
    /// `[tokens.len() × vocab]`.
    pub fn score(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let mut all = Vec::with_capacity(tokens.len() * self.model().config().n_vocab);
        for part in tokens.chunks(self.seqs.max_step_tokens()) {
            all.extend(self.run(part, Want::All)?);
        }
        Ok(all)
    }

    /// Forgets everything after the first `len` tokens.
    pub fn rewind(&mut self, len: usize) -> Result<()> {
        self.seqs.rewind(self.id, len)
    }

    /// Continues from `tokens`, reusing the cached prefix they share with
    /// what the session holds; returns the logits of the last token.
    pub fn feed_prompt(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.feed_prompt_with_progress(tokens, &mut |_, _| {})
    }

    /// Like [`Session::feed_prompt`], reporting prefill progress.
    pub fn feed_prompt_with_progress(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<f32>> {
        let common = self
            .tokens()
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        // At least one token must run to produce logits.
        let keep = common.min(tokens.len().saturating_sub(1));
        self.rewind(keep)?;
        let keep = self.tokens().len();
        self.feed_with_progress(&tokens[keep..], progress)
    }

    pub fn reset(&mut self) {
        // Truncating to nothing always succeeds.
        let _ = self.seqs.rewind(self.id, 0);
    }
}

/// A logit row of the last reduced step, kept on the device.
pub struct Kept<'a, 'm> {
    seqs: &'a mut Sequences<'m>,
    row: usize,
}

impl KeptRow for Kept<'_, '_> {
    fn fetch(&mut self) -> std::result::Result<Vec<f32>, String> {
        self.seqs.fetch_row(self.row).map_err(|e| e.to_string())
    }

    fn reduce(&mut self, req: &RowReduce) -> std::result::Result<RowDigest, String> {
        self.seqs
            .reduce_row(self.row, req)
            .map_err(|e| e.to_string())
    }

    fn logit(&mut self, token: u32) -> std::result::Result<f32, String> {
        self.seqs
            .fetch_logit(self.row, token)
            .map_err(|e| e.to_string())
    }
}
