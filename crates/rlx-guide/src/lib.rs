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
//! A guide also sees the token budget ([`Constraint::budget`]). When the
//! tokens left are about to be too few for the output to end, it closes
//! the output by the shortest continuation it finds — closing quotes and
//! brackets, a required key with its shortest value, the end token — so
//! what comes out still parses and validates ([`GuideOptions::close`]).
//! JSON values are held to soft length limits ([`ValueLimits`]), and a
//! tool-call list that starts repeating itself is ended
//! ([`GuideOptions::end_on_repeat`]).
//!
//! [`tools`] turns a request's functions into prompts and constraints and
//! reads the calls back out of replies, in Gemma 4's own syntax
//! ([`gemma4`]) or as JSON for the Gemma generations without tool tokens.

pub mod gemma4;
mod shape;
pub mod tools;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use rlx_gemma::generate::Constraint;
use rlx_tokenizer::{EncodeOptions, TokenKind, Tokenizer};
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

pub use shape::ValueLimits;
use shape::{JsonShape, Limit};

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
    /// A JSON value valid under this JSON schema. An object that lists its
    /// properties gets no others unless the schema says so
    /// (`additionalProperties`), as OpenAI's strict mode has it: a model
    /// cannot know what undeclared keys would mean, and small ones invent
    /// them.
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

    fn is_json(&self) -> bool {
        matches!(self, Spec::JsonSchema(_) | Spec::JsonObject)
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Spec::JsonSchema(v) => TopLevelGrammar::from_json_schema(compact(closed_objects(v))),
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

/// `schema` with every object that lists its properties closed to others
/// (unless it says otherwise).
fn closed_objects(schema: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match schema {
        Value::Object(o) => {
            let mut o: serde_json::Map<String, Value> = o
                .iter()
                .map(|(k, v)| (k.clone(), closed_objects(v)))
                .collect();
            if o.get("properties").is_some_and(Value::is_object) {
                o.entry("additionalProperties")
                    .or_insert(Value::Bool(false));
            }
            Value::Object(o)
        }
        Value::Array(items) => Value::Array(items.iter().map(closed_objects).collect()),
        other => other.clone(),
    }
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

/// How a guide treats the token budget and JSON values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuideOptions {
    /// Close the output by the shortest continuation the guide finds once
    /// the tokens left are about to be too few for it (where none is found
    /// in time, the output is cut by the budget as it stands).
    pub close: bool,
    /// Soft limits on the length of JSON values (JSON schemas and objects
    /// only); `None` for none.
    pub limits: Option<ValueLimits>,
    /// An object item of an array identical to an earlier one closes the
    /// output: a model repeating a tool call.
    pub end_on_repeat: bool,
}

impl Default for GuideOptions {
    fn default() -> GuideOptions {
        GuideOptions {
            close: true,
            limits: Some(ValueLimits::default()),
            end_on_repeat: false,
        }
    }
}

/// Token sets a guide narrows its masks with, built once per vocabulary.
struct Classes {
    /// Tokens whose text starts with `"`: a string's end.
    quote_first: SimpleVob,
    /// Tokens whose text does not start with a number's character (special
    /// tokens included): a number's end.
    not_number_first: SimpleVob,
    /// Tokens without a comma (special tokens included): no further item.
    no_comma: SimpleVob,
    /// Tokens without `{`, `[` or `,` (special tokens included): nothing
    /// new opened, as the budget nears its end.
    no_opening: SimpleVob,
    /// Tokens that open something: a further item, an object, an array.
    openers: Vec<u32>,
    /// `"`, `}` and `]`: one thing closed.
    enders: Vec<u32>,
    /// `"`, and single characters that patterns commonly ask for in
    /// strings, for a string's shortest valid end.
    quote: Option<u32>,
    content: Vec<u32>,
    /// The text tokens a closing is tried with, in order: tokens of only
    /// `"`, `}` and `]` (longest first), separators, the shortest values,
    /// then single characters.
    closers: Vec<u32>,
}

impl Classes {
    fn new(trie: &TokTrie) -> Classes {
        let n = trie.vocab_size();
        let mut quote_first = SimpleVob::alloc(n);
        let mut not_number_first = SimpleVob::alloc(n);
        let mut no_comma = SimpleVob::alloc(n);
        let mut no_opening = SimpleVob::alloc(n);
        let mut closing = Vec::new();
        for t in 0..n as u32 {
            if trie.is_special_token(t) {
                not_number_first.allow_token(t);
                no_comma.allow_token(t);
                no_opening.allow_token(t);
                continue;
            }
            let b = trie.token(t);
            let Some(&first) = b.first() else { continue };
            if first == b'"' {
                quote_first.allow_token(t);
            }
            if !matches!(first, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                not_number_first.allow_token(t);
            }
            if !b.contains(&b',') {
                no_comma.allow_token(t);
            }
            if !b.iter().any(|c| matches!(c, b'{' | b'[' | b',')) {
                no_opening.allow_token(t);
            }
            if b.iter().all(|c| matches!(c, b'"' | b'}' | b']')) {
                closing.push(t);
            }
        }
        closing.sort_by_key(|&t| std::cmp::Reverse(trie.token(t).len()));
        let mut closers = closing;
        let texts = [
            ", ", ",", ": ", ":", "0", "\"\"", "{}", "[]", "{", "[", "null", "false", "true",
        ];
        let single = (b'!'..=b'~').chain([b' ']).map(|c| (c as char).to_string());
        for text in texts.iter().map(|t| t.to_string()).chain(single) {
            if let Some(t) = trie.token_id(text.as_bytes()) {
                if !closers.contains(&t) {
                    closers.push(t);
                }
            }
        }
        let openers = [",", "{", "["]
            .iter()
            .filter_map(|t| trie.token_id(t.as_bytes()))
            .collect();
        let content = ["a", "0", ".", "@", "-", "_", "A", " ", ":", "/", "+", "#"]
            .iter()
            .filter_map(|t| trie.token_id(t.as_bytes()))
            .collect();
        let enders = ["\"", "}", "]"]
            .iter()
            .filter_map(|t| trie.token_id(t.as_bytes()))
            .collect();
        Classes {
            openers,
            enders,
            quote: trie.token_id(b"\""),
            content,
            quote_first,
            not_number_first,
            no_comma,
            no_opening,
            closers,
        }
    }
}

/// A tokenizer's vocabulary, ready to compile constraints over.
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
    env: TokEnv,
    classes: Arc<Classes>,
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
        let classes = Arc::new(Classes::new(&trie));
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GuideError::Vocabulary(e.to_string()))?;
        // Nothing on stderr from the library: errors come back as values.
        factory.set_stderr_log_level(0);
        Ok(Vocabulary {
            factory: Arc::new(factory),
            env,
            classes,
        })
    }

    /// A guide for one output under `spec`; a bad schema, expression or
    /// grammar is an error that says what is wrong.
    pub fn guide(&self, spec: &Spec, opts: &GuideOptions) -> Result<Guide, GuideError> {
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
            env: self.env.clone(),
            classes: Arc::clone(&self.classes),
            opts: opts.clone(),
            shape: spec.is_json().then(JsonShape::default),
            bytes: 0,
            closing: None,
            closed_at: None,
            cut_short: false,
            estimate: 0,
            since_estimate: 0,
            left: usize::MAX,
            opening: 0,
        })
    }
}

