//! The merge loop both tokenizers share (llama.cpp's `llm_tokenizer_spm_session`
//! and `llm_tokenizer_bpe_session`): start from UTF-8 characters, repeatedly
//! merge the adjacent pair with the best priority (ties to the leftmost),
//! skipping queue entries that went stale.
//!
//! Long fragments are cut into words before each ▁ wherever no piece can
//! span the cut, which gives the same result (no pair across a cut is ever
//! queued, so words never interact) with small, cache-friendly queues.

/// A symbol covers bytes `start..start + len` of the segment; `len == 0`
/// means it was merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

/// Priority in the high half, the left index inverted in the low half, so
/// one integer comparison orders by priority and then leftmost first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    key: u64,
    right: u32,
    size: u32,
}

impl Candidate {
    fn left(&self) -> u32 {
        u32::MAX - self.key as u32
    }
}

/// Byte length of a character from its lead byte, as llama.cpp's
/// `unicode_len_utf8`: continuation and invalid bytes count as one, and
/// 0xF8..0xFF as four.
pub(crate) fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize]
}

const SPACE: &[u8] = "\u{2581}".as_bytes();

/// Strings that contain ▁ after their first byte, each with the offsets of
/// those ▁s: the only strings that could span a cut before a ▁.
#[derive(Default)]
pub(crate) struct SpaceJunctions {
    spans: Vec<(Box<[u8]>, Vec<usize>)>,
    /// False when there are too many to check; then nothing is cut.
    enabled: bool,
}

impl SpaceJunctions {
    const MAX: usize = 256;

    pub fn new(spans: Vec<(Box<[u8]>, Vec<usize>)>) -> SpaceJunctions {
        let enabled = spans.len() <= Self::MAX;
        SpaceJunctions { spans, enabled }
    }

    /// Offsets of ▁ in `s` after its first byte.
    pub fn inner_spaces(s: &[u8]) -> Vec<usize> {
        memchr::memmem::find_iter(s, SPACE)
            .filter(|&k| k > 0)
            .collect()
    }

    /// True if some string in the list occurs in `text` across byte `at`.
    fn spans(&self, text: &[u8], at: usize) -> bool {
        self.spans.iter().any(|(s, offsets)| {
            offsets
                .iter()
                .any(|&k| at >= k && text[at - k..].starts_with(s))
        })
    }
}

/// Calls `segment` for each word of `text`: pieces between cuts made before
/// a ▁ character wherever `junctions` says no string can span the cut.
pub(crate) fn for_each_word(
    text: &[u8],
    junctions: &SpaceJunctions,
    mut segment: impl FnMut(&[u8]),
) {
    // Beyond u32 offsets the merge loop cannot index; cut there regardless.
    const MAX_SEGMENT: usize = u32::MAX as usize - 4;
    let mut start = 0;
    let mut offset = 0;
    while offset < text.len() {
        let cut = offset > start
            && ((junctions.enabled
                && text[offset..].starts_with(SPACE)
                && !junctions.spans(text, offset))
                || offset - start >= MAX_SEGMENT);
        if cut {
            segment(&text[start..offset]);
            start = offset;
        }
        offset += utf8_len(text[offset]).min(text.len() - offset);
    }
    if start < text.len() {
        segment(&text[start..]);
    }
}

#[derive(Default)]
pub(crate) struct MergeSession {
    symbols: Vec<Symbol>,
    queue: QuadHeap,
}

/// A max-heap with four children per node: half the depth of a binary heap,
/// and the children of a node share a cache line. Popping dominates encoding
/// time on long words, where the queue holds about one entry per character.
#[derive(Default)]
struct QuadHeap {
    items: Vec<Candidate>,
}

impl QuadHeap {
    fn clear(&mut self) {
        self.items.clear();
    }

    /// Makes a heap of `items` in O(n).
    fn rebuild(&mut self) {
        let n = self.items.len();
        if n > 1 {
            for i in (0..=(n - 2) / 4).rev() {
                self.sift_down(i);
            }
        }
    }

    fn push(&mut self, c: Candidate) {
        let mut i = self.items.len();
        self.items.push(c);
        while i > 0 {
            let parent = (i - 1) / 4;
            if self.items[parent] >= c {
                break;
            }
            self.items[i] = self.items[parent];
            i = parent;
        }
        self.items[i] = c;
    }

    fn pop(&mut self) -> Option<Candidate> {
        let last = self.items.pop()?;
        if self.items.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.items[0], last);
        self.sift_down(0);
        Some(top)
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.items.len();
        let c = self.items[i];
        loop {
            let first = 4 * i + 1;
            if first >= n {
                break;
            }
            let mut best = first;
            for child in first + 1..(first + 4).min(n) {
                if self.items[child] > self.items[best] {
                    best = child;
                }
            }
            if self.items[best] <= c {
                break;
            }
            self.items[i] = self.items[best];
            i = best;
        }
        self.items[i] = c;
    }
}

