//! pi's JSON for model calls through a proxy: the body of `POST /api/stream` that
//! pi-agent-core's `streamProxy` sends (pi-ai's model, context and options, all
//! camelCase) and the events it reads back (pi's assistant events without their
//! `partial` message, which the client rebuilds).
//!
//! Tiller's own wire types are snake_case and richer; these are the forms pi
//! speaks, with conversions to and from them, so that a Tiller server can answer
//! pi's clients. Fields pi sends that a proxy has no use for (the model's prices,
//! the client's transport preferences) are accepted and ignored.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::{Context, ContextRef, Tool};
use crate::event::AssistantEvent;
use crate::file::FileContent;
use crate::message::{
    AssistantContent, AssistantMessage, Content, ImageContent, Message, StopReason, TextContent,
    ThinkingContent, ToolCall, ToolResultMessage, UserMessage,
};
use crate::model::Api;
use crate::options::ThinkingLevel;
use crate::usage::{Cost, Usage};

/// The body of `POST /api/stream`: which model, what conversation, which options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyRequest<'a> {
    /// The model the client wants.
    pub model: ProxyModel<'a>,
    /// The conversation and tools.
    pub context: PiContext<'a>,
    /// Sampling and session options.
    #[serde(default)]
    pub options: ProxyOptions,
}

/// The model a proxy request names. pi sends its whole model description; a proxy
/// goes by `provider` and `id` and decides itself where the call goes and with
/// which key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyModel<'a> {
    /// The model id, such as `gpt-4o-mini`.
    pub id: Cow<'a, str>,
    /// The provider, such as `openai`.
    pub provider: Cow<'a, str>,
    /// pi's name of the wire API, such as `openai-completions` (Tiller's server
    /// does not need it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<Cow<'a, str>>,
}

/// The options a proxy request carries that a proxy applies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyOptions {
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The most tokens the answer may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// How hard a reasoning model should think (`minimal` to `xhigh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ThinkingLevel>,
    /// The conversation's id, for providers' prompt caching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// pi's context: system prompt, messages, tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PiContext<'a> {
    /// Instructions ahead of the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<Cow<'a, str>>,
    /// The conversation.
    #[serde(default)]
    pub messages: Vec<PiMessage<'a>>,
    /// The tools the model may call (the same fields as Tiller's).
    #[serde(default, skip_serializing_if = "<[Tool]>::is_empty")]
    pub tools: Cow<'a, [Tool]>,
}

/// One of pi's messages, tagged by `role`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "camelCase")]
pub enum PiMessage<'a> {
    /// What the user said.
    User(PiUserMessage<'a>),
    /// What the model answered.
    Assistant(PiAssistantMessage<'a>),
    /// The answer to one tool call.
    ToolResult(PiToolResultMessage<'a>),
}

/// pi's user message: a string or blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PiUserMessage<'a> {
    /// The text, or text and image blocks.
    pub content: PiUserContent<'a>,
    /// Milliseconds since the Unix epoch.
    #[serde(default)]
    pub timestamp: u64,
}

/// A user message's content: pi allows a plain string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PiUserContent<'a> {
    /// Plain text.
    Text(Cow<'a, str>),
    /// Text and image blocks.
    Blocks(Vec<PiContent<'a>>),
}

/// A text block, in user, tool-result and assistant content alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PiText<'a> {
    /// The text.
    pub text: Cow<'a, str>,
    /// The provider's signature, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_signature: Option<Cow<'a, str>>,
}

impl From<PiText<'_>> for TextContent {
    fn from(text: PiText<'_>) -> Self {
        TextContent {
            text: text.text.into_owned(),
            signature: text.text_signature.map(Cow::into_owned),
        }
    }
}

impl<'a> From<&'a TextContent> for PiText<'a> {
    fn from(text: &'a TextContent) -> Self {
        PiText {
            text: Cow::Borrowed(&text.text),
            text_signature: text.signature.as_deref().map(Cow::Borrowed),
        }
    }
}

/// A block of user or tool-result content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum PiContent<'a> {
    /// Text.
    Text(PiText<'a>),
    /// A base64-encoded image.
    #[serde(rename_all = "camelCase")]
    Image {
        /// The bytes, base64-encoded.
        data: Cow<'a, str>,
        /// Such as `image/png`.
        mime_type: Cow<'a, str>,
    },
    /// A base64-encoded file (Tiller's own: pi has none; its proxy refuses them).
    #[serde(rename_all = "camelCase")]
    File {
        /// The bytes, base64-encoded.
        data: Cow<'a, str>,
        /// Such as `application/pdf`.
        mime_type: Cow<'a, str>,
        /// The file's name.
        name: Cow<'a, str>,
    },
}

