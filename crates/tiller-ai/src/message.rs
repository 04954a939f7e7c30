//! Messages and their content blocks: what a conversation is made of.
//!
//! A conversation is a list of [`Message`]s. Users speak in [`Content`] (text,
//! images and files), the model answers with an [`AssistantMessage`] whose blocks are
//! [`AssistantContent`] (text, thinking and tool calls), and every tool call is
//! answered by one [`ToolResultMessage`]. All types serialize as snake_case JSON
//! with a `role` tag on messages and a `type` tag on blocks.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::file::FileContent;
use crate::model::{Api, Model};
use crate::usage::Usage;

/// One message of a conversation, tagged by its `role`.
///
/// The larger kinds are boxed, so a message is small to store and move (agents keep
/// many of them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// What the user said.
    User(UserMessage),
    /// What the model answered.
    Assistant(Box<AssistantMessage>),
    /// The answer to one tool call.
    ToolResult(Box<ToolResultMessage>),
}

impl Message {
    /// A user message holding one text block.
    pub fn user(text: impl Into<String>) -> Self {
        Message::User(UserMessage::text(text))
    }
}

impl From<UserMessage> for Message {
    fn from(message: UserMessage) -> Self {
        Message::User(message)
    }
}

impl From<AssistantMessage> for Message {
    fn from(message: AssistantMessage) -> Self {
        Message::Assistant(Box::new(message))
    }
}

impl From<ToolResultMessage> for Message {
    fn from(message: ToolResultMessage) -> Self {
        Message::ToolResult(Box::new(message))
    }
}

/// A message from the user: text, images and files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    /// The blocks, in order.
    pub content: Vec<Content>,
    /// When the message was made, in milliseconds since the Unix epoch.
    pub timestamp: u64,
}

impl UserMessage {
    /// A user message holding one text block, stamped now.
    pub fn text(text: impl Into<String>) -> Self {
        UserMessage {
            content: vec![Content::text(text)],
            timestamp: now_ms(),
        }
    }

    /// Adds an image block after the existing content.
    pub fn with_image(mut self, image: ImageContent) -> Self {
        self.content.push(Content::Image(image));
        self
    }

    /// Adds a file block after the existing content.
    pub fn with_file(mut self, file: FileContent) -> Self {
        self.content.push(Content::File(file));
        self
    }

    /// The text blocks joined.
    pub fn text_content(&self) -> String {
        self.content.iter().filter_map(Content::as_text).collect()
    }
}

/// A block of user or tool-result content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Content {
    /// Plain text.
    Text(TextContent),
    /// A base64-encoded image.
    Image(ImageContent),
    /// A document or audio file, base64-encoded.
    File(FileContent),
}

impl Content {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Content::Text(TextContent::new(text))
    }

    /// The text of a text block; `None` for an image or a file.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text(text) => Some(&text.text),
            Content::Image(_) | Content::File(_) => None,
        }
    }
}

/// A block of an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AssistantContent {
    /// Text for the user.
    Text(TextContent),
    /// The model's reasoning.
    Thinking(ThinkingContent),
    /// A request to run a tool (boxed: it is the largest block).
    ToolCall(Box<ToolCall>),
}

/// Text, with the provider's signature when it sends one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextContent {
    /// The text itself.
    pub text: String,
    /// An opaque provider signature that must be sent back unchanged, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl TextContent {
    /// Text without a signature.
    pub fn new(text: impl Into<String>) -> Self {
        TextContent {
            text: text.into(),
            signature: None,
        }
    }
}

/// The model's reasoning, replayed to the provider with its signature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThinkingContent {
    /// The reasoning text; empty when the provider redacted it.
    pub thinking: String,
    /// The provider's signature over the reasoning (for redacted thinking, the
    /// encrypted reasoning itself; for OpenAI's Responses API, the whole reasoning
    /// item with its encrypted content). Required to replay thinking to the API
    /// that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Whether the provider redacted the reasoning.
    #[serde(default, skip_serializing_if = "is_false")]
    pub redacted: bool,
}

