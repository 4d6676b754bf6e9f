//! Timing a step's kernels one at a time (`rlx bench --profile`).
//!
//! While profiling is on, plans launch without graphs and the device
//! records an event after every kernel. A step first queues a kernel that
//! waits on the GPU for longer than the host took to queue the step before,
//! so the step's kernels run back to back however slowly the host queues
//! them, and the time between two events is one kernel's, in a warm GPU
//! (caches and clocks as a running step has them), not the host's. The
//! events keep kernels from overlapping (programmatic dependent launch
//! does not cross them), so a step's sum bounds what it takes as a graph.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaEvent, CudaFunction, LaunchConfig, PushKernelArg};

use super::{CudaDevice, CudaError};
use crate::backend::{KernelTime, StepProfile};

/// The wait before a step when nothing has been queued yet, and the
/// longest (ns).
const FIRST_WAIT_NS: u64 = 5_000_000;
const MAX_WAIT_NS: u64 = 100_000_000;

#[derive(Default)]
pub(super) struct Profiler {
    step: Option<Step>,
    /// How long the host took to queue the last step.
    queued: Duration,
    /// Kernel names by function handle.
    names: HashMap<usize, String>,
    /// By step rows.
    done: BTreeMap<usize, Totals>,
}

/// The step being queued: its rows, the event after its wait, and per
/// launch what ran and the event after it.
struct Step {
    rows: usize,
    began: Instant,
    start: CudaEvent,
    launches: Vec<(String, u64, CudaEvent)>,
}

#[derive(Default)]
struct Totals {
    steps: usize,
    /// By name: launches, seconds, weight bytes.
    kernels: BTreeMap<String, (usize, f64, u64)>,
}

impl CudaDevice {
    /// Whether launches are being timed.
    pub(super) fn profiling(&self) -> bool {
        self.profiling.load(Ordering::Relaxed)
    }

    /// Turns timing every launch on or off (see the module's comment).
    pub fn set_profiling(&self, on: bool) {
        self.profiling.store(on, Ordering::Relaxed);
    }

    fn profiler(&self) -> std::sync::MutexGuard<'_, Profiler> {
        self.profiler.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn timing_event(&self) -> Result<CudaEvent, CudaError> {
        Ok(self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
    }

    /// Starts a profiled step of `rows` rows: the wait, then its first
    /// event.
    pub(super) fn profile_begin(&self, rows: usize) -> Result<(), CudaError> {
        let mut p = self.profiler();
        let wait = match p.queued.as_nanos() as u64 {
            0 => FIRST_WAIT_NS,
            ns => (ns * 3 / 2 + 200_000).min(MAX_WAIT_NS),
        };
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let ns = wait as i64;
        let mut launch = self.stream.launch_builder(&self.kernels.spin);
        launch.arg(&ns);
        // SAFETY: `spin` takes one 64-bit integer and touches no memory.
        unsafe { launch.launch(cfg) }?;
        p.step = Some(Step {
            rows,
            began: Instant::now(),
            start: self.timing_event()?,
            launches: Vec::new(),
        });
        Ok(())
    }

    /// Marks the end of a kernel just queued (`f`, or a library call
    /// named `name`) that reads `bytes` of weights.
    pub(super) fn profile_launch(
        &self,
        f: Option<&CudaFunction>,
        name: &str,
        bytes: u64,
    ) -> Result<(), CudaError> {
        let event = self.timing_event()?;
        let mut p = self.profiler();
        let name = match f {
            Some(f) => {
                let handle = f.cu_function() as usize;
                p.names
                    .entry(handle)
                    .or_insert_with(|| function_name(f).unwrap_or_else(|| name.to_string()))
                    .clone()
            }
            None => name.to_string(),
        };
        if let Some(step) = p.step.as_mut() {
            step.launches.push((name, bytes, event));
        }
        Ok(())
    }

    /// Marks the end of queueing the step's kernels (before anything waits
    /// for them): how long the next step's wait must be.
    pub(super) fn profile_queued(&self) {
        let mut p = self.profiler();
        if let Some(began) = p.step.as_ref().map(|s| s.began) {
            p.queued = began.elapsed();
        }
    }

    /// Ends the profiled step: waits for it and adds its kernels' times.
    pub(super) fn profile_end(&self) -> Result<(), CudaError> {
        let mut p = self.profiler();
        let Some(step) = p.step.take() else {
            return Ok(());
        };
        self.stream.synchronize()?;
        let totals = p.done.entry(step.rows).or_default();
        totals.steps += 1;
        let mut before = &step.start;
        for (name, bytes, event) in &step.launches {
            let secs = f64::from(before.elapsed_ms(event)?) / 1e3;
            let k = totals.kernels.entry(name.clone()).or_default();
            *k = (k.0 + 1, k.1 + secs, k.2 + bytes);
            before = event;
        }
        Ok(())
    }

    /// What was timed since the last call, by step size, slowest kernels
    /// first.
    pub fn take_profile(&self) -> Vec<StepProfile> {
        let done = std::mem::take(&mut self.profiler().done);
        done.into_iter()
            .map(|(rows, t)| {
                let mut kernels: Vec<KernelTime> = t
                    .kernels
                    .into_iter()
                    .map(|(name, (launches, seconds, weight_bytes))| KernelTime {
                        name,
                        launches,
                        seconds,
                        weight_bytes,
                    })
                    .collect();
                kernels.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
                StepProfile {
                    rows,
                    steps: t.steps,
                    kernels,
                }
            })
            .collect()
    }
}

/// A kernel's name as the module declares it.
fn function_name(f: &CudaFunction) -> Option<String> {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver writes a pointer to a string it owns, valid
    // while the module is loaded (the device keeps it); it is copied at once.
    unsafe {
        sys::cuFuncGetName(&mut name, f.cu_function())
            .result()
            .ok()?;
        if name.is_null() {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}
