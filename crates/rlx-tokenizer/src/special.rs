//! Splitting special tokens out of raw text before merging, with exactly the
//! result of llama.cpp's `tokenizer_st_partition`: take the special tokens
//! longest first, and cut each one out of every remaining raw fragment at
//! its leftmost non-overlapping matches.
//!
//! Doing that literally costs (number of specials) x (text length). Instead
//! one Aho-Corasick pass finds which specials occur at all, and only those
//! are searched for, in priority order.

use aho_corasick::automaton::Automaton;
use aho_corasick::nfa::contiguous::NFA;
use aho_corasick::{Anchored, MatchKind};
use memchr::memmem::Finder;

use crate::hash::FxHashSet;
use crate::vocab::{attr, Vocab};
use crate::TokenizerError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Bytes `start..end` of the input, still to be merged.
    Raw {
        start: usize,
        end: usize,
    },
    Token(u32),
}

pub(crate) struct SpecialSplitter {
    /// Patterns in priority order: pattern index i is `ids[i]`.
    automaton: Option<NFA>,
    finders: Vec<Finder<'static>>,
    ids: Vec<u32>,
    /// CONTROL and UNKNOWN tokens take part only when parsing special tokens.
    needs_parse_special: Vec<bool>,
}

impl SpecialSplitter {
    pub fn new(vocab: &Vocab) -> Result<SpecialSplitter, TokenizerError> {
        let ids = vocab.specials.clone();
        let texts: Vec<&[u8]> = ids
            .iter()
            .map(|&i| vocab.pieces[i as usize].as_bytes())
            .collect();
        // Standard semantics: a match state lists every pattern ending there.
        let automaton = if texts.is_empty() {
            None
        } else {
            let nfa = NFA::builder()
                .match_kind(MatchKind::Standard)
                .build(&texts)
                .map_err(|e| TokenizerError::BadMetadata {
                    key: "tokenizer.ggml.tokens".to_owned(),
                    reason: format!("cannot index the {} special tokens: {e}", texts.len()),
                })?;
            Some(nfa)
        };
        let finders = texts.iter().map(|t| Finder::new(t).into_owned()).collect();
        let needs_parse_special = ids
            .iter()
            .map(|&i| vocab.attrs[i as usize] & (attr::CONTROL | attr::UNKNOWN) != 0)
            .collect();
        Ok(SpecialSplitter {
            automaton,
            finders,
            ids,
            needs_parse_special,
        })
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

        let first_at = self.first_occurrences(automaton, text, parse_special);

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

    /// Where each special that takes part first occurs (`usize::MAX`: nowhere);
    /// empty when none occurs. Each automaton state's patterns are read only
    /// the first time the state is entered: the first entry of any state that
    /// reports a pattern is that pattern's first occurrence. This keeps runs
    /// such as a megabyte of spaces linear.
    fn first_occurrences(&self, nfa: &NFA, text: &[u8], parse_special: bool) -> Vec<usize> {
        let mut first_at: Vec<usize> = Vec::new();
        let Ok(mut sid) = nfa.start_state(Anchored::No) else {
            return first_at;
        };
        let mut seen: FxHashSet<u32> = FxHashSet::default();
        let mut last_match = None;
        for (i, &b) in text.iter().enumerate() {
            sid = nfa.next_state(Anchored::No, sid, b);
            if !nfa.is_special(sid) || !nfa.is_match(sid) || last_match == Some(sid) {
                continue;
            }
            last_match = Some(sid);
            if !seen.insert(sid.as_u32()) {
                continue;
            }
            for k in 0..nfa.match_len(sid) {
                let p = nfa.match_pattern(sid, k).as_usize();
                if !parse_special && self.needs_parse_special[p] {
                    continue;
                }
                if first_at.is_empty() {
                    first_at = vec![usize::MAX; self.ids.len()];
                }
                let start = i + 1 - nfa.pattern_len(nfa.match_pattern(sid, k));
                first_at[p] = first_at[p].min(start);
            }
        }
        first_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aho_corasick::AhoCorasick;

    #[test]
    fn first_occurrences_agree_with_an_overlapping_search() {
        let patterns = [
            "  ", "   ", "    ", "\n", "\n\n", "<b>", "<b><b>", "b><", "ab",
        ];
        let nfa = NFA::builder()
            .match_kind(MatchKind::Standard)
            .build(patterns)
            .unwrap();
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .build(patterns)
            .unwrap();
        let splitter = SpecialSplitter {
            automaton: None,
            finders: Vec::new(),
            ids: (0..patterns.len() as u32).collect(),
            needs_parse_special: vec![false; patterns.len()],
        };
        for text in [
            "a  b   c    d\n\n\n<b><b><b>ab",
            "         ",
            "x<b>y\nab ab  ",
            "",
            "nothing here",
        ] {
            let mut want = vec![usize::MAX; patterns.len()];
            for m in ac.find_overlapping_iter(text) {
                let p = m.pattern().as_usize();
                want[p] = want[p].min(m.start());
            }
            let got = splitter.first_occurrences(&nfa, text.as_bytes(), true);
            if want.iter().all(|&w| w == usize::MAX) {
                assert!(got.is_empty(), "{text:?}");
            } else {
                assert_eq!(got, want, "{text:?}");
            }
        }
    }
}
