//! The events of one streamed response.
//!
//! Every stream yields `start` first and exactly one terminal event last: `done`
//! (stop, length or tool use) or `error` (error or aborted). Between them, each block
//! of the answer opens with a `*_start`, grows by `*_delta`s and closes with a
//! `*_end`; blocks open in `content_index` order. A stream that fails may leave its
//! last block without an `*_end`: the terminal event's message is complete.
//!
//! Deltas carry only the new piece, so an event costs what its piece costs (messages
//! and calls are boxed, keeping every event small to move). To keep a copy of the
//! growing message, apply each event to a [`crate::PartialMessage`].

use serde::{Deserialize, Serialize};

use crate::error::StreamError;
use crate::message::{AssistantMessage, StopReason, ToolCall};

/// One step of a streamed assistant response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AssistantEvent {
    /// The response began; `message` is still empty.
    Start {
        /// The empty message: api, provider, model and timestamp.
        message: Box<AssistantMessage>,
    },
    /// A text block opened.
    TextStart {
        /// The block's index in the message content.
        content_index: usize,
    },
    /// Text arrived.
    TextDelta {
        /// The block's index in the message content.
        content_index: usize,
        /// The new text.
        delta: String,
    },
    /// A text block closed.
    TextEnd {
        /// The block's index in the message content.
        content_index: usize,
        /// The provider's signature over the block, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// A thinking block opened.
    ThinkingStart {
        /// The block's index in the message content.
        content_index: usize,
        /// Whether the provider redacted this reasoning.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        redacted: bool,
    },
    /// Reasoning arrived.
    ThinkingDelta {
        /// The block's index in the message content.
        content_index: usize,
        /// The new reasoning text.
        delta: String,
    },
    /// A thinking block closed.
    ThinkingEnd {
        /// The block's index in the message content.
        content_index: usize,
        /// The provider's signature over the reasoning (the encrypted reasoning when redacted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// A tool call opened.
    ToolCallStart {
        /// The block's index in the message content.
        content_index: usize,
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
    },
    /// A piece of the call's JSON arguments arrived.
    ToolCallDelta {
        /// The block's index in the message content.
        content_index: usize,
        /// The new piece of argument JSON.
        delta: String,
    },
    /// A tool call closed, with its arguments parsed.
    ToolCallEnd {
        /// The block's index in the message content.
        content_index: usize,
        /// The complete call.
        tool_call: Box<ToolCall>,
    },
    /// The response ended normally.
    Done {
        /// Why it ended: stop, length or tool use.
        reason: StopReason,
        /// The complete message.
        message: Box<AssistantMessage>,
    },
    /// The response failed or was aborted; what arrived before is kept.
    Error {
        /// `error` or `aborted`.
        reason: StopReason,
        /// What went wrong.
        error: StreamError,
        /// The message as far as it got, with `error_message` set.
        message: Box<AssistantMessage>,
    },
}

impl AssistantEvent {
    /// Whether this is the last event of its stream.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            AssistantEvent::Done { .. } | AssistantEvent::Error { .. }
        )
    }
}
