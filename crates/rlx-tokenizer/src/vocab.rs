//! The vocabulary as llama.cpp's `llama_vocab::impl::load` builds it from the
//! `tokenizer.*` keys: pieces, scores, token attributes (after its text-based
//! fix-ups), special ids, the end-of-generation set and the list of tokens
//! that are split out of raw text before merging.

use rlx_gguf::{Array, GgufFile, Value};

use crate::hash::FxHashMap;
use crate::TokenizerError;

/// The token type as stored in `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
    Undefined,
}

impl TokenKind {
    fn from_gguf(t: i32) -> TokenKind {
        match t {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }
}

/// llama.cpp's `llama_token_attr` bits. These, not the stored types, decide
/// splitting and rendering, because llama.cpp adjusts them by token text.
pub(crate) mod attr {
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;

    pub fn from_kind(kind: super::TokenKind) -> u8 {
        use super::TokenKind::*;
        match kind {
            Normal => NORMAL,
            Unknown => UNKNOWN,
            Control => CONTROL,
            UserDefined => USER_DEFINED,
            Unused => UNUSED,
            Byte => BYTE,
            Undefined => 0,
        }
    }
}

/// Which merge algorithm the vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerModel {
    /// `tokenizer.ggml.model = "llama"`: score-driven SentencePiece merges (Gemma 1 to 3n).
    SentencePiece,
    /// `tokenizer.ggml.model = "gemma4"`: rank-driven BPE over lines (Gemma 4).
    Gemma4Bpe,
}

/// Texts llama.cpp promotes to CONTROL and to end-of-generation, whatever
/// their stored type (`load`, "auto-detect special tokens by text").
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Texts llama.cpp takes as the end-of-turn token when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle texts llama.cpp promotes to CONTROL. The pad, repo and
/// file-separator ones also end generation.
const FIM_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_EOG_TEXTS: &[&str] = &[
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

pub(crate) struct Vocab {
    pub model: TokenizerModel,
    pub pieces: Vec<String>,
    pub scores: Vec<f32>,
    pub kinds: Vec<TokenKind>,
    pub attrs: Vec<u8>,
    pub piece_to_id: FxHashMap<Box<[u8]>, u32>,
    pub max_piece_len: usize,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// Sorted ascending.
    pub eog: Vec<u32>,
    /// Tokens split out of raw text, longest text first.
    pub specials: Vec<u32>,
    /// Byte-fallback token for each byte value.
    pub byte_tokens: [Option<u32>; 256],
    /// What each token renders as with special tokens shown, concatenated;
    /// `rendered_offsets[i]..rendered_offsets[i + 1]` is token i.
    pub rendered: Vec<u8>,
    pub rendered_offsets: Vec<u32>,
}

fn bad(key: &str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::BadMetadata {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

fn opt_u32(file: &GgufFile, key: &str) -> Result<Option<u64>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(key, format!("expected an unsigned integer, found {v}"))),
    }
}

fn opt_bool(file: &GgufFile, key: &str) -> Result<Option<bool>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(key, format!("expected a bool, found {v}"))),
    }
}

