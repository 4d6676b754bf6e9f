//! Gemma tokenizers read from GGUF metadata, token for token the same as
//! llama.cpp's (`src/llama-vocab.cpp`), and Gemma chat formatting.
//!
//! - `tokenizer.ggml.model = "llama"` (Gemma 1 to 3n): SentencePiece-style
//!   merges driven by piece scores, with byte fallback.
//! - `tokenizer.ggml.model = "gemma4"`: BPE over lines driven by merge ranks.
//!
//! Encoding splits special tokens out first (CONTROL and UNKNOWN ones only
//! when asked to parse special text, USER_DEFINED ones always), escapes
//! spaces to ▁ and merges each remaining fragment. See
//! `shared/docs/gemma-family.md` §4 for the rules.
//!
//! ```no_run
//! use rlx_tokenizer::{EncodeOptions, Tokenizer};
//! let file = rlx_gguf::GgufFile::open("gemma-3-270m-q4_k_m.gguf")?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let ids = tok.encode("Hello world", EncodeOptions::default());
//! assert_eq!(tok.decode(&ids, false), "Hello world");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bpe;
mod chat;
mod decode;
mod error;
mod hash;
mod merge;
mod special;
mod spm;
mod vocab;

pub use chat::{ChatMessage, ChatOptions, ChatTemplate, Tuning, BUILTIN_TEMPLATES, GEMMA_TEMPLATE};
pub use decode::StreamDecoder;
pub use error::TokenizerError;
pub use vocab::{TokenKind, TokenizerModel};

use rlx_gguf::GgufFile;

use bpe::Merges;
use merge::{MergeSession, SpaceJunctions};
use special::{Fragment, SpecialSplitter};
use vocab::Vocab;

/// How to encode a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add the tokens the vocabulary asks for around the text: BOS when
    /// [`Tokenizer::add_bos`] is on (`tokenizer.ggml.add_bos_token`, true for
    /// every Gemma), and EOS when `tokenizer.ggml.add_eos_token` is on (never
    /// for Gemma). This is llama.cpp's `add_special`.
    pub add_bos: bool,
    /// Turn the text of CONTROL and UNKNOWN tokens (`<start_of_turn>`,
    /// `<bos>`, ...) into those tokens. USER_DEFINED tokens (whitespace runs,
    /// HTML tags) are always recognized, except the ones llama.cpp turns into
    /// CONTROL because they end generation (`</s>` in Gemma 3,
    /// `<|tool_response>` in Gemma 4).
    pub parse_special: bool,
}

impl Default for EncodeOptions {
    /// BOS as the vocabulary says, special text taken literally.
    fn default() -> Self {
        EncodeOptions {
            add_bos: true,
            parse_special: false,
        }
    }
}

impl EncodeOptions {
    /// For text rendered by a chat template: special tokens parsed, no BOS
    /// added (the templates write `<bos>` themselves).
    pub const CHAT: EncodeOptions = EncodeOptions {
        add_bos: false,
        parse_special: true,
    };
}

