//! The K/V pool: the K/V memory of every sequence, in blocks of
//! [`BLOCK_TOKENS`] rows.
//!
//! Layers are grouped by their attention window. Each group has its own
//! blocks, and every sequence a block table per group (logical block →
//! physical block). Full-attention layers grow a sequence by blocks;
//! sliding-window layers drop the blocks their window has left, so their
//! memory is bounded by the window whatever the context. A layer may share
//! another layer's K/V (it has no storage of its own and reads its source's
//! blocks). Blocks are reference-counted: a forked sequence shares its
//! parent's blocks, and a block is copied only when one of its holders writes
//! to it. Every row remembers its token position (−1: empty), which is what
//! masks use.
//!
//! Full blocks can be offered to a prefix cache ([`KvPool::publish`]): a
//! later sequence whose tokens start the same way takes them over
//! ([`KvPool::add_cached`]) instead of computing them again, whatever
//! sequence computed them and whether it is still alive. Cached blocks are
//! evicted, least recently used first, when a step needs blocks.
//!
//! The pool does the bookkeeping on the host; where K/V live is the
//! backend's [`KvStorage`].

mod prefix;

use std::any::Any;
use std::collections::BTreeMap;

use rlx_gguf::GgmlType;
use rlx_ir::CacheSlot;

use crate::batch::{Batch, BatchError, SeqId, SeqRun};
use prefix::{PrefixCache, ROOT};

/// Rows per block: one key block of the attention kernels.
pub const BLOCK_TOKENS: usize = 32;

/// Storage type of cached keys or values: a float, or one of ggml's block
/// formats (32 elements a block, so a quantized cache's head sizes must be
/// multiples of 32), stored as ggml writes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDType {
    #[default]
    F32,
    F16,
    BF16,
    /// 8-bit codes with an f16 scale per 32: 34 bytes (8.5 bits an element).
    Q8_0,
    /// 4-bit codes with an f16 scale per 32: 18 bytes (4.5 bits an element).
    Q4_0,
}

impl KvDType {
    /// Every type, in the order `--kv-type` lists them.
    pub const ALL: [KvDType; 5] = [
        KvDType::F32,
        KvDType::F16,
        KvDType::BF16,
        KvDType::Q8_0,
        KvDType::Q4_0,
    ];

    /// The ggml type of the stored elements.
    pub fn ggml(self) -> GgmlType {
        match self {
            KvDType::F32 => GgmlType::F32,
            KvDType::F16 => GgmlType::F16,
            KvDType::BF16 => GgmlType::BF16,
            KvDType::Q8_0 => GgmlType::Q8_0,
            KvDType::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// Elements per stored block (1 for the float types).
    pub fn block_elems(self) -> usize {
        self.ggml().block_elems()
    }

    /// Bytes of `elems` elements, a whole number of blocks.
    pub fn row_bytes(self, elems: usize) -> usize {
        elems / self.block_elems() * self.ggml().block_bytes()
    }

    /// The name flags and messages use: `f32`, `f16`, `bf16`, `q8_0`, `q4_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvDType::F32 => "f32",
            KvDType::F16 => "f16",
            KvDType::BF16 => "bf16",
            KvDType::Q8_0 => "q8_0",
            KvDType::Q4_0 => "q4_0",
        }
    }

    /// The type a name (as [`KvDType::name`] gives it, any case) stands for.
    pub fn parse(s: &str) -> Option<KvDType> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }
}

impl std::fmt::Display for KvDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The storage types of a cache's keys and of its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvTypes {
    pub k: KvDType,
    pub v: KvDType,
}

impl KvTypes {
    /// Keys and values of one type.
    pub fn both(t: KvDType) -> KvTypes {
        KvTypes { k: t, v: t }
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "K {} / V {}", self.k, self.v)
        }
    }
}

/// The K/V types asked for, each `None` where the device's default is
/// wanted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvChoice {
    pub k: Option<KvDType>,
    pub v: Option<KvDType>,
}