/// Tokens kept beyond a closing's length when deciding to close: what one
/// more sampled token may add to it (opening a string, an object and a key,
/// say).
const RESERVE: usize = 6;
/// How many things [`Guide::opening_cost`] closes first in looking for
/// something to open.
const OPEN_AHEAD: usize = 4;
/// Within this many tokens of the closing's length, a JSON output opens
/// nothing new (no object, array or further item).
const APPROACH: usize = 12;
/// The longest run of characters, and the most tokens tried, in search of
/// a string's shortest valid end.
const STRING_RUN: usize = 6;
const STRING_TRIES: usize = 2000;
/// Within this many tokens of the last closing's length, the closing is
/// found again after every token; further away, every [`EVERY`] tokens.
const WATCH: usize = 16;
const EVERY: usize = 8;

/// One output held to a [`Spec`].
pub struct Guide {
    matcher: Matcher,
    mask_secs: f64,
    masks: usize,
    env: TokEnv,
    classes: Arc<Classes>,
    opts: GuideOptions,
    /// Where a JSON output stands (JSON specs only).
    shape: Option<JsonShape>,
    /// Bytes of output so far.
    bytes: usize,
    /// The closing being written: the tokens still to come.
    closing: Option<VecDeque<u32>>,
    /// The output's length in bytes when its closing began.
    closed_at: Option<usize>,
    /// Whether the closing was for the budget (not for a repeat).
    cut_short: bool,
    /// The length of the last closing found, in tokens, and the tokens
    /// since it was found.
    estimate: usize,
    since_estimate: usize,
    /// The tokens left, as last told.
    left: usize,
    /// The longest closing after one token that opens something (a
    /// further item, an object, an array), itself included, as last found:
    /// once it nears what is left, a JSON output opens nothing more.
    opening: usize,
}

