//! The Gemma 4 BPE of llama.cpp's `llm_tokenizer_bpe_session` with the
//! `gemma4` pre-tokenizer: split the (▁-escaped) text into lines and runs of
//! newlines, emit a newline run whole when it is a token, otherwise merge the
//! adjacent pair with the lowest rank in `tokenizer.ggml.merges`, then fall
//! back to `<0xHH>` tokens (dropping bytes that have none).

use rlx_gguf::GgufFile;

use crate::hash::FxHashMap;
use crate::merge::{for_each_word, MergeSession, SpaceJunctions};
use crate::vocab::Vocab;
use crate::TokenizerError;

/// Merge ranks keyed by `left_len (u32 LE) ++ left ++ right`, so a lookup
/// needs no allocation and two splits of the same string stay apart.
pub(crate) struct Merges {
    ranks: FxHashMap<Box<[u8]>, u32>,
}

impl Merges {
    pub fn from_gguf(file: &GgufFile) -> Result<Merges, TokenizerError> {
        let key = "tokenizer.ggml.merges";
        let list =
            file.get_array(key)?
                .as_strings()
                .ok_or_else(|| TokenizerError::BadMetadata {
                    key: key.to_owned(),
                    reason: "expected an array of strings".to_owned(),
                })?;
        let mut ranks = FxHashMap::default();
        ranks.reserve(list.len());
        let mut scratch = Vec::new();
        for (rank, merge) in list.iter().enumerate() {
            // Split at the first space after position 0; without one, llama.cpp
            // records an empty pair, which can never match.
            let bytes = merge.as_bytes();
            let Some(pos) = bytes
                .get(1..)
                .and_then(|rest| memchr::memchr(b' ', rest))
                .map(|p| p + 1)
            else {
                continue;
            };
            let (left, right) = (&bytes[..pos], &bytes[pos + 1..]);
            key_into(&mut scratch, left, right);
            // The first rank of a repeated merge wins, as with `emplace`.
            ranks
                .entry(scratch.as_slice().into())
                .or_insert(rank as u32);
        }
        Ok(Merges { ranks })
    }

    fn rank(&self, scratch: &mut Vec<u8>, left: &[u8], right: &[u8]) -> Option<u32> {
        key_into(scratch, left, right);
        self.ranks.get(scratch.as_slice()).copied()
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }
}

fn key_into(scratch: &mut Vec<u8>, left: &[u8], right: &[u8]) {
    scratch.clear();
    scratch.extend_from_slice(&(left.len() as u32).to_le_bytes());
    scratch.extend_from_slice(left);
    scratch.extend_from_slice(right);
}

/// Merges `(left, right)` with `right` starting with ▁, as the strings they
/// produce: the only merges that could cross a cut before a ▁.
pub(crate) fn space_junctions(merges: &Merges) -> SpaceJunctions {
    let spans = merges
        .ranks
        .keys()
        .filter_map(|key| {
            let left_len = u32::from_le_bytes(key[..4].try_into().ok()?) as usize;
            let pair = &key[4..];
            (left_len > 0 && pair[left_len..].starts_with("\u{2581}".as_bytes()))
                .then(|| (pair.into(), vec![left_len]))
        })
        .collect();
    SpaceJunctions::new(spans)
}

/// Tokenizes one raw fragment whose spaces are already escaped to ▁.
pub(crate) fn tokenize(
    session: &mut MergeSession,
    scratch: &mut Vec<u8>,
    vocab: &Vocab,
    merges: &Merges,
    junctions: &SpaceJunctions,
    text: &[u8],
    out: &mut Vec<u32>,
) {
    let text = llama_utf8_roundtrip(text);
    let text = text.as_ref();
    let mut start = 0;
    while start < text.len() {
        let newline = text[start] == b'\n';
        let len = text[start..]
            .iter()
            .position(|&b| (b == b'\n') != newline)
            .unwrap_or(text.len() - start);
        let chunk = &text[start..start + len];
        start += len;
        if newline {
            if let Some(id) = vocab.id(chunk) {
                out.push(id);
                continue;
            }
        }
        for_each_word(chunk, junctions, |word| {
            session.merge(
                word,
                // Lowest rank first.
                |pair, split| {
                    merges
                        .rank(scratch, &pair[..split], &pair[split..])
                        .map(|r| u32::MAX - r)
                },
                |symbol| match vocab.id(symbol) {
                    Some(id) => out.push(id),
                    // Missing byte tokens are dropped, as in llama.cpp.
                    None => {
                        out.extend(symbol.iter().filter_map(|&b| vocab.byte_tokens[b as usize]))
                    }
                },
            )
        });
    }
}

