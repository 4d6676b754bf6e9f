//! Token-at-a-time decoding that only ever emits whole UTF-8 characters.

use crate::Tokenizer;

/// Decodes a stream of tokens. A character split over byte-fallback tokens
/// is held back until its last byte arrives; bytes that can never form a
/// character are emitted as U+FFFD right away, so output never stalls.
///
/// ```no_run
/// # fn demo(tok: &rlx_tokenizer::Tokenizer, ids: &[u32]) {
/// let mut dec = tok.stream_decoder(false);
/// for &id in ids {
///     print!("{}", dec.push(tok, id));
/// }
/// print!("{}", dec.finish());
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    render_special: bool,
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new(render_special: bool) -> StreamDecoder {
        StreamDecoder {
            render_special,
            pending: Vec::new(),
        }
    }

    /// Adds one token and returns the text it completes (often all of it,
    /// sometimes nothing).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.pending
            .extend_from_slice(tokenizer.token_bytes(id, self.render_special));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // `valid` is the prefix from_utf8 accepted; this cannot fail.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            rest = tail;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &tail[n..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is still held back comes out, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