/// pi's assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PiAssistantMessage<'a> {
    /// The blocks.
    pub content: Vec<PiAssistantContent<'a>>,
    /// pi's name of the API that answered.
    #[serde(default)]
    pub api: Cow<'a, str>,
    /// The provider that answered.
    #[serde(default)]
    pub provider: Cow<'a, str>,
    /// The model that answered.
    #[serde(default)]
    pub model: Cow<'a, str>,
    /// Tokens and cost.
    #[serde(default)]
    pub usage: PiUsage,
    /// Why it ended.
    pub stop_reason: PiStopReason,
    /// What went wrong, for `error` and `aborted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<Cow<'a, str>>,
    /// Milliseconds since the Unix epoch.
    #[serde(default)]
    pub timestamp: u64,
}

/// A block of pi's assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum PiAssistantContent<'a> {
    /// Text.
    Text(PiText<'a>),
    /// Reasoning.
    #[serde(rename_all = "camelCase")]
    Thinking {
        /// The reasoning text.
        thinking: Cow<'a, str>,
        /// The provider's signature over it, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thinking_signature: Option<Cow<'a, str>>,
        /// Whether the provider redacted it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        redacted: bool,
    },
    /// A tool call.
    #[serde(rename_all = "camelCase")]
    ToolCall {
        /// The call's id.
        id: Cow<'a, str>,
        /// The tool's name.
        name: Cow<'a, str>,
        /// The arguments.
        #[serde(default)]
        arguments: Cow<'a, Value>,
        /// Gemini's signature over the call, sent back with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thought_signature: Option<Cow<'a, str>>,
    },
}

/// pi's tool result message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PiToolResultMessage<'a> {
    /// The call it answers.
    pub tool_call_id: Cow<'a, str>,
    /// The tool that ran.
    pub tool_name: Cow<'a, str>,
    /// What the model sees.
    pub content: Vec<PiContent<'a>>,
    /// Details for the application, never sent to a model.
    #[serde(default, skip_serializing_if = "is_null")]
    pub details: Cow<'a, Value>,
    /// Whether the tool failed.
    #[serde(default)]
    pub is_error: bool,
    /// Milliseconds since the Unix epoch.
    #[serde(default)]
    pub timestamp: u64,
}

/// pi's stop reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PiStopReason {
    /// The answer is complete.
    Stop,
    /// The token limit cut it off.
    Length,
    /// Tools are to run.
    ToolUse,
    /// It failed.
    Error,
    /// It was aborted.
    Aborted,
}

/// pi's token counts and cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PiUsage {
    /// Uncached prompt tokens.
    pub input: u64,
    /// Generated tokens.
    pub output: u64,
    /// Prompt tokens read from the cache.
    pub cache_read: u64,
    /// Prompt tokens written to the cache.
    pub cache_write: u64,
    /// All of them.
    pub total_tokens: u64,
    /// What they cost.
    pub cost: PiCost,
}

/// pi's cost per token class, in US dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PiCost {
    /// Uncached prompt tokens.
    pub input: f64,
    /// Generated tokens.
    pub output: f64,
    /// Cache reads.
    pub cache_read: f64,
    /// Cache writes.
    pub cache_write: f64,
    /// The sum.
    pub total: f64,
}

