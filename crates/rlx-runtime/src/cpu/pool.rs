//! A persistent thread pool: workers spin briefly between jobs (an op in a
//! decode step is microseconds long, and waking a parked thread costs about
//! as much), then park; they claim task indices from a shared counter.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Task = dyn Fn(usize) + Sync;

/// How long an idle worker polls for the next job before it parks.
const SPIN: Duration = Duration::from_micros(500);

#[derive(Clone, Copy)]
struct Job {
    /// Lifetime-erased pointer to the caller's closure; valid until every
    /// worker has checked out of this generation.
    task: *const Task,
    n_tasks: usize,
}

// SAFETY: the pointer is only dereferenced while the submitting thread waits
// in `for_each`, which keeps the closure (which is `Sync`) alive.
unsafe impl Send for Job {}

struct Shared {
    /// Bumped once per job; workers run a job when they see a new value.
    generation: AtomicU64,
    job: Mutex<Option<Job>>,
    next: AtomicUsize,
    /// Workers that have not yet finished the current generation.
    running: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `for_each` calls from different threads.
    submit: Mutex<()>,
}

impl ThreadPool {
    /// A pool that runs tasks on `n_threads` threads in all (the caller counts
    /// as one). `n_threads` of 0 is treated as 1.
    pub fn new(n_threads: usize) -> Self {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            next: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..n_threads.max(1))
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("rlx-worker-{i}"))
                    .spawn(move || worker(&s))
                    .expect("spawn worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            submit: Mutex::new(()),
        }
    }

    /// Threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every `i` in `0..n_tasks`, spread over the pool, and
    /// returns when all have finished. Tasks must not call back into the pool.
    pub fn for_each(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _one_job = self.submit.lock().expect("pool lock");
        let s = &*self.shared;
        // SAFETY: erases the closure's lifetime; see `Job::task`. We wait
        // below until every worker has checked out of this generation.
        let task =
            unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Task>(f) };
        *s.job.lock().expect("pool lock") = Some(Job { task, n_tasks });
        s.next.store(0, Ordering::SeqCst);
        s.running.store(self.workers.len(), Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        // A worker counts itself a sleeper before its last look at
        // `generation`, so either it sees the new job or we see it here.
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _park = s.park.lock().expect("pool lock");
            s.wake.notify_all();
        }
        run_tasks(s, f, n_tasks);
        // Workers finish within microseconds unless the OS has descheduled
        // one; then spinning would only take the core it needs.
        let mut spins = 0u32;
        while s.running.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 1 << 10 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl ThreadPool {
    /// Runs `f(first_row, band)` over `out` cut into bands of whole rows of
    /// `row` elements, one band per thread; outputs under `min_len` elements
    /// (where a wake-up costs more than the work) run inline as one band.
    pub fn for_rows(
        &self,
        out: &mut [f32],
        row: usize,
        min_len: usize,
        f: &(dyn Fn(usize, &mut [f32]) + Sync),
    ) {
        let row = row.max(1);
        let rows = out.len() / row;
        let parts = self.threads().min(rows);
        if parts <= 1 || out.len() < min_len {
            f(0, out);
            return;
        }
        let mut bands = Vec::with_capacity(parts);
        let mut rest = out;
        for t in 0..parts {
            let r = split_range(rows, parts, t);
            // The last band also takes a partial trailing row, if any.
            let len = if t + 1 == parts {
                rest.len()
            } else {
                r.len() * row
            };
            let (band, tail) = rest.split_at_mut(len);
            bands.push((r.start, Mutex::new(band)));
            rest = tail;
        }
        self.for_each(parts, &|t| {
            let (first, band) = &bands[t];
            f(*first, &mut band.lock().expect("band lock"));
        });
    }
}

fn run_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), n_tasks: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n_tasks {
            break;
        }
        f(i);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Poll, then park until the generation moves.
        let start = Instant::now();
        let mut polls = 0u32;
        while s.generation.load(Ordering::Acquire) == seen && !s.shutdown.load(Ordering::Relaxed) {
            std::hint::spin_loop();
            polls += 1;
            if !polls.is_multiple_of(256) {
                continue;
            }
            // Lets another runnable thread on this core (an oversubscribed
            // pool, a busy machine) go ahead; costs a syscall otherwise.
            std::thread::yield_now();
            if start.elapsed() > SPIN {
                let mut park = s.park.lock().expect("pool lock");
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.generation.load(Ordering::SeqCst) == seen
                    && !s.shutdown.load(Ordering::SeqCst)
                {
                    park = s.wake.wait(park).expect("pool lock");
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
        }
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        seen = s.generation.load(Ordering::Acquire);
        let job = s
            .job
            .lock()
            .expect("pool lock")
            .expect("a job is published before its generation");
        // SAFETY: the submitter keeps the closure alive until this worker
        // decrements `running` below.
        let f = unsafe { &*job.task };
        run_tasks(s, f, job.n_tasks);
        s.running.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _park = self.shared.park.lock().expect("pool lock");
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Splits `0..n` into `parts` contiguous ranges of near-equal size.
pub fn split_range(n: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    let parts = parts.max(1);
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_task_runs_exactly_once_across_many_jobs() {
        let pool = ThreadPool::new(3);
        for n in [1usize, 2, 5, 100, 1000] {
            let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
            pool.for_each(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn for_rows_hands_out_every_row_once_with_its_index() {
        let pool = ThreadPool::new(3);
        for (len, row, min) in [(0, 4, 0), (7, 1, 0), (40, 4, 0), (42, 4, 0), (40, 4, 100)] {
            let mut out = vec![-1f32; len];
            pool.for_rows(&mut out, row, min, &|first, band| {
                for (i, v) in band.iter_mut().enumerate() {
                    *v = (first * row + i) as f32;
                }
            });
            assert!(
                out.iter().enumerate().all(|(i, &v)| v == i as f32),
                "{len} {row}"
            );
        }
    }

    #[test]
    fn split_range_covers_everything_once() {
        for n in [0, 1, 7, 64, 1001] {
            for parts in [1, 2, 3, 16] {
                let mut next = 0;
                for i in 0..parts {
                    let r = split_range(n, parts, i);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
