//! Reading a chat-completions stream.
//!
//! Each `data:` line is a chunk whose first choice carries a delta: `content`
//! (text), `reasoning_content` or `reasoning` (thinking), `refusal`, and
//! `tool_calls` keyed by `index` (id and name first, argument pieces after; some
//! servers repeat the id and name in every piece, or send the legacy
//! `function_call` beside them). `finish_reason` arrives before the usage chunk,
//! and `data: [DONE]` ends the stream. Only choice 0 is read.

use std::borrow::Cow;

use serde::Deserialize;

use crate::builder::MessageBuilder;
use crate::error::StreamError;
use crate::message::StopReason;
use crate::model::Model;
use crate::providers::parse_data;
use crate::sse::{Flow, SseEvent};

pub(crate) struct Decoder {
    provider: String,
    open: Option<Open>,
    /// Wire indexes of the tool calls started so far.
    tool_indexes: Vec<u32>,
    finish_reason: Option<String>,
    refusal: Option<String>,
    saw_chunk: bool,
}

/// The block currently receiving deltas.
#[derive(Clone, Copy)]
enum Open {
    Text(usize),
    Thinking(usize),
    Tool { index: u32, content_index: usize },
}

/// The wire index given to a legacy `function_call`, which has none.
const LEGACY_FUNCTION_INDEX: u32 = u32::MAX;

impl Decoder {
    pub(crate) fn new(model: &Model) -> Self {
        Decoder {
            provider: model.provider.clone(),
            open: None,
            tool_indexes: Vec::new(),
            finish_reason: None,
            refusal: None,
            saw_chunk: false,
        }
    }

