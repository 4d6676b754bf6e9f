//! Tool calls: the functions a request offers, how the model is asked to
//! call them, the constraint that makes a required call well-formed, and
//! reading the calls back out of the output.
//!
//! Two syntaxes. Gemma 4 has its own ([`crate::gemma4`]): the chat template
//! declares the tools and the model writes `<|tool_call>…<tool_call|>`.
//! Gemma 1 to 3 have no tool tokens: the tools are described in the system
//! text and the whole reply is a JSON object, either
//! `{"tool_calls": [{"name": …, "arguments": {…}}]}` or
//! `{"response": "…"}`, held to that shape by a JSON schema so it always
//! parses.

use serde_json::{json, Value};

use crate::gemma4::{self, Delta};
use crate::shape::JsonShape;
use crate::Spec;

/// A function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// The arguments' JSON schema (an object schema).
    pub parameters: Value,
}

/// One call the model made: a function and its arguments (a JSON object).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call: the tools are not shown to the model.
    None,
    /// The model decides.
    Auto,
    /// At least one call, of any tool.
    Required,
    /// A call of this function.
    Named(String),
}

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// `<|tool_call>call:NAME{…}<tool_call|>`, tools declared by the chat
    /// template.
    Gemma4,
    /// A JSON reply, tools described in the system text.
    Json,
}

/// What a request asks of the model about tools.
#[derive(Clone, Debug)]
pub struct ToolUse {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// More than one call in a reply.
    pub parallel: bool,
}

impl ToolUse {
    /// The tools a call may be of.
    fn callable(&self) -> Vec<Tool> {
        match &self.choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Named(n) => self
                .tools
                .iter()
                .filter(|t| &t.name == n)
                .cloned()
                .collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.clone(),
        }
    }

    /// The constraint on the reply: with [`Syntax::Gemma4`] a required or
    /// named call (otherwise the model writes freely); with [`Syntax::Json`]
    /// always, since that reply is JSON by design.
    pub fn spec(&self, syntax: Syntax) -> Option<Spec> {
        let tools = self.callable();
        if tools.is_empty() {
            return None;
        }
        let must_call = !matches!(self.choice, ToolChoice::Auto);
        match syntax {
            Syntax::Gemma4 => {
                must_call.then(|| Spec::Lark(gemma4::call_grammar(&tools, self.parallel)))
            }
            Syntax::Json => {
                let calls = json!({
                    "type": "object",
                    "properties": {"tool_calls": self.calls_schema(&tools)},
                    "required": ["tool_calls"],
                    "additionalProperties": false
                });
                let schema = if must_call {
                    calls
                } else {
                    json!({"anyOf": [calls, {
                        "type": "object",
                        "properties": {"response": {"type": "string"}},
                        "required": ["response"],
                        "additionalProperties": false
                    }]})
                };
                Some(Spec::JsonSchema(schema))
            }
        }
    }

    fn calls_schema(&self, tools: &[Tool]) -> Value {
        let one: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false
                })
            })
            .collect();
        // At most one call per function (a model that lists more is
        // repeating itself), or one call where parallel calls are off.
        let most = if self.parallel { tools.len() } else { 1 };
        json!({"type": "array", "items": {"anyOf": one}, "minItems": 1, "maxItems": most})
    }

    /// For [`Syntax::Json`]: the system text that describes the tools and
    /// the reply's shape; `None` when no tool may be called.
    pub fn instructions(&self) -> Option<String> {
        let tools = self.callable();
        if tools.is_empty() {
            return None;
        }
        let mut text = String::from("You can call these functions:\n");
        for t in &tools {
            let decl = json!({"name": t.name, "description": t.description,
                              "parameters": t.parameters});
            text.push_str(&decl.to_string());
            text.push('\n');
        }
        let how = if self.parallel {
            "To call functions, reply with {\"tool_calls\": [{\"name\": \"<function name>\", \"arguments\": {<its arguments>}}, ...]}, one entry per call."
        } else {
            "To call a function, reply with {\"tool_calls\": [{\"name\": \"<function name>\", \"arguments\": {<its arguments>}}]}."
        };
        text.push('\n');
        text.push_str(how);
        match &self.choice {
            ToolChoice::Auto => text.push_str(
                " To answer without calling a function, reply with {\"response\": \"<your answer>\"}.",
            ),
            ToolChoice::Named(n) => text.push_str(&format!(" Call {n} now.")),
            ToolChoice::Required | ToolChoice::None => text.push_str(" Call a function now."),
        }
        text.push_str(" Reply with the JSON object only.");
        Some(text)
    }
}