impl KvChoice {
    /// The types, `default` where none was asked for.
    pub fn resolve(self, default: KvDType) -> KvTypes {
        KvTypes {
            k: self.k.unwrap_or(default),
            v: self.v.unwrap_or(default),
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

/// What a pool is sized for.
#[derive(Clone, Debug, PartialEq)]
pub struct KvPoolConfig {
    /// One spec per slot; `CacheSlot(i)` is `layers[i]`.
    pub layers: Vec<KvLayerSpec>,
    /// Storage types of keys and values.
    pub types: KvTypes,
    /// Tokens the full-attention layers hold over all sequences (each
    /// sequence holds whole blocks).
    pub tokens: usize,
    /// Most sequences alive at once: sliding layers need this many windows.
    pub max_seqs: usize,
    /// Most tokens a sequence appends in one step.
    pub max_chunk: usize,
}

/// Layers that share a window, and the blocks they have.
#[derive(Clone, Debug, PartialEq)]
pub struct KvGroup {
    /// `None` for full attention.
    pub window: Option<usize>,
    pub blocks: usize,
    /// The slots with storage in this group.
    pub slots: Vec<CacheSlot>,
}

impl KvPoolConfig {
    /// Checks that sharing layers share an earlier owning layer of their shape.
    pub fn validate(&self) -> Result<(), KvError> {
        if self.max_chunk == 0 || self.max_seqs == 0 || self.tokens == 0 {
            return Err(KvError::Config(format!(
                "tokens ({}), max_seqs ({}) and max_chunk ({}) must be at least 1",
                self.tokens, self.max_seqs, self.max_chunk
            )));
        }
        for (i, spec) in self.layers.iter().enumerate() {
            for (what, t, dim) in [
                ("K", self.types.k, spec.head_dim),
                ("V", self.types.v, spec.v_head_dim),
            ] {
                if spec.shares.is_none() && dim % t.block_elems() != 0 {
                    return Err(KvError::Config(format!(
                        "a {t} {what} cache stores heads in blocks of {}, but layer {i}'s heads have {dim} elements",
                        t.block_elems()
                    )));
                }
            }
            let Some(src) = spec.shares else { continue };
            let ok = (src.0 as usize) < i
                && self.layers[src.0 as usize].shares.is_none()
                && self.layers[src.0 as usize].kv_heads == spec.kv_heads
                && self.layers[src.0 as usize].head_dim == spec.head_dim;
            if !ok {
                return Err(KvError::Config(format!(
                    "layer {i} shares layer {} which is not an earlier, owning layer of the same shape",
                    src.0
                )));
            }
        }
        Ok(())
    }

    /// Blocks a sequence's sliding layers may hold at once: the window
    /// before a chunk's first query and the chunk, and one more where they
    /// straddle block edges.
    fn window_blocks(&self, window: usize) -> usize {
        (window - 1 + self.max_chunk).div_ceil(BLOCK_TOKENS) + 1
    }

    /// The groups, full attention first, then by window.
    pub fn groups(&self) -> Vec<KvGroup> {
        let full_blocks = self.tokens.div_ceil(BLOCK_TOKENS);
        let mut by_window: BTreeMap<usize, Vec<CacheSlot>> = BTreeMap::new();
        for (i, spec) in self.layers.iter().enumerate() {
            if spec.shares.is_none() {
                let key = spec.window.unwrap_or(0);
                by_window.entry(key).or_default().push(CacheSlot(i as u32));
            }
        }
        by_window
            .into_iter()
            .map(|(w, slots)| {
                let window = (w > 0).then_some(w);
                let blocks = match window {
                    None => full_blocks,
                    Some(w) => full_blocks.min(self.max_seqs * self.window_blocks(w)),
                };
                KvGroup {
                    window,
                    blocks,
                    slots,
                }
            })
            .collect()
    }

    /// The group index of every slot (a sharing layer is in its source's).
    pub fn slot_groups(&self) -> Vec<usize> {
        let groups = self.groups();
        (0..self.layers.len())
            .map(|i| {
                let owner = self.layers[i].shares.map_or(i as u32, |s| s.0);
                groups
                    .iter()
                    .position(|g| g.slots.contains(&CacheSlot(owner)))
                    .expect("every owner is in a group")
            })
            .collect()
    }

    /// Bytes of K/V storage a pool of this config allocates.
    pub fn memory_bytes(&self) -> usize {
        self.groups()
            .iter()
            .map(|g| g.blocks * BLOCK_TOKENS * self.group_row_bytes(g))
            .sum()
    }

    /// Bytes of one row (token) over every layer of a group.
    fn group_row_bytes(&self, g: &KvGroup) -> usize {
        g.slots
            .iter()
            .map(|s| {
                let l = &self.layers[s.0 as usize];
                self.types.k.row_bytes(l.kv_heads * l.head_dim)
                    + self.types.v.row_bytes(l.kv_heads * l.v_head_dim)
            })
            .sum()
    }

    /// Bytes a cache holding every position of `tokens` tokens for every
    /// owning layer would take (what a pool without windows would need).
    pub fn full_length_bytes(&self, tokens: usize) -> usize {
        self.groups()
            .iter()
            .map(|g| tokens * self.group_row_bytes(g))
            .sum()
    }
}

/// The storage shape of one owning layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerLayout {
    pub slot: usize,
    /// Rows: the group's blocks × [`BLOCK_TOKENS`].
    pub rows: usize,
    /// Elements per row of K and of V.
    pub k_width: usize,
    pub v_width: usize,
}

impl KvPoolConfig {
    /// One storage value per slot: `alloc` for each owning layer that
    /// `slots` keeps, `None` for the others and for layers that share
    /// another's K/V.
    pub fn alloc_layers<T, E>(
        &self,
        slots: &SlotSet,
        mut alloc: impl FnMut(&LayerLayout) -> Result<T, E>,
    ) -> Result<Vec<Option<T>>, E> {
        let mut layers: Vec<Option<T>> = (0..self.layers.len()).map(|_| None).collect();
        for g in self.groups() {
            for slot in g.slots.iter().filter(|s| slots.has(**s)) {
                let spec = &self.layers[slot.0 as usize];
                let layout = LayerLayout {
                    slot: slot.0 as usize,
                    rows: g.blocks * BLOCK_TOKENS,
                    k_width: spec.kv_heads * spec.head_dim,
                    v_width: spec.kv_heads * spec.v_head_dim,
                };
                layers[layout.slot] = Some(alloc(&layout)?);
            }
        }
        Ok(layers)
    }

    /// The owning slots of each group that `slots` keeps.
    pub fn group_slots(&self, slots: &SlotSet) -> Vec<Vec<usize>> {
        self.groups()
            .iter()
            .map(|g| {
                g.slots
                    .iter()
                    .filter(|s| slots.has(**s))
                    .map(|s| s.0 as usize)
                    .collect()
            })
            .collect()
    }

    /// Bytes of K/V storage the owning slots `slots` keeps take.
    pub fn slots_bytes(&self, slots: &SlotSet) -> usize {
        self.groups()
            .iter()
            .flat_map(|g| {
                g.slots
                    .iter()
                    .filter(|s| slots.has(**s))
                    .map(move |s| (g.blocks, s))
            })
            .map(|(blocks, s)| {
                let l = &self.layers[s.0 as usize];
                blocks
                    * BLOCK_TOKENS
                    * (self.types.k.row_bytes(l.kv_heads * l.head_dim)
                        + self.types.v.row_bytes(l.kv_heads * l.v_head_dim))
            })
            .sum()
    }
}

/// The cache slots one storage holds: every slot, or those listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotSet {
    All,
    Only(Vec<bool>),
}

impl SlotSet {
    pub fn has(&self, slot: CacheSlot) -> bool {
        match self {
            SlotSet::All => true,
            SlotSet::Only(keep) => keep.get(slot.0 as usize).copied().unwrap_or(false),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KvError {
    #[error("K/V pool full: {seq} needs {needed} more blocks of {BLOCK_TOKENS} tokens for its {layers} layers, {free} are free")]
    Full {
        seq: SeqId,
        layers: String,
        needed: usize,
        free: usize,
    },
    #[error("{0} is not in the K/V pool")]
    UnknownSeq(SeqId),
    #[error("{seq} holds {len} tokens, {tokens} were given for it")]
    Tokens {
        seq: SeqId,
        len: usize,
        tokens: usize,
    },
    #[error("{seq} holds {len} tokens; the next must be at position {len}, not {pos}")]
    Position { seq: SeqId, len: usize, pos: usize },
    #[error("{seq}: {n} tokens in one step, the pool was sized for {max_chunk}")]
    ChunkTooLong {
        seq: SeqId,
        n: usize,
        max_chunk: usize,
    },
    #[error("K/V cache slot {slot} does not exist (the pool has {slots})")]
    NoSlot { slot: u32, slots: usize },
    #[error("slot {slot}: {what}")]
    Layout { slot: u32, what: String },
    #[error(
        "cannot rewind {seq} to {len} tokens: its sliding layers only keep positions from {oldest}"
    )]
    RewindTooFar {
        seq: SeqId,
        len: usize,
        oldest: usize,
    },
    #[error("invalid K/V pool config: {0}")]
    Config(String),
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("K/V storage: {0}")]
    Storage(String),
}

/// Where a backend keeps the K/V rows of a pool: for each owning slot,
/// `blocks × BLOCK_TOKENS` rows of `[kv_heads, head_dim]` keys and
/// `[kv_heads, v_head_dim]` values, row `b·BLOCK_TOKENS + i` being row `i` of
/// physical block `b` of the slot's group.
pub trait KvStorage: Send {
    /// Copies every row of block `from` to block `to` in every slot of `group`.
    fn copy_block(&mut self, group: usize, from: u32, to: u32) -> Result<(), KvError>;
    /// Bytes allocated.
    fn bytes(&self) -> usize;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Per group: block ownership and the position of every row.
struct Group {
    window: Option<usize>,
    refs: Vec<u32>,
    free: Vec<u32>,
    /// Token position of each row (−1: empty).
    pos: Vec<i64>,
    /// Bidirectional span id of each row (0: none).
    span: Vec<i32>,
}

impl Group {
    fn alloc(&mut self) -> u32 {
        let b = self.free.pop().expect("counted before allocating");
        self.refs[b as usize] = 1;
        b
    }

