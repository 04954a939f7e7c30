//! Reading a `streamGenerateContent` stream (`alt=sse`).
//!
//! Each `data:` line is a whole `GenerateContentResponse`: the first candidate's
//! new parts (text, thought text, whole function calls, each perhaps carrying a
//! `thoughtSignature`), a `finishReason` once the candidate ends, and the usage so
//! far. Consecutive text parts make one text block, consecutive thought parts one
//! thinking block; a signature on a text or thought part belongs to the block it
//! extends (Gemini 3 sends it on a last, empty part). Parts of kinds Tiller does
//! not model (code execution, inline data) are skipped.
//!
//! Nothing on the wire marks the end: the body ends. A `finishReason` does not end
//! the response either, since a response may carry two (text arrives after the
//! first); the last one read when the body ends is the stop reason.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::builder::MessageBuilder;
use crate::error::StreamError;
use crate::message::StopReason;
use crate::model::Model;
use crate::providers::parse_data;
use crate::sse::{Flow, SseEvent};

pub(crate) struct Decoder {
    provider: String,
    open: Option<Open>,
    finish_reason: Option<String>,
    /// Why the prompt was blocked, when Gemini said so instead of answering.
    block_reason: Option<String>,
    saw_chunk: bool,
}

/// The block receiving parts, with the last signature given for it.
struct Open {
    content_index: usize,
    thinking: bool,
    signature: Option<String>,
}

impl Decoder {
    pub(crate) fn new(model: &Model) -> Self {
        Decoder {
            provider: model.provider.clone(),
            open: None,
            finish_reason: None,
            block_reason: None,
            saw_chunk: false,
        }
    }

    pub(crate) fn on_event(&mut self, event: SseEvent<'_>, out: &mut MessageBuilder) -> Flow {
        let chunk: Chunk<'_> = parse_data(event.data.trim())?;
        self.saw_chunk = true;
        if let Some(error) = chunk.error {
            return Err(StreamError::Provider {
                provider: self.provider.clone(),
                code: error.status.map(Cow::into_owned),
                message: error
                    .message
                    .map_or_else(|| event.data.trim().to_owned(), Cow::into_owned),
            });
        }
        if let Some(usage) = chunk.usage_metadata {
            usage.apply(out);
        }
        if let Some(reason) = chunk.prompt_feedback.and_then(|f| f.block_reason) {
            self.block_reason = Some(reason.into_owned());
        }
        for candidate in chunk.candidates.into_iter().flatten() {
            if candidate.index != 0 {
                continue;
            }
            let parts = candidate.content.and_then(|c| c.parts);
            for part in parts.into_iter().flatten() {
                self.part(part, out);
            }
            if let Some(reason) = candidate.finish_reason {
                self.finish_reason = Some(reason.into_owned());
            }
        }
        Ok(false)
    }

    /// The body ended: the response is complete as far as it got.
    pub(crate) fn on_end(&mut self, out: &mut MessageBuilder) -> Result<(), StreamError> {
        if let Some(reason) = self.block_reason.take() {
            self.close(out);
            return Err(blocked(&reason));
        }
        let Some(reason) = self.finish_reason.take() else {
            let message = if self.saw_chunk {
                "the stream ended without a finish reason"
            } else {
                "the server closed the stream without sending any event"
            };
            return Err(StreamError::Incomplete {
                message: message.to_owned(),
            });
        };
        self.close(out);
        let stop = match reason.as_str() {
            "STOP" if out.has_tool_calls() => StopReason::ToolUse,
            "STOP" => StopReason::Stop,
            "MAX_TOKENS" => StopReason::Length,
            "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII"
            | "IMAGE_SAFETY" => return Err(StreamError::ContentFiltered),
            "MALFORMED_FUNCTION_CALL" | "UNEXPECTED_TOOL_CALL" => {
                return Err(StreamError::Provider {
                    provider: self.provider.clone(),
                    code: Some(reason),
                    message: "the model made a function call Gemini could not use".to_owned(),
                });
            }
            other => {
                return Err(StreamError::UnknownStopReason {
                    reason: other.to_owned(),
                });
            }
        };
        out.finish(stop);
        Ok(())
    }

