//! The CPU backend: a persistent thread pool, runtime-dispatched SIMD
//! matmuls for every weight type, and plain f32 kernels for the other ops.

pub mod features;
pub mod kernels;
pub mod matmul;
pub mod pool;

use std::marker::PhantomData;
use std::sync::Arc;

use features::Isa;
use pool::ThreadPool;

/// A CPU device: the thread pool and instruction set kernels may use.
#[derive(Clone)]
pub struct CpuDevice {
    pool: Arc<ThreadPool>,
    isa: Isa,
}

impl CpuDevice {
    /// `threads` threads in all, the best instruction set this CPU supports.
    pub fn new(threads: usize) -> Self {
        CpuDevice {
            pool: Arc::new(ThreadPool::new(threads)),
            isa: Isa::detect(),
        }
    }

    /// Restricts kernels to `isa` (e.g. the portable path in tests).
    pub fn with_isa(mut self, isa: Isa) -> Self {
        self.isa = isa;
        self
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
}

/// A mutable slice shared by pool tasks that each write a disjoint part.
pub(crate) struct SharedMut<'a> {
    ptr: *mut f32,
    len: usize,
    _life: PhantomData<&'a mut [f32]>,
}

// SAFETY: tasks only write disjoint ranges (each caller documents why).
unsafe impl Send for SharedMut<'_> {}
unsafe impl Sync for SharedMut<'_> {}

impl<'a> SharedMut<'a> {
    pub fn new(s: &'a mut [f32]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: PhantomData,
        }
    }

    /// # Safety
    /// No two live slices from one `SharedMut` may overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &'a mut [f32] {
        assert!(start + len <= self.len, "range past the shared slice");
        // SAFETY: in bounds (checked above); disjointness is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
