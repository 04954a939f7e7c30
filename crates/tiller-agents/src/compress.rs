//! Compressing a transcript as it is reloaded from the store: long assistant
//! answers are cut in the middle, keeping their start and their end, with a marker
//! naming the stored message, and the built-in `lookup` tool fetches a cut message
//! whole by that name. User messages and tool results are never cut, and the store
//! keeps every message whole. It is made of what the runtime offers any host: a
//! reload hook ([`AgentCode::on_reload`](tiller_runtime::AgentCode::on_reload)) and a tool.
//!
//! A cut answer's text becomes one text block (before its other blocks, such as
//! tool calls), its first `max_chars − keep_end_chars` characters, the marker on a
//! line of its own, and its last `keep_end_chars` characters:
//!
//! ```text
//! {start}
//! [… N characters cut. The whole message is "message:SEQ": call the `lookup` tool with that name to read it.]
//! {end}
//! ```
//!
//! where `N` counts the characters (Unicode scalar values) left out and `SEQ` is the
//! message's place in the stored transcript. It is set from Rust
//! ([`Compression::applied_to`]), agent files (`compression: {max_chars: 400,
//! keep_end_chars: 100}`), `tiller serve --compress-chars N` and the command's
//! `--compress-chars N`.
//!
//! ```
//! use std::sync::Arc;
//! use tiller::{AgentSettings, agents::Compression, store::SessionStore};
//! # let model = tiller::faux::FauxProvider::new().model();
//! let store: Arc<dyn SessionStore> = Arc::new(tiller::store::MemoryStore::new());
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
#[serde(from = "CompressionFields")]
pub struct Compression {
    /// Assistant messages whose text is longer than this many characters are cut to
    /// it, the marker aside (default 400).
    pub max_chars: usize,
    /// How many of the kept characters come from the end of the text (default a
    /// quarter of `max_chars`, 100 of the default 400; at most `max_chars`).
    pub keep_end_chars: usize,
}

/// [`Compression`] as written: either field may be left out.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CompressionFields {
    max_chars: Option<usize>,
    keep_end_chars: Option<usize>,
}

impl From<CompressionFields> for Compression {
    fn from(fields: CompressionFields) -> Self {
        let kept =
            Compression::keeping(fields.max_chars.unwrap_or(Compression::default().max_chars));
        Compression {
            keep_end_chars: fields.keep_end_chars.unwrap_or(kept.keep_end_chars),
            ..kept
        }
    }
}

impl Default for Compression {
    fn default() -> Self {
        Compression::keeping(400)
    }
}

/// The name of the built-in tool that reads a cut message.
pub const LOOKUP_TOOL: &str = "lookup";

/// The name a cut message is fetched by.
fn name_of(seq: u64) -> String {
    format!("message:{seq}")
}

impl Compression {
    /// Answers longer than `max_chars` cut to it, a quarter of it from their end.
    pub fn keeping(max_chars: usize) -> Self {
        Compression {
            max_chars,
            keep_end_chars: max_chars / 4,
        }
    }

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
                self.compress(first, messages);
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

impl Compression {
    /// Cuts, in place, the assistant messages of `messages` longer than
    /// `max_chars`; the first of them is at place `first` in the stored transcript.
    fn compress(self, first: u64, messages: &mut [Arc<AgentMessage>]) {
        let keep_end = self.keep_end_chars.min(self.max_chars);
        let keep_start = self.max_chars - keep_end;
        for (seq, message) in (first..).zip(messages.iter_mut()) {
            let Some(assistant) = message.as_assistant() else {
                continue;
            };
            let text = assistant.text();
            let length = text.chars().count();
            if length <= self.max_chars {
                continue;
            }
            let start: String = text.chars().take(keep_start).collect();
            let end: String = text.chars().skip(length - keep_end).collect();
            let marker = format!(
                "{start}\n[… {} characters cut. The whole message is \"{}\": call the `{LOOKUP_TOOL}` tool with that name to read it.]\n{end}",
                length - self.max_chars,
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

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use tiller_ai::{AssistantMessage, Model, ToolCall, ToolResultMessage};

    use super::*;

    fn long(what: &str) -> String {
        format!("{what} begins. {} {what} ends.", "middle ".repeat(100))
    }

    /// A long answer keeps its start and its end around the documented marker;
    /// long user messages and tool results come back whole, as do short answers.
    #[test]
    fn a_long_answer_keeps_its_start_and_end_and_nothing_else_is_cut() {
        let model = Model::openai_compatible("http://127.0.0.1:9/v1", "m");
        let answer = |text: String, call: Option<ToolCall>| {
            let mut message = AssistantMessage::empty(&model);
            message
                .content
                .push(AssistantContent::Text(TextContent::new(text)));
            message
                .content
                .extend(call.map(|call| AssistantContent::ToolCall(Box::new(call))));
            AgentMessage::from(message)
        };
        let call = ToolCall {
            id: "c1".into(),
            name: "search".into(),
            arguments: json!({"q": "x"}),
            arguments_error: None,
            signature: None,
        };
        let transcript: Vec<AgentMessage> = vec![
            AgentMessage::user(long("The question")),
            answer(long("The answer"), Some(call.clone())),
            ToolResultMessage::text(&call, long("The result"), false).into(),
            answer("Short.".into(), None),
        ];
        let mut messages: Vec<Arc<AgentMessage>> =
            transcript.iter().cloned().map(Arc::new).collect();
        let compression = Compression {
            max_chars: 30,
            keep_end_chars: 12,
        };
        compression.compress(7, &mut messages);

        let cut = messages[1].as_assistant().unwrap();
        let length = long("The answer").chars().count();
        assert_eq!(
            cut.text(),
            format!(
                "The answer begins.\n[… {} characters cut. The whole message is \"message:8\": call the `lookup` tool with that name to read it.]\nanswer ends.",
                length - 30
            )
        );
        assert_eq!(cut.tool_calls().count(), 1, "the call stays");
        for at in [0, 2, 3] {
            assert_eq!(*messages[at], transcript[at], "message {at} is whole");
        }
    }

    /// Written with `max_chars` alone, a quarter of it is kept from the end.
    #[test]
    fn the_end_kept_defaults_to_a_quarter_of_what_is_kept() {
        let read = |text: &str| serde_json::from_str::<Compression>(text).unwrap();
        assert_eq!(
            read(r#"{"max_chars": 80}"#),
            Compression {
                max_chars: 80,
                keep_end_chars: 20
            }
        );
        assert_eq!(read("{}"), Compression::default());
        assert!(serde_json::from_str::<Compression>(r#"{"keep": 1}"#).is_err());
    }
}