    pub(crate) fn on_event(&mut self, event: SseEvent<'_>, out: &mut MessageBuilder) -> Flow {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.complete(out)?;
            return Ok(true);
        }
        let chunk: Chunk<'_> = parse_data(data)?;
        self.saw_chunk = true;
        if let Some(error) = chunk.error {
            return Err(StreamError::Provider {
                provider: self.provider.clone(),
                code: error.code_text(),
                message: error
                    .message
                    .map_or_else(|| data.to_owned(), Cow::into_owned),
            });
        }
        if let Some(usage) = chunk.usage {
            usage.apply(out);
        }
        for choice in chunk.choices.into_iter().flatten() {
            if choice.index != 0 {
                continue;
            }
            if let Some(delta) = choice.delta {
                self.apply(delta, out);
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason.into_owned());
            }
        }
        Ok(false)
    }

    pub(crate) fn on_end(&mut self, out: &mut MessageBuilder) -> Result<(), StreamError> {
        if self.finish_reason.is_some() {
            return self.complete(out);
        }
        let message = if self.saw_chunk {
            "the stream ended without a finish reason"
        } else {
            "the server closed the stream without sending any event"
        };
        Err(StreamError::Incomplete {
            message: message.to_owned(),
        })
    }

    fn apply(&mut self, delta: Delta<'_>, out: &mut MessageBuilder) {
        if let Some(reasoning) = delta.reasoning_content.or(delta.reasoning)
            && !reasoning.is_empty()
        {
            let content_index = match self.open {
                Some(Open::Thinking(content_index)) => content_index,
                _ => {
                    self.close(out, false);
                    let content_index = out.thinking_start(false);
                    self.open = Some(Open::Thinking(content_index));
                    content_index
                }
            };
            out.thinking_delta(content_index, &reasoning);
        }
        for text in [delta.content, delta.refusal.clone()].into_iter().flatten() {
            if !text.is_empty() {
                self.text(&text, out);
            }
        }
        if let Some(refusal) = delta.refusal
            && !refusal.is_empty()
        {
            self.refusal.get_or_insert_default().push_str(&refusal);
        }
        match delta.tool_calls {
            Some(calls) if !calls.is_empty() => {
                for call in calls {
                    let function = call.function.unwrap_or_default();
                    self.tool_delta(call.index.unwrap_or(0), call.id, function, out);
                }
            }
            _ => {
                if let Some(function) = delta.function_call
                    && self
                        .tool_indexes
                        .iter()
                        .all(|i| *i == LEGACY_FUNCTION_INDEX)
                {
                    self.tool_delta(LEGACY_FUNCTION_INDEX, None, function, out);
                }
            }
        }
    }

    fn text(&mut self, text: &str, out: &mut MessageBuilder) {
        let content_index = match self.open {
            Some(Open::Text(content_index)) => content_index,
            _ => {
                self.close(out, false);
                let content_index = out.text_start();
                self.open = Some(Open::Text(content_index));
                content_index
            }
        };
        out.text_delta(content_index, text);
    }

    fn tool_delta(
        &mut self,
        index: u32,
        id: Option<Cow<'_, str>>,
        function: FunctionDelta<'_>,
        out: &mut MessageBuilder,
    ) {
        let content_index = match self.open {
            Some(Open::Tool {
                index: open,
                content_index,
            }) if open == index => {
                if let Some(name) = function.name.as_deref().filter(|n| !n.is_empty()) {
                    out.name_tool_call(content_index, name);
                }
                content_index
            }
            _ => {
                if self.tool_indexes.contains(&index) {
                    tracing::warn!(index, "ignoring a delta for a tool call that already ended");
                    return;
                }
                self.close(out, false);
                // A call without an id (some compatible servers send none) gets a
                // unique one: its id is the key a tool may pass on to stay
                // idempotent, so it must not repeat across responses.
                let id = match id.as_deref().filter(|id| !id.is_empty()) {
                    Some(id) => Cow::Borrowed(id),
                    None => Cow::Owned(crate::new_id()),
                };
                let content_index =
                    out.tool_call_start(&id, function.name.as_deref().unwrap_or(""));
                self.tool_indexes.push(index);
                self.open = Some(Open::Tool {
                    index,
                    content_index,
                });
                content_index
            }
        };
        if let Some(arguments) = function.arguments
            && !arguments.is_empty()
        {
            out.tool_call_delta(content_index, &arguments);
        }
    }

    fn close(&mut self, out: &mut MessageBuilder, cut_off: bool) {
        match self.open.take() {
            Some(Open::Text(content_index)) => out.text_end(content_index, None),
            Some(Open::Thinking(content_index)) => out.thinking_end(content_index, None),
            Some(Open::Tool { content_index, .. }) => out.tool_call_end(content_index, cut_off),
            None => {}
        }
    }

    fn complete(&mut self, out: &mut MessageBuilder) -> Result<(), StreamError> {
        if !self.saw_chunk {
            return Err(StreamError::Incomplete {
                message: "the stream ended before any chunk arrived".to_owned(),
            });
        }
        let reason = self
            .finish_reason
            .take()
            .unwrap_or_else(|| "stop".to_owned());
        self.close(out, reason == "length");
        if let Some(refusal) = self.refusal.take() {
            return Err(StreamError::Refused { message: refusal });
        }
        let stop = match reason.as_str() {
            "stop" if out.has_tool_calls() => StopReason::ToolUse,
            "stop" => StopReason::Stop,
            "length" => StopReason::Length,
            "tool_calls" | "function_call" => StopReason::ToolUse,
            "content_filter" => return Err(StreamError::ContentFiltered),
            other => {
                return Err(StreamError::UnknownStopReason {
                    reason: other.to_owned(),
                });
            }
        };
        out.finish(stop);
        Ok(())
    }
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, borrow)]
    error: Option<ErrorBody<'a>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<ToolCallDelta<'a>>>,
    #[serde(default, borrow)]
    function_call: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct ToolCallDelta<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize, Default)]
struct FunctionDelta<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl Usage {
    /// OpenAI counts cached tokens inside `prompt_tokens` and reasoning tokens inside
    /// `completion_tokens`; each is counted once here.
    fn apply(self, out: &mut MessageBuilder) {
        let cached = self
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0);
        let usage = out.usage_mut();
        usage.input = self.prompt_tokens.unwrap_or(0).saturating_sub(cached);
        usage.cache_read = cached;
        usage.output = self.completion_tokens.unwrap_or(0);
        usage.reasoning = self
            .completion_tokens_details
            .and_then(|d| d.reasoning_tokens)
            .unwrap_or(0);
    }
}

#[derive(Deserialize)]
struct ErrorBody<'a> {
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

impl ErrorBody<'_> {
    fn code_text(&self) -> Option<String> {
        match &self.code {
            Some(serde_json::Value::String(code)) => Some(code.clone()),
            Some(serde_json::Value::Number(code)) => Some(code.to_string()),
            _ => self.kind.as_deref().map(str::to_owned),
        }
    }
}