/// One event of a proxied answer, as pi's `streamProxy` reads it: a server-sent
/// event's `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProxyEvent<'a> {
    /// The answer began.
    Start,
    /// A text block opened.
    #[serde(rename_all = "camelCase")]
    TextStart {
        /// The block's index.
        content_index: usize,
    },
    /// Text arrived.
    #[serde(rename_all = "camelCase")]
    TextDelta {
        /// The block's index.
        content_index: usize,
        /// The new text.
        #[serde(borrow)]
        delta: Cow<'a, str>,
    },
    /// A text block closed.
    #[serde(rename_all = "camelCase")]
    TextEnd {
        /// The block's index.
        content_index: usize,
        /// The provider's signature, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content_signature: Option<Cow<'a, str>>,
    },
    /// A thinking block opened.
    #[serde(rename_all = "camelCase")]
    ThinkingStart {
        /// The block's index.
        content_index: usize,
    },
    /// Reasoning arrived.
    #[serde(rename_all = "camelCase")]
    ThinkingDelta {
        /// The block's index.
        content_index: usize,
        /// The new reasoning.
        #[serde(borrow)]
        delta: Cow<'a, str>,
    },
    /// A thinking block closed.
    #[serde(rename_all = "camelCase")]
    ThinkingEnd {
        /// The block's index.
        content_index: usize,
        /// The provider's signature, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content_signature: Option<Cow<'a, str>>,
    },
    /// A tool call opened.
    #[serde(rename_all = "camelCase")]
    ToolcallStart {
        /// The block's index.
        content_index: usize,
        /// The call's id.
        id: Cow<'a, str>,
        /// The tool's name.
        tool_name: Cow<'a, str>,
    },
    /// A piece of the call's JSON arguments.
    #[serde(rename_all = "camelCase")]
    ToolcallDelta {
        /// The block's index.
        content_index: usize,
        /// The piece.
        #[serde(borrow)]
        delta: Cow<'a, str>,
    },
    /// A tool call closed.
    #[serde(rename_all = "camelCase")]
    ToolcallEnd {
        /// The block's index.
        content_index: usize,
    },
    /// The answer ended: `stop`, `length` or `toolUse`.
    Done {
        /// Why.
        reason: PiStopReason,
        /// Tokens and cost.
        usage: PiUsage,
    },
    /// The answer failed (`error`) or was aborted.
    #[serde(rename_all = "camelCase")]
    Error {
        /// `error` or `aborted`.
        reason: PiStopReason,
        /// What went wrong.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_message: Option<Cow<'a, str>>,
        /// Tokens and cost so far.
        usage: PiUsage,
    },
}

impl<'a> From<&'a AssistantEvent> for ProxyEvent<'a> {
    fn from(event: &'a AssistantEvent) -> Self {
        let signature = |signature: &'a Option<String>| signature.as_deref().map(Cow::Borrowed);
        match event {
            AssistantEvent::Start { .. } => ProxyEvent::Start,
            AssistantEvent::TextStart { content_index } => ProxyEvent::TextStart {
                content_index: *content_index,
            },
            AssistantEvent::TextDelta {
                content_index,
                delta,
            } => ProxyEvent::TextDelta {
                content_index: *content_index,
                delta: Cow::Borrowed(delta),
            },
            AssistantEvent::TextEnd {
                content_index,
                signature: given,
            } => ProxyEvent::TextEnd {
                content_index: *content_index,
                content_signature: signature(given),
            },
            AssistantEvent::ThinkingStart { content_index, .. } => ProxyEvent::ThinkingStart {
                content_index: *content_index,
            },
            AssistantEvent::ThinkingDelta {
                content_index,
                delta,
            } => ProxyEvent::ThinkingDelta {
                content_index: *content_index,
                delta: Cow::Borrowed(delta),
            },
            AssistantEvent::ThinkingEnd {
                content_index,
                signature: given,
            } => ProxyEvent::ThinkingEnd {
                content_index: *content_index,
                content_signature: signature(given),
            },
            AssistantEvent::ToolCallStart {
                content_index,
                id,
                name,
            } => ProxyEvent::ToolcallStart {
                content_index: *content_index,
                id: Cow::Borrowed(id),
                tool_name: Cow::Borrowed(name),
            },
            AssistantEvent::ToolCallDelta {
                content_index,
                delta,
            } => ProxyEvent::ToolcallDelta {
                content_index: *content_index,
                delta: Cow::Borrowed(delta),
            },
            AssistantEvent::ToolCallEnd { content_index, .. } => ProxyEvent::ToolcallEnd {
                content_index: *content_index,
            },
            AssistantEvent::Done { reason, message } => ProxyEvent::Done {
                reason: (*reason).into(),
                usage: message.usage.into(),
            },
            AssistantEvent::Error {
                reason,
                error,
                message,
            } => ProxyEvent::Error {
                reason: (*reason).into(),
                error_message: Some(match &message.error_message {
                    Some(text) => Cow::Borrowed(text),
                    None => Cow::Owned(error.to_string()),
                }),
                usage: message.usage.into(),
            },
        }
    }
}

