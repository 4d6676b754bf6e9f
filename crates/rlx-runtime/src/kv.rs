//! The KV cache: per-layer K/V storage owned by a session, read and appended
//! by plans.
//!
//! Layers may differ in head count and head size. Sliding-window layers keep
//! a ring of `window + max_chunk − 1` rows — enough for every query of a
//! chunk to see its whole window — so their memory does not grow with the
//! context. A layer may share another layer's K/V (it has no storage of its
//! own). Every row remembers its token position, which is what masks use.

use half::{bf16, f16};
use rlx_ir::CacheSlot;

/// Storage precision of cached K/V.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDType {
    #[default]
    F32,
    F16,
    BF16,
}

impl KvDType {
    pub fn bytes(self) -> usize {
        match self {
            KvDType::F32 => 4,
            KvDType::F16 | KvDType::BF16 => 2,
        }
    }
}

/// The shape of one layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayerSpec {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    /// Sliding window in tokens; `None` keeps the full context.
    pub window: Option<usize>,
    /// Reuse this earlier layer's K/V instead of storing any.
    pub shares: Option<CacheSlot>,
}

/// What a cache is sized for.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCacheConfig {
    /// One spec per slot; `CacheSlot(i)` is `layers[i]`.
    pub layers: Vec<KvLayerSpec>,
    /// Longest context (tokens) full-attention layers must hold.
    pub max_context: usize,
    /// Most tokens appended in one step (prefill chunk).
    pub max_chunk: usize,
    pub dtype: KvDType,
}

impl KvCacheConfig {
    /// Rows a layer stores and whether they form a ring: a sliding layer
    /// needs its window plus one chunk (less one), unless the full context is
    /// smaller.
    pub fn rows(&self, spec: &KvLayerSpec) -> (usize, bool) {
        match spec.window {
            Some(w) if w + self.max_chunk - 1 < self.max_context => (w + self.max_chunk - 1, true),
            _ => (self.max_context, false),
        }
    }

    /// Checks that `n` more tokens fit a cache holding `len`.
    pub fn check_append(&self, len: usize, n: usize) -> Result<(), KvError> {
        if n > self.max_chunk {
            return Err(KvError::ChunkTooLong {
                n,
                max_chunk: self.max_chunk,
            });
        }
        if len + n > self.max_context {
            return Err(KvError::Full {
                needed: len + n,
                capacity: self.max_context,
            });
        }
        Ok(())
    }

    /// The spec of `slot` if `n` rows can be written to it at length `len`:
    /// they fit, and the slot owns its K/V.
    pub(crate) fn writable(
        &self,
        slot: CacheSlot,
        len: usize,
        n: usize,
    ) -> Result<KvLayerSpec, KvError> {
        self.check_append(len, n)?;
        let spec = *self.layers.get(slot.0 as usize).ok_or(KvError::NoSlot {
            slot: slot.0,
            slots: self.layers.len(),
        })?;
        if spec.shares.is_some() {
            return Err(KvError::Layout {
                slot: slot.0,
                what: "layer shares another layer's K/V and cannot be written".into(),
            });
        }
        Ok(spec)
    }

    /// Bytes of K/V storage a cache of this config allocates.
    pub fn memory_bytes(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.shares.is_none())
            .map(|l| self.rows(l).0 * l.kv_heads * (l.head_dim + l.v_head_dim) * self.dtype.bytes())
            .sum()
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KvError {
    #[error("KV cache full: {needed} tokens needed, the cache holds {capacity}")]
    Full { needed: usize, capacity: usize },
    #[error("KV cache slot {slot} does not exist (the cache has {slots})")]
    NoSlot { slot: u32, slots: usize },
    #[error("slot {slot}: {what}")]
    Layout { slot: u32, what: String },
    #[error("cannot append {n} tokens at once, the cache was sized for chunks of {max_chunk}")]
    ChunkTooLong { n: usize, max_chunk: usize },
    #[error(
        "cannot rewind to {len} tokens: sliding layer {slot} only keeps positions from {oldest}"
    )]
    RewindTooFar {
        len: usize,
        slot: u32,
        oldest: usize,
    },
    #[error("invalid cache config: {0}")]
    Config(String),
}

enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Rows {
    fn new(dtype: KvDType, n: usize) -> Self {
        match dtype {
            KvDType::F32 => Rows::F32(vec![0.0; n]),
            KvDType::F16 => Rows::F16(vec![f16::ZERO; n]),
            KvDType::BF16 => Rows::BF16(vec![bf16::ZERO; n]),
        }
    }

    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Rows::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Rows::F16(v) => v[at..at + src.len()]
                .iter_mut()
                .zip(src)
                .for_each(|(d, s)| *d = f16::from_f32(*s)),
            Rows::BF16(v) => v[at..at + src.len()]
                .iter_mut()
                .zip(src)
                .for_each(|(d, s)| *d = bf16::from_f32(*s)),
        }
    }

    fn view(&self) -> RowsView<'_> {
        match self {
            Rows::F32(v) => RowsView::F32(v),
            Rows::F16(v) => RowsView::F16(v),
            Rows::BF16(v) => RowsView::BF16(v),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Rows::F32(v) => v.len() * 4,
            Rows::F16(v) => v.len() * 2,
            Rows::BF16(v) => v.len() * 2,
        }
    }
}

/// Borrowed K or V rows of one layer, in the cache's storage type.
#[derive(Clone, Copy)]
pub enum RowsView<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl RowsView<'_> {
    /// Element `i` as f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            RowsView::F32(v) => v[i],
            RowsView::F16(v) => v[i].to_f32(),
            RowsView::BF16(v) => v[i].to_f32(),
        }
    }

    /// The `buf.len()` elements at `start` as f32: borrowed in place for f32
    /// storage, converted into `buf` otherwise.
    #[inline]
    pub fn row<'b>(&'b self, start: usize, buf: &'b mut [f32]) -> &'b [f32] {
        match self {
            RowsView::F32(v) => &v[start..start + buf.len()],
            _ => {
                self.read(start, buf);
                buf
            }
        }
    }

    /// Copies `out.len()` elements starting at `start` into `out` as f32.
    #[inline]
    pub fn read(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            RowsView::F32(v) => out.copy_from_slice(&v[start..end]),
            RowsView::F16(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, s)| *o = s.to_f32()),
            RowsView::BF16(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, s)| *o = s.to_f32()),
        }
    }
}

struct LayerStore {
    k: Rows,
    v: Rows,
    /// Token position held in each row, or -1 for an empty row.
    pos: Vec<i64>,
    /// Bidirectional span id of each row (0 = none).
    span: Vec<i32>,
    capacity: usize,
    ring: bool,
}

/// A read view of one layer for attention.
pub struct LayerView<'a> {
    pub spec: KvLayerSpec,
    pub k: RowsView<'a>,
    pub v: RowsView<'a>,
    /// Token position of each row (−1 = empty); rows are in storage order.
    pub pos: &'a [i64],
    pub span: &'a [i32],
}

/// K/V for every layer of one sequence.
pub struct KvCache {
    config: KvCacheConfig,
    stores: Vec<Option<LayerStore>>,
    len: usize,
}