    fn release(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r -= 1;
        if *r == 0 {
            self.clear_rows(b, 0);
            self.free.push(b);
        }
    }

    /// Marks rows `from ..` of block `b` empty.
    fn clear_rows(&mut self, b: u32, from: usize) {
        let rows = b as usize * BLOCK_TOKENS + from..(b as usize + 1) * BLOCK_TOKENS;
        self.pos[rows.clone()].fill(-1);
        self.span[rows].fill(0);
    }

    /// The first position a query at `pos` can see (0 for full attention).
    fn horizon(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// One sequence: its length and a block table per group (`None` where a
/// sliding group dropped a block).
#[derive(Clone)]
struct Seq {
    len: usize,
    tables: Vec<Vec<Option<u32>>>,
    /// Prefix-cache keys of its first full blocks, as far as published.
    keys: Vec<u64>,
}

/// What the kernels of one step need from the pool.
#[derive(Clone, Debug, Default)]
pub struct StepLayout {
    /// The batch's runs, one per sequence.
    pub runs: Vec<SeqRun>,
    /// `[group][run]`: the physical blocks the run's queries may read, in
    /// logical order (dropped blocks left out).
    pub blocks: Vec<Vec<Vec<u32>>>,
    /// `[group][run]`: the logical index of each of those blocks.
    pub logical: Vec<Vec<Vec<u32>>>,
    /// `[group][row]`: the physical row each batch row's K/V go to.
    pub write_rows: Vec<Vec<u32>>,
}

/// A read view of one group's row positions and span ids.
pub struct GroupRows<'a> {
    pub pos: &'a [i64],
    pub span: &'a [i32],
}

/// The K/V memory of every sequence of a model on one device.
pub struct KvPool {
    config: KvPoolConfig,
    slot_groups: Vec<usize>,
    groups: Vec<Group>,
    seqs: BTreeMap<SeqId, Seq>,
    next_id: u32,
    /// Where the rows are: one storage, or one per device of a split graph.
    parts: Vec<Box<dyn KvStorage>>,
    /// The part holding each slot's rows (a sharing slot: its owner's).
    slot_part: Vec<usize>,
    cache: PrefixCache,
}

impl KvPool {
    /// A pool over `storage`, which the backend allocated for `config`.
    pub fn new(config: KvPoolConfig, storage: Box<dyn KvStorage>) -> Result<Self, KvError> {
        let slots = vec![0; config.layers.len()];
        Self::with_parts(config, vec![storage], slots)
    }

