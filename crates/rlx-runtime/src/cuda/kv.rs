//! K/V storage in device memory: per owning layer, the rows of every block
//! of its group in one buffer for keys and one for values, in the pool's
//! storage types (f32, f16, bf16, or ggml's Q8_0 or Q4_0 blocks). Where a row belongs (sequence, position)
//! is the [`KvPool`](crate::KvPool)'s bookkeeping; each step's plan uploads
//! what its kernels need of it.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError};

use super::{type_code, CudaDevice, CudaError};
use crate::kv::{KvDType, KvError, KvPoolConfig, KvStorage, KvTypes, SlotSet, BLOCK_TOKENS};

/// One owning layer's rows.
struct LayerRows {
    /// `[blocks · BLOCK_TOKENS, kv_heads · head_dim]` elements.
    k: CudaSlice<u8>,
    /// `[blocks · BLOCK_TOKENS, kv_heads · v_head_dim]` elements.
    v: CudaSlice<u8>,
    k_width: usize,
    v_width: usize,
}

/// The device addresses and row widths of one owning layer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerPtrs {
    pub k: u64,
    pub v: u64,
    /// Elements per row of `k` and `v`.
    pub k_width: usize,
    pub v_width: usize,
    /// The storage types of keys and values.
    pub types: KvTypes,
}

/// The K/V rows of a pool on a GPU.
pub struct CudaKvStorage {
    /// Unique per storage: a plan's captured graphs hold this storage's
    /// addresses and are replayed only with it.
    id: u64,
    device: Arc<CudaDevice>,
    /// Per slot; `None` for layers that share another's K/V.
    layers: Vec<Option<LayerRows>>,
    /// The owning slots of each group.
    groups: Vec<Vec<usize>>,
    types: KvTypes,
}

/// The kernels' code of a K/V storage type (`kernels.cu`'s `T_*`).
pub(crate) fn kv_code(t: KvDType) -> u32 {
    type_code(t.ggml()).expect("the kernels read every K/V type")
}

impl CudaKvStorage {
    /// Zeroed rows for the owning layers of `config` that `slots` keeps.
    pub fn new(
        device: &Arc<CudaDevice>,
        config: &KvPoolConfig,
        slots: &SlotSet,
    ) -> Result<Self, CudaError> {
        config.validate()?;
        let types = config.types;
        let s = &device.stream;
        // Zero bytes are zeros in every type (block scales of 0).
        let layers = config.alloc_layers(slots, |l| {
            Ok::<_, CudaError>(LayerRows {
                k: s.alloc_zeros(l.rows * types.k.row_bytes(l.k_width))?,
                v: s.alloc_zeros(l.rows * types.v.row_bytes(l.v_width))?,
                k_width: l.k_width,
                v_width: l.v_width,
            })
        })?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(CudaKvStorage {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            device: Arc::clone(device),
            layers,
            groups: config.group_slots(slots),
            types,
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The buffers of an owning slot (`None` for a sharing or unknown slot).
    pub(crate) fn layer(&self, slot: usize) -> Option<LayerPtrs> {
        let l = self.layers.get(slot)?.as_ref()?;
        Some(LayerPtrs {
            k: self.device.ptr(&l.k),
            v: self.device.ptr(&l.v),
            k_width: l.k_width,
            v_width: l.v_width,
            types: self.types,
        })
    }
}

/// Copies `len` bytes of `buf` from `from` to `to` on `stream`; the ranges
/// must not overlap (they are different blocks).
fn copy_within(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<u8>,
    from: usize,
    to: usize,
    len: usize,
) -> Result<(), DriverError> {
    if len == 0 {
        return Ok(());
    }
    if from < to {
        let (lo, mut hi) = buf.split_at_mut(to);
        stream.memcpy_dtod(&lo.slice(from..from + len), &mut hi.slice_mut(..len))
    } else {
        let (mut lo, hi) = buf.split_at_mut(from);
        stream.memcpy_dtod(&hi.slice(..len), &mut lo.slice_mut(to..to + len))
    }
}

impl KvStorage for CudaKvStorage {
    /// Device-to-device copies on the device's stream, so they land before
    /// the kernels of the step that asked for them.
    fn copy_block(&mut self, group: usize, from: u32, to: u32) -> Result<(), KvError> {
        if from == to {
            return Ok(());
        }
        let slots = self
            .groups
            .get(group)
            .ok_or_else(|| KvError::Storage(format!("group {group} does not exist")))?;
        let (src, dst) = (from as usize * BLOCK_TOKENS, to as usize * BLOCK_TOKENS);
        let stream = &self.device.stream;
        for &slot in slots {
            let l = self.layers[slot].as_mut().expect("owners have storage");
            let (kw, vw) = (
                self.types.k.row_bytes(l.k_width),
                self.types.v.row_bytes(l.v_width),
            );
            copy_within(stream, &mut l.k, src * kw, dst * kw, BLOCK_TOKENS * kw)
                .and_then(|()| copy_within(stream, &mut l.v, src * vw, dst * vw, BLOCK_TOKENS * vw))
                .map_err(|e| KvError::Storage(format!("copying block {from} to {to}: {e}")))?;
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|l| l.k.len() + l.v.len())
            .sum()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