impl KvCache {
    pub fn new(config: KvCacheConfig) -> Result<Self, KvError> {
        if config.max_chunk == 0 {
            return Err(KvError::Config("max_chunk must be at least 1".into()));
        }
        let mut stores = Vec::with_capacity(config.layers.len());
        for (i, spec) in config.layers.iter().enumerate() {
            if let Some(src) = spec.shares {
                let ok = (src.0 as usize) < i
                    && config.layers[src.0 as usize].shares.is_none()
                    && config.layers[src.0 as usize].kv_heads == spec.kv_heads
                    && config.layers[src.0 as usize].head_dim == spec.head_dim;
                if !ok {
                    return Err(KvError::Config(format!(
                        "layer {i} shares layer {} which is not an earlier, owning layer of the same shape",
                        src.0
                    )));
                }
                stores.push(None);
                continue;
            }
            let (capacity, ring) = config.rows(spec);
            stores.push(Some(LayerStore {
                k: Rows::new(config.dtype, capacity * spec.kv_heads * spec.head_dim),
                v: Rows::new(config.dtype, capacity * spec.kv_heads * spec.v_head_dim),
                pos: vec![-1; capacity],
                span: vec![0; capacity],
                capacity,
                ring,
            }));
        }
        Ok(KvCache {
            config,
            stores,
            len: 0,
        })
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

    /// Bytes of K/V storage held.
    pub fn memory_bytes(&self) -> usize {
        self.stores
            .iter()
            .flatten()
            .map(|s| s.k.bytes() + s.v.bytes())
            .sum()
    }

    /// Rows of storage of a slot (its ring size for sliding layers).
    pub fn capacity(&self, slot: CacheSlot) -> Result<usize, KvError> {
        Ok(self.owner(slot)?.1.capacity)
    }

    fn owner(&self, slot: CacheSlot) -> Result<(usize, &LayerStore), KvError> {
        let i = slot.0 as usize;
        let spec = self.config.layers.get(i).ok_or(KvError::NoSlot {
            slot: slot.0,
            slots: self.config.layers.len(),
        })?;
        let owner = spec.shares.map_or(i, |s| s.0 as usize);
        Ok((
            owner,
            self.stores[owner].as_ref().expect("owners have storage"),
        ))
    }

    /// Checks that `n` more tokens fit, before anything is written.
    pub fn check_append(&self, n: usize) -> Result<(), KvError> {
        self.config.check_append(self.len, n)
    }

    /// Writes K/V rows `[n, kv_heads, dim]` for positions `len .. len+n` of a
    /// slot. The cache length advances only with [`KvCache::commit`], so every
    /// layer of a step writes at the same positions.
    pub fn write(
        &mut self,
        slot: CacheSlot,
        k: &[f32],
        v: &[f32],
        n: usize,
        spans: Option<&[i32]>,
    ) -> Result<(), KvError> {
        let spec = self.config.writable(slot, self.len, n)?;
        let i = slot.0 as usize;
        let (kd, vd) = (
            spec.kv_heads * spec.head_dim,
            spec.kv_heads * spec.v_head_dim,
        );
        if k.len() != n * kd || v.len() != n * vd {
            return Err(KvError::Layout {
                slot: slot.0,
                what: format!(
                    "expected k {}×{kd} and v {}×{vd} values, got {} and {}",
                    n,
                    n,
                    k.len(),
                    v.len()
                ),
            });
        }
        let start = self.len;
        let store = self.stores[i].as_mut().expect("owners have storage");
        for t in 0..n {
            let p = start + t;
            let row = if store.ring { p % store.capacity } else { p };
            store.k.write(row * kd, &k[t * kd..(t + 1) * kd]);
            store.v.write(row * vd, &v[t * vd..(t + 1) * vd]);
            store.pos[row] = p as i64;
            store.span[row] = spans.map_or(0, |s| s[t]);
        }
        Ok(())
    }

    /// Advances the length after a step wrote `n` tokens to every layer.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// A read view of a slot (a sharing layer sees its source's rows).
    pub fn view(&self, slot: CacheSlot) -> Result<LayerView<'_>, KvError> {
        let (owner, s) = self.owner(slot)?;
        let spec = self.config.layers[owner];
        Ok(LayerView {
            spec,
            k: s.k.view(),
            v: s.v.view(),
            pos: &s.pos,
            span: &s.span,
        })
    }

    /// Forgets every token from position `len` on (rewind, or reuse of a
    /// shared prefix). Fails if a sliding layer no longer holds the window
    /// that position `len` would need.
    pub fn truncate(&mut self, len: usize) -> Result<(), KvError> {
        if len >= self.len {
            return Ok(());
        }
        for (i, s) in self.stores.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.ring {
                let window = self.config.layers[i].window.unwrap_or(usize::MAX);
                check_rewind(&s.pos, window, len, i as u32)?;
            }
        }
        for s in self.stores.iter_mut().flatten() {
            for (p, span) in s.pos.iter_mut().zip(s.span.iter_mut()) {
                if *p >= len as i64 {
                    *p = -1;
                    *span = 0;
                }
            }
        }
        self.len = len;
        Ok(())
    }

    /// Empties the cache.
    pub fn clear(&mut self) {
        for s in self.stores.iter_mut().flatten() {
            s.pos.fill(-1);
            s.span.fill(0);
        }
        self.len = 0;
    }
}

/// Whether a ring (position p at row p % rows, `pos` per row) still holds
/// the window a query at position `len` needs: len−window+1 .. len−1.
pub(crate) fn check_rewind(
    pos: &[i64],
    window: usize,
    len: usize,
    slot: u32,
) -> Result<(), KvError> {
    let rows = pos.len();
    let needed = len.saturating_sub(window.saturating_sub(1))..len;
    if let Some(lost) = needed.clone().find(|&p| pos[p % rows] != p as i64) {
        let oldest = (lost..len)
            .find(|&p| pos[p % rows] == p as i64)
            .unwrap_or(len);
        return Err(KvError::RewindTooFar { len, slot, oldest });
    }
    Ok(())
}
