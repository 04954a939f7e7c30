//! Compressing a transcript as it is reloaded from the store: long assistant
//! answers are cut, each with a marker naming the stored message, and the built-in
//! `lookup` tool fetches a cut message whole by that name. Tool results are never
//! cut, and the store keeps every message whole. It is made of what the runtime
//! offers any host: a reload hook ([`AgentCode::on_reload`](tiller_runtime::AgentCode::on_reload)) and a tool.
//!
//! ```
//! use std::sync::Arc;
//! use tiller::{AgentSettings, Compression, SessionStore};
//! # let model = tiller::faux::FauxProvider::new().model();
//! let store: Arc<dyn SessionStore> = Arc::new(tiller::tiller_store::MemoryStore::new());
//! let settings = Compression::default().applied_to(AgentSettings::new(model), store);
//! assert!(settings.code.tools.tools().any(|tool| tool.name() == "lookup"));
//! assert!(settings.definition.tools.is_empty(), "the session does not store it");
//! ```

use std::sync::Arc;

use serde_json::json;
use tiller_ai::{AssistantContent, TextContent};
use tiller_core::{AgentTool, FnTool, ToolError, ToolOutput, ToolSet};
use tiller_store::SessionStore;

use crate::AgentMessage;
use tiller_runtime::AgentSettings;

/// How a transcript reloaded from the store (on resume, restart or thaw) is
/// compressed: off unless [`Compression::applied_to`] an agent's settings.
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
fn name_of(seq: u64) -> String {
    format!("message:{seq}")
}

impl Compression {
    /// `settings` compressing their reloaded transcripts, with the `lookup` tool
    /// reading cut messages from `store` (unless their tools have one already).
    /// The tool comes with the compression, not the definition: the session does
    /// not store its name, so a host may resume without compression.
    pub fn applied_to(
        self,
        mut settings: AgentSettings,
        store: Arc<dyn SessionStore>,
    ) -> AgentSettings {
        settings.code.on_reload = Some(Arc::new(
            move |first: u64, messages: &mut [Arc<AgentMessage>]| {
                compress(first, messages, self.max_chars);
            },
        ));
        if settings
            .code
            .tools
            .definitions()
            .iter()
            .any(|tool| tool.name == LOOKUP_TOOL)
        {
            return settings;
        }
        let tools = settings.code.tools.tools().cloned().chain([lookup(store)]);
        if let Ok(tools) = ToolSet::new(tools) {
            settings.code.tools = tools;
        }
        settings
    }
}

/// Cuts, in place, the assistant messages of `messages` longer than `max_chars`;
/// the first of them is at place `first` in the stored transcript.
fn compress(first: u64, messages: &mut [Arc<AgentMessage>], max_chars: usize) {
    for (seq, message) in (first..).zip(messages.iter_mut()) {
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
    }
}

/// The `lookup` tool: reads a cut message of the calling agent's session from
/// `store`.
fn lookup(store: Arc<dyn SessionStore>) -> Arc<dyn AgentTool> {
    let lookup = FnTool::new(
        LOOKUP_TOOL,
        "Reads a message of this conversation that was cut short, by the name its marker gives (such as \"message:3\").",
        json!({
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The message's name, as \"message:N\"."}},
            "required": ["name"]
        }),
        move |args, ctx| {
            let store = store.clone();
            async move {
                let session = ctx
                    .agent()
                    .session_id()
                    .ok_or_else(|| ToolError::new("this agent has no session to read"))?;
                let name = args["name"].as_str().unwrap_or_default();
                let seq = name
                    .strip_prefix("message:")
                    .and_then(|seq| seq.parse::<u64>().ok())
                    .ok_or_else(|| {
                        ToolError::new(format!("`{name}` names no message: expected \"message:N\""))
                    })?;
                let message = store
                    .messages(session, seq, 1)
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
    Arc::new(lookup)
}
