//! What an agent's transcript holds: every LLM message, plus application messages
//! the model never sees unless `convert_to_llm` says so.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller_ai::{AssistantMessage, Message, ToolResultMessage, UserMessage, now_ms};

/// One entry of an agent's transcript, small to store (its larger kinds are
/// boxed). Serialized flat: an LLM message keeps its
/// `role` (`user`, `assistant`, `tool_result`), a custom message has role `custom`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AgentMessage {
    /// A message the model can see.
    Llm(Message),
    /// An application message (a notification, a marker, a UI card…).
    Custom(Box<CustomMessage>),
}

/// An application message: a kind and a JSON payload, kept in the transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename = "custom")]
pub struct CustomMessage {
    /// What kind of message this is, for the application.
    pub kind: String,
    /// Its data.
    pub payload: Value,
    /// When it was made, in milliseconds since the Unix epoch.
    pub timestamp: u64,
}

impl CustomMessage {
    /// A custom message stamped now.
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        CustomMessage {
            kind: kind.into(),
            payload,
            timestamp: now_ms(),
        }
    }
}

impl AgentMessage {
    /// A user message holding one text block.
    pub fn user(text: impl Into<String>) -> Self {
        AgentMessage::Llm(Message::user(text))
    }

    /// The LLM message, unless this is a custom one.
    pub fn as_llm(&self) -> Option<&Message> {
        match self {
            AgentMessage::Llm(message) => Some(message),
            AgentMessage::Custom(_) => None,
        }
    }

    /// The user message, if this is one.
    pub fn as_user(&self) -> Option<&UserMessage> {
        match self {
            AgentMessage::Llm(Message::User(message)) => Some(message),
            _ => None,
        }
    }

    /// The assistant message, if this is one.
    pub fn as_assistant(&self) -> Option<&AssistantMessage> {
        match self {
            AgentMessage::Llm(Message::Assistant(message)) => Some(message),
            _ => None,
        }
    }

    /// The tool result, if this is one.
    pub fn as_tool_result(&self) -> Option<&ToolResultMessage> {
        match self {
            AgentMessage::Llm(Message::ToolResult(message)) => Some(message),
            _ => None,
        }
    }

    /// The role as it appears in JSON.
    pub fn role(&self) -> &'static str {
        match self {
            AgentMessage::Llm(Message::User(_)) => "user",
            AgentMessage::Llm(Message::Assistant(_)) => "assistant",
            AgentMessage::Llm(Message::ToolResult(_)) => "tool_result",
            AgentMessage::Custom(_) => "custom",
        }
    }
}

impl From<&str> for AgentMessage {
    fn from(text: &str) -> Self {
        AgentMessage::user(text)
    }
}

impl From<String> for AgentMessage {
    fn from(text: String) -> Self {
        AgentMessage::user(text)
    }
}

impl From<Message> for AgentMessage {
    fn from(message: Message) -> Self {
        AgentMessage::Llm(message)
    }
}

impl From<UserMessage> for AgentMessage {
    fn from(message: UserMessage) -> Self {
        AgentMessage::Llm(Message::User(message))
    }
}

impl From<AssistantMessage> for AgentMessage {
    fn from(message: AssistantMessage) -> Self {
        AgentMessage::Llm(Message::Assistant(Box::new(message)))
    }
}

impl From<ToolResultMessage> for AgentMessage {
    fn from(message: ToolResultMessage) -> Self {
        AgentMessage::Llm(Message::ToolResult(Box::new(message)))
    }
}

impl From<CustomMessage> for AgentMessage {
    fn from(message: CustomMessage) -> Self {
        AgentMessage::Custom(Box::new(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::default_convert_to_llm;
    use serde_json::json;
    use std::borrow::Cow;

    #[test]
    fn messages_serialize_flat_with_their_role() {
        let custom = AgentMessage::from(CustomMessage {
            kind: "note".into(),
            payload: json!({"text": "hi"}),
            timestamp: 5,
        });
        let value = serde_json::to_value(&custom).unwrap();
        assert_eq!(
            value,
            json!({"role": "custom", "kind": "note", "payload": {"text": "hi"}, "timestamp": 5})
        );
        assert_eq!(
            serde_json::from_value::<AgentMessage>(value).unwrap(),
            custom
        );

        let user = AgentMessage::user("hello");
        let value = serde_json::to_value(&user).unwrap();
        assert_eq!(value["role"], "user");
        assert_eq!(serde_json::from_value::<AgentMessage>(value).unwrap(), user);
    }

    #[test]
    fn the_default_conversion_drops_custom_messages_without_copying() {
        let messages = vec![
            AgentMessage::user("a"),
            CustomMessage::new("note", json!(null)).into(),
            AgentMessage::user("b"),
        ];
        let converted = default_convert_to_llm(&messages);
        assert_eq!(converted.len(), 2);
        assert!(converted.iter().all(|m| matches!(m, Cow::Borrowed(_))));
    }
}