impl Guide {
    /// Seconds spent computing masks, and how many were computed.
    pub fn mask_seconds(&self) -> (f64, usize) {
        (self.mask_secs, self.masks)
    }

    /// The tokens that may come next (timed and counted); an error where
    /// none may. While closing, only the closing's next token; otherwise
    /// the grammar's mask, narrowed by a soft limit where one is reached
    /// and the grammar allows what it asks.
    fn compute_mask(&mut self) -> Result<SimpleVob, String> {
        let t = Instant::now();
        let trie = self.env.tok_trie();
        if let Some(&next) = self.closing.as_ref().and_then(|c| c.front()) {
            let mut only = SimpleVob::alloc(trie.vocab_size());
            only.allow_token(next);
            return Ok(only);
        }
        let mut allowed = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        if let Some(shape) = &self.shape {
            let limit = match self.opts.limits.as_ref().map(|l| shape.limit(l)) {
                None | Some(Limit::None) => None,
                Some(Limit::EndString) => Some(&self.classes.quote_first),
                Some(Limit::EndNumber) => Some(&self.classes.not_number_first),
                Some(Limit::EndArray) => Some(&self.classes.no_comma),
            };
            // Something new opened now must still close in what is left:
            // as the closing nears it, or as opening costs more than is
            // left.
            let near_end = self.opts.close
                && (self.left <= self.estimate + APPROACH
                    || self.opening.saturating_add(2) > self.left);
            let narrow = near_end.then_some(&self.classes.no_opening);
            // Each only where the grammar allows something it does.
            for class in [limit, narrow].into_iter().flatten() {
                if !allowed.and_is_zero(class) {
                    allowed.and(class);
                }
            }
        }
        self.mask_secs += t.elapsed().as_secs_f64();
        self.masks += 1;
        if allowed.is_zero() {
            return Err(self.error());
        }
        Ok(allowed)
    }