    /// A pool whose rows are in several storages: slot `i`'s (and every
    /// slot sharing it) in `parts[slot_part[i]]`, each allocated for the
    /// owning slots it holds.
    pub fn with_parts(
        config: KvPoolConfig,
        parts: Vec<Box<dyn KvStorage>>,
        slot_part: Vec<usize>,
    ) -> Result<Self, KvError> {
        config.validate()?;
        if slot_part.len() != config.layers.len() || slot_part.iter().any(|&p| p >= parts.len()) {
            return Err(KvError::Config(format!(
                "{} slots placed over {} storages, expected one of them for each of {} slots",
                slot_part.len(),
                parts.len(),
                config.layers.len()
            )));
        }
        for (i, spec) in config.layers.iter().enumerate() {
            if let Some(src) = spec.shares {
                if slot_part[src.0 as usize] != slot_part[i] {
                    return Err(KvError::Config(format!(
                        "layer {i} reads layer {}'s K/V, which is kept on another device",
                        src.0
                    )));
                }
            }
        }
        let groups = config
            .groups()
            .iter()
            .map(|g| Group {
                window: g.window,
                refs: vec![0; g.blocks],
                free: (0..g.blocks as u32).rev().collect(),
                pos: vec![-1; g.blocks * BLOCK_TOKENS],
                span: vec![0; g.blocks * BLOCK_TOKENS],
            })
            .collect();
        Ok(KvPool {
            slot_groups: config.slot_groups(),
            config,
            groups,
            seqs: BTreeMap::new(),
            next_id: 0,
            parts,
            slot_part,
            cache: PrefixCache::new(),
        })
    }

    pub fn config(&self) -> &KvPoolConfig {
        &self.config
    }

    /// Tokens a sequence of `len` tokens holds: whole blocks.
    pub fn held_tokens(len: usize) -> usize {
        len.next_multiple_of(BLOCK_TOKENS)
    }

    /// The longest prefix of `len` tokens that sequences can share: whole
    /// blocks (the prefix cache keeps and hands out blocks).
    pub fn shareable_tokens(len: usize) -> usize {
        len / BLOCK_TOKENS * BLOCK_TOKENS
    }

