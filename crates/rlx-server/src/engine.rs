//! The engine: one thread that owns the model's session and runs requests
//! one after the other, streaming text back over a channel. The cache is
//! kept between requests, so a conversation that grows by a turn only runs
//! the new tokens.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use rlx_gemma::generate::{generate, StopReason};
use rlx_gemma::sampling::{Sampler, SamplerConfig};
use rlx_gemma::{Model, ModelError, SessionOptions};
use rlx_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::stop::StopFilter;

/// One generation request, already tokenized.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Where the text goes; generation stops when the receiver is dropped
    /// (the client went away).
    pub events: UnboundedSender<Event>,
}

/// What the engine sends back for a job: text pieces, then `Done` or `Error`.
#[derive(Debug)]
pub enum Event {
    Text(String),
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
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The request asked for something the model cannot do.
    #[error("{0}")]
    Invalid(String),
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

/// The engine thread and the queue in front of it.
pub struct Engine {
    queue: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    tokenizer: Arc<Tokenizer>,
    context: usize,
}

impl Engine {
    /// Starts the thread; fails if the session (KV cache of `opts.context`
    /// tokens) cannot be made.
    pub fn start(
        model: Model,
        tokenizer: Arc<Tokenizer>,
        opts: SessionOptions,
    ) -> Result<Engine, StartError> {
        let (queue, jobs) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel();
        let tok = Arc::clone(&tokenizer);
        let thread = std::thread::Builder::new()
            .name("rlx-engine".into())
            .spawn(move || {
                let mut session = match model.session(opts) {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(s.context()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = jobs.recv() {
                    run_job(&mut session, &tok, job);
                }
            })
            .map_err(StartError::Thread)?;
        let context = ready.recv().map_err(|_| StartError::Died)??;
        Ok(Engine {
            queue: Some(queue),
            thread: Some(thread),
            tokenizer,
            context,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The session's context length in tokens.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Queues a job; its events arrive on `job.events`.
    pub fn submit(&self, job: Job) -> Result<(), JobError> {
        self.queue
            .as_ref()
            .and_then(|q| q.send(job).ok())
            .ok_or_else(|| JobError::Internal("the engine has stopped".into()))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the job it is running.
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run_job(session: &mut rlx_gemma::Session<'_>, tok: &Tokenizer, job: Job) {
    if job.events.is_closed() {
        return;
    }
    let send = |e: Event| job.events.send(e).is_ok();
    let mut sampler = match Sampler::new(job.sampler.clone()) {
        Ok(s) => s,
        Err(e) => {
            send(Event::Error(JobError::Invalid(e.to_string())));
            return;
        }
    };
    let stop_tokens = if job.ignore_eos {
        Vec::new()
    } else {
        tok.eog_ids().to_vec()
    };
    let mut decoder = tok.stream_decoder(false);
    let mut filter = StopFilter::new(job.stop.clone());
    let mut stop_string = false;
    let result = generate(
        session,
        &job.prompt,
        job.max_tokens,
        &mut sampler,
        &stop_tokens,
        &mut |t| {
            if stop_tokens.contains(&t) {
                return false;
            }
            let (text, stopped) = filter.push(&decoder.push(tok, t));
            if !text.is_empty() && !send(Event::Text(text)) {
                return false;
            }
            stop_string = stopped;
            !stopped
        },
    );
    match result {
        Ok((tokens, reason, stats)) => {
            if !stop_string {
                // Bytes of an unfinished character, then what the filter held.
                let (mut rest, stopped) = filter.push(&decoder.finish());
                stop_string = stopped;
                rest.push_str(&filter.finish());
                if !rest.is_empty() {
                    send(Event::Text(rest));
                }
            }
            let reason = match reason {
                StopReason::Length if !stop_string => FinishReason::Length,
                _ => FinishReason::Stop,
            };
            send(Event::Done(Finish {
                reason,
                prompt_tokens: job.prompt.len(),
                cached_tokens: job.prompt.len() - stats.prefilled,
                completion_tokens: tokens.len(),
                prefill_secs: stats.prefill_secs,
                decode_secs: stats.decode_secs,
            }));
        }
        Err(e @ (ModelError::ContextFull { .. } | ModelError::BadToken { .. })) => {
            send(Event::Error(JobError::Invalid(e.to_string())));
        }
        Err(e) => {
            // The cache may be half-written; start the next job afresh.
            session.reset();
            send(Event::Error(JobError::Internal(e.to_string())));
        }
    }
}