    /// The shortest closing found from where the output stands, in at most
    /// `cap` tokens: at each step the tokens the grammar forces, else the
    /// first of [`Classes::closers`] it accepts — for JSON, the first that
    /// leaves no more open (strings, objects, arrays) than before, else the
    /// one that opens least — until the output may end (the end token then
    /// included, unless the grammar has stopped by itself). The matcher is
    /// rolled back to where it was.
    fn find_closing(&mut self, cap: usize, mut lex: Option<shape::Lex>) -> Option<Vec<u32>> {
        let env = self.env.clone();
        let trie = env.tok_trie();
        let classes = Arc::clone(&self.classes);
        let mut plan = Vec::new();
        // Whether a closing was found, and whether it needs the end token.
        let (found, end) = loop {
            if self.matcher.is_stopped() {
                break (true, false);
            }
            if self.matcher.is_accepting().unwrap_or(false) {
                break (true, true);
            }
            if plan.len() >= cap {
                break (false, false);
            }
            let forced = self.matcher.compute_ff_tokens();
            let took = if forced.is_empty() {
                self.closing_step(&classes.closers, lex.as_ref())
            } else {
                let n = self.matcher.try_consume_tokens(&forced).unwrap_or(0);
                (n > 0).then(|| forced[..n].to_vec())
            };
            let Some(took) = took else {
                break (false, false);
            };
            if let Some(lex) = &mut lex {
                for &t in &took {
                    lex.push(trie.token(t));
                }
            }
            plan.extend(took);
        };
        // A failed rollback leaves the matcher in an error state, which its
        // next use reports.
        self.matcher.rollback(plan.len()).ok()?;
        if !found {
            return None;
        }
        if end {
            plan.push(trie.eos_token());
        }
        (plan.len() <= cap).then_some(plan)
    }

    /// One token of a closing (consumed by the matcher): the first of
    /// `closers` the grammar accepts — for JSON (`lex`), the first whose
    /// every character closes something, else the first that leaves the
    /// fewest things open (strings, objects, arrays).
    fn closing_step(&mut self, closers: &[u32], lex: Option<&shape::Lex>) -> Option<Vec<u32>> {
        let env = self.env.clone();
        let trie = env.tok_trie();
        // The best accepted token so far, by what it leaves open.
        let mut best: Option<(usize, u32)> = None;
        for &t in closers {
            if self.matcher.try_consume_tokens(&[t]).unwrap_or(0) != 1 {
                continue;
            }
            let Some(lex) = lex else {
                return Some(vec![t]);
            };
            let mut closed = *lex;
            if closed.close_each(trie.token(t)) {
                return Some(vec![t]);
            }
            let mut after = *lex;
            after.push(trie.token(t));
            self.matcher.rollback(1).ok()?;
            if best.is_none_or(|(open, _)| after.open() < open) {
                best = Some((after.open(), t));
            }
        }
        let (open, t) = best?;
        if lex.is_some_and(|l| l.in_string() && open == l.open()) {
            // A string that cannot end yet (a pattern, a minimum length):
            // the shortest run of characters after which it can, if short.
            let mut tries = STRING_TRIES;
            for depth in 1..=STRING_RUN {
                if let Some(run) = self.string_run(depth, &mut tries) {
                    return Some(run);
                }
            }
        }
        (self.matcher.try_consume_tokens(&[t]).unwrap_or(0) == 1).then(|| vec![t])
    }

    /// `depth` tokens of [`Classes::content`] (consumed by the matcher)
    /// after which the open string may close; at most `tries` tokens
    /// tried.
    fn string_run(&mut self, depth: usize, tries: &mut usize) -> Option<Vec<u32>> {
        let classes = Arc::clone(&self.classes);
        let quote = classes.quote?;
        for &t in &classes.content {
            if *tries == 0 {
                return None;
            }
            *tries -= 1;
            if self.matcher.try_consume_tokens(&[t]).unwrap_or(0) != 1 {
                continue;
            }
            if depth == 1 {
                if self.matcher.validate_tokens(&[quote]).unwrap_or(0) == 1 {
                    return Some(vec![t]);
                }
            } else if let Some(mut rest) = self.string_run(depth - 1, tries) {
                rest.insert(0, t);
                return Some(rest);
            }
            self.matcher.rollback(1).ok()?;
        }
        None
    }