    /// The storages of the pool's rows (one unless the model is split over
    /// devices).
    pub fn parts(&self) -> impl Iterator<Item = &dyn KvStorage> + '_ {
        self.parts.iter().map(|p| &**p)
    }

    /// The storage holding `slot`'s rows.
    pub fn storage_of(&self, slot: CacheSlot) -> Result<&dyn KvStorage, KvError> {
        let part = self.part_of(slot)?;
        Ok(&*self.parts[part])
    }

    pub fn storage_of_mut(&mut self, slot: CacheSlot) -> Result<&mut dyn KvStorage, KvError> {
        let part = self.part_of(slot)?;
        Ok(&mut *self.parts[part])
    }

    fn part_of(&self, slot: CacheSlot) -> Result<usize, KvError> {
        self.slot_part
            .get(slot.0 as usize)
            .copied()
            .ok_or(KvError::NoSlot {
                slot: slot.0,
                slots: self.slot_part.len(),
            })
    }

    /// Bytes of K/V storage allocated.
    pub fn memory_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.bytes()).sum()
    }

    /// Bytes of the blocks in use.
    pub fn used_bytes(&self) -> usize {
        let groups = self.config.groups();
        self.groups
            .iter()
            .zip(&groups)
            .map(|(g, spec)| {
                (g.refs.len() - g.free.len()) * BLOCK_TOKENS * self.config.group_row_bytes(spec)
            })
            .sum()
    }

    /// Free blocks of each group.
    pub fn free_blocks(&self) -> Vec<usize> {
        self.groups.iter().map(|g| g.free.len()).collect()
    }

    /// The group a slot reads.
    pub fn group_of(&self, slot: CacheSlot) -> Result<usize, KvError> {
        self.slot_groups
            .get(slot.0 as usize)
            .copied()
            .ok_or(KvError::NoSlot {
                slot: slot.0,
                slots: self.config.layers.len(),
            })
    }

    /// The slot whose storage `slot` reads and its spec.
    pub fn owner(&self, slot: CacheSlot) -> Result<(CacheSlot, KvLayerSpec), KvError> {
        let spec = self
            .config
            .layers
            .get(slot.0 as usize)
            .ok_or(KvError::NoSlot {
                slot: slot.0,
                slots: self.config.layers.len(),
            })?;
        let owner = spec.shares.unwrap_or(slot);
        Ok((owner, self.config.layers[owner.0 as usize]))
    }