impl MergeSession {
    /// Merges one word. `priority(pair, split)` is called with the bytes of
    /// two adjacent symbols and the length of the left one; it returns None
    /// when they do not merge, else a priority (higher merges first).
    /// `emit` receives the final symbols in order.
    pub fn merge(
        &mut self,
        text: &[u8],
        mut priority: impl FnMut(&[u8], usize) -> Option<u32>,
        mut emit: impl FnMut(&[u8]),
    ) {
        debug_assert!(text.len() < u32::MAX as usize);
        self.split_chars(text);
        self.queue.clear();
        for i in 1..self.symbols.len() as u32 {
            if let Some(c) = self.candidate(text, &mut priority, i - 1, i) {
                self.queue.items.push(c);
            }
        }
        // Heapify once instead of pushing one by one.
        self.queue.rebuild();

        while let Some(c) = self.queue.pop() {
            let left = c.left();
            let (l, r) = (self.symbols[left as usize], self.symbols[c.right as usize]);
            // Stale: a side was merged away or grew since this was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != c.size {
                continue;
            }
            self.symbols[left as usize].len += r.len;
            self.symbols[c.right as usize].len = 0;
            self.symbols[left as usize].next = r.next;
            if r.next != NONE {
                self.symbols[r.next as usize].prev = left;
            }
            if l.prev != NONE {
                if let Some(c) = self.candidate(text, &mut priority, l.prev, left) {
                    self.queue.push(c);
                }
            }
            if r.next != NONE {
                if let Some(c) = self.candidate(text, &mut priority, left, r.next) {
                    self.queue.push(c);
                }
            }
        }

        let mut i = if self.symbols.is_empty() { NONE } else { 0 };
        while i != NONE {
            let s = self.symbols[i as usize];
            emit(&text[s.start as usize..(s.start + s.len) as usize]);
            i = s.next;
        }
    }

    fn split_chars(&mut self, text: &[u8]) {
        self.symbols.clear();
        let mut offset = 0;
        while offset < text.len() {
            let len = utf8_len(text[offset]).min(text.len() - offset);
            let i = self.symbols.len() as u32;
            self.symbols.push(Symbol {
                start: offset as u32,
                len: len as u32,
                prev: if i == 0 { NONE } else { i - 1 },
                next: if offset + len == text.len() {
                    NONE
                } else {
                    i + 1
                },
            });
            offset += len;
        }
    }

    fn candidate(
        &self,
        text: &[u8],
        priority: &mut impl FnMut(&[u8], usize) -> Option<u32>,
        left: u32,
        right: u32,
    ) -> Option<Candidate> {
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let size = l.len + r.len;
        // Adjacent live symbols are contiguous in the text.
        let pair = &text[l.start as usize..(l.start + size) as usize];
        let p = priority(pair, l.len as usize)?;
        Some(Candidate {
            key: ((p as u64) << 32) | (u32::MAX - left) as u64,
            right,
            size,
        })
    }
}

/// An f32 mapped to a u32 with the same order, for use as a priority.
/// -0.0 and 0.0 must be made equal first (the loader does).
pub(crate) fn ordered_f32(x: f32) -> u32 {
    let bits = x.to_bits();
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_f32_keeps_order() {
        let xs = [f32::MIN, -1000.0, -1.5, -1e-30, 0.0, 1e-30, 2.0, f32::MAX];
        for w in xs.windows(2) {
            assert!(ordered_f32(w[0]) < ordered_f32(w[1]), "{w:?}");
        }
    }

    #[test]
    fn words_are_cut_before_spaces_unless_spanned() {
        let junctions = SpaceJunctions::new(vec![(
            ">▁<".as_bytes().into(),
            SpaceJunctions::inner_spaces(">▁<".as_bytes()),
        )]);
        let text = "a▁b>▁<c▁".as_bytes();
        let mut words = Vec::new();
        for_each_word(text, &junctions, |w| {
            words.push(String::from_utf8_lossy(w).into_owned())
        });
        assert_eq!(words, ["a", "▁b>▁<c", "▁"]);
    }

    #[test]
    fn quad_heap_pops_in_order() {
        let mut h = QuadHeap::default();
        let mut x: u64 = 12345;
        let mut all = Vec::new();
        for i in 0..1000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let c = Candidate {
                key: x >> 40,
                right: i,
                size: 1,
            };
            all.push(c);
            if i < 500 {
                h.items.push(c);
            }
        }
        h.rebuild();
        for &c in &all[500..] {
            h.push(c);
        }
        all.sort_unstable_by(|a, b| b.cmp(a));
        let popped: Vec<Candidate> = std::iter::from_fn(|| h.pop()).collect();
        assert!(popped == all);
    }

    #[test]
    fn tie_goes_to_the_leftmost_pair() {
        // Every pair merges with the same priority: pairs form from the left.
        let mut s = MergeSession::default();
        let mut out = Vec::new();
        s.merge(
            b"aaaaa",
            |pair, _| (pair.len() == 2).then_some(1),
            |sym| out.push(sym.to_vec()),
        );
        assert_eq!(out, [b"aa".to_vec(), b"aa".to_vec(), b"a".to_vec()]);
    }
}