    /// [`Guide::opening`] where the output stands (JSON only; `left` as
    /// [`Constraint::budget`] has it): the longest closing after one of the
    /// openers the grammar accepts — here, or after closing up to
    /// [`OPEN_AHEAD`] things by quotes and brackets (one token may close a
    /// value and its object and open the next item) — counting the tokens
    /// before it; `usize::MAX` where one leaves no closing within the
    /// budget.
    fn opening_cost(&mut self, left: usize, lex: Option<shape::Lex>) -> usize {
        let Some(mut lex) = lex else { return 0 };
        let env = self.env.clone();
        let trie = env.tok_trie();
        let classes = Arc::clone(&self.classes);
        let mut most = 0;
        let mut ahead = 0;
        loop {
            for &o in &classes.openers {
                if self.matcher.try_consume_tokens(&[o]).unwrap_or(0) != 1 {
                    continue;
                }
                let mut after = lex;
                after.push(trie.token(o));
                let cap = left.saturating_sub(ahead + 1);
                let cost = self.find_closing(cap, Some(after));
                if self.matcher.rollback(1).is_err() {
                    most = usize::MAX;
                    break;
                }
                most = most.max(cost.map_or(usize::MAX, |p| ahead + 1 + p.len()));
            }
            // Close one more thing, then the openers again.
            if ahead == OPEN_AHEAD {
                break;
            }
            let step = classes
                .enders
                .iter()
                .find(|&&t| self.matcher.try_consume_tokens(&[t]).unwrap_or(0) == 1);
            let Some(&t) = step else { break };
            lex.push(trie.token(t));
            ahead += 1;
        }
        if self.matcher.rollback(ahead).is_err() {
            return usize::MAX;
        }
        most
    }

    /// Starts writing `plan` as the output's closing.
    fn close(&mut self, plan: Vec<u32>, cut_short: bool) {
        self.closed_at = Some(self.bytes);
        self.cut_short = cut_short;
        self.closing = Some(plan.into());
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

    fn budget(&mut self, left: usize) {
        self.left = left;
        if !self.opts.close || self.closing.is_some() || self.matcher.is_stopped() {
            return;
        }
        self.since_estimate += 1;
        if left > self.estimate + WATCH && self.since_estimate < EVERY {
            return;
        }
        self.since_estimate = 0;
        let lex = self.shape.as_ref().map(|s| s.lex());
        match self.find_closing(left, lex) {
            Some(plan) => {
                self.estimate = plan.len();
                if plan.len() + RESERVE >= left {
                    self.close(plan, true);
                } else {
                    self.opening = self.opening_cost(left, lex);
                }
            }
            // No closing within the budget (yet): look again later.
            None => self.estimate = 0,
        }
    }

    fn cut_short(&self) -> bool {
        self.cut_short
    }

    fn closed_at(&self) -> Option<usize> {
        self.closed_at
    }

    fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        // While closing, the closing's tokens are forced, not drafted; the
        // grammar alone (not the soft limits the mask adds) judges the rest.
        if self.closing.is_some() || self.matcher.is_stopped() {
            return 0;
        }
        self.matcher.validate_tokens(tokens).unwrap_or(0)
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
            .map_err(|e| format!("token {token}: {e}"))?;
        if let Some(closing) = &mut self.closing {
            if closing.front() == Some(&token) {
                closing.pop_front();
            } else {
                // Not the closing's token (the rest of a forced run that
                // began before it, or a caller that samples past the mask):
                // find the closing again at the next budget.
                self.closing = None;
                (self.closed_at, self.cut_short) = (None, false);
                self.since_estimate = EVERY;
            }
        }
        let trie = self.env.tok_trie();
        if !trie.is_special_token(token) {
            let bytes = trie.token(token);
            self.bytes += bytes.len();
            if let Some(shape) = &mut self.shape {
                shape.push(bytes);
            }
        }
        let repeated = self.shape.as_ref().is_some_and(|s| s.repeated());
        if self.opts.end_on_repeat && repeated && self.closed_at.is_none() {
            let lex = self.shape.as_ref().map(|s| s.lex());
            if let Some(plan) = self.find_closing(usize::MAX, lex) {
                self.close(plan, false);
            }
        }
        Ok(())
    }

    fn forced(&mut self) -> Vec<u32> {
        match &self.closing {
            Some(c) if !c.is_empty() => c.iter().copied().collect(),
            _ => self.matcher.compute_ff_tokens(),
        }
    }

    fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}