impl PiContext<'_> {
    /// The context in Tiller's types. An assistant message from an API Tiller does
    /// not speak is taken as `api`'s (the one the call goes to).
    pub fn into_context(self, api: Api) -> Context {
        Context {
            system_prompt: self.system_prompt.map(Cow::into_owned),
            messages: self
                .messages
                .into_iter()
                .map(|message| message.into_message(api))
                .collect(),
            tools: self.tools.into_owned(),
        }
    }
}

impl<'a> PiContext<'a> {
    /// `context` in pi's form, borrowing from it.
    pub fn from_ref(context: ContextRef<'a>) -> Self {
        PiContext {
            system_prompt: context.system_prompt.map(Cow::Borrowed),
            messages: context
                .messages
                .iter()
                .map(|m| PiMessage::from(*m))
                .collect(),
            tools: Cow::Borrowed(context.tools),
        }
    }
}

impl PiMessage<'_> {
    /// The message in Tiller's types (see [`PiContext::into_context`]).
    pub fn into_message(self, api: Api) -> Message {
        match self {
            PiMessage::User(user) => Message::User(UserMessage {
                content: match user.content {
                    PiUserContent::Text(text) => vec![Content::text(text)],
                    PiUserContent::Blocks(blocks) => {
                        blocks.into_iter().map(Content::from).collect()
                    }
                },
                timestamp: user.timestamp,
            }),
            PiMessage::Assistant(assistant) => Message::from(AssistantMessage {
                content: assistant
                    .content
                    .into_iter()
                    .map(AssistantContent::from)
                    .collect(),
                api: Api::named(&assistant.api).unwrap_or(api),
                provider: assistant.provider.into_owned(),
                model: assistant.model.into_owned(),
                usage: assistant.usage.into(),
                stop_reason: assistant.stop_reason.into(),
                error_message: assistant.error_message.map(Cow::into_owned),
                timestamp: assistant.timestamp,
            }),
            PiMessage::ToolResult(result) => Message::from(ToolResultMessage {
                tool_call_id: result.tool_call_id.into_owned(),
                tool_name: result.tool_name.into_owned(),
                content: result.content.into_iter().map(Content::from).collect(),
                details: result.details.into_owned(),
                is_error: result.is_error,
                timestamp: result.timestamp,
                state: serde_json::Map::new(),
            }),
        }
    }
}

impl<'a> From<&'a Message> for PiMessage<'a> {
    fn from(message: &'a Message) -> Self {
        match message {
            Message::User(user) => PiMessage::User(PiUserMessage {
                content: PiUserContent::Blocks(user.content.iter().map(PiContent::from).collect()),
                timestamp: user.timestamp,
            }),
            Message::Assistant(assistant) => PiMessage::Assistant(PiAssistantMessage {
                content: assistant
                    .content
                    .iter()
                    .map(PiAssistantContent::from)
                    .collect(),
                api: Cow::Borrowed(assistant.api.as_str()),
                provider: Cow::Borrowed(&assistant.provider),
                model: Cow::Borrowed(&assistant.model),
                usage: assistant.usage.into(),
                stop_reason: assistant.stop_reason.into(),
                error_message: assistant.error_message.as_deref().map(Cow::Borrowed),
                timestamp: assistant.timestamp,
            }),
            Message::ToolResult(result) => PiMessage::ToolResult(PiToolResultMessage {
                tool_call_id: Cow::Borrowed(&result.tool_call_id),
                tool_name: Cow::Borrowed(&result.tool_name),
                content: result.content.iter().map(PiContent::from).collect(),
                details: Cow::Borrowed(&result.details),
                is_error: result.is_error,
                timestamp: result.timestamp,
            }),
        }
    }
}

impl From<PiContent<'_>> for Content {
    fn from(content: PiContent<'_>) -> Self {
        match content {
            PiContent::Text(text) => Content::Text(text.into()),
            PiContent::Image { data, mime_type } => Content::Image(ImageContent {
                data: data.into_owned(),
                mime_type: mime_type.into_owned(),
            }),
            PiContent::File {
                data,
                mime_type,
                name,
            } => Content::File(FileContent {
                data: data.into_owned(),
                mime_type: mime_type.into_owned(),
                name: name.into_owned(),
            }),
        }
    }
}

impl<'a> From<&'a Content> for PiContent<'a> {
    fn from(content: &'a Content) -> Self {
        match content {
            Content::Text(text) => PiContent::Text(text.into()),
            Content::Image(image) => PiContent::Image {
                data: Cow::Borrowed(&image.data),
                mime_type: Cow::Borrowed(&image.mime_type),
            },
            Content::File(file) => PiContent::File {
                data: Cow::Borrowed(&file.data),
                mime_type: Cow::Borrowed(&file.mime_type),
                name: Cow::Borrowed(&file.name),
            },
        }
    }
}

