//! A request turned into prompt tokens and sampling parameters.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use rlx_guide::tools::{Syntax, ToolChoice, ToolUse};
use rlx_tokenizer::{ChatMessage, ChatOptions, EncodeOptions};
use serde_json::{json, Map, Value};

use crate::openai::{self, BadRequest, Message, Params, Prompt};
use crate::response::ApiError;
use crate::{Endpoint, Server};

impl Server {
    /// Prompt tokens and parameters of a request body.
    pub(crate) fn prepare(
        &self,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Result<(Vec<u32>, Params), ApiError> {
        let body = openai::object(body)?;
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        // Without a seed, each request samples differently.
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(n, |d| d.as_nanos() as u64 ^ n);
        let api = match endpoint {
            Endpoint::Chat => openai::Api::Chat,
            Endpoint::Completion => openai::Api::Completions,
        };
        let mut params = openai::params(&body, api, &self.opts.sampling, seed)?;
        if let Some(spec) = calling(&params).and_then(|t| t.spec(self.tool_syntax)) {
            params.constraint = Some(("tools", spec));
            // A model listing the same call again has nothing more to call.
            params.guide.end_on_repeat = true;
        }
        let tok = self.engine.tokenizer();
        let ids = match endpoint {
            Endpoint::Chat => self.chat_prompt(&body, &params)?,
            Endpoint::Completion => match openai::prompt(&body)? {
                Prompt::Text(t) => tok.encode(&t, EncodeOptions::default()),
                Prompt::Tokens(t) => t,
            },
        };
        if ids.is_empty() {
            return Err(BadRequest::new("the prompt is empty").into());
        }
        let context = self.engine.context();
        if ids.len() >= context {
            return Err(BadRequest::new(format!(
                "the prompt has {} tokens; a request holds at most {context} (start the server with a larger -c or a smaller --parallel)",
                ids.len(),
            ))
            .into());
        }
        if let Some(n) = params.max_tokens.filter(|&n| ids.len() + n > context) {
            return Err(BadRequest::param(
                "max_tokens",
                format!(
                    "the prompt ({} tokens) and max_tokens ({n}) exceed the {context} tokens a request holds (start the server with a larger -c or a smaller --parallel)",
                    ids.len(),
                ),
            )
            .into());
        }
        Ok((ids, params))
    }

    /// The conversation rendered by the chat template: with Gemma 4's
    /// syntax, messages, calls and tools as the template takes them; for
    /// JSON replies, the tools described in the system text, earlier calls
    /// as the JSON the model wrote and results as user turns.
    fn chat_prompt(
        &self,
        body: &Map<String, Value>,
        params: &Params,
    ) -> Result<Vec<u32>, ApiError> {
        let messages = openai::messages(body)?;
        let opts = ChatOptions {
            add_generation_prompt: true,
            enable_thinking: params.enable_thinking,
        };
        let tools = calling(params);
        let rendered = match self.tool_syntax {
            Syntax::Gemma4 => {
                let list: Vec<Value> = messages.iter().map(template_message).collect();
                let tools = tools.map(|t| {
                    let decls: Vec<Value> = t
                        .tools
                        .iter()
                        .map(|t| {
                            json!({"type": "function", "function": {"name": t.name,
                                "description": t.description, "parameters": t.parameters}})
                        })
                        .collect();
                    Value::Array(decls).to_string()
                });
                self.template
                    .render_json(&Value::Array(list).to_string(), tools.as_deref(), &opts)
            }
            Syntax::Json => {
                let plain = json_conversation(&messages, tools.and_then(ToolUse::instructions));
                self.template.render(&plain, &opts)
            }
        }
        .map_err(|e| BadRequest::new(format!("chat template: {e}")))?;
        Ok(self.engine.tokenizer().encode_chat(&rendered))
    }
}

/// The request's tools when the model may call them.
pub(crate) fn calling(params: &Params) -> Option<&ToolUse> {
    params
        .tools
        .as_ref()
        .filter(|t| t.choice != ToolChoice::None)
}

/// A message as chat templates take it (OpenAI's shape, arguments as
/// objects).
fn template_message(m: &Message) -> Value {
    let mut v = json!({"role": m.role, "content": m.content});
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|(id, c)| {
                json!({"id": id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        v["tool_calls"] = Value::Array(calls);
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    if let Some(name) = &m.name {
        v["name"] = json!(name);
    }
    v
}

/// The conversation for a model that calls tools in JSON: `instructions`
/// added to the system text, an assistant's calls written as its JSON
/// reply, tool results as user turns (joined with a neighbouring user turn,
/// since Gemma's templates want turns to alternate).
fn json_conversation(messages: &[Message], instructions: Option<String>) -> Vec<ChatMessage> {
    let mut out: Vec<(ChatMessage, bool)> = Vec::with_capacity(messages.len() + 1);
    for (i, m) in messages.iter().enumerate() {
        let (role, text, from_tool) = match m.role {
            "tool" => {
                // The function's name from the call this answers.
                let name = messages[..i]
                    .iter()
                    .rev()
                    .flat_map(|p| p.tool_calls.iter())
                    .find(|(id, _)| Some(id) == m.tool_call_id.as_ref())
                    .map(|(_, c)| c.name.clone())
                    .or_else(|| m.name.clone())
                    .unwrap_or_else(|| "the function".to_owned());
                ("user", format!("{name} returned: {}", m.content), true)
            }
            "assistant" if !m.tool_calls.is_empty() => {
                let calls: Vec<_> = m.tool_calls.iter().map(|(_, c)| c.clone()).collect();
                let reply = rlx_guide::tools::json_reply(&calls);
                let text = if m.content.is_empty() {
                    reply
                } else {
                    format!("{}\n{reply}", m.content)
                };
                ("assistant", text, true)
            }
            role => (role, m.content.clone(), false),
        };
        match out.last_mut() {
            Some((prev, prev_tool)) if prev.role == role && (from_tool || *prev_tool) => {
                prev.content.push_str("\n\n");
                prev.content.push_str(&text);
                *prev_tool = true;
            }
            _ => out.push((ChatMessage::new(role, text), from_tool)),
        }
    }
    if let Some(text) = instructions {
        match out.iter_mut().find(|(m, _)| m.role == "system") {
            Some((m, _)) => {
                m.content.push_str("\n\n");
                m.content.push_str(&text);
            }
            None => out.insert(0, (ChatMessage::system(text), false)),
        }
    }
    out.into_iter().map(|(m, _)| m).collect()
}
