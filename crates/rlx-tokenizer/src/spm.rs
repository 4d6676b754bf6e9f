//! The SentencePiece-style merge of llama.cpp's `llm_tokenizer_spm_session`:
//! start from UTF-8 characters, repeatedly merge the adjacent pair whose
//! concatenation is the highest-scoring piece, then fall back to bytes for
//! whatever is left that is not a piece.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

/// A symbol covers bytes `start..start + len`; `len == 0` means merged away.
#[derive(Clone, Copy)]
pub(crate) struct Symbol {
    pub start: usize,
    pub len: usize,
    pub prev: usize,
    pub next: usize,
}

pub(crate) const NONE: usize = usize::MAX;

/// Splits into characters by lead byte, clipped at the end of the text, as
/// llama.cpp's `unicode_len_utf8` does; invalid bytes become one-byte symbols
/// or swallow the bytes after them, exactly like the reference.
pub(crate) fn split_chars(text: &[u8], symbols: &mut Vec<Symbol>) {
    symbols.clear();
    let mut offset = 0;
    while offset < text.len() {
        let len = utf8_len(text[offset]).min(text.len() - offset);
        let i = symbols.len();
        symbols.push(Symbol {
            start: offset,
            len,
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

pub(crate) fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize]
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Higher score first; on a tie, the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        // Scores are never NaN (the loader replaces them), so this is `<`.
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Reusable buffers for one merge at a time.
#[derive(Default)]
pub(crate) struct SpmSession {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl SpmSession {
    /// Tokenizes one raw fragment whose spaces are already escaped to ▁.
    pub fn tokenize(&mut self, vocab: &Vocab, text: &[u8], out: &mut Vec<u32>) {
        split_chars(text, &mut self.symbols);
        self.queue.clear();
        for i in 1..self.symbols.len() {
            self.try_add_bigram(vocab, text, i - 1, i);
        }

        while let Some(bigram) = self.queue.pop() {
            let (l, r) = (self.symbols[bigram.left], self.symbols[bigram.right]);
            // Stale: one side was merged into something else since.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            self.symbols[bigram.left].len += r.len;
            self.symbols[bigram.right].len = 0;
            self.symbols[bigram.left].next = r.next;
            if r.next != NONE {
                self.symbols[r.next].prev = bigram.left;
            }
            self.try_add_bigram(vocab, text, l.prev, bigram.left);
            self.try_add_bigram(vocab, text, bigram.left, r.next);
        }

        // Every merged symbol is a piece by construction; only unmerged
        // characters can miss the vocabulary.
        let mut i = if self.symbols.is_empty() { NONE } else { 0 };
        while i != NONE {
            let s = self.symbols[i];
            let bytes = &text[s.start..s.start + s.len];
            match vocab.id(bytes) {
                Some(id) => out.push(id),
                None => push_bytes(vocab, bytes, out),
            }
            i = s.next;
        }
    }

    fn try_add_bigram(&mut self, vocab: &Vocab, text: &[u8], left: usize, right: usize) {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (self.symbols[left], self.symbols[right]);
        let size = l.len + r.len;
        if size > vocab.max_piece_len {
            return;
        }
        // Adjacent live symbols are contiguous in the text.
        let Some(id) = vocab.id(&text[l.start..l.start + size]) else {
            return;
        };
        self.queue.push(Bigram {
            score: vocab.scores[id as usize],
            left,
            right,
            size,
        });
    }
}

/// Byte fallback: `<0xHH>` for each byte. llama.cpp aborts when a byte has
/// no token; the unknown token stands in instead.
pub(crate) fn push_bytes(vocab: &Vocab, bytes: &[u8], out: &mut Vec<u32>) {
    for &b in bytes {
        if let Some(id) = vocab.byte_tokens[b as usize].or(vocab.unk) {
            out.push(id);
        }
    }
}
