//! A persistent thread pool: workers park between jobs and claim task
//! indices from a shared counter, so an op costs a wake-up, not a spawn.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Task = dyn Fn(usize) + Sync;

struct Job {
    /// Lifetime-erased pointer to the caller's closure; valid until every
    /// worker has reported done for this generation.
    task: *const Task,
    n_tasks: usize,
    generation: u64,
}

// SAFETY: the pointer is only dereferenced while the submitting thread blocks
// in `for_each`, which keeps the closure (which is `Sync`) alive.
unsafe impl Send for Job {}

struct Shared {
    job: Mutex<Option<Job>>,
    wake: Condvar,
    next: AtomicUsize,
    done_workers: Mutex<usize>,
    all_done: Condvar,
    shutdown: std::sync::atomic::AtomicBool,
}

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    generation: Mutex<u64>,
}

impl ThreadPool {
    /// A pool that runs tasks on `n_threads` threads in all (the caller counts
    /// as one). `n_threads` of 0 is treated as 1.
    pub fn new(n_threads: usize) -> Self {
        let shared = Arc::new(Shared {
            job: Mutex::new(None),
            wake: Condvar::new(),
            next: AtomicUsize::new(0),
            done_workers: Mutex::new(0),
            all_done: Condvar::new(),
            shutdown: std::sync::atomic::AtomicBool::new(false),
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
            generation: Mutex::new(0),
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
        // One job at a time per pool.
        let mut gen = self.generation.lock().expect("pool lock");
        *gen += 1;
        *self.shared.done_workers.lock().expect("pool lock") = 0;
        self.shared.next.store(0, Ordering::SeqCst);
        {
            let mut job = self.shared.job.lock().expect("pool lock");
            // SAFETY: erases the closure's lifetime; see `Job::task`. We wait
            // below until every worker has finished with it.
            let task = unsafe {
                std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Task>(f)
            };
            *job = Some(Job {
                task,
                n_tasks,
                generation: *gen,
            });
        }
        self.shared.wake.notify_all();
        run_tasks(&self.shared, f, n_tasks);
        let mut done = self.shared.done_workers.lock().expect("pool lock");
        while *done < self.workers.len() {
            done = self.shared.all_done.wait(done).expect("pool lock");
        }
        *self.shared.job.lock().expect("pool lock") = None;
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
        let (task, n_tasks) = {
            let mut job = s.job.lock().expect("pool lock");
            loop {
                if s.shutdown.load(Ordering::SeqCst) {
                    return;
                }
                match &*job {
                    Some(j) if j.generation != seen => {
                        seen = j.generation;
                        break (j.task, j.n_tasks);
                    }
                    _ => job = s.wake.wait(job).expect("pool lock"),
                }
            }
        };
        // SAFETY: the submitter keeps the closure alive until this worker
        // increments `done_workers` below.
        let f = unsafe { &*task };
        run_tasks(s, f, n_tasks);
        *s.done_workers.lock().expect("pool lock") += 1;
        s.all_done.notify_all();
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _job = self.shared.job.lock().expect("pool lock");
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
