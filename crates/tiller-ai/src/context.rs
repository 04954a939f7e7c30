//! What a model sees in one request: a system prompt, the messages and the tools.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::Message;

/// A tool the model may call: its name, what it does and the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

impl Tool {
    /// A tool definition.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Tool {
            name: name.into(),
            description: description.into(),
            parameters,
        }
    }
}

/// An owned request context.
///
/// ```
/// use tiller_ai::{Context, Message};
/// let context = Context::new()
///     .with_system_prompt("Be brief.")
///     .with_message(Message::user("Hello"));
/// assert_eq!(context.messages.len(), 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    /// Instructions sent ahead of the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// The tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
}

impl Context {
    /// An empty context.
    pub fn new() -> Self {
        Context::default()
    }

    /// The same context with a system prompt.
    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// The same context with one more message.
    pub fn with_message(mut self, message: impl Into<Message>) -> Self {
        self.messages.push(message.into());
        self
    }

    /// The same context with one more tool.
    pub fn with_tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }
}

/// A borrowed request context, for callers that keep their messages elsewhere
/// (an agent's transcript, say) and should not copy them for every request.
#[derive(Debug, Clone, Copy)]
pub struct ContextRef<'a> {
    /// Instructions sent ahead of the conversation.
    pub system_prompt: Option<&'a str>,
    /// The conversation so far.
    pub messages: &'a [&'a Message],
    /// The tools the model may call.
    pub tools: &'a [Tool],
}

impl ContextRef<'_> {
    /// An owned copy.
    pub fn to_context(&self) -> Context {
        Context {
            system_prompt: self.system_prompt.map(str::to_owned),
            messages: self.messages.iter().map(|m| (*m).clone()).collect(),
            tools: self.tools.to_vec(),
        }
    }
}
