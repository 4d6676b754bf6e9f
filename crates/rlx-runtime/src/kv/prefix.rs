//! Blocks kept by content for prefix reuse.
//!
//! A full block's key hashes its tokens with its predecessor's key, so a key
//! names a whole prefix. An entry keeps one reference on the block of every
//! group (where the group still held it when the block was published), the
//! block's tokens and its parent's key: a lookup compares both, so a hash
//! collision is a miss, never another prompt's K/V. Entries are evicted
//! least recently used (the deepest first among equals, so a chain loses
//! its tail before its head) when a step needs blocks the free lists lack.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};

use super::BLOCK_TOKENS;

/// The key of the (absent) block before a sequence's first.
pub(super) const ROOT: u64 = 0;

pub(super) struct Entry {
    pub parent: u64,
    pub tokens: [u32; BLOCK_TOKENS],
    /// Per group: the physical block, or none where the group had dropped
    /// it (a sliding window) before the block was published.
    pub blocks: Vec<Option<u32>>,
    /// Blocks before this one in its chain.
    pub depth: usize,
    pub used: u64,
}

pub(super) struct PrefixCache {
    pub entries: HashMap<u64, Entry>,
    /// Random per pool: a client cannot craft prompts whose keys collide.
    hasher: RandomState,
    clock: u64,
}

impl PrefixCache {
    pub fn new() -> Self {
        PrefixCache {
            entries: HashMap::new(),
            hasher: RandomState::new(),
            clock: 0,
        }
    }

    /// The key of a block of `tokens` after the block keyed `parent`.
    pub fn key(&self, parent: u64, tokens: &[u32]) -> u64 {
        let mut h = self.hasher.build_hasher();
        parent.hash(&mut h);
        tokens.hash(&mut h);
        // ROOT stays reserved for "no block".
        h.finish().max(1)
    }

    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The entries of the longest cached chain that starts `tokens`' full
    /// blocks, each checked against its tokens and parent: their keys.
    pub fn chain(&self, tokens: &[u32]) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut parent = ROOT;
        for block in tokens.chunks_exact(BLOCK_TOKENS) {
            let key = self.key(parent, block);
            match self.entries.get(&key) {
                Some(e) if e.parent == parent && e.tokens[..] == *block => keys.push(key),
                _ => break,
            }
            parent = key;
        }
        keys
    }

    /// The entry to evict next among those `evictable` allows.
    pub fn victim(&self, evictable: impl Fn(&Entry) -> bool) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| evictable(e))
            .min_by_key(|(_, e)| (e.used, std::cmp::Reverse(e.depth)))
            .map(|(&k, _)| k)
    }
}
