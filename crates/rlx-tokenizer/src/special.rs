//! Splitting special tokens out of raw text before merging, with exactly the
//! result of llama.cpp's `tokenizer_st_partition`: take the special tokens
//! longest first, and cut each one out of every remaining raw fragment at
//! its leftmost non-overlapping matches.
//!
//! Doing that literally costs (number of specials) x (text length). Instead
//! one Aho-Corasick pass finds which specials occur at all, and only those
//! are searched for, in priority order.

use aho_corasick::{AhoCorasick, MatchKind};
use memchr::memmem::Finder;

use crate::vocab::{attr, Vocab};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Bytes `start..end` of the input, still to be merged.
    Raw { start: usize, end: usize },
    Token(u32),
}

pub(crate) struct SpecialSplitter {
    /// Patterns in priority order: pattern index i is `ids[i]`.
    automaton: Option<AhoCorasick>,
    finders: Vec<Finder<'static>>,
    ids: Vec<u32>,
    /// CONTROL and UNKNOWN tokens take part only when parsing special tokens.
    needs_parse_special: Vec<bool>,
}

impl SpecialSplitter {
    pub fn new(vocab: &Vocab) -> SpecialSplitter {
        let ids = vocab.specials.clone();
        let texts: Vec<&[u8]> = ids
            .iter()
            .map(|&i| vocab.pieces[i as usize].as_bytes())
            .collect();
        // Standard match kind: the overlapping search below needs it.
        let automaton = if texts.is_empty() {
            None
        } else {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(&texts)
                .ok()
        };
        let finders = texts.iter().map(|t| Finder::new(t).into_owned()).collect();
        let needs_parse_special = ids
            .iter()
            .map(|&i| vocab.attrs[i as usize] & (attr::CONTROL | attr::UNKNOWN) != 0)
            .collect();
        SpecialSplitter {
            automaton,
            finders,
            ids,
            needs_parse_special,
        }
    }

    pub fn split(&self, text: &[u8], parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Raw {
            start: 0,
            end: text.len(),
        }];
        let Some(automaton) = &self.automaton else {
            return fragments;
        };

        // First occurrence of every special that occurs anywhere.
        let mut first_at: Vec<usize> = Vec::new();
        for m in automaton.find_overlapping_iter(text) {
            let p = m.pattern().as_usize();
            if !parse_special && self.needs_parse_special[p] {
                continue;
            }
            if first_at.is_empty() {
                first_at = vec![usize::MAX; self.ids.len()];
            }
            first_at[p] = first_at[p].min(m.start());
        }

        let mut next = Vec::new();
        for (p, &first) in first_at.iter().enumerate() {
            if first == usize::MAX {
                continue;
            }
            let finder = &self.finders[p];
            let len = finder.needle().len();
            next.clear();
            for &f in &fragments {
                let Fragment::Raw { mut start, end } = f else {
                    next.push(f);
                    continue;
                };
                if end < first + len || end - start < len {
                    next.push(f);
                    continue;
                }
                // memmem's iterator is leftmost and non-overlapping, as is
                // llama.cpp's search that restarts after each match.
                let base = start;
                for m in finder.find_iter(&text[base..end]) {
                    let at = base + m;
                    if at > start {
                        next.push(Fragment::Raw { start, end: at });
                    }
                    next.push(Fragment::Token(self.ids[p]));
                    start = at + len;
                }
                if start < end {
                    next.push(Fragment::Raw { start, end });
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments
    }
}