impl From<PiAssistantContent<'_>> for AssistantContent {
    fn from(content: PiAssistantContent<'_>) -> Self {
        match content {
            PiAssistantContent::Text(text) => AssistantContent::Text(text.into()),
            PiAssistantContent::Thinking {
                thinking,
                thinking_signature,
                redacted,
            } => AssistantContent::Thinking(ThinkingContent {
                thinking: thinking.into_owned(),
                signature: thinking_signature.map(Cow::into_owned),
                redacted,
            }),
            PiAssistantContent::ToolCall {
                id,
                name,
                arguments,
                thought_signature,
            } => AssistantContent::ToolCall(Box::new(ToolCall {
                id: id.into_owned(),
                name: name.into_owned(),
                arguments: arguments.into_owned(),
                arguments_error: None,
                signature: thought_signature.map(Cow::into_owned),
            })),
        }
    }
}

impl<'a> From<&'a AssistantContent> for PiAssistantContent<'a> {
    fn from(content: &'a AssistantContent) -> Self {
        match content {
            AssistantContent::Text(text) => PiAssistantContent::Text(text.into()),
            AssistantContent::Thinking(thinking) => PiAssistantContent::Thinking {
                thinking: Cow::Borrowed(&thinking.thinking),
                thinking_signature: thinking.signature.as_deref().map(Cow::Borrowed),
                redacted: thinking.redacted,
            },
            AssistantContent::ToolCall(call) => PiAssistantContent::ToolCall {
                id: Cow::Borrowed(&call.id),
                name: Cow::Borrowed(&call.name),
                arguments: Cow::Borrowed(&call.arguments),
                thought_signature: call.signature.as_deref().map(Cow::Borrowed),
            },
        }
    }
}

impl From<StopReason> for PiStopReason {
    fn from(reason: StopReason) -> Self {
        match reason {
            StopReason::Stop => PiStopReason::Stop,
            StopReason::Length => PiStopReason::Length,
            StopReason::ToolUse => PiStopReason::ToolUse,
            StopReason::Error => PiStopReason::Error,
            StopReason::Aborted => PiStopReason::Aborted,
        }
    }
}

impl From<PiStopReason> for StopReason {
    fn from(reason: PiStopReason) -> Self {
        match reason {
            PiStopReason::Stop => StopReason::Stop,
            PiStopReason::Length => StopReason::Length,
            PiStopReason::ToolUse => StopReason::ToolUse,
            PiStopReason::Error => StopReason::Error,
            PiStopReason::Aborted => StopReason::Aborted,
        }
    }
}

impl From<Usage> for PiUsage {
    fn from(usage: Usage) -> Self {
        PiUsage {
            input: usage.input,
            output: usage.output,
            cache_read: usage.cache_read,
            cache_write: usage.cache_write,
            total_tokens: usage.total_tokens,
            cost: PiCost {
                input: usage.cost.input,
                output: usage.cost.output,
                cache_read: usage.cost.cache_read,
                cache_write: usage.cost.cache_write,
                total: usage.cost.total,
            },
        }
    }
}

impl From<PiUsage> for Usage {
    fn from(usage: PiUsage) -> Self {
        Usage {
            input: usage.input,
            output: usage.output,
            cache_read: usage.cache_read,
            cache_write: usage.cache_write,
            reasoning: 0,
            total_tokens: usage.total_tokens,
            cost: Cost {
                input: usage.cost.input,
                output: usage.cost.output,
                cache_read: usage.cost.cache_read,
                cache_write: usage.cost.cache_write,
                total: usage.cost.total,
            },
        }
    }
}