impl Vocab {
    pub fn from_gguf(file: &GgufFile) -> Result<Vocab, TokenizerError> {
        let model_name = file.get_str("tokenizer.ggml.model")?;
        let model = match model_name {
            "llama" => TokenizerModel::SentencePiece,
            "gemma4" => TokenizerModel::Gemma4Bpe,
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_owned(),
                })
            }
        };

        let key = "tokenizer.ggml.tokens";
        let mut pieces: Vec<String> = file
            .get_array(key)?
            .as_strings()
            .ok_or_else(|| bad(key, "expected an array of strings"))?
            .to_vec();
        let n = pieces.len();
        if n == 0 {
            return Err(bad(key, "the vocabulary is empty"));
        }
        if n > u32::MAX as usize / 2 {
            return Err(bad(key, format!("{n} tokens is more than ids can hold")));
        }

        let scores = read_scores(file, n)?;
        let kinds = read_kinds(file, n)?;

        let mut piece_to_id: FxHashMap<Box<[u8]>, u32> = FxHashMap::default();
        piece_to_id.reserve(n);
        let mut max_piece_len = 0;
        for (i, p) in pieces.iter_mut().enumerate() {
            // llama.cpp renames empty pieces so that every piece is findable.
            if p.is_empty() {
                *p = format!("[EMPTY_{i}]");
            }
            max_piece_len = max_piece_len.max(p.len());
            // Last one wins on duplicates, as in llama.cpp's map insert.
            piece_to_id.insert(p.as_bytes().into(), i as u32);
        }
        let mut attrs: Vec<u8> = kinds.iter().map(|&k| attr::from_kind(k)).collect();

        // Defaults when the keys are absent, from llama.cpp.
        let (mut bos, mut eos, mut unk) = match model {
            TokenizerModel::SentencePiece => (Some(1), Some(2), Some(0)),
            TokenizerModel::Gemma4Bpe => (None, None, None),
        };
        let (mut eot, mut eom, mut pad) = (None, None, None);
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        bos = in_range(bos);
        eos = in_range(eos);
        unk = in_range(unk);
        for (key, slot) in [
            ("tokenizer.ggml.bos_token_id", &mut bos),
            ("tokenizer.ggml.eos_token_id", &mut eos),
            ("tokenizer.ggml.eot_token_id", &mut eot),
            ("tokenizer.ggml.eom_token_id", &mut eom),
            ("tokenizer.ggml.unknown_token_id", &mut unk),
            ("tokenizer.ggml.padding_token_id", &mut pad),
        ] {
            // llama.cpp keeps the default for an out-of-range id; a file
            // that names a token it does not have is refused instead (a
            // Gemma without its real BOS degrades silently).
            if let Some(id) = opt_u32(file, key)? {
                if (id as usize) >= n {
                    return Err(TokenizerError::BadMetadata {
                        key: key.to_owned(),
                        reason: format!("token id {id} is outside the vocabulary of {n} tokens"),
                    });
                }
                *slot = Some(id as u32);
            }
        }

        let (mut add_bos, add_eos, add_space_prefix) = match model {
            TokenizerModel::SentencePiece => (true, false, true),
            TokenizerModel::Gemma4Bpe => (false, false, false),
        };
        if let Some(b) = opt_bool(file, "tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        let add_eos = opt_bool(file, "tokenizer.ggml.add_eos_token")?.unwrap_or(add_eos);
        let add_space_prefix =
            opt_bool(file, "tokenizer.ggml.add_space_prefix")?.unwrap_or(add_space_prefix);
        // Gemma 4 files written before the converter set the flag still need BOS.
        if model == TokenizerModel::Gemma4Bpe {
            add_bos = true;
        }

        let mut eog: Vec<u32> = Vec::new();
        let find = |text: &str| piece_to_id.get(text.as_bytes()).copied();
        for &text in FIM_TEXTS {
            if let Some(id) = find(text) {
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        for &text in FIM_EOG_TEXTS.iter().chain(EOG_TEXTS) {
            if let Some(id) = find(text) {
                attrs[id as usize] |= attr::CONTROL;
                eog.push(id);
            }
        }
        if eot.is_none() {
            eot = EOT_TEXTS.iter().find_map(|t| find(t));
        }
        eog.extend(eos.iter().chain(&eot).chain(&eom));
        eog.sort_unstable();
        eog.dedup();
        // Gemma 4 has an ordinary `</s>`; `<|tool_response>` tells it apart.
        if let (Some(tr), Some(s)) = (find("<|tool_response>"), find("</s>")) {
            if eog.contains(&tr) {
                eog.retain(|&i| i != s);
                attrs[s as usize] = attr::NORMAL;
            }
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        // llama.cpp uses an unstable sort here; ties between equal lengths only
        // matter for overlapping equal-length specials, which Gemma lacks.
        specials.sort_by_key(|&i| std::cmp::Reverse(pieces[i as usize].len()));

        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = find(&hex);
            if slot.is_none() && model == TokenizerModel::SentencePiece && b < 0x80 {
                *slot = find(std::str::from_utf8(&[b as u8]).unwrap_or_default());
            }
        }

        let mut vocab = Vocab {
            model,
            pieces,
            scores,
            kinds,
            attrs,
            piece_to_id,
            max_piece_len,
            bos,
            eos,
            eot,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
            eog,
            specials,
            byte_tokens,
            rendered: Vec::new(),
            rendered_offsets: Vec::new(),
        };
        vocab.build_rendered();
        Ok(vocab)
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn id(&self, piece: &[u8]) -> Option<u32> {
        self.piece_to_id.get(piece).copied()
    }

    /// llama.cpp's `token_to_piece` with `special = true`; the caller drops
    /// CONTROL and UNKNOWN tokens when special tokens are not rendered.
    fn build_rendered(&mut self) {
        let mut out = Vec::with_capacity(self.pieces.iter().map(|p| p.len()).sum());
        let mut offsets = Vec::with_capacity(self.pieces.len() + 1);
        offsets.push(0u32);
        for (piece, &a) in self.pieces.iter().zip(&self.attrs) {
            if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
                out.extend_from_slice(piece.as_bytes());
            } else if a & attr::NORMAL != 0 {
                unescape_spaces(piece.as_bytes(), &mut out);
            } else if a & attr::BYTE != 0 {
                out.push(byte_of_piece(piece));
            }
            // UNUSED and undefined tokens render as nothing.
            offsets.push(out.len() as u32);
        }
        self.rendered = out;
        self.rendered_offsets = offsets;
    }

    /// The bytes token `id` decodes to; empty for an unknown id.
    pub fn rendered(&self, id: u32, render_special: bool) -> &[u8] {
        let i = id as usize;
        if i >= self.pieces.len() {
            return &[];
        }
        if !render_special && self.attrs[i] & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return &[];
        }
        let (a, b) = (self.rendered_offsets[i], self.rendered_offsets[i + 1]);
        &self.rendered[a as usize..b as usize]
    }
}