/// llama.cpp's regex splitter decodes the text to code points and encodes
/// them again: each byte that does not start a well-formed sequence becomes
/// U+FFFD, while overlong forms and surrogates are re-encoded from their
/// value. Valid UTF-8 comes back unchanged.
fn llama_utf8_roundtrip(text: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if std::str::from_utf8(text).is_ok() {
        return std::borrow::Cow::Borrowed(text);
    }
    let cont = |i: usize| text.get(i).is_some_and(|&b| b & 0xc0 == 0x80);
    let mut out = Vec::with_capacity(text.len() + 8);
    let mut i = 0;
    while i < text.len() {
        let b = text[i] as u32;
        let (cpt, n) = if b & 0x80 == 0 {
            (Some(b), 1)
        } else if b & 0x40 == 0 {
            (None, 1)
        } else if b & 0x20 == 0 {
            if cont(i + 1) {
                (Some(((b & 0x1f) << 6) | (text[i + 1] as u32 & 0x3f)), 2)
            } else {
                (None, 1)
            }
        } else if b & 0x10 == 0 {
            if cont(i + 1) && cont(i + 2) {
                let c = ((b & 0x0f) << 12)
                    | ((text[i + 1] as u32 & 0x3f) << 6)
                    | (text[i + 2] as u32 & 0x3f);
                (Some(c), 3)
            } else {
                (None, 1)
            }
        } else if b & 0x08 == 0 {
            if cont(i + 1) && cont(i + 2) && cont(i + 3) {
                let c = ((b & 0x07) << 18)
                    | ((text[i + 1] as u32 & 0x3f) << 12)
                    | ((text[i + 2] as u32 & 0x3f) << 6)
                    | (text[i + 3] as u32 & 0x3f);
                (Some(c), 4)
            } else {
                (None, 1)
            }
        } else {
            (None, 1)
        };
        // Above U+10FFFF llama.cpp throws; U+FFFD is the graceful reading.
        encode_cpt(cpt.filter(|&c| c <= 0x10ffff).unwrap_or(0xfffd), &mut out);
        i += n;
    }
    std::borrow::Cow::Owned(out)
}

/// UTF-8 encoding that, like llama.cpp's, also encodes surrogates.
fn encode_cpt(c: u32, out: &mut Vec<u8>) {
    if c <= 0x7f {
        out.push(c as u8);
    } else if c <= 0x7ff {
        out.extend_from_slice(&[0xc0 | (c >> 6) as u8, 0x80 | (c & 0x3f) as u8]);
    } else if c <= 0xffff {
        out.extend_from_slice(&[
            0xe0 | (c >> 12) as u8,
            0x80 | ((c >> 6) & 0x3f) as u8,
            0x80 | (c & 0x3f) as u8,
        ]);
    } else {
        out.extend_from_slice(&[
            0xf0 | (c >> 18) as u8,
            0x80 | ((c >> 12) & 0x3f) as u8,
            0x80 | ((c >> 6) & 0x3f) as u8,
            0x80 | (c & 0x3f) as u8,
        ]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_matches_llama_decoder() {
        assert_eq!(
            &*llama_utf8_roundtrip("héllo".as_bytes()),
            "héllo".as_bytes()
        );
        // A lone continuation byte and a truncated sequence become U+FFFD each.
        assert_eq!(
            &*llama_utf8_roundtrip(b"a\x80b\xe2\x96"),
            "a\u{fffd}b\u{fffd}\u{fffd}".as_bytes()
        );
        // An overlong NUL is decoded by value.
        assert_eq!(
            &*llama_utf8_roundtrip(b"\xc0\x80x\xff"),
            b"\x00x\xef\xbf\xbd"
        );
        // Surrogates pass through.
        assert_eq!(
            &*llama_utf8_roundtrip(b"\xed\xa0\x80\xff"),
            b"\xed\xa0\x80\xef\xbf\xbd"
        );
    }
}
