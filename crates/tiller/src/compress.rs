//! Compressing a transcript as it is reloaded from the store: long assistant
//! answers are cut, each with a marker naming the stored message, and the built-in
//! `lookup` tool fetches a cut message whole by that name. Tool results are never
//! cut, and the store keeps every message whole.

use std::sync::Arc;

use serde_json::json;
use tiller_ai::{AssistantContent, TextContent};
use tiller_core::{AgentTool, FnTool, ToolError, ToolOutput, ToolSet};
use tiller_store::SessionStore;

use crate::AgentMessage;
use crate::settings::AgentSettings;

/// How a transcript reloaded from the store (on resume, restart or thaw) is
/// compressed. Off unless set in [`crate::AgentCode::compression`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Compression {
    /// Assistant messages whose text is longer than this many characters are cut to
    /// it (default 400).
    pub max_chars: usize,
}

impl Default for Compression {
    fn default() -> Self {
        Compression { max_chars: 400 }
    }
}

/// The name of the built-in tool that reads a cut message.
pub const LOOKUP_TOOL: &str = "lookup";

/// The name a cut message is fetched by.
fn name_of(seq: usize) -> String {
    format!("message:{seq}")
}

/// Cuts, in place, the assistant messages of `messages` longer than `max_chars`;
/// answers how many were cut.
pub(crate) fn compress(messages: &mut [Arc<AgentMessage>], max_chars: usize) -> usize {
    let mut cut = 0;
    for (seq, message) in messages.iter_mut().enumerate() {
        let Some(assistant) = message.as_assistant() else {
            continue;
        };
        let text = assistant.text();
        let length = text.chars().count();
        if length <= max_chars {
            continue;
        }
        let kept: String = text.chars().take(max_chars).collect();
        let marker = format!(
            "{kept}\n[… {} more characters cut. The whole message is \"{}\": call the `{LOOKUP_TOOL}` tool with that name to read it.]",
            length - max_chars,
            name_of(seq)
        );
        let mut shortened = assistant.clone();
        shortened
            .content
            .retain(|block| !matches!(block, AssistantContent::Text(_)));
        shortened
            .content
            .insert(0, AssistantContent::Text(TextContent::new(marker)));
        *message = Arc::new(shortened.into());
        cut += 1;
    }
    cut
}

/// `settings` with the `lookup` tool reading session `session` of `store` (unless
/// its tools have one already).
pub(crate) fn with_lookup(
    settings: &AgentSettings,
    store: Arc<dyn SessionStore>,
    session: Arc<str>,
) -> AgentSettings {
    let mut settings = settings.clone();
    if settings
        .code
        .tools
        .definitions()
        .iter()
        .any(|tool| tool.name == LOOKUP_TOOL)
    {
        return settings;
    }
    let lookup = FnTool::new(
        LOOKUP_TOOL,
        "Reads a message of this conversation that was cut short, by the name its marker gives (such as \"message:3\").",
        json!({
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The message's name, as \"message:N\"."}},
            "required": ["name"]
        }),
        move |args, _| {
            let store = store.clone();
            let session = session.clone();
            async move {
                let name = args["name"].as_str().unwrap_or_default();
                let seq = name
                    .strip_prefix("message:")
                    .and_then(|seq| seq.parse::<u64>().ok())
                    .ok_or_else(|| {
                        ToolError::new(format!("`{name}` names no message: expected \"message:N\""))
                    })?;
                let message = store
                    .messages(&session, seq, 1)
                    .await
                    .map_err(|error| ToolError::new(error.to_string()))?
                    .pop()
                    .ok_or_else(|| ToolError::new(format!("there is no message `{name}`")))?;
                Ok(ToolOutput::text(match message.as_assistant() {
                    Some(assistant) => assistant.text(),
                    None => serde_json::to_string(&message).unwrap_or_default(),
                }))
            }
        },
    );
    let tools = settings
        .code
        .tools
        .tools()
        .cloned()
        .chain([Arc::new(lookup) as Arc<dyn AgentTool>]);
    if let Ok(tools) = ToolSet::new(tools) {
        settings.set_tools(tools);
    }
    settings
}
