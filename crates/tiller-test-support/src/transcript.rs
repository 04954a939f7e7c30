//! Checks and views of transcripts, for assertions.

use tiller_ai::Message;
use tiller_core::AgentMessage;

/// Asserts that every tool call in `messages` has exactly one result in place.
pub fn assert_valid(messages: &[AgentMessage]) {
    if let Err(error) = tiller_core::check_transcript(messages) {
        panic!("invalid transcript: {error}\n{messages:#?}");
    }
}

/// The roles of messages, in order.
pub fn roles(messages: &[AgentMessage]) -> Vec<&'static str> {
    messages.iter().map(AgentMessage::role).collect()
}

/// A message as `role`, `user:text`, `tool_result:id` or `custom:kind`.
pub fn label(message: &AgentMessage) -> String {
    match message {
        AgentMessage::Llm(Message::User(_)) => {
            format!("user:{}", user_text(message).unwrap_or_default())
        }
        AgentMessage::Llm(Message::Assistant(_)) => "assistant".to_owned(),
        AgentMessage::Llm(Message::ToolResult(result)) => {
            format!("tool_result:{}", result.tool_call_id)
        }
        AgentMessage::Custom(custom) => format!("custom:{}", custom.kind),
    }
}

/// The text of a user message.
pub fn user_text(message: &AgentMessage) -> Option<String> {
    message.as_user().map(|user| user.text_content())
}

/// The text of a tool result message.
pub fn result_text(message: &AgentMessage) -> String {
    message
        .as_tool_result()
        .expect("a tool result")
        .text_content()
}