/// For `skip_serializing_if`, which hands over the field as it is.
#[allow(clippy::ptr_arg)]
fn is_null(value: &Cow<'_, Value>) -> bool {
    value.is_null()
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    /// A request as pi-agent-core 0.73's `streamProxy` sends it, after a tool round.
    #[test]
    fn a_request_from_pi_becomes_tillers_context() {
        let request: ProxyRequest = serde_json::from_value(json!({
            "model": {"id": "m", "name": "M", "api": "openai-completions", "provider": "openai",
                      "baseUrl": "https://example.invalid/v1", "reasoning": false, "input": ["text"],
                      "cost": {"input": 1, "output": 2, "cacheRead": 0, "cacheWrite": 0},
                      "contextWindow": 8192, "maxTokens": 1024},
            "context": {
                "systemPrompt": "Be brief.",
                "messages": [
                    {"role": "user", "content": "What time is it?", "timestamp": 1},
                    {"role": "assistant", "api": "openai-responses", "provider": "openai", "model": "m",
                     "content": [{"type": "thinking", "thinking": "hm", "thinkingSignature": "sig"},
                                 {"type": "toolCall", "id": "call_1", "name": "clock", "arguments": {"zone": "UTC"}}],
                     "usage": {"input": 3, "output": 4, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 7,
                               "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
                     "stopReason": "toolUse", "timestamp": 2},
                    {"role": "toolResult", "toolCallId": "call_1", "toolName": "clock",
                     "content": [{"type": "text", "text": "noon"}], "isError": false, "timestamp": 3},
                    {"role": "user", "content": [{"type": "text", "text": "Thanks"},
                                                 {"type": "image", "data": "AAAA", "mimeType": "image/png"}],
                     "timestamp": 4}
                ],
                "tools": [{"name": "clock", "description": "Tells the time", "parameters": {"type": "object"}}]
            },
            "options": {"temperature": 0.5, "maxTokens": 100, "reasoning": "low", "sessionId": "s1",
                        "transport": "sse", "headers": {"x": "y"}}
        }))
        .unwrap();
        assert_eq!(
            (request.model.provider.as_ref(), request.model.id.as_ref()),
            ("openai", "m")
        );
        assert_eq!(
            request.options,
            ProxyOptions {
                temperature: Some(0.5),
                max_tokens: Some(100),
                reasoning: Some(ThinkingLevel::Low),
                session_id: Some("s1".to_owned()),
            }
        );
        let context = request.context.into_context(Api::OpenAiCompletions);
        assert_eq!(
            serde_json::to_value(&context).unwrap(),
            json!({
                "system_prompt": "Be brief.",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "What time is it?"}], "timestamp": 1},
                    {"role": "assistant", "api": "openai-responses", "provider": "openai", "model": "m",
                     "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"},
                                 {"type": "tool_call", "id": "call_1", "name": "clock", "arguments": {"zone": "UTC"}}],
                     "usage": {"input": 3, "output": 4, "cache_read": 0, "cache_write": 0, "reasoning": 0,
                               "total_tokens": 7,
                               "cost": {"input": 0.0, "output": 0.0, "cache_read": 0.0, "cache_write": 0.0, "total": 0.0}},
                     "stop_reason": "tool_use", "timestamp": 2},
                    {"role": "tool_result", "tool_call_id": "call_1", "tool_name": "clock",
                     "content": [{"type": "text", "text": "noon"}], "is_error": false, "timestamp": 3},
                    {"role": "user", "content": [{"type": "text", "text": "Thanks"},
                                                 {"type": "image", "data": "AAAA", "mime_type": "image/png"}],
                     "timestamp": 4}
                ],
                "tools": [{"name": "clock", "description": "Tells the time", "parameters": {"type": "object"}}]
            })
        );
    }

    #[test]
    fn proxy_events_are_written_as_pi_reads_them() {
        let events = [
            ProxyEvent::Start,
            ProxyEvent::ToolcallStart {
                content_index: 1,
                id: "c".into(),
                tool_name: "t".into(),
            },
            ProxyEvent::TextEnd {
                content_index: 0,
                content_signature: None,
            },
            ProxyEvent::Done {
                reason: PiStopReason::ToolUse,
                usage: PiUsage::default(),
            },
            ProxyEvent::Error {
                reason: PiStopReason::Aborted,
                error_message: Some("stop".into()),
                usage: PiUsage::default(),
            },
        ];
        let usage = json!({"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0,
                           "cost": {"input": 0.0, "output": 0.0, "cacheRead": 0.0, "cacheWrite": 0.0, "total": 0.0}});
        assert_eq!(
            serde_json::to_value(events).unwrap(),
            json!([
                {"type": "start"},
                {"type": "toolcall_start", "contentIndex": 1, "id": "c", "toolName": "t"},
                {"type": "text_end", "contentIndex": 0},
                {"type": "done", "reason": "toolUse", "usage": usage},
                {"type": "error", "reason": "aborted", "errorMessage": "stop", "usage": usage}
            ])
        );
    }
}
