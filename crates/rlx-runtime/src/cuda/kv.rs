//! The KV cache in device memory: the CPU cache's layout (rows per layer
//! from [`KvCacheConfig::rows`], rings for sliding layers, shared layers
//! without storage) with f32 rows. Row positions live on the device for the
//! attention kernel and on the host for rewinds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use rlx_ir::CacheSlot;

use super::{CudaDevice, CudaError};
use crate::kv::{check_rewind, KvCacheConfig, KvDType, KvError, KvLayerSpec};

struct Layer {
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    /// Device copy of `pos` as i32 (−1 = empty).
    dev_pos: CudaSlice<i32>,
    pos: Vec<i64>,
    ring: bool,
}

/// The K/V of one sequence on a GPU.
pub struct CudaKvCache {
    /// Unique per cache: a plan's captured graphs hold this cache's
    /// addresses and are replayed only with it.
    id: u64,
    device: Arc<CudaDevice>,
    config: KvCacheConfig,
    layers: Vec<Option<Layer>>,
    len: usize,
}

/// What the attention kernel needs of one layer.
pub(crate) struct LayerPtrs {
    pub k: u64,
    pub v: u64,
    pub pos: u64,
    pub rows: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
}

impl CudaKvCache {
    pub fn new(device: &Arc<CudaDevice>, config: KvCacheConfig) -> Result<Self, CudaError> {
        if config.dtype != KvDType::F32 {
            return Err(CudaError::Unsupported(format!(
                "the CUDA K/V cache holds f32 rows, not {:?}",
                config.dtype
            )));
        }
        if config.max_chunk == 0 {
            return Err(CudaError::Unsupported(
                "max_chunk must be at least 1".into(),
            ));
        }
        let s = &device.stream;
        let mut layers = Vec::with_capacity(config.layers.len());
        for (i, spec) in config.layers.iter().enumerate() {
            if let Some(src) = spec.shares {
                let owner = config.layers.get(src.0 as usize);
                if src.0 as usize >= i || owner.is_none_or(|o| o.shares.is_some()) {
                    return Err(CudaError::Unsupported(format!(
                        "layer {i} shares layer {}, which is not an earlier owning layer",
                        src.0
                    )));
                }
                layers.push(None);
                continue;
            }
            let (rows, ring) = config.rows(spec);
            let pos = vec![-1i64; rows];
            layers.push(Some(Layer {
                k: s.alloc_zeros(rows * spec.kv_heads * spec.head_dim)?,
                v: s.alloc_zeros(rows * spec.kv_heads * spec.v_head_dim)?,
                dev_pos: s.clone_htod(&vec![-1i32; rows])?,
                pos,
                ring,
            }));
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(CudaKvCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            device: Arc::clone(device),
            config,
            layers,
            len: 0,
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub fn config(&self) -> &KvCacheConfig {
        &self.config
    }

    /// Tokens held (the position the next token gets).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of device memory the rows take.
    pub fn memory_bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|l| (l.k.len() + l.v.len()) * 4)
            .sum()
    }

    fn spec(&self, slot: CacheSlot) -> Result<KvLayerSpec, KvError> {
        self.config
            .layers
            .get(slot.0 as usize)
            .copied()
            .ok_or(KvError::NoSlot {
                slot: slot.0,
                slots: self.config.layers.len(),
            })
    }

    fn owner(&self, slot: CacheSlot) -> Result<usize, KvError> {
        Ok(self
            .spec(slot)?
            .shares
            .map_or(slot.0 as usize, |s| s.0 as usize))
    }

    /// The device buffers of a slot (a sharing layer's are its source's).
    pub(crate) fn layer(&self, slot: CacheSlot) -> Result<LayerPtrs, KvError> {
        let owner = self.owner(slot)?;
        let spec = self.config.layers[owner];
        let l = self.layers[owner].as_ref().expect("owners have storage");
        Ok(LayerPtrs {
            k: self.device.ptr(&l.k),
            v: self.device.ptr(&l.v),
            pos: self.device.ptr(&l.dev_pos),
            rows: l.pos.len(),
            kv_heads: spec.kv_heads,
            head_dim: spec.head_dim,
            v_head_dim: spec.v_head_dim,
        })
    }

    /// Stores K/V rows `[n, kv_heads, dim]` (device addresses) for positions
    /// `len .. len + n` of an owning slot (`start` holds `len` on the
    /// device); the length moves on at [`CudaKvCache::commit`].
    pub(crate) fn write(
        &mut self,
        slot: CacheSlot,
        k: u64,
        v: u64,
        n: usize,
        start: u64,
    ) -> Result<(), CudaError> {
        let spec = self.config.writable(slot, self.len, n)?;
        let dev = Arc::clone(&self.device);
        let l = self.layers[slot.0 as usize]
            .as_ref()
            .expect("owners have storage");
        let (kd, vd) = (
            (spec.kv_heads * spec.head_dim) as i32,
            (spec.kv_heads * spec.v_head_dim) as i32,
        );
        let (kc, vc, pc) = (dev.ptr(&l.k), dev.ptr(&l.v), dev.ptr(&l.dev_pos));
        let (n32, rows32, ring) = (n as i32, l.pos.len() as i32, l.ring as i32);
        let total = n as u32 * (kd + vd) as u32;
        let mut b = dev.stream.launch_builder(&dev.kernels.kv_write);
        b.arg(&k)
            .arg(&v)
            .arg(&kc)
            .arg(&vc)
            .arg(&pc)
            .arg(&n32)
            .arg(&kd)
            .arg(&vd)
            .arg(&start)
            .arg(&rows32)
            .arg(&ring);
        // SAFETY: k and v hold n rows of kd and vd floats (the plan's values
        // of those shapes); `start` is the device copy of `len`, so the rows
        // written are `< rows` (a ring wraps, a full layer holds
        // max_context ≥ len + n, checked above).
        unsafe { b.launch(LaunchConfig::for_num_elems(total)) }?;
        self.note_rows(slot, n);
        Ok(())
    }

    /// The host side of a write of `n` rows (row positions), for a write
    /// that a replayed graph makes on the device.
    pub(crate) fn record(&mut self, slot: CacheSlot, n: usize) -> Result<(), CudaError> {
        self.config.writable(slot, self.len, n)?;
        self.note_rows(slot, n);
        Ok(())
    }

    /// Row positions of `n` rows written at the current length.
    fn note_rows(&mut self, slot: CacheSlot, n: usize) {
        let start = self.len;
        let l = self.layers[slot.0 as usize]
            .as_mut()
            .expect("owners have storage");
        let rows = l.pos.len();
        for t in 0..n {
            let p = start + t;
            let row = if l.ring { p % rows } else { p };
            l.pos[row] = p as i64;
        }
    }

    /// Advances the length after a step wrote `n` tokens to every layer.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Forgets every token from position `len` on; fails, changing nothing,
    /// if a sliding layer no longer holds the window position `len` needs.
    pub fn truncate(&mut self, len: usize) -> Result<(), CudaError> {
        if len >= self.len {
            return Ok(());
        }
        for (i, l) in self.layers.iter().enumerate() {
            let Some(l) = l else { continue };
            if l.ring {
                let window = self.config.layers[i].window.unwrap_or(usize::MAX);
                check_rewind(&l.pos, window, len, i as u32)?;
            }
        }
        self.forget_from(len)
    }

    /// Empties the cache.
    pub fn clear(&mut self) -> Result<(), CudaError> {
        self.forget_from(0)
    }

    fn forget_from(&mut self, len: usize) -> Result<(), CudaError> {
        for l in self.layers.iter_mut().flatten() {
            for p in l.pos.iter_mut() {
                if *p >= len as i64 {
                    *p = -1;
                }
            }
            let dev: Vec<i32> = l.pos.iter().map(|&p| p as i32).collect();
            self.device.stream.memcpy_htod(&dev, &mut l.dev_pos)?;
        }
        self.len = len;
        Ok(())
    }
}