/// How an earlier call is shown to a model that writes JSON replies: the
/// reply it would have written.
pub fn json_reply(calls: &[ToolCall]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| json!({"name": c.name, "arguments": c.arguments}))
        .collect();
    json!({ "tool_calls": calls }).to_string()
}

/// Reads a reply as it streams into content, reasoning and tool calls.
#[derive(Debug)]
pub enum ReplyReader {
    /// Everything is content.
    Plain,
    /// Gemma 4's channels and calls, parsed as they arrive.
    Gemma4(gemma4::Parser),
    /// A JSON reply, read when it is whole (held until then).
    Json(String),
}

impl ReplyReader {
    pub fn new(syntax: Option<Syntax>) -> ReplyReader {
        match syntax {
            None => ReplyReader::Plain,
            Some(Syntax::Gemma4) => ReplyReader::Gemma4(gemma4::Parser::new()),
            Some(Syntax::Json) => ReplyReader::Json(String::new()),
        }
    }

    pub fn push(&mut self, text: &str) -> Delta {
        match self {
            ReplyReader::Plain => Delta {
                content: text.to_owned(),
                ..Delta::default()
            },
            ReplyReader::Gemma4(p) => p.push(text),
            ReplyReader::Json(held) => {
                held.push_str(text);
                Delta::default()
            }
        }
    }

    /// The end of the reply; `closed_at` is where the constraint began
    /// closing it, if it did (calls that were not finished by then are
    /// dropped: their arguments are the closing's, not the model's).
    pub fn finish(&mut self, closed_at: Option<usize>) -> Delta {
        match self {
            ReplyReader::Plain => Delta::default(),
            ReplyReader::Gemma4(p) => p.finish(),
            ReplyReader::Json(held) => read_json_reply(&std::mem::take(held), closed_at),
        }
    }
}

/// A whole JSON reply: its calls, or its response as content; text that is
/// not such a reply (cut short, say) is content as it stands. Of a reply
/// the constraint closed from byte `closed_at` on, only the calls finished
/// before it count; a call repeating an earlier one is dropped.
pub fn read_json_reply(text: &str, closed_at: Option<usize>) -> Delta {
    let plain = || Delta {
        content: text.to_owned(),
        ..Delta::default()
    };
    let Ok(Value::Object(reply)) = serde_json::from_str::<Value>(text) else {
        return plain();
    };
    if let Some(Value::String(r)) = reply.get("response") {
        return Delta {
            content: r.clone(),
            ..Delta::default()
        };
    }
    let Some(Value::Array(list)) = reply.get("tool_calls") else {
        return plain();
    };
    let finished = closed_at.map_or(list.len(), |at| {
        JsonShape::complete_items(text.as_bytes(), at)
    });
    if finished == 0 {
        // Closed inside the first call: no call is the model's.
        return plain();
    }
    let mut calls: Vec<ToolCall> = Vec::new();
    for c in list.iter().take(finished) {
        let call = match (c.get("name"), c.get("arguments")) {
            (Some(Value::String(name)), Some(args @ Value::Object(_))) => ToolCall {
                name: name.clone(),
                arguments: args.clone(),
            },
            _ => return plain(),
        };
        if !calls.contains(&call) {
            calls.push(call);
        }
    }
    Delta {
        calls,
        ..Delta::default()
    }
}
