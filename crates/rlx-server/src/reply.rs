//! A chat choice's reply as the client sees it: generated text read into
//! content, `reasoning_content` and `tool_calls` (Gemma 4's syntax, or a
//! JSON reply for models without tool tokens), whole or as stream deltas.

use rlx_guide::gemma4::Delta;
use rlx_guide::tools::ReplyReader;
use serde_json::{json, Map, Value};

use crate::engine::FinishReason;

pub(crate) struct Reply {
    reader: ReplyReader,
    /// Calls beyond this many are dropped (`parallel_tool_calls: false`).
    max_calls: usize,
    /// Call ids are this and the call's index.
    id_prefix: String,
    content: String,
    reasoning: String,
    calls: Vec<Value>,
}

impl Reply {
    pub fn new(reader: ReplyReader, parallel: bool, id_prefix: String) -> Reply {
        Reply {
            reader,
            max_calls: if parallel { usize::MAX } else { 1 },
            id_prefix,
            content: String::new(),
            reasoning: String::new(),
            calls: Vec::new(),
        }
    }

    /// Reads generated text; the delta's fields that are not empty.
    pub fn push(&mut self, text: &str) -> Map<String, Value> {
        let d = self.reader.push(text);
        self.take(d)
    }

    /// The end of the generation: what the reader held back (`closed_at`
    /// as `ReplyReader::finish` takes it).
    pub fn finish(&mut self, closed_at: Option<usize>) -> Map<String, Value> {
        let d = self.reader.finish(closed_at);
        self.take(d)
    }

    fn take(&mut self, d: Delta) -> Map<String, Value> {
        let mut delta = Map::new();
        if !d.content.is_empty() {
            self.content.push_str(&d.content);
            delta.insert("content".into(), Value::String(d.content));
        }
        if !d.reasoning.is_empty() {
            self.reasoning.push_str(&d.reasoning);
            delta.insert("reasoning_content".into(), Value::String(d.reasoning));
        }
        let mut calls = Vec::new();
        for c in d.calls {
            if self.calls.len() == self.max_calls {
                break;
            }
            let index = self.calls.len();
            let call = json!({
                "id": format!("{}{index}", self.id_prefix),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments.to_string()}
            });
            self.calls.push(call.clone());
            let mut streamed = call;
            streamed["index"] = json!(index);
            calls.push(streamed);
        }
        if !calls.is_empty() {
            delta.insert("tool_calls".into(), Value::Array(calls));
        }
        delta
    }

    /// The message of a whole generated `text` (`closed_at` as
    /// [`Reply::finish`] takes it), for a response that did not stream.
    pub fn whole(&mut self, text: &str, closed_at: Option<usize>) -> Value {
        self.push(text);
        self.finish(closed_at);
        self.message()
    }

    /// The whole message, for a response that did not stream.
    pub fn message(&self) -> Value {
        let mut m = json!({"role": "assistant", "content": self.content});
        if !self.calls.is_empty() {
            if self.content.is_empty() {
                m["content"] = Value::Null;
            }
            m["tool_calls"] = Value::Array(self.calls.clone());
        }
        if !self.reasoning.is_empty() {
            m["reasoning_content"] = Value::String(self.reasoning.clone());
        }
        m
    }

    /// `tool_calls` when the model stopped after calling.
    pub fn finish_reason(&self, reason: FinishReason) -> &'static str {
        if reason == FinishReason::Stop && !self.calls.is_empty() {
            "tool_calls"
        } else {
            reason.as_str()
        }
    }
}