    fn part(&mut self, part: Part<'_>, out: &mut MessageBuilder) {
        if let Some(call) = part.function_call {
            self.close(out);
            // Gemini 2.5 gives calls no id; each gets a unique one, the key a tool
            // may pass on to stay idempotent.
            let id = match call.id.as_deref().filter(|id| !id.is_empty()) {
                Some(id) => Cow::Borrowed(id),
                None => Cow::Owned(crate::new_id()),
            };
            let content_index = out.tool_call_start(&id, &call.name);
            let arguments = call.args.map_or("{}", RawValue::get);
            out.tool_call_delta(content_index, arguments);
            if let Some(signature) = &part.thought_signature {
                out.sign_tool_call(content_index, signature);
            }
            out.tool_call_end(content_index, false);
            return;
        }
        let Some(text) = part.text else {
            return;
        };
        let thinking = part.thought;
        let extends_open = self.open.as_ref().is_some_and(|o| o.thinking == thinking);
        if !extends_open {
            if text.is_empty() && part.thought_signature.is_none() {
                return;
            }
            self.close(out);
            let content_index = if thinking {
                out.thinking_start(false)
            } else {
                out.text_start()
            };
            self.open = Some(Open {
                content_index,
                thinking,
                signature: None,
            });
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if !text.is_empty() {
            if thinking {
                out.thinking_delta(open.content_index, &text);
            } else {
                out.text_delta(open.content_index, &text);
            }
        }
        if let Some(signature) = part.thought_signature {
            open.signature = Some(signature.into_owned());
        }
    }

    fn close(&mut self, out: &mut MessageBuilder) {
        if let Some(open) = self.open.take() {
            if open.thinking {
                out.thinking_end(open.content_index, open.signature);
            } else {
                out.text_end(open.content_index, open.signature);
            }
        }
    }
}

fn blocked(reason: &str) -> StreamError {
    match reason {
        "SAFETY" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "IMAGE_SAFETY" => {
            StreamError::ContentFiltered
        }
        other => StreamError::Refused {
            message: format!("Gemini blocked the prompt ({other})"),
        },
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk<'a> {
    #[serde(default, borrow)]
    candidates: Option<Vec<Candidate<'a>>>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default, borrow)]
    prompt_feedback: Option<PromptFeedback<'a>>,
    #[serde(default, borrow)]
    error: Option<ErrorBody<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    content: Option<CandidateContent<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct CandidateContent<'a> {
    #[serde(default, borrow)]
    parts: Option<Vec<Part<'a>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    thought: bool,
    #[serde(default, borrow)]
    thought_signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function_call: Option<FunctionCall<'a>>,
}

#[derive(Deserialize)]
struct FunctionCall<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default, borrow)]
    args: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback<'a> {
    #[serde(default, borrow)]
    block_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    cached_content_token_count: u64,
    #[serde(default)]
    tool_use_prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
}

impl UsageMetadata {
    /// Gemini counts cached tokens inside the prompt's, and thoughts apart from the
    /// answer's; here each is counted once, thoughts inside the output (as the
    /// other providers count reasoning), and the prompt of a built-in tool's use
    /// as input.
    fn apply(self, out: &mut MessageBuilder) {
        let usage = out.usage_mut();
        usage.input = self
            .prompt_token_count
            .saturating_add(self.tool_use_prompt_token_count)
            .saturating_sub(self.cached_content_token_count);
        usage.cache_read = self.cached_content_token_count;
        usage.output = self
            .candidates_token_count
            .saturating_add(self.thoughts_token_count);
        usage.reasoning = self.thoughts_token_count;
    }
}

#[derive(Deserialize)]
struct ErrorBody<'a> {
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
}
