//! Structured output: generated text held to a JSON schema, a regular
//! expression or a Lark grammar.
//!
//! [`Vocabulary`] builds, once per tokenizer, llguidance's token trie over
//! the model's vocabulary (each token's bytes; control and unused tokens
//! behind toktrie's special-token marker, so no grammar can produce them
//! as text) and a parser factory. [`Vocabulary::guide`] compiles a
//! [`Spec`] into a [`Guide`], the [`Constraint`] the generation loop asks
//! before each token: it masks every token that cannot continue a valid
//! output (an end-of-generation token only where the output may end) and
//! names the tokens the grammar forces, which are taken without sampling.
//! The grammar engine is llguidance's; the mask's cost per step is kept
//! (`Guide::mask_seconds`).
//!
//! [`tools`] turns a request's functions into prompts and constraints and
//! reads the calls back out of replies, in Gemma 4's own syntax
//! ([`gemma4`]) or as JSON for the Gemma generations without tool tokens.

pub mod gemma4;
pub mod tools;

use std::sync::Arc;
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use rlx_gemma::generate::Constraint;
use rlx_tokenizer::{EncodeOptions, TokenKind, Tokenizer};
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// Why a constraint could not be made or followed.
#[derive(Debug, thiserror::Error)]
pub enum GuideError {
    #[error("the vocabulary cannot be used for constrained output: {0}")]
    Vocabulary(String),
    #[error("{what}: {msg}")]
    Invalid { what: &'static str, msg: String },
}

/// What the output must match.
#[derive(Clone, Debug)]
pub enum Spec {
    /// A JSON value valid under this JSON schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching a regular expression (whole).
    Regex(String),
    /// Text in the language of a Lark grammar (llguidance's Lark dialect,
    /// which also embeds JSON schemas and regular expressions).
    Lark(String),
}

impl Spec {
    fn what(&self) -> &'static str {
        match self {
            Spec::JsonSchema(_) => "JSON schema",
            Spec::JsonObject => "JSON object",
            Spec::Regex(_) => "regular expression",
            Spec::Lark(_) => "grammar",
        }
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Spec::JsonSchema(v) => TopLevelGrammar::from_json_schema(compact(v.clone())),
            Spec::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({
                "type": "object"
            }))),
            Spec::Regex(r) => TopLevelGrammar::from_regex(r),
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// `schema` with JSON written one way: `", "` between items, `": "` after
/// keys, no other whitespace (unless the schema's own `x-guidance` says
/// otherwise). Free whitespace lets a sampled model pad a finished value
/// with blank lines until its token budget runs out.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": "
            })
        });
    }
    schema
}

/// The model's vocabulary as llguidance sees it.
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tok.encode_bytes(
            s,
            EncodeOptions {
                add_bos: false,
                ..EncodeOptions::default()
            },
        )
    }
}

/// A tokenizer's vocabulary, ready to compile constraints over.
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
}

impl Vocabulary {
    /// Builds the token trie of `tok` (a fraction of a second for a
    /// 262,144-token vocabulary). End of generation is the tokenizer's EOS,
    /// or its end-of-turn token for chat.
    pub fn new(tok: Arc<Tokenizer>) -> Result<Vocabulary, GuideError> {
        let n = tok.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let text = matches!(
                    tok.token_kind(id),
                    Some(TokenKind::Normal | TokenKind::Byte | TokenKind::UserDefined)
                );
                let bytes = tok.token_bytes(id, false);
                if text && !bytes.is_empty() {
                    bytes.to_vec()
                } else {
                    // Special: reachable by id only.
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.piece(id).unwrap_or("").as_bytes());
                    w
                }
            })
            .collect();
        let eos = tok
            .eos_id()
            .ok_or_else(|| GuideError::Vocabulary("it has no end-of-sequence token".into()))?;
        let info = TokRxInfo {
            tok_end_of_turn: tok.eot_id(),
            tok_bos: tok.bos_id(),
            ..TokRxInfo::new(n as u32, eos)
        };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GuideError::Vocabulary(e.to_string()))?;
        // Nothing on stderr from the library: errors come back as values.
        factory.set_stderr_log_level(0);
        Ok(Vocabulary {
            factory: Arc::new(factory),
        })
    }

    /// A guide for one output under `spec`; a bad schema, expression or
    /// grammar is an error that says what is wrong.
    pub fn guide(&self, spec: &Spec) -> Result<Guide, GuideError> {
        let parser =
            self.factory
                .create_parser(spec.grammar())
                .map_err(|e| GuideError::Invalid {
                    what: spec.what(),
                    msg: e.to_string(),
                })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GuideError::Invalid {
                what: spec.what(),
                msg: e,
            });
        }
        Ok(Guide {
            matcher,
            mask_secs: 0.0,
            masks: 0,
        })
    }
}

/// One output held to a [`Spec`].
pub struct Guide {
    matcher: Matcher,
    mask_secs: f64,
    masks: usize,
}

impl Guide {
    /// Seconds spent computing masks, and how many were computed.
    pub fn mask_seconds(&self) -> (f64, usize) {
        (self.mask_secs, self.masks)
    }

    /// The tokens that may come next (timed and counted); an error where
    /// none may.
    fn compute_mask(&mut self) -> Result<SimpleVob, String> {
        let t = Instant::now();
        let allowed = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        self.mask_secs += t.elapsed().as_secs_f64();
        self.masks += 1;
        if allowed.is_zero() {
            return Err(self.error());
        }
        Ok(allowed)
    }

    fn error(&self) -> String {
        self.matcher
            .get_error()
            .unwrap_or_else(|| "the constraint stopped".into())
    }
}

impl Constraint for Guide {
    fn allowed(&mut self) -> Result<Option<Vec<u32>>, String> {
        Ok(Some(self.compute_mask()?.as_slice().to_vec()))
    }

    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.compute_mask()?;
        for (i, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("token {token}: {e}"))
    }

    fn forced(&mut self) -> Vec<u32> {
        self.matcher.compute_ff_tokens()
    }

    fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}