/// A base64-encoded image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageContent {
    /// The image bytes, base64-encoded.
    pub data: String,
    /// The media type, such as `image/png`.
    pub mime_type: String,
}

/// A request from the model to run a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; the tool result refers to it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as a JSON value (an empty object when they were unusable).
    pub arguments: Value,
    /// Why the arguments could not be used, when they could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_error: Option<ArgumentsError>,
    /// An opaque provider token that must be sent back with the call, if any
    /// (Gemini's thought signature, the Responses API's item id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// Why a tool call's streamed arguments could not be used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ArgumentsError {
    /// The response ended (token limit, abort or failure) before the arguments were complete.
    #[error("the tool call's arguments were cut off before they were complete ({} bytes received)", received.len())]
    Truncated {
        /// The argument text that did arrive.
        received: String,
    },
    /// The arguments arrived complete but are not valid JSON, even after repair.
    #[error("the tool call's arguments are not valid JSON: {error}")]
    Malformed {
        /// The argument text as received.
        received: String,
        /// What the JSON parser said.
        error: String,
    },
}

/// What the model answered: its blocks, the usage and why it stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// The blocks, in the order the model produced them.
    pub content: Vec<AssistantContent>,
    /// The wire API that produced the message.
    pub api: Api,
    /// The provider that served it, such as `openai`.
    pub provider: String,
    /// The model id the request named.
    pub model: String,
    /// Tokens and cost of this response.
    pub usage: Usage,
    /// Why the response ended.
    pub stop_reason: StopReason,
    /// What went wrong, when `stop_reason` is `error` or `aborted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// When the response started, in milliseconds since the Unix epoch.
    pub timestamp: u64,
}

impl AssistantMessage {
    /// An empty message for `model`, stamped now, as a response starts.
    pub fn empty(model: &Model) -> Self {
        AssistantMessage {
            content: Vec::new(),
            api: model.api,
            provider: model.provider.clone(),
            model: model.id.clone(),
            usage: Usage::default(),
            stop_reason: StopReason::Stop,
            error_message: None,
            timestamp: now_ms(),
        }
    }

    /// The text blocks joined together.
    pub fn text(&self) -> String {
        let mut text = String::new();
        for block in &self.content {
            if let AssistantContent::Text(t) = block {
                text.push_str(&t.text);
            }
        }
        text
    }

    /// The tool calls, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.content.iter().filter_map(|block| match block {
            AssistantContent::ToolCall(call) => Some(&**call),
            _ => None,
        })
    }
}

/// The answer to one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResultMessage {
    /// The id of the call this answers.
    pub tool_call_id: String,
    /// The name of the tool that ran.
    pub tool_name: String,
    /// What the model sees: text and images.
    pub content: Vec<Content>,
    /// Structured details for the application; never sent to the model.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub details: Value,
    /// Whether the tool failed.
    pub is_error: bool,
    /// When the result was made, in milliseconds since the Unix epoch.
    pub timestamp: u64,
    /// The agent's state the call set, by name (`tiller_core::ContextState`):
    /// stored with the result, never sent to the model.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub state: serde_json::Map<String, Value>,
}

impl ToolResultMessage {
    /// A text result for `call`, stamped now.
    pub fn text(call: &ToolCall, text: impl Into<String>, is_error: bool) -> Self {
        ToolResultMessage {
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            content: vec![Content::text(text)],
            details: Value::Null,
            is_error,
            timestamp: now_ms(),
            state: serde_json::Map::new(),
        }
    }

    /// The text blocks joined.
    pub fn text_content(&self) -> String {
        self.content.iter().filter_map(Content::as_text).collect()
    }
}

/// Why a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its answer.
    Stop,
    /// The output token limit cut the answer off.
    Length,
    /// The model asked for tools to run.
    ToolUse,
    /// The request or the stream failed; see `error_message`.
    Error,
    /// The caller cancelled the request.
    Aborted,
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn is_false(value: &bool) -> bool {
    !*value
}