    /// Row positions and span ids of a group.
    pub fn rows(&self, group: usize) -> GroupRows<'_> {
        let g = &self.groups[group];
        GroupRows {
            pos: &g.pos,
            span: &g.span,
        }
    }

    /// Sets the span id of a row written in this step (image tokens).
    pub fn set_span(&mut self, group: usize, row: u32, span: i32) {
        self.groups[group].span[row as usize] = span;
    }

    /// A new, empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(
            id,
            Seq {
                len: 0,
                tables: vec![Vec::new(); self.groups.len()],
                keys: Vec::new(),
            },
        );
        id
    }

    /// The sequences in the pool.
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied()
    }

    fn seq(&self, id: SeqId) -> Result<&Seq, KvError> {
        self.seqs.get(&id).ok_or(KvError::UnknownSeq(id))
    }

    /// Tokens a sequence holds (the position its next token gets).
    pub fn len(&self, id: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(id)?.len)
    }

    /// A new sequence holding what `src` holds, sharing its blocks.
    pub fn fork(&mut self, src: SeqId) -> Result<SeqId, KvError> {
        let copy = self.seq(src)?.clone();
        for (g, table) in self.groups.iter_mut().zip(&copy.tables) {
            for &b in table.iter().flatten() {
                g.refs[b as usize] += 1;
            }
        }
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(id, copy);
        Ok(id)
    }

    /// Removes a sequence; blocks no one else holds return to the pool.
    pub fn free(&mut self, id: SeqId) -> Result<(), KvError> {
        let seq = self.seqs.remove(&id).ok_or(KvError::UnknownSeq(id))?;
        for (g, table) in self.groups.iter_mut().zip(&seq.tables) {
            for &b in table.iter().flatten() {
                g.release(b);
            }
        }
        Ok(())
    }

    /// Forgets every token of a sequence from position `len` on. Fails,
    /// changing nothing, if a sliding layer no longer holds the window a
    /// query at `len` needs.
    pub fn truncate(&mut self, id: SeqId, len: usize) -> Result<(), KvError> {
        let seq = self.seq(id)?;
        if len >= seq.len {
            return Ok(());
        }
        for (g, table) in self.groups.iter().zip(&seq.tables) {
            let needed = g.horizon(len)..len;
            if let Some(lost) = needed
                .clone()
                .find(|&p| table.get(p / BLOCK_TOKENS).is_none_or(|b| b.is_none()))
            {
                let oldest = (lost..len)
                    .find(|&p| table.get(p / BLOCK_TOKENS).is_some_and(|b| b.is_some()))
                    .unwrap_or(len);
                return Err(KvError::RewindTooFar {
                    seq: id,
                    len,
                    oldest,
                });
            }
        }
        let seq = self.seqs.get_mut(&id).expect("checked");
        seq.keys.truncate(len / BLOCK_TOKENS);
        let keep_blocks = len.div_ceil(BLOCK_TOKENS);
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            for b in table.drain(keep_blocks.min(table.len())..).flatten() {
                g.release(b);
            }
            // Rows past `len` in the last kept block; a shared block keeps
            // them for its other holders, and `prepare` clears its copy.
            if let Some(Some(b)) = table.get(len / BLOCK_TOKENS) {
                if g.refs[*b as usize] == 1 {
                    g.clear_rows(*b, len % BLOCK_TOKENS);
                }
            }
        }
        seq.len = len;
        Ok(())
    }

    /// Makes logical block `lb` of `table` (in group `gi`) held by this
    /// table alone, copying it if it is shared (a free block was counted
    /// for it); returns the physical block.
    fn make_private(
        &mut self,
        gi: usize,
        table: &mut [Option<u32>],
        lb: usize,
    ) -> Result<u32, KvError> {
        let old = table[lb].expect("present");
        let g = &mut self.groups[gi];
        if g.refs[old as usize] == 1 {
            return Ok(old);
        }
        let new = g.alloc();
        let (o, n) = (old as usize * BLOCK_TOKENS, new as usize * BLOCK_TOKENS);
        g.pos.copy_within(o..o + BLOCK_TOKENS, n);
        g.span.copy_within(o..o + BLOCK_TOKENS, n);
        g.refs[old as usize] -= 1;
        table[lb] = Some(new);
        for part in &mut self.parts {
            part.copy_block(gi, old, new)?;
        }
        Ok(new)
    }

    /// Gets the pool ready for `batch`: checks every sequence and position,
    /// counts the blocks the step needs before taking any (a full pool is an
    /// error naming the sequence that does not fit), drops blocks that slid
    /// out of every window, copies shared blocks about to be written, and
    /// marks the rows the step writes with their positions.
    pub fn prepare(&mut self, batch: &Batch) -> Result<StepLayout, KvError> {
        let runs = batch.runs()?;
        for run in &runs {
            let seq = self.seq(run.seq)?;
            if run.start != seq.len {
                return Err(KvError::Position {
                    seq: run.seq,
                    len: seq.len,
                    pos: run.start,
                });
            }
            if run.rows.len() > self.config.max_chunk {
                return Err(KvError::ChunkTooLong {
                    seq: run.seq,
                    n: run.rows.len(),
                    max_chunk: self.config.max_chunk,
                });
            }
        }
        // Count first (evicting cached blocks while that helps): blocks
        // dropped from windows come back, new and copied blocks are taken.
        while let Err((gi, e)) = self.count(&runs) {
            if !self.evict_one(gi) {
                return Err(e);
            }
        }
        let n_groups = self.groups.len();
        let mut layout = StepLayout {
            blocks: vec![Vec::with_capacity(runs.len()); n_groups],
            logical: vec![Vec::with_capacity(runs.len()); n_groups],
            write_rows: vec![vec![0; batch.len()]; n_groups],
            runs,
        };
        for ri in 0..layout.runs.len() {
            let run = layout.runs[ri].clone();
            let mut seq = self.seqs.remove(&run.seq).expect("checked");
            let end = run.start + run.rows.len();
            for gi in 0..n_groups {
                let horizon = self.groups[gi].horizon(run.start) / BLOCK_TOKENS;
                let table = &mut seq.tables[gi];
                for slot in table.iter_mut().take(horizon) {
                    if let Some(b) = slot.take() {
                        self.groups[gi].release(b);
                    }
                }
                if table.len() < end.div_ceil(BLOCK_TOKENS) {
                    table.resize(end.div_ceil(BLOCK_TOKENS), None);
                }
                for lb in run.start / BLOCK_TOKENS..end.div_ceil(BLOCK_TOKENS) {
                    let b = match table[lb] {
                        Some(_) => self.make_private(gi, table, lb)?,
                        None => {
                            let b = self.groups[gi].alloc();
                            table[lb] = Some(b);
                            b
                        }
                    };
                    // Rows from the first written on may be stale (left by a
                    // truncation while the block was shared).
                    if lb == run.start / BLOCK_TOKENS {
                        self.groups[gi].clear_rows(b, run.start % BLOCK_TOKENS);
                    }
                }
                let g = &mut self.groups[gi];
                for (i, row) in run.rows.clone().enumerate() {
                    let p = run.start + i;
                    let phys = table[p / BLOCK_TOKENS].expect("allocated") as usize * BLOCK_TOKENS
                        + p % BLOCK_TOKENS;
                    g.pos[phys] = p as i64;
                    g.span[phys] = 0;
                    layout.write_rows[gi][row] = phys as u32;
                }
                let (blocks, logical): (Vec<u32>, Vec<u32>) = table
                    .iter()
                    .enumerate()
                    .filter_map(|(lb, b)| b.map(|b| (b, lb as u32)))
                    .unzip();
                layout.blocks[gi].push(blocks);
                layout.logical[gi].push(logical);
            }
            self.seqs.insert(run.seq, seq);
        }
        Ok(layout)
    }

    /// Whether the free blocks cover what `runs` take; if not, the group
    /// that lacks blocks and the error.
    fn count(&self, runs: &[SeqRun]) -> Result<(), (usize, KvError)> {
        for (gi, g) in self.groups.iter().enumerate() {
            let mut free = g.free.len() as isize;
            for run in runs {
                let table = &self.seqs[&run.seq].tables[gi];
                let end = run.start + run.rows.len();
                let horizon = g.horizon(run.start) / BLOCK_TOKENS;
                let mut needed = 0;
                for b in table.iter().take(horizon).flatten() {
                    free += (g.refs[*b as usize] == 1) as isize;
                }
                for lb in run.start / BLOCK_TOKENS..end.div_ceil(BLOCK_TOKENS) {
                    needed += match table.get(lb) {
                        Some(Some(b)) => (g.refs[*b as usize] > 1) as isize,
                        _ => 1,
                    };
                }
                free -= needed;
                if free < 0 {
                    return Err((
                        gi,
                        KvError::Full {
                            seq: run.seq,
                            layers: layers_name(g.window),
                            needed: needed as usize,
                            free: (free + needed).max(0) as usize,
                        },
                    ));
                }
            }
        }
        Ok(())
    }

    /// Frees a block of group `gi` that only the cache holds, least
    /// recently used first; false if there is none. A sliding group's block
    /// goes alone (the entry stays usable where the window allows), a
    /// full-attention group's with its whole entry (no prefix through it is
    /// usable without it).
    fn evict_one(&mut self, gi: usize) -> bool {
        let g = &self.groups[gi];
        let Some(key) = self
            .cache
            .victim(|e| e.blocks[gi].is_some_and(|b| g.refs[b as usize] == 1))
        else {
            return false;
        };
        let whole = self.groups[gi].window.is_none();
        let e = self.cache.entries.get_mut(&key).expect("chosen");
        if whole {
            let e = self.cache.entries.remove(&key).expect("chosen");
            for (g, b) in self.groups.iter_mut().zip(e.blocks) {
                if let Some(b) = b {
                    g.release(b);
                }
            }
        } else {
            let b = e.blocks[gi].take().expect("chosen");
            if e.blocks.iter().all(Option::is_none) {
                self.cache.entries.remove(&key);
            }
            self.groups[gi].release(b);
        }
        true
    }

    /// Offers the full blocks of sequence `id`, whose tokens are `tokens`,
    /// to the prefix cache (blocks already there are marked used).
    pub fn publish(&mut self, id: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let KvPool {
            seqs,
            cache,
            groups,
            ..
        } = self;
        let seq = seqs.get_mut(&id).ok_or(KvError::UnknownSeq(id))?;
        if tokens.len() != seq.len {
            return Err(KvError::Tokens {
                seq: id,
                len: seq.len,
                tokens: tokens.len(),
            });
        }
        let now = cache.tick();
        for k in &seq.keys {
            if let Some(e) = cache.entries.get_mut(k) {
                e.used = now;
            }
        }
        for lb in seq.keys.len()..seq.len / BLOCK_TOKENS {
            let parent = seq.keys.last().copied().unwrap_or(ROOT);
            let block = &tokens[lb * BLOCK_TOKENS..(lb + 1) * BLOCK_TOKENS];
            let key = cache.key(parent, block);
            seq.keys.push(key);
            if let Some(e) = cache.entries.get_mut(&key) {
                e.used = now;
                continue;
            }
            let blocks: Vec<Option<u32>> = seq
                .tables
                .iter()
                .map(|t| t.get(lb).copied().flatten())
                .collect();
            for (g, b) in groups.iter_mut().zip(&blocks) {
                if let Some(b) = b {
                    g.refs[*b as usize] += 1;
                }
            }
            cache.entries.insert(
                key,
                prefix::Entry {
                    parent,
                    tokens: block.try_into().expect("a block of tokens"),
                    blocks,
                    depth: lb,
                    used: now,
                },
            );
        }
        Ok(())
    }

    /// How many blocks of a cached chain a new sequence can start from:
    /// every group must hold what a query after them sees.
    fn usable(&self, chain: &[u64]) -> usize {
        (1..=chain.len())
            .rev()
            .find(|&n| {
                self.groups.iter().enumerate().all(|(gi, g)| {
                    let from = g.horizon(n * BLOCK_TOKENS) / BLOCK_TOKENS;
                    chain[from..n]
                        .iter()
                        .all(|k| self.cache.entries[k].blocks[gi].is_some())
                })
            })
            .unwrap_or(0)
    }

    /// Tokens at the start of `tokens` that [`KvPool::add_cached`] would
    /// take from the cache (whole blocks).
    pub fn cached_prefix(&self, tokens: &[u32]) -> usize {
        self.usable(&self.cache.chain(tokens)) * BLOCK_TOKENS
    }

    /// A new sequence holding the longest cached prefix of `tokens` (whole
    /// blocks, shared with the cache), and how many tokens that is.
    pub fn add_cached(&mut self, tokens: &[u32]) -> (SeqId, usize) {
        let chain = self.cache.chain(tokens);
        let n = self.usable(&chain);
        let id = self.add_sequence();
        let now = self.cache.tick();
        let seq = self.seqs.get_mut(&id).expect("just added");
        for (gi, g) in self.groups.iter_mut().enumerate() {
            let from = g.horizon(n * BLOCK_TOKENS) / BLOCK_TOKENS;
            let table = &mut seq.tables[gi];
            for (lb, k) in chain[..n].iter().enumerate() {
                let b = self.cache.entries[k].blocks[gi].filter(|_| lb >= from);
                if let Some(b) = b {
                    g.refs[b as usize] += 1;
                }
                table.push(b);
            }
        }
        for k in &chain[..n] {
            self.cache.entries.get_mut(k).expect("in the chain").used = now;
        }
        seq.keys = chain[..n].to_vec();
        seq.len = n * BLOCK_TOKENS;
        (id, seq.len)
    }

    /// Blocks the prefix cache holds.
    pub fn cached_blocks(&self) -> usize {
        self.cache.entries.len()
    }

    /// Drops every cached block no sequence holds.
    pub fn clear_cache(&mut self) {
        for gi in 0..self.groups.len() {
            while self.evict_one(gi) {}
        }
    }

    /// Advances every sequence of a step that ran.
    pub fn commit(&mut self, layout: &StepLayout) {
        for run in &layout.runs {
            if let Some(seq) = self.seqs.get_mut(&run.seq) {
                seq.len = run.start + run.rows.len();
            }
        }
    }

    /// Checks the bookkeeping: every block's count equals the tables that
    /// hold it, free blocks are held by none and empty, and a sequence's
    /// rows hold its positions. For tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (gi, g) in self.groups.iter().enumerate() {
            let mut counts = vec![0u32; g.refs.len()];
            for e in self.cache.entries.values() {
                let Some(b) = e.blocks[gi] else { continue };
                counts[b as usize] += 1;
                for i in 0..BLOCK_TOKENS {
                    let p = (e.depth * BLOCK_TOKENS + i) as i64;
                    let got = g.pos[b as usize * BLOCK_TOKENS + i];
                    if got != p {
                        return Err(format!(
                            "group {gi}: cached block {b} should hold position {p}, holds {got}"
                        ));
                    }
                }
            }
            for (id, seq) in &self.seqs {
                for (lb, b) in seq.tables[gi].iter().enumerate() {
                    let Some(b) = b else { continue };
                    counts[*b as usize] += 1;
                    for i in 0..BLOCK_TOKENS {
                        let p = lb * BLOCK_TOKENS + i;
                        let got = g.pos[*b as usize * BLOCK_TOKENS + i];
                        if p < seq.len && got != p as i64 {
                            return Err(format!(
                                "group {gi}: {id} position {p} is in block {b}, whose row holds {got}"
                            ));
                        }
                    }
                }
            }
            if counts != g.refs {
                return Err(format!(
                    "group {gi}: counts {:?} differ from tables {counts:?}",
                    g.refs
                ));
            }
            for &b in &g.free {
                if g.refs[b as usize] != 0 {
                    return Err(format!("group {gi}: free block {b} is held"));
                }
                let rows = b as usize * BLOCK_TOKENS..(b as usize + 1) * BLOCK_TOKENS;
                if g.pos[rows].iter().any(|&p| p >= 0) {
                    return Err(format!("group {gi}: free block {b} has rows"));
                }
            }
            let held = g.refs.iter().filter(|&&r| r > 0).count();
            if held + g.free.len() != g.refs.len() {
                return Err(format!("group {gi}: blocks leaked"));
            }
        }
        Ok(())
    }
}

fn layers_name(window: Option<usize>) -> String {
    match window {
        None => "full-attention".into(),
        Some(w) => format!("sliding-window ({w})"),
    }
}
