//! The SentencePiece-style encoding of llama.cpp's `llm_tokenizer_spm_session`:
//! merge the adjacent pair whose concatenation is the highest-scoring piece
//! (of any type), then fall back to bytes for what is not a piece.

use crate::merge::{for_each_word, ordered_f32, MergeSession, SpaceJunctions};
use crate::vocab::Vocab;

/// Pieces with ▁ after their first byte; Gemma 3 has one (`>▁</`).
pub(crate) fn space_junctions(vocab: &Vocab) -> SpaceJunctions {
    SpaceJunctions::new(
        vocab
            .pieces
            .iter()
            .filter_map(|p| {
                let offsets = SpaceJunctions::inner_spaces(p.as_bytes());
                (!offsets.is_empty()).then(|| (p.as_bytes().into(), offsets))
            })
            .collect(),
    )
}

/// Tokenizes one raw fragment whose spaces are already escaped to ▁.
pub(crate) fn tokenize(
    session: &mut MergeSession,
    vocab: &Vocab,
    junctions: &SpaceJunctions,
    text: &[u8],
    out: &mut Vec<u32>,
) {
    for_each_word(text, junctions, |word| {
        session.merge(
            word,
            |pair, _| {
                if pair.len() > vocab.max_piece_len {
                    return None;
                }
                vocab
                    .id(pair)
                    .map(|id| ordered_f32(vocab.scores[id as usize]))
            },
            // Merged symbols are pieces by construction; only single
            // characters can miss the vocabulary.
            |symbol| match vocab.id(symbol) {
                Some(id) => out.push(id),
                None => push_bytes(vocab, symbol, out),
            },
        )
    });
}

/// Byte fallback: `<0xHH>` for each byte. llama.cpp aborts when a byte has
/// no token; the unknown token stands in instead.
fn push_bytes(vocab: &Vocab, bytes: &[u8], out: &mut Vec<u32>) {
    for &b in bytes {
        if let Some(id) = vocab.byte_tokens[b as usize].or(vocab.unk) {
            out.push(id);
        }
    }
}