fn read_scores(file: &GgufFile, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let key = "tokenizer.ggml.scores";
    let mut scores: Vec<f32> = match file.get(key) {
        None => vec![0.0; n],
        Some(Value::Array(Array::F32(v))) => v.clone(),
        Some(Value::Array(Array::I32(v))) => v.iter().map(|&s| s as f32).collect(),
        Some(v) => return Err(bad(key, format!("expected f32[] or i32[], found {v}"))),
    };
    if scores.len() < n {
        return Err(bad(key, format!("{} scores for {n} tokens", scores.len())));
    }
    scores.truncate(n);
    // The merge queue orders scores by their bits: a NaN would be
    // meaningless there, and -0.0 must equal 0.0 as it does for `<`.
    for s in &mut scores {
        if s.is_nan() {
            *s = f32::MIN;
        } else if *s == 0.0 {
            *s = 0.0;
        }
    }
    Ok(scores)
}

fn read_kinds(file: &GgufFile, n: usize) -> Result<Vec<TokenKind>, TokenizerError> {
    let key = "tokenizer.ggml.token_type";
    match file.get(key) {
        None => Ok(vec![TokenKind::Normal; n]),
        Some(Value::Array(Array::I32(v))) => {
            if v.len() < n {
                return Err(bad(key, format!("{} token types for {n} tokens", v.len())));
            }
            Ok(v[..n].iter().map(|&t| TokenKind::from_gguf(t)).collect())
        }
        Some(v) => Err(bad(key, format!("expected i32[], found {v}"))),
    }
}

/// ▁ (U+2581) back to a space.
fn unescape_spaces(piece: &[u8], out: &mut Vec<u8>) {
    let mut rest = piece;
    while let Some(i) = memchr::memmem::find(rest, "\u{2581}".as_bytes()) {
        out.extend_from_slice(&rest[..i]);
        out.push(b' ');
        rest = &rest[i + 3..];
    }
    out.extend_from_slice(rest);
}

/// The byte of a `<0xHH>` piece, read like llama.cpp's `strtol(text.substr(3, 2), 16)`.
fn byte_of_piece(piece: &str) -> u8 {
    let digits = piece.as_bytes().get(3..).unwrap_or_default();
    let mut v: u32 = 0;
    for &c in digits.iter().take(2) {
        match (c as char).to_digit(16) {
            Some(d) => v = v * 16 + d,
            None => break,
        }
    }
    v as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_piece_parsing() {
        assert_eq!(byte_of_piece("<0x0A>"), 0x0a);
        assert_eq!(byte_of_piece("<0xFF>"), 0xff);
        assert_eq!(byte_of_piece("<0x"), 0);
        assert_eq!(byte_of_piece("<0xZ1>"), 0);
    }

    #[test]
    fn unescape() {
        let mut out = Vec::new();
        unescape_spaces("▁a▁▁b".as_bytes(), &mut out);
        assert_eq!(out, b" a  b");
    }
}
