//! The engine: one thread that owns the model's sequences and steps every
//! running request together (continuous batching). Requests join and leave
//! between steps; each step carries one token of every generating request
//! and prompt chunks of the others under a token budget, so a long prompt
//! does not stall the streams already generating. Finished requests keep
//! their sequence for a while: a new prompt that starts the same way forks
//! it and runs only the rest (a conversation re-sent with one more turn, a
//! shared system prompt), its blocks shared until one side writes. With
//! speculation on (`EngineOptions::speculation`), a generating request
//! carries a draft in its place in the step — the tokens that followed its
//! last tokens where they occurred before (prompt lookup), or a draft
//! model's greedy continuation (every request's drafted together, a token
//! a draft step) — and keeps those its own samples confirm: the drafts of
//! many sequences are verified in one step.

use rlx_runtime::KvPool;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

pub use rlx_gemma::generate::TokenLogprob;
use rlx_gemma::generate::{
    keep_drafted, Constraint, DraftSource, Finish as GenFinish, Generation, GenerationOptions,
    Piece, Row, Speculation,
};
use rlx_gemma::sampling::{Sampler, SamplerConfig};
use rlx_gemma::speculative::{greedy_token, DraftControl, NgramIndex};
use rlx_gemma::{
    Feed, LogitRows, Model, ModelError, SeqId, Sequences, SequencesOptions, StepLogits, Want,
};
use rlx_runtime::KvTypes;
use rlx_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

/// One generation request, already tokenized.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Send each sampled token's log-probability with this many of the
    /// likeliest alternatives (`None`: text only).
    pub logprobs: Option<usize>,
    /// Where the text goes; generation stops when the receiver is dropped
    /// (the client went away).
    pub events: UnboundedSender<Event>,
    /// What the output must match (structured output): tokens it rules out
    /// are masked before each sample, and the request ends when the output
    /// is complete.
    pub constraint: Option<Box<dyn Constraint + Send>>,
    /// Whether drafts may speed this request up where the engine drafts
    /// (`EngineOptions::speculation`); a request that asks for
    /// log-probabilities decodes one token a step regardless.
    pub speculative: bool,
}