/// A tokenizer built from a GGUF file's `tokenizer.*` metadata.
pub struct Tokenizer {
    vocab: Vocab,
    splitter: SpecialSplitter,
    /// Present for the Gemma 4 BPE.
    merges: Option<Merges>,
    junctions: SpaceJunctions,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.vocab.model)
            .field("vocab_size", &self.vocab.len())
            .field("bos", &self.vocab.bos)
            .field("eos", &self.vocab.eos)
            .field("eog", &self.vocab.eog)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Opens a GGUF file and reads its tokenizer.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_gguf(&GgufFile::open(path)?)
    }

    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::from_gguf(file)?;
        let merges = match vocab.model {
            TokenizerModel::SentencePiece => None,
            TokenizerModel::Gemma4Bpe => Some(Merges::from_gguf(file)?),
        };
        let splitter = SpecialSplitter::new(&vocab)?;
        let junctions = match &merges {
            None => spm::space_junctions(&vocab),
            Some(m) => bpe::space_junctions(m),
        };
        Ok(Tokenizer {
            vocab,
            splitter,
            merges,
            junctions,
        })
    }

    pub fn model(&self) -> TokenizerModel {
        self.vocab.model
    }

    pub fn encode(&self, text: &str, opts: EncodeOptions) -> Vec<u32> {
        self.encode_bytes(text.as_bytes(), opts)
    }

    /// Encodes arbitrary bytes; invalid UTF-8 goes through byte fallback the
    /// way llama.cpp handles it.
    pub fn encode_bytes(&self, text: &[u8], opts: EncodeOptions) -> Vec<u32> {
        let v = &self.vocab;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let fragments = self.splitter.split(text, opts.parse_special);
        if opts.add_bos && v.add_bos {
            out.extend(v.bos);
        }
        let mut escaped = Vec::new();
        let mut session = MergeSession::default();
        match &self.merges {
            None => {
                let mut prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Raw { start, end } => {
                            escaped.clear();
                            // Never taken for Gemma, whose files say false.
                            if v.add_space_prefix && prev_special {
                                escaped.extend_from_slice(ESCAPED_SPACE);
                            }
                            escape_spaces(&text[start..end], &mut escaped);
                            spm::tokenize(&mut session, v, &self.junctions, &escaped, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Some(merges) => {
                let mut scratch = Vec::new();
                for f in fragments {
                    match f {
                        Fragment::Raw { start, end } => {
                            escaped.clear();
                            escape_spaces(&text[start..end], &mut escaped);
                            bpe::tokenize(
                                &mut session,
                                &mut scratch,
                                v,
                                merges,
                                &self.junctions,
                                &escaped,
                                &mut out,
                            );
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if opts.add_bos && v.add_eos {
            out.extend(v.eos);
        }
        out
    }

    /// Encodes text rendered by a chat template: special tokens parsed, and
    /// BOS added only if the text does not already start with it.
    pub fn encode_chat(&self, rendered: &str) -> Vec<u32> {
        let mut ids = self.encode(rendered, EncodeOptions::CHAT);
        if let Some(bos) = self.vocab.bos.filter(|_| self.vocab.add_bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        ids
    }

    /// Decodes to text, replacing invalid UTF-8 with U+FFFD. With
    /// `render_special` false, CONTROL and UNKNOWN tokens (BOS, turn
    /// markers) produce nothing. Unknown ids produce nothing.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, render_special)).into_owned()
    }

    /// The raw bytes the ids decode to.
    pub fn decode_bytes(&self, ids: &[u32], render_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id, render_special));
        }
        out
    }

    /// What one token decodes to, as llama.cpp's `token_to_piece`: raw bytes
    /// that may be part of a character.
    pub fn token_bytes(&self, id: u32, render_special: bool) -> &[u8] {
        self.vocab.rendered(id, render_special)
    }

    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder {
        StreamDecoder::new(render_special)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// The end-of-turn token (`<end_of_turn>`; none for Gemma 4).
    pub fn eot_id(&self) -> Option<u32> {
        self.vocab.eot
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.vocab.unk
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.vocab.pad
    }

    /// Tokens that end generation, ascending: llama.cpp's EOG set. For
    /// Gemma 1 to 3n that is `<eos>`, `<end_of_turn>` and, where the
    /// vocabulary has it, `</s>`; for Gemma 4 `<eos>`, `<turn|>` and
    /// `<|tool_response>`.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// The id of a piece, by its stored text (with ▁ for spaces in normal
    /// pieces, e.g. `"▁world"`).
    pub fn id_of(&self, piece: &str) -> Option<u32> {
        self.vocab.id(piece.as_bytes())
    }

    /// The stored text of a piece.
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.vocab.pieces.get(id as usize).map(String::as_str)
    }

    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.vocab.kinds.get(id as usize).copied()
    }

    pub fn score(&self, id: u32) -> Option<f32> {
        self.vocab.scores.get(id as usize).copied()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Number of BPE merges (0 for SentencePiece vocabularies).
    pub fn merge_count(&self) -> usize {
        self.merges.as_ref().map_or(0, Merges::len)
    }

    /// Whether `EncodeOptions::add_bos` adds BOS; from the file.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }

    /// Overrides `tokenizer.ggml.add_bos_token`.
    pub fn set_add_bos(&mut self, add_bos: bool) {
        self.vocab.add_bos = add_bos;
    }
}

const ESCAPED_SPACE: &[u8] = "\u{2581}".as_bytes();

/// Every U+0020 becomes U+2581; nothing else changes.
fn escape_spaces(text: &[u8], out: &mut Vec<u8>) {
    out.reserve(text.len() + text.len() / 4);
    let mut rest = text;
    while let Some(i) = memchr::memchr(b' ', rest) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(ESCAPED_SPACE);
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokenizer_can_be_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::Tokenizer>();
        assert_send_sync::<super::ChatTemplate>();
    }
}
