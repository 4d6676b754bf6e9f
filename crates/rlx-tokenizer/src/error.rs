//! Errors of loading a tokenizer and of rendering chat templates.

/// Everything that can go wrong building a tokenizer or rendering a chat.
/// Encoding and decoding themselves never fail: bad input degrades to byte
/// tokens or U+FFFD.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] rlx_gguf::GgufError),

    #[error("{key}: {reason}")]
    BadMetadata { key: String, reason: String },

    #[error(
        "unsupported tokenizer model {model:?} (tokenizer.ggml.model); supported: \"llama\" (SentencePiece) and \"gemma4\" (BPE)"
    )]
    UnsupportedModel { model: String },

    #[error("{}", template_message(.name, .line, .source_line, .message))]
    Template {
        /// Where the template came from, e.g. `tokenizer.chat_template`.
        name: String,
        /// 1-based line of the template the error points at, when known.
        line: Option<usize>,
        /// The text of that line.
        source_line: Option<String>,
        message: String,
    },
}

fn template_message(
    name: &str,
    line: &Option<usize>,
    source_line: &Option<String>,
    message: &str,
) -> String {
    match (line, source_line) {
        (Some(l), Some(text)) => {
            format!(
                "chat template {name}, line {l}: {message}\n  {l} | {}",
                text.trim_end()
            )
        }
        (Some(l), None) => format!("chat template {name}, line {l}: {message}"),
        _ => format!("chat template {name}: {message}"),
    }
}