/// What the engine sends back for a job: text pieces (with log-probabilities
/// when asked for, one event per sampled token), then `Done` or `Error`.
#[derive(Debug)]
pub enum Event {
    Text(String),
    /// A sampled token, the text it released (possibly none yet) and its
    /// log-probability.
    Token {
        text: String,
        logprob: TokenLogprob,
    },
    Done(Finish),
    Error(JobError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` ran out.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// How a job ended and what it cost.
#[derive(Clone, Copy, Debug)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens found in the cache (not run again).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// The output's length in bytes when its constraint began closing it,
    /// if it did (see `Constraint::closed_at`).
    pub closed_at: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The request asked for something the model cannot do.
    #[error("{0}")]
    Invalid(String),
    /// The queue is full; try again later.
    #[error("the server is busy: {0} requests are waiting (try again shortly)")]
    Busy(usize),
    #[error("{0}")]
    Internal(String),
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("cannot start the engine thread: {0}")]
    Thread(std::io::Error),
    #[error("the engine thread ended before it was ready")]
    Died,
}

/// How the engine is sized.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Requests generated at once.
    pub parallel: usize,
    /// Tokens one request may hold: prompt plus generated.
    pub context: usize,
    /// Tokens per step: decode tokens first, prompt chunks in what is left.
    pub step_tokens: usize,
    /// K/V storage types (default: the device's for the model's precision).
    pub kv_types: Option<KvTypes>,
    /// Requests that may wait for a place; more are refused as busy.
    pub max_queue: usize,
    /// Drafts verified in the step, per request: by prompt lookup, or
    /// ([`DraftSource::Model`]) by the draft model handed to
    /// [`Engine::start_with_draft`]; `None` decodes one token a request a
    /// step.
    pub speculation: Option<Speculation>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            parallel: 1,
            context: 4096,
            step_tokens: 512,
            kv_types: None,
            max_queue: 64,
            speculation: None,
        }
    }
}

/// Load the engine reports, updated between steps.
#[derive(Debug, Default)]
pub struct Load {
    /// Requests submitted and not yet running.
    pub waiting: AtomicUsize,
    /// Requests running.
    pub running: AtomicUsize,
    /// Bytes of K/V blocks in use (running sequences and the prefix cache).
    pub kv_used_bytes: AtomicUsize,
    /// Blocks the prefix cache holds.
    pub cached_blocks: AtomicUsize,
    /// Generated tokens a constraint forced (taken without sampling).
    pub forced_tokens: AtomicU64,
    /// Tokens drafted, and those of them kept.
    pub drafted_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    pub kv_total_bytes: AtomicUsize,
    /// Prompt tokens run and taken from the cache, tokens generated.
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Seconds spent in steps (as f64 bits).
    busy_secs: AtomicU64,
}

impl Load {
    pub fn busy_secs(&self) -> f64 {
        f64::from_bits(self.busy_secs.load(Ordering::Relaxed))
    }

    fn add_busy(&self, secs: f64) {
        let total = self.busy_secs() + secs;
        self.busy_secs.store(total.to_bits(), Ordering::Relaxed);
    }
}

/// The engine thread and the queue in front of it.
pub struct Engine {
    queue: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    tokenizer: Arc<Tokenizer>,
    context: usize,
    max_queue: usize,
    load: Arc<Load>,
}

impl Engine {
    /// Starts the thread; fails if the K/V pool for `opts` cannot be made.
    pub fn start(
        model: Model,
        tokenizer: Arc<Tokenizer>,
        opts: EngineOptions,
    ) -> Result<Engine, StartError> {
        Engine::start_with_draft(model, None, tokenizer, opts)
    }

    /// [`Engine::start`] with a draft model of the same vocabulary, for
    /// speculation from [`DraftSource::Model`]: it keeps a sequence of its
    /// own per drafting request, in a pool sized as the model's.
    pub fn start_with_draft(
        model: Model,
        draft: Option<Model>,
        tokenizer: Arc<Tokenizer>,
        opts: EngineOptions,
    ) -> Result<Engine, StartError> {
        let invalid = |what: String| Err(StartError::Model(ModelError::Invalid(what)));
        match (opts.speculation.map(|s| s.source), &draft) {
            (Some(DraftSource::Model), None) => {
                return invalid("speculation with a draft model needs the draft model".into())
            }
            (Some(DraftSource::Ngram) | None, Some(_)) => {
                return invalid("a draft model was given, but speculation does not draft with one".into())
            }
            (_, Some(d)) if d.config().n_vocab != model.config().n_vocab => {
                return invalid(format!(
                    "the draft model has {} tokens in its vocabulary, the model {}: drafts need the same vocabulary",
                    d.config().n_vocab,
                    model.config().n_vocab
                ))
            }
            _ => {}
        }
        let (queue, jobs) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel();
        let tok = Arc::clone(&tokenizer);
        let load = Arc::new(Load::default());
        let engine_load = Arc::clone(&load);
        let max_queue = opts.max_queue;
        let thread = std::thread::Builder::new()
            .name("rlx-engine".into())
            .spawn(move || {
                let parallel = opts.parallel.max(1);
                let context = opts.context.max(1);
                let sized = SequencesOptions {
                    max_seqs: parallel,
                    kv_tokens: Some(parallel * KvPool::held_tokens(context)),
                    context: Some(context),
                    max_step_tokens: opts.step_tokens.max(parallel),
                    kv_types: opts.kv_types,
                    memory_limit_bytes: None,
                };
                let both = model.sequences(sized.clone()).and_then(|s| {
                    let d = draft.as_ref().map(|d| d.sequences(sized)).transpose()?;
                    Ok((s, d))
                });
                let (seqs, draft_seqs) = match both {
                    Ok((s, d)) => {
                        let _ = ready_tx.send(Ok(s.context()));
                        (s, d)
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                engine_load
                    .kv_total_bytes
                    .store(seqs.pool().memory_bytes(), Ordering::Relaxed);
                let mut scheduler = Scheduler::new(seqs, tok, parallel, engine_load);
                scheduler.speculation = opts.speculation;
                scheduler.draft = draft_seqs;
                scheduler.run(&jobs);
            })
            .map_err(StartError::Thread)?;
        let context = ready.recv().map_err(|_| StartError::Died)??;
        Ok(Engine {
            queue: Some(queue),
            thread: Some(thread),
            tokenizer,
            context,
            max_queue,
            load,
        })
    }

    /// What the engine is doing.
    pub fn load(&self) -> &Load {
        &self.load
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Tokens one request may hold (prompt plus generated).
    pub fn context(&self) -> usize {
        self.context
    }

    /// Queues a job; its events arrive on `job.events`. Refused as busy
    /// when the queue already holds `max_queue` jobs.
    pub fn submit(&self, job: Job) -> Result<(), JobError> {
        let waiting = self.load.waiting.fetch_add(1, Ordering::Relaxed);
        if waiting >= self.max_queue {
            self.load.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(JobError::Busy(waiting));
        }
        self.queue
            .as_ref()
            .and_then(|q| q.send(job).ok())
            .ok_or_else(|| {
                self.load.waiting.fetch_sub(1, Ordering::Relaxed);
                JobError::Internal("the engine has stopped".into())
            })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the queue ends the thread once the running requests finish.
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request being served.
struct Running {
    job: Job,
    seq: SeqId,
    /// Prompt tokens in the sequence (the reused prefix included).
    fed: usize,
    cached: usize,
    /// Sampling, stop tokens and strings, forced tokens, the text: what
    /// `rlx run` drives too.
    generation: Generation,
    started: Instant,
    first_token: Option<Instant>,
    /// Where the request drafts: its drafts' source and length.
    drafting: Option<Drafting>,
}

/// A request's drafts: where they come from, their length, and what the
/// step being planned runs for it.
struct Drafting {
    source: Proposer,
    control: DraftControl,
    /// The pending token and its draft, when the step verifies one.
    run: Vec<u32>,
}

/// Where a request's drafts come from.
enum Proposer {
    /// Prompt lookup: the index over its prompt and output, and the
    /// generated tokens it holds.
    Ngram { index: NgramIndex, indexed: usize },
    /// The draft model's sequence for the request (what it holds is
    /// brought to the request's tokens before each draft).
    Model { seq: SeqId },
}

/// What one request contributes to a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// The next `n` prompt tokens.
    Prompt { n: usize },
    /// The first `n` pending generated tokens.
    Generated { n: usize },
}

/// What a step of at most `budget` tokens carries of requests that each
/// have `pending` generated tokens to run and `prompt_left` prompt tokens
/// not yet run: every request's pending tokens first, in order, as far as
/// the budget goes (decode is never starved by prompts), then prompt chunks
/// of the requests with nothing pending, in order, in what is left.
fn plan_step(budget: usize, requests: &[(usize, usize)]) -> Vec<(usize, Part)> {
    let mut budget = budget;
    let mut plan = Vec::new();
    for (i, &(pending, _)) in requests.iter().enumerate() {
        let n = pending.min(budget);
        if n > 0 {
            plan.push((i, Part::Generated { n }));
            budget -= n;
        }
    }
    for (i, &(pending, left)) in requests.iter().enumerate() {
        let n = left.min(budget);
        if pending == 0 && n > 0 {
            plan.push((i, Part::Prompt { n }));
            budget -= n;
        }
    }
    plan
}

struct Scheduler<'m> {
    seqs: Sequences<'m>,
    tok: Arc<Tokenizer>,
    parallel: usize,
    running: Vec<Running>,
    waiting: VecDeque<Job>,
    load: Arc<Load>,
    speculation: Option<Speculation>,
    /// The draft model's sequences, where speculation drafts with one.
    draft: Option<Sequences<'m>>,
}

impl<'m> Scheduler<'m> {
    fn new(seqs: Sequences<'m>, tok: Arc<Tokenizer>, parallel: usize, load: Arc<Load>) -> Self {
        Scheduler {
            seqs,
            tok,
            parallel,
            running: Vec::new(),
            waiting: VecDeque::new(),
            load,
            speculation: None,
            draft: None,
        }
    }

    /// Steps until the queue is closed and every request has finished.
    fn run(mut self, jobs: &mpsc::Receiver<Job>) {
        let mut open = true;
        loop {
            while open {
                match jobs.try_recv() {
                    Ok(job) => self.waiting.push_back(job),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => open = false,
                }
            }
            if self.running.is_empty() && self.waiting.is_empty() {
                if !open {
                    return;
                }
                match jobs.recv() {
                    Ok(job) => self.waiting.push_back(job),
                    Err(_) => return,
                }
            }
            self.admit();
            self.drop_gone();
            if !self.running.is_empty() {
                let t = Instant::now();
                self.step();
                self.load.add_busy(t.elapsed().as_secs_f64());
            }
            self.load
                .running
                .store(self.running.len(), Ordering::Relaxed);
            self.load
                .kv_used_bytes
                .store(self.seqs.pool().used_bytes(), Ordering::Relaxed);
            self.load
                .cached_blocks
                .store(self.seqs.pool().cached_blocks(), Ordering::Relaxed);
        }
    }

    /// Starts waiting requests while there is room.
    fn admit(&mut self) {
        let mut deferred = VecDeque::new();
        while self.running.len() < self.parallel {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            if job.events.is_closed() {
                self.load.waiting.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            // A prompt that shares more whole blocks with one still being
            // prefilled than the cache holds waits for it, then takes those
            // blocks from the cache instead of computing the same prefix
            // again (many users, one system prompt); the wait ends when that
            // prompt is in.
            let limit = job.prompt.len().saturating_sub(1);
            let soon = self
                .running
                .iter()
                .filter(|r| r.fed < r.job.prompt.len())
                .map(|r| KvPool::shareable_tokens(common(&r.job.prompt, &job.prompt).min(limit)))
                .max()
                .unwrap_or(0);
            if soon > self.seqs.cached_prefix(&job.prompt[..limit]) {
                deferred.push_back(job);
                continue;
            }
            self.load.waiting.fetch_sub(1, Ordering::Relaxed);
            if let Some(r) = self.start(job) {
                self.load
                    .cached_tokens
                    .fetch_add(r.cached as u64, Ordering::Relaxed);
                self.running.push(r);
            }
        }
        while let Some(job) = deferred.pop_back() {
            self.waiting.push_front(job);
        }
    }

    /// A running request for `job`, starting from the longest prefix of its
    /// prompt the pool's prefix cache holds; `None` when it cannot start
    /// (the client is told why).
    fn start(&mut self, job: Job) -> Option<Running> {
        let fail = |job: &Job, e: JobError| {
            let _ = job.events.send(Event::Error(e));
        };
        let sampler = match Sampler::new(job.sampler.clone()) {
            Ok(s) => s,
            Err(e) => {
                fail(&job, JobError::Invalid(e.to_string()));
                return None;
            }
        };
        // At least the prompt's last token runs, for the logits.
        let limit = job.prompt.len().saturating_sub(1);
        let (seq, cached) = match self.seqs.add_cached(&job.prompt[..limit]) {
            Ok(found) => found,
            Err(e) => {
                fail(&job, JobError::Internal(e.to_string()));
                return None;
            }
        };
        let opts = GenerationOptions {
            max_tokens: job.max_tokens,
            stop_tokens: if job.ignore_eos {
                Vec::new()
            } else {
                self.tok.eog_ids().to_vec()
            },
            stop_strings: job.stop.clone(),
            logprobs: job.logprobs,
            speculation: None,
        };
        let draft = &mut self.draft;
        let drafting = self
            .speculation
            .filter(|_| job.speculative && job.logprobs.is_none())
            .and_then(|spec| {
                let source = match spec.source {
                    DraftSource::Ngram => {
                        let mut index = NgramIndex::new(spec.ngram);
                        index.extend(&job.prompt);
                        Proposer::Ngram { index, indexed: 0 }
                    }
                    // Where the draft pool has no room, the request decodes
                    // without drafts.
                    DraftSource::Model => {
                        let (seq, _) = draft.as_mut()?.add_cached(&job.prompt[..limit]).ok()?;
                        Proposer::Model { seq }
                    }
                };
                Some(Drafting {
                    source,
                    control: DraftControl::new(spec.draft),
                    run: Vec::new(),
                })
            });
        Some(Running {
            drafting,
            generation: Generation::new(sampler, &job.prompt, opts),
            job,
            seq,
            fed: cached,
            cached,
            started: Instant::now(),
            first_token: None,
        })
    }

    /// Ends requests whose client went away; their blocks go back at once.
    fn drop_gone(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].job.events.is_closed() {
                let r = self.running.swap_remove(i);
                self.release(&r, true);
            } else {
                i += 1;
            }
        }
    }

    /// One step over every running request.
    /// Drafts for the requests that decode one token a step, as long as the
    /// step's budget (after every pending token) and each one's context
    /// allow: by prompt lookup, or with the draft model for all of its
    /// requests together ([`Scheduler::draft_with_model`]).
    fn draft(&mut self) {
        let pending: usize = self
            .running
            .iter()
            .map(|r| r.generation.pending().len())
            .sum();
        let mut budget = self.seqs.max_step_tokens().saturating_sub(pending);
        let context = self.seqs.context();
        let mut by_model = Vec::new();
        for (i, r) in self.running.iter_mut().enumerate() {
            let Some(d) = r.drafting.as_mut() else {
                continue;
            };
            d.run.clear();
            let pending = r.generation.pending();
            if pending.len() != 1 || r.fed < r.job.prompt.len() {
                continue;
            }
            let held = self.seqs.tokens(r.seq).map_or(context, |t| t.len());
            let generated = r.generation.tokens();
            let left = r.job.max_tokens.saturating_sub(generated.len());
            let room = context.saturating_sub(held + 1);
            let k = d.control.length().min(left).min(room).min(budget);
            let draft = match &mut d.source {
                Proposer::Ngram { index, indexed } => {
                    index.extend(&generated[*indexed..]);
                    *indexed = generated.len();
                    if k > 0 {
                        index.propose(k).to_vec()
                    } else {
                        Vec::new()
                    }
                }
                Proposer::Model { .. } if k > 0 => {
                    by_model.push((i, k));
                    budget -= k;
                    continue;
                }
                Proposer::Model { .. } => Vec::new(),
            };
            budget -= r.take_draft(draft);
        }
        if !by_model.is_empty() {
            self.draft_with_model(&by_model);
        }
    }

    /// Drafts of up to `k` tokens for each `(request, k)` of `wanted` with
    /// the draft model, in steps of its own over all of them: the first
    /// brings each request's draft sequence to the request's tokens and its
    /// pending token (from where they first differ) and gives the first
    /// drafted token, each further step runs every draft's last token for
    /// the next (the draft model's greedy choice). A catch-up longer than
    /// what is left of the draft model's step runs in part, without a
    /// draft this step. The draft steps' time is shared out by drafted
    /// tokens, for the requests' draft lengths.
    fn draft_with_model(&mut self, wanted: &[(usize, usize)]) {
        struct Drafted {
            i: usize,
            seq: SeqId,
            k: usize,
            feed: Vec<u32>,
            out: Vec<u32>,
        }
        let Some(dseqs) = self.draft.as_mut() else {
            return;
        };
        let t = Instant::now();
        let mut room = dseqs.max_step_tokens();
        let mut jobs = Vec::new();
        for &(i, k) in wanted {
            let r = &self.running[i];
            let Some(Proposer::Model { seq }) = r.drafting.as_ref().map(|d| &d.source) else {
                continue;
            };
            let mut want = self
                .seqs
                .tokens(r.seq)
                .map_or_else(|_| Vec::new(), <[u32]>::to_vec);
            want.extend_from_slice(r.generation.pending());
            let same = dseqs.tokens(*seq).map_or(0, |held| common(held, &want));
            // The last token runs again if need be: its row is the first
            // draft's.
            let from = same.min(want.len() - 1);
            if room == 0 || dseqs.rewind(*seq, from).is_err() {
                continue;
            }
            let n = (want.len() - from).min(room);
            room -= n;
            jobs.push(Drafted {
                i,
                seq: *seq,
                k: if from + n == want.len() { k } else { 0 },
                feed: want[from..from + n].to_vec(),
                out: Vec::new(),
            });
        }
        let mut first = true;
        loop {
            let active: Vec<usize> = (0..jobs.len())
                .filter(|&j| first || jobs[j].out.len() < jobs[j].k)
                .collect();
            if active.is_empty() {
                break;
            }
            let feeds: Vec<Feed> = active
                .iter()
                .map(|&j| {
                    let d = &jobs[j];
                    Feed {
                        seq: d.seq,
                        tokens: if first {
                            &d.feed
                        } else {
                            &d.out[d.out.len() - 1..]
                        },
                        logits: if d.k > 0 { Want::Last } else { Want::None },
                    }
                })
                .collect();
            let logits = match dseqs.step(&feeds) {
                Ok(l) => l,
                // No drafts this step; the next finds what the draft
                // sequences hold.
                Err(_) => {
                    jobs.iter_mut().for_each(|d| d.out.clear());
                    break;
                }
            };
            for (f, &j) in active.iter().enumerate() {
                if jobs[j].k > 0 {
                    let token = greedy_token(logits.get(f));
                    jobs[j].out.push(token);
                }
            }
            first = false;
        }
        let drafted: usize = jobs.iter().map(|d| d.out.len()).sum();
        let secs = t.elapsed().as_secs_f64();
        for d in jobs {
            let r = &mut self.running[d.i];
            if let Some(control) = r.drafting.as_mut().map(|x| &mut x.control) {
                if !d.out.is_empty() {
                    control.drafting_timed(d.out.len(), secs * d.out.len() as f64 / drafted as f64);
                }
            }
            r.take_draft(d.out);
        }
    }

    /// The rows of a step that verified request `i`'s draft (`rows`: one
    /// a token of its run): each sampled in turn, the drafted tokens kept
    /// up to the first whose row sampled another, the sequence rewound
    /// past the rest.
    fn verify(&mut self, i: usize, rows: &[f32]) -> Next {
        let r = &mut self.running[i];
        let d = r.drafting.as_mut().expect("a request that drafted");
        let run = std::mem::take(&mut d.run);
        let draft = &run[1..];
        // The pending token ran; the sequence holds it and the draft.
        r.generation.ran(1);
        let base = self
            .seqs
            .tokens(r.seq)
            .map_or(0, |t| t.len().saturating_sub(run.len()));
        let (tok, load) = (&self.tok, &self.load);
        let (job, first_token) = (&mut r.job, &mut r.first_token);
        let v = keep_drafted(&mut r.generation, rows, draft, |g, row| {
            let next = sample(g, job, first_token, Row::Whole(row), tok, load);
            Ok::<_, std::convert::Infallible>((!matches!(next, Next::Going)).then_some(next))
        })
        .unwrap_or_else(|never| match never {});
        let d = r.drafting.as_mut().expect("a request that drafted");
        d.control.record(draft.len(), v.accepted);
        load.drafted_tokens
            .fetch_add(draft.len() as u64, Ordering::Relaxed);
        load.accepted_tokens
            .fetch_add(v.accepted as u64, Ordering::Relaxed);
        // The sequence keeps what ran and stands: the pending token and the
        // drafted tokens kept.
        if let Err(e) = self.seqs.rewind(r.seq, base + 1 + v.kept) {
            let _ = r
                .job
                .events
                .send(Event::Error(JobError::Internal(e.to_string())));
            return Next::Dropped;
        }
        v.end.unwrap_or(Next::Going)
    }

    fn step(&mut self) {
        self.draft();
        let run_len = |r: &Running| r.drafting.as_ref().map_or(0, |d| d.run.len());
        let requests: Vec<(usize, usize)> = self
            .running
            .iter()
            .map(|r| {
                let pending = r.generation.pending().len().max(run_len(r));
                (pending, r.job.prompt.len() - r.fed)
            })
            .collect();
        let plan = plan_step(self.seqs.max_step_tokens(), &requests);
        // A step that verifies drafts brings its rows back whole.
        let verifying = self.running.iter().any(|r| run_len(r) > 0);
        // Each logit row reduced on the device to what its sampler needs
        // (a row needed whole, for a constraint that can only mask a whole
        // row, is read back on its own).
        let wants: Vec<usize> = plan
            .iter()
            .filter(|(i, part)| {
                let r = &self.running[*i];
                match part {
                    Part::Generated { n } => *n == r.generation.pending().len(),
                    Part::Prompt { n } => r.fed + n == r.job.prompt.len(),
                }
            })
            .map(|(i, _)| *i)
            .collect();
        let mut reqs = (!verifying).then(|| Vec::with_capacity(wants.len()));
        for &i in wants.iter().filter(|_| !verifying) {
            let r = &mut self.running[i];
            let c = r
                .job
                .constraint
                .as_mut()
                .map(|c| &mut **c as &mut dyn Constraint);
            match r.generation.request(c) {
                Ok(req) => {
                    if let Some(v) = reqs.as_mut() {
                        v.push(req);
                    }
                }
                // Every row comes back whole: a constraint's error comes
                // back again from its mask, where the request's own error
                // path reports it.
                Err(_) => reqs = None,
            }
        }
        let running = &self.running;
        let feeds: Vec<Feed> = plan
            .iter()
            .map(|(i, part)| {
                let r = &running[*i];
                match part {
                    // A draft's rows, each token's.
                    Part::Generated { .. } if run_len(r) > 0 => Feed {
                        seq: r.seq,
                        tokens: &r.drafting.as_ref().expect("drafted").run,
                        logits: Want::All,
                    },
                    // Logits once every pending token has run.
                    Part::Generated { n } => Feed {
                        seq: r.seq,
                        tokens: &r.generation.pending()[..*n],
                        logits: if *n == r.generation.pending().len() {
                            Want::Last
                        } else {
                            Want::None
                        },
                    },
                    Part::Prompt { n } => Feed {
                        seq: r.seq,
                        tokens: &r.job.prompt[r.fed..r.fed + n],
                        logits: if r.fed + n == r.job.prompt.len() {
                            Want::Last
                        } else {
                            Want::None
                        },
                    },
                }
            })
            .collect();
        // The pool gives cached blocks back before a step fails for room.
        let out = match &reqs {
            Some(reqs) => self.seqs.step_reduced(&feeds, reqs).map(StepRows::Reduced),
            None => self.seqs.step(&feeds).map(StepRows::Whole),
        };
        drop(feeds);
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                self.fail(plan.iter().map(|(i, _)| *i).collect(), &e);
                return;
            }
        };
        let mut finished = Vec::new();
        let vocab = self.seqs.model().config().n_vocab;
        let mut row = 0;
        for (k, (i, part)) in plan.into_iter().enumerate() {
            let r = &mut self.running[i];
            match part {
                Part::Prompt { n } => {
                    self.load
                        .prompt_tokens
                        .fetch_add(n as u64, Ordering::Relaxed);
                    r.fed += n;
                    if r.fed < r.job.prompt.len() {
                        continue;
                    }
                }
                Part::Generated { .. } if run_len(r) > 0 => {
                    let StepRows::Whole(out) = &out else {
                        unreachable!("a verifying step's rows come back whole")
                    };
                    match self.verify(i, out.get(k)) {
                        Next::Going => {}
                        Next::Done(reason) => finished.push((i, Some(reason))),
                        Next::Dropped => finished.push((i, None)),
                    }
                    continue;
                }
                Part::Generated { n } => {
                    r.generation.ran(n);
                    if !r.generation.pending().is_empty() {
                        continue;
                    }
                }
            }
            let next = match (&out, &reqs) {
                (StepRows::Whole(out), _) => r.next(Row::Whole(out.get(k)), &self.tok, &self.load),
                (StepRows::Reduced(LogitRows::Full(all)), Some(reqs)) => {
                    // Whole rows for reduction requests (the CPU).
                    let logits = &all[row * vocab..(row + 1) * vocab];
                    let row = Row::Unreduced {
                        req: &reqs[row],
                        logits,
                    };
                    r.next(row, &self.tok, &self.load)
                }
                (StepRows::Reduced(LogitRows::Reduced(digests)), Some(reqs)) => {
                    let row = Row::Reduced {
                        req: &reqs[row],
                        digest: &digests[row],
                        kept: &mut self.seqs.kept(row),
                    };
                    r.next(row, &self.tok, &self.load)
                }
                (StepRows::Reduced(_), None) => {
                    unreachable!("rows are reduced only when asked")
                }
            };
            row += 1;
            match next {
                Next::Going => {}
                Next::Done(reason) => finished.push((i, Some(reason))),
                Next::Dropped => finished.push((i, None)),
            }
        }
        // What the step computed is offered for reuse at once, so a prompt
        // waiting on a shared prefix finds it.
        for r in &self.running {
            let _ = self.seqs.publish(r.seq);
        }
        // Highest index first, so the others keep their places.
        finished.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (i, reason) in finished {
            let r = self.running.swap_remove(i);
            self.finish(r, reason);
        }
    }

    /// Ends request `r` (telling the client how, unless it is gone or was
    /// sent an error): its full blocks stay in the prefix cache.
    fn finish(&mut self, r: Running, reason: Option<FinishReason>) {
        if let Some(reason) = reason {
            r.send_done(reason);
        }
        self.release(&r, true);
    }

    /// Gives back a request's sequences (the model's, and the draft
    /// model's where it drafts with one), their full blocks offered to the
    /// prefix cache first where `publish`.
    fn release(&mut self, r: &Running, publish: bool) {
        let draft = match r.drafting.as_ref().map(|d| &d.source) {
            Some(&Proposer::Model { seq }) => self.draft.as_mut().map(|d| (d, seq)),
            _ => None,
        };
        if let Some((d, seq)) = draft {
            if publish {
                let _ = d.publish(seq);
            }
            let _ = d.remove(seq);
        }
        if publish {
            let _ = self.seqs.publish(r.seq);
        }
        let _ = self.seqs.remove(r.seq);
    }

    /// Fails the requests at `indices` after an engine error; their
    /// sequences are dropped (their K/V may be half written).
    fn fail(&mut self, mut indices: Vec<usize>, e: &ModelError) {
        indices.sort_unstable_by(|a, b| b.cmp(a));
        indices.dedup();
        for i in indices {
            let r = self.running.swap_remove(i);
            self.release(&r, false);
            let err = match e {
                ModelError::ContextFull { .. } | ModelError::BadToken { .. } => {
                    JobError::Invalid(e.to_string())
                }
                _ => JobError::Internal(e.to_string()),
            };
            let _ = r.job.events.send(Event::Error(err));
        }
    }
}

/// A step's logit rows: whole per feed, or as `step_reduced` returned them.
enum StepRows {
    Whole(StepLogits),
    Reduced(LogitRows),
}

/// The length of the common prefix of `a` and `b`.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// [`Running::next`] on the request's parts, so that a verification step
/// can hand its generation to `keep_drafted` and sample through this.
fn sample(
    generation: &mut Generation,
    job: &mut Job,
    first_token: &mut Option<Instant>,
    logits: Row<'_>,
    tok: &Tokenizer,
    load: &Load,
) -> Next {
    first_token.get_or_insert(Instant::now());
    let (before, forced) = (generation.tokens().len(), generation.forced());
    let events = &job.events;
    let constraint = job
        .constraint
        .as_mut()
        .map(|c| &mut **c as &mut dyn Constraint);
    let step = generation.next_row(logits, constraint, Some(tok), &mut |piece| {
        let event = match piece {
            Piece::Text(text) => Event::Text(text),
            Piece::Token { text, logprob } => Event::Token { text, logprob },
        };
        events.send(event).is_ok()
    });
    let generated = generation.tokens().len() - before;
    load.generated_tokens
        .fetch_add(generated as u64, Ordering::Relaxed);
    load.forced_tokens
        .fetch_add((generation.forced() - forced) as u64, Ordering::Relaxed);
    match step {
        Ok(None) => Next::Going,
        // Closed early to fit the budget: whole, but cut by it.
        Ok(Some(GenFinish::Length | GenFinish::Closed)) => Next::Done(FinishReason::Length),
        Ok(Some(GenFinish::StopToken | GenFinish::StopString | GenFinish::Complete)) => {
            Next::Done(FinishReason::Stop)
        }
        Ok(Some(GenFinish::Cancelled)) => Next::Dropped,
        Err(e) => {
            let _ = events.send(Event::Error(JobError::Internal(e.to_string())));
            Next::Dropped
        }
    }
}

/// Where a request stands after a token.
enum Next {
    Going,
    Done(FinishReason),
    /// The client went away, or was sent an error.
    Dropped,
}

impl Running {
    /// Makes `draft` the tokens this step verifies after the pending one,
    /// cut at the first its constraint rules out; a draft left empty counts
    /// as a step without one. Returns the tokens it adds to the step.
    fn take_draft(&mut self, mut draft: Vec<u32>) -> usize {
        let Some(d) = self.drafting.as_mut() else {
            return 0;
        };
        if let Some(c) = self.job.constraint.as_mut() {
            let valid = c.valid_prefix(&draft);
            draft.truncate(valid);
        }
        if draft.is_empty() {
            d.control.record(0, 0);
            return 0;
        }
        d.run.push(self.generation.pending()[0]);
        d.run.extend_from_slice(&draft);
        draft.len()
    }

    /// Samples the next token from its logit row and streams its text.
    fn next(&mut self, logits: Row<'_>, tok: &Tokenizer, load: &Load) -> Next {
        sample(
            &mut self.generation,
            &mut self.job,
            &mut self.first_token,
            logits,
            tok,
            load,
        )
    }

    fn send_done(&self, reason: FinishReason) {
        let first = self.first_token.unwrap_or(self.started);
        let _ = self.job.events.send(Event::Done(Finish {
            reason,
            prompt_tokens: self.job.prompt.len(),
            cached_tokens: self.cached,
            completion_tokens: self.generation.tokens().len(),
            prefill_secs: (first - self.started).as_secs_f64(),
            decode_secs: first.elapsed().as_secs_f64(),
            closed_at: self.job.constraint.as_ref().and_then(|c| c.closed_at()),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::{plan_step, Part};

    #[test]
    fn decode_goes_first_then_prompts_in_order_within_the_budget() {
        // Two decoding requests, two prefilling ones.
        let plan = plan_step(10, &[(0, 30), (1, 0), (0, 4), (1, 0)]);
        assert_eq!(
            plan,
            vec![
                (1, Part::Generated { n: 1 }),
                (3, Part::Generated { n: 1 }),
                (0, Part::Prompt { n: 8 }),
            ]
        );
        // What the first prompt leaves goes to the next.
        let plan = plan_step(10, &[(0, 3), (1, 0), (0, 40)]);
        assert_eq!(
            plan,
            vec![
                (1, Part::Generated { n: 1 }),
                (0, Part::Prompt { n: 3 }),
                (2, Part::Prompt { n: 6 }),
            ]
        );
    }

    #[test]
    fn forced_tokens_and_a_small_budget_are_split_across_steps() {
        // Pending tokens beyond the budget wait; no prompt runs then.
        assert_eq!(
            plan_step(4, &[(3, 0), (5, 0), (0, 9)]),
            vec![(0, Part::Generated { n: 3 }), (1, Part::Generated { n: 1 })]
        );
        // A request with pending tokens does not also prefill.
        assert_eq!(plan_step(8, &[(2, 5)]), vec![(0, Part::Generated { n: 2 })]);
        assert!(plan_step(0, &[(1, 4)]).is_empty());
        assert!(plan_step(8, &[(0, 0)]).is_empty());
    }
}
