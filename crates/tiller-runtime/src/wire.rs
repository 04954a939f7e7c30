//! An agent's events as JSON on a wire (server-sent events, a WebSocket, JSON
//! lines, a cluster's bus): lean, so that what a stream sends grows with what
//! the model wrote, not with its square.
//!
//! In the lean form a `message_update` carries its piece
//! (`assistant_message_event`) and not the message as it stands, and a
//! `tool_execution_update` carries no `args` (its call's `tool_execution_start`
//! had them). A reader keeps each message from its `message_start` and applies
//! each piece to it; `message_end` brings the finished message. Every other
//! event is as serde writes it.
//!
//! A reader that cannot rebuild (it came in the middle of a message, or missed
//! events: a `lagged` notice) gets the first update of that message in the full
//! form, with `message` (or `args`) as it stands: a snapshot that replaces what
//! it held, after which the pieces apply. A [`Cursor`] chooses, per reader.
//!
//! Each form of an event becomes bytes once, however many readers it has: a
//! [`Frame`], the server-sent event whose JSON (a WebSocket text, a JSON line)
//! is a slice of it ([`Envelope::lean`], [`Envelope::full`]). [`Rebuild`] is
//! the rule in Rust, for a host reading a lean stream.
//!
//! ```
//! use tiller_runtime::wire::{Cursor, Updates};
//! use tiller_runtime::{AgentId, Delivered, Envelope};
//! use tiller_core::AgentEvent;
//!
//! let mut cursor = Cursor::new(Updates::Lean);
//! let envelope = Envelope::new(AgentId::from("a"), 0, Delivered::Event(AgentEvent::TurnStart));
//! let frame = cursor.frame(&envelope);
//! assert_eq!(&frame.json()[..], br#"{"agent_id":"a","seq":0,"event":{"type":"turn_start"}}"#);
//! assert!(frame.sse().starts_with(b"id: 0\nevent: turn_start\ndata: {"));
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use tiller_ai::{AssistantEvent, AssistantMessage, StreamedMessage};
use tiller_core::AgentEvent;

use crate::{AgentId, Delivered, Envelope, Notice};

/// Which form of `message_update` and `tool_execution_update` a reader gets
/// (`lean` or `full` as text).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Updates {
    /// The piece only (and a snapshot where the reader cannot rebuild).
    #[default]
    Lean,
    /// Every update with the message (or the call's arguments) as it stands:
    /// pi-agent-core's shape, whose bytes grow with the square of an answer's
    /// length.
    Full,
}

/// One form of an event on the wire, made once: the server-sent event
/// `id: SEQ\nevent: TYPE\ndata: JSON\n\n`, of which the JSON (a WebSocket
/// text, a JSON line) and the event without its `id:` (on a stream of several
/// agents, whose numbers are each agent's own) are slices. Cloning shares the
/// bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    bytes: Bytes,
    event_at: usize,
    data_at: usize,
}

impl Frame {
    /// Event `seq`, whose envelope is `json` (one line: compact JSON holds no
    /// line break).
    pub fn new(seq: u64, json: &[u8]) -> Frame {
        let kind = std::str::from_utf8(json).map_or("event", Envelope::type_in);
        let seq = seq.to_string();
        let mut bytes = Vec::with_capacity(json.len() + kind.len() + seq.len() + 20);
        bytes.extend_from_slice(b"id: ");
        bytes.extend_from_slice(seq.as_bytes());
        bytes.push(b'\n');
        let event_at = bytes.len();
        bytes.extend_from_slice(b"event: ");
        bytes.extend_from_slice(kind.as_bytes());
        bytes.extend_from_slice(b"\ndata: ");
        let data_at = bytes.len();
        bytes.extend_from_slice(json);
        bytes.extend_from_slice(b"\n\n");
        Frame {
            bytes: Bytes::from(bytes),
            event_at,
            data_at,
        }
    }

    /// The envelope's JSON.
    pub fn json(&self) -> Bytes {
        self.bytes.slice(self.data_at..self.bytes.len() - 2)
    }

    /// The server-sent event, `id:` its number.
    pub fn sse(&self) -> &Bytes {
        &self.bytes
    }

    /// The server-sent event without `id:`.
    pub fn sse_unnumbered(&self) -> Bytes {
        self.bytes.slice(self.event_at..)
    }
}

/// An envelope's lean form, made the first time it is asked for. A clone of
/// the envelope starts without it (its fields may be changed).
#[derive(Default)]
pub(crate) struct Encoded {
    lean: OnceLock<Frame>,
}

impl Clone for Encoded {
    fn clone(&self) -> Self {
        Encoded::default()
    }
}

impl Envelope {
    /// The envelope in the lean form, made once and shared by every reader.
    pub fn lean(&self) -> &Frame {
        self.json.lean.get_or_init(|| self.encode(&Lean(self)))
    }

    /// The envelope in the full form (every update with what it updates),
    /// made at each call: kept, the whole answer so far in each update would
    /// hold memory growing with the square of its length wherever envelopes are
    /// kept (a replay buffer). Building an update's message replays its
    /// stream's pieces so far.
    pub fn full(&self) -> Frame {
        self.encode(self)
    }

    /// `form`, this envelope's, framed; one that cannot be written as JSON (a
    /// map with keys that are not strings in a tool's output) is written as a
    /// `lagged` notice of one, so that a reader sees the gap rather than nothing.
    fn encode(&self, form: &impl Serialize) -> Frame {
        let json = serde_json::to_vec(form).unwrap_or_else(|error| {
            tracing::warn!(%error, seq = self.seq, "an event that cannot be written as JSON");
            let missed = Envelope::new(
                self.agent_id.clone(),
                self.seq,
                Delivered::Notice(Notice::Lagged { missed: 1 }),
            );
            serde_json::to_vec(&missed).unwrap_or_default()
        });
        Frame::new(self.seq, &json)
    }

    /// Whether the lean form leaves something out (an update's message or
    /// arguments), so that a reader may need the full one.
    fn abridged(&self) -> bool {
        matches!(&self.event, Delivered::Event(event) if abridged(event))
    }
}

fn abridged(event: &AgentEvent) -> bool {
    match event {
        AgentEvent::MessageUpdate { .. } | AgentEvent::ToolExecutionUpdate { .. } => true,
        AgentEvent::ChildEvent { event, .. } => abridged(event),
        _ => false,
    }
}

/// An envelope in the lean form.
struct Lean<'a>(&'a Envelope);

impl Serialize for Lean<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let envelope = self.0;
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("agent_id", &envelope.agent_id)?;
        map.serialize_entry("seq", &envelope.seq)?;
        match &envelope.event {
            Delivered::Event(event) => map.serialize_entry("event", &LeanEvent(event))?,
            Delivered::Notice(notice) => map.serialize_entry("event", notice)?,
        }
        map.end()
    }
}

/// An event in the lean form.
struct LeanEvent<'a>(&'a AgentEvent);

impl Serialize for LeanEvent<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            AgentEvent::MessageUpdate {
                assistant_message_event,
                ..
            } => {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("type", "message_update")?;
                map.serialize_entry("assistant_message_event", assistant_message_event)?;
                map.end()
            }
            AgentEvent::ToolExecutionUpdate {
                tool_call_id,
                tool_name,
                partial_result,
                ..
            } => {
                let mut map = serializer.serialize_map(Some(4))?;
                map.serialize_entry("type", "tool_execution_update")?;
                map.serialize_entry("tool_call_id", tool_call_id)?;
                map.serialize_entry("tool_name", tool_name)?;
                map.serialize_entry("partial_result", partial_result)?;
                map.end()
            }
            AgentEvent::ChildEvent {
                path,
                tool_call_id,
                event,
            } => {
                let mut map = serializer.serialize_map(Some(4))?;
                map.serialize_entry("type", "child_event")?;
                map.serialize_entry("path", path)?;
                map.serialize_entry("tool_call_id", tool_call_id)?;
                map.serialize_entry("event", &LeanEvent(event))?;
                map.end()
            }
            event => event.serialize(serializer),
        }
    }
}

/// Where a message streams: the agent's own (`""`), or a sub-agent's under one
/// of its calls.
fn scope_of(tool_call_id: &str, path: &[String]) -> String {
    let mut scope = String::from(tool_call_id);
    for agent in path {
        scope.push('\u{0}');
        scope.push_str(agent);
    }
    scope
}

/// A tool call's key within its scope.
fn call_of(scope: &str, tool_call_id: &str) -> String {
    format!("{scope}\u{1}{tool_call_id}")
}

/// What one reader of an agent's events has seen the start of, to choose each
/// event's form: lean once the reader can rebuild, full (a snapshot) the first
/// time it cannot. Its memory is the messages and tool calls in progress.
#[derive(Debug, Default)]
pub struct Cursor {
    updates: Updates,
    /// The scopes whose message in progress the reader has from its start.
    messages: HashSet<String>,
    /// The calls in progress whose arguments the reader has.
    calls: HashSet<String>,
}

impl Cursor {
    /// A reader that asked for `updates`.
    pub fn new(updates: Updates) -> Self {
        Cursor {
            updates,
            ..Cursor::default()
        }
    }

    /// The frame to send this reader for `envelope` (the agent's events in
    /// order): shared bytes, made once for all readers.
    pub fn frame(&mut self, envelope: &Envelope) -> Frame {
        let full = match &envelope.event {
            Delivered::Event(event) => self.needs_full("", event),
            Delivered::Notice(notice) => {
                if !matches!(notice, Notice::AgentStopped { .. }) {
                    // Missed events, or a turn run again: nothing is known.
                    self.forget();
                }
                false
            }
        };
        if full || (self.updates == Updates::Full && envelope.abridged()) {
            envelope.full()
        } else {
            envelope.lean().clone()
        }
    }

    /// Forgets every message and call: what follows needs a snapshot (after
    /// events missed).
    fn forget(&mut self) {
        self.messages.clear();
        self.calls.clear();
    }

    /// Notes `event` (in `scope`); whether the reader needs it whole.
    fn needs_full(&mut self, scope: &str, event: &AgentEvent) -> bool {
        match event {
            AgentEvent::MessageStart { message } => {
                if message.as_assistant().is_some() {
                    self.messages.insert(scope.to_owned());
                }
                false
            }
            AgentEvent::MessageUpdate { .. } => {
                !self.messages.contains(scope) && self.messages.insert(scope.to_owned())
            }
            AgentEvent::MessageEnd { .. } => {
                self.messages.remove(scope);
                false
            }
            AgentEvent::ToolExecutionStart { tool_call_id, .. } => {
                self.calls.insert(call_of(scope, tool_call_id));
                false
            }
            AgentEvent::ToolExecutionUpdate { tool_call_id, .. } => {
                self.calls.insert(call_of(scope, tool_call_id))
            }
            AgentEvent::ToolExecutionEnd { tool_call_id, .. } => {
                self.calls.remove(&call_of(scope, tool_call_id));
                false
            }
            AgentEvent::ChildEvent {
                path,
                tool_call_id,
                event,
            } => self.needs_full(&scope_of(tool_call_id, path), event),
            AgentEvent::AgentEnd { .. } if scope.is_empty() => {
                self.forget();
                false
            }
            _ => false,
        }
    }
}

/// Why a lean event could not be rebuilt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RebuildError {
    /// It is not an envelope's JSON.
    #[error("not an event: {0}")]
    Json(#[from] serde_json::Error),
    /// An update came without the start of what it updates (the stream was
    /// joined in the middle, or events were missed, and no snapshot came).
    #[error("a {0} without its start")]
    Unstarted(&'static str),
}

/// The rebuild rule in Rust: lean JSON envelopes, each agent's in order, back
/// to [`Envelope`]s with every update's message and arguments.
///
/// ```
/// use tiller_runtime::wire::Rebuild;
/// use tiller_core::AgentEvent;
/// use tiller_runtime::Delivered;
///
/// let mut rebuild = Rebuild::default();
/// let mut model = tiller_ai::AssistantMessage::empty(&tiller_ai::Model::openai_compatible("http://localhost/v1", "m"));
/// rebuild.seed(&"a".into(), model.clone());
/// let line = br#"{"agent_id":"a","seq":4,"event":{"type":"message_update","assistant_message_event":{"type":"text_start","content_index":0}}}"#;
/// let envelope = rebuild.envelope(line)?;
/// let Delivered::Event(AgentEvent::MessageUpdate { message, .. }) = envelope.event else { panic!() };
/// assert_eq!(message.get().content.len(), 1);
/// # Ok::<(), tiller_runtime::wire::RebuildError>(())
/// ```
#[derive(Default)]
pub struct Rebuild {
    /// What each agent has in progress.
    agents: HashMap<AgentId, InProgress>,
}

/// One agent's messages and tool calls in progress, by where they stream.
#[derive(Default)]
struct InProgress {
    /// Each scope's message.
    messages: HashMap<String, StreamedMessage>,
    /// The arguments of each call.
    args: HashMap<String, Arc<Value>>,
}

impl Rebuild {
    /// Starts from `agent`'s message in progress as it stands (from its
    /// state), for a stream joined after that message began.
    pub fn seed(&mut self, agent: &AgentId, message: AssistantMessage) {
        self.agents
            .entry(agent.clone())
            .or_default()
            .messages
            .insert(String::new(), StreamedMessage::start(message));
    }

    /// The envelope `json` holds, rebuilt.
    pub fn envelope(&mut self, json: &[u8]) -> Result<Envelope, RebuildError> {
        let mut value: Value = serde_json::from_slice(json)?;
        let agent_id: AgentId = serde_json::from_value(value["agent_id"].take())?;
        let seq: u64 = serde_json::from_value(value["seq"].take())?;
        let in_progress = self.agents.entry(agent_id.clone()).or_default();
        let event = in_progress.delivered("", value["event"].take())?;
        if let Delivered::Notice(Notice::AgentStopped { .. }) = event {
            self.agents.remove(&agent_id);
        }
        Ok(Envelope::new(agent_id, seq, event))
    }
}

impl InProgress {
    fn delivered(&mut self, scope: &str, mut value: Value) -> Result<Delivered, RebuildError> {
        let event = match value["type"].as_str() {
            Some("message_update") if value.get("message").is_none() => {
                let piece: AssistantEvent =
                    serde_json::from_value(value["assistant_message_event"].take())?;
                let message = self
                    .messages
                    .get(scope)
                    .ok_or(RebuildError::Unstarted("message_update"))?
                    .then(piece.clone());
                AgentEvent::MessageUpdate {
                    assistant_message_event: piece,
                    message,
                }
            }
            Some("tool_execution_update") if value.get("args").is_none() => {
                let call = value["tool_call_id"].as_str().unwrap_or_default();
                let args = self
                    .args
                    .get(&call_of(scope, call))
                    .ok_or(RebuildError::Unstarted("tool_execution_update"))?
                    .clone();
                AgentEvent::ToolExecutionUpdate {
                    tool_call_id: serde_json::from_value(value["tool_call_id"].take())?,
                    tool_name: serde_json::from_value(value["tool_name"].take())?,
                    args,
                    partial_result: serde_json::from_value(value["partial_result"].take())?,
                }
            }
            Some("child_event") => {
                let path: Vec<String> = serde_json::from_value(value["path"].take())?;
                let tool_call_id: String = serde_json::from_value(value["tool_call_id"].take())?;
                let inner = scope_of(&tool_call_id, &path);
                let Delivered::Event(event) = self.delivered(&inner, value["event"].take())? else {
                    return Err(RebuildError::Unstarted("child_event"));
                };
                return Ok(Delivered::Event(AgentEvent::ChildEvent {
                    path,
                    tool_call_id,
                    event: Box::new(event),
                }));
            }
            _ => match serde_json::from_value(value)? {
                Delivered::Event(event) => event,
                Delivered::Notice(notice) => {
                    // Missed events, or a turn run again: nothing holds.
                    *self = InProgress::default();
                    return Ok(Delivered::Notice(notice));
                }
            },
        };
        self.note(scope, &event);
        Ok(Delivered::Event(event))
    }

    /// Keeps what later updates build on.
    fn note(&mut self, scope: &str, event: &AgentEvent) {
        match event {
            AgentEvent::MessageStart { message } => {
                if let Some(assistant) = message.as_assistant() {
                    self.messages
                        .insert(scope.to_owned(), StreamedMessage::start(assistant.clone()));
                }
            }
            AgentEvent::MessageUpdate { message, .. } => {
                self.messages.insert(scope.to_owned(), message.clone());
            }
            AgentEvent::MessageEnd { .. } => {
                self.messages.remove(scope);
            }
            AgentEvent::ToolExecutionStart {
                tool_call_id, args, ..
            } => {
                self.args
                    .insert(call_of(scope, tool_call_id), Arc::new(args.clone()));
            }
            AgentEvent::ToolExecutionUpdate {
                tool_call_id, args, ..
            } => {
                self.args.insert(call_of(scope, tool_call_id), args.clone());
            }
            AgentEvent::ToolExecutionEnd { tool_call_id, .. } => {
                self.args.remove(&call_of(scope, tool_call_id));
            }
            AgentEvent::AgentEnd { .. } if scope.is_empty() => *self = InProgress::default(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;
    use tiller_ai::Model;
    use tiller_core::ToolOutput;

    use super::*;

    fn start() -> AssistantMessage {
        AssistantMessage::empty(&Model::openai_compatible("http://localhost/v1", "m"))
    }

    fn envelope(seq: u64, event: AgentEvent) -> Envelope {
        Envelope::new(AgentId::from("a"), seq, Delivered::Event(event))
    }

    /// A message streamed as `pieces`: its start, an update per piece, its end.
    fn streamed(pieces: &[&str]) -> Vec<Envelope> {
        let mut message = StreamedMessage::start(start());
        let mut events = vec![AgentEvent::MessageStart {
            message: Box::new(start().into()),
        }];
        let mut updates = vec![AssistantEvent::TextStart { content_index: 0 }];
        updates.extend(pieces.iter().map(|piece| AssistantEvent::TextDelta {
            content_index: 0,
            delta: (*piece).to_owned(),
        }));
        for piece in updates {
            message = message.then(piece.clone());
            events.push(AgentEvent::MessageUpdate {
                assistant_message_event: piece,
                message: message.clone(),
            });
        }
        events.push(AgentEvent::MessageEnd {
            message: Box::new(message.get().into()),
        });
        (0..)
            .zip(events)
            .map(|(seq, event)| envelope(seq, event))
            .collect()
    }

    fn value(json: &Bytes) -> Value {
        serde_json::from_slice(json).unwrap_or_default()
    }

    #[test]
    fn a_reader_from_the_start_gets_pieces_and_one_joining_a_snapshot_first() {
        let envelopes = streamed(&["Hel", "lo"]);
        let mut from_start = Cursor::new(Updates::Lean);
        let sent: Vec<Value> = envelopes
            .iter()
            .map(|envelope| value(&from_start.frame(envelope).json()))
            .collect();
        assert_eq!(
            sent[2]["event"],
            json!({"type": "message_update", "assistant_message_event": {"type": "text_delta", "content_index": 0, "delta": "Hel"}})
        );
        assert!(
            sent.iter()
                .all(|sent| sent["event"].get("message").is_none()
                    || sent["event"]["type"] != "message_update")
        );

        let mut joining = Cursor::new(Updates::Lean);
        let late: Vec<Bytes> = envelopes[2..]
            .iter()
            .map(|envelope| joining.frame(envelope).json())
            .collect();
        assert_eq!(
            value(&late[0])["event"]["message"]["content"],
            json!([{"type": "text", "text": "Hel"}])
        );
        assert!(value(&late[1])["event"].get("message").is_none());
        let mut rebuild = Rebuild::default();
        let rebuilt: Vec<Envelope> = late
            .iter()
            .map(|json| {
                rebuild
                    .envelope(json)
                    .unwrap_or_else(|error| panic!("{error}"))
            })
            .collect();
        assert_eq!(rebuilt, envelopes[2..]);
    }

    #[test]
    fn after_a_lagged_notice_the_next_update_is_whole_and_full_is_whole_throughout() {
        let envelopes = streamed(&["a", "b", "c"]);
        let mut cursor = Cursor::new(Updates::Lean);
        for envelope in &envelopes[..3] {
            cursor.frame(envelope);
        }
        let lagged = Envelope::new(
            AgentId::from("a"),
            3,
            Delivered::Notice(Notice::Lagged { missed: 1 }),
        );
        cursor.frame(&lagged);
        let next = value(&cursor.frame(&envelopes[4]).json());
        assert_eq!(next["event"]["message"]["content"][0]["text"], "abc");

        let mut full = Cursor::new(Updates::Full);
        let texts: Vec<Value> = envelopes
            .iter()
            .map(|envelope| value(&full.frame(envelope).json()))
            .filter(|sent| sent["event"]["type"] == "message_update")
            .map(|sent| sent["event"]["message"]["content"][0]["text"].clone())
            .collect();
        assert_eq!(texts, [json!(""), json!("a"), json!("ab"), json!("abc")]);
    }

    #[test]
    fn a_tool_update_carries_no_args_but_to_a_reader_that_missed_the_start() {
        let args = Arc::new(json!({"path": "/tmp"}));
        let events = [
            AgentEvent::ToolExecutionStart {
                tool_call_id: "c1".to_owned(),
                tool_name: "ls".to_owned(),
                label: "ls".to_owned(),
                args: (*args).clone(),
            },
            AgentEvent::ToolExecutionUpdate {
                tool_call_id: "c1".to_owned(),
                tool_name: "ls".to_owned(),
                args: args.clone(),
                partial_result: ToolOutput::text("one"),
            },
            AgentEvent::ToolExecutionUpdate {
                tool_call_id: "c1".to_owned(),
                tool_name: "ls".to_owned(),
                args,
                partial_result: ToolOutput::text("two"),
            },
        ];
        let envelopes: Vec<Envelope> = (0..).zip(events).map(|(n, e)| envelope(n, e)).collect();
        let mut from_start = Cursor::new(Updates::Lean);
        let sent: Vec<Value> = envelopes
            .iter()
            .map(|envelope| value(&from_start.frame(envelope).json()))
            .collect();
        assert!(sent[1]["event"].get("args").is_none() && sent[2]["event"].get("args").is_none());
        let mut rebuild = Rebuild::default();
        for (json, envelope) in sent.iter().zip(&envelopes) {
            let rebuilt = rebuild.envelope(json.to_string().as_bytes());
            assert_eq!(rebuilt.ok().as_ref(), Some(envelope));
        }

        let mut joining = Cursor::new(Updates::Lean);
        assert_eq!(
            value(&joining.frame(&envelopes[1]).json())["event"]["args"],
            json!({"path": "/tmp"})
        );
        assert!(
            value(&joining.frame(&envelopes[2]).json())["event"]
                .get("args")
                .is_none()
        );
    }

    #[test]
    fn a_sub_agents_message_is_followed_apart_from_its_parents() {
        let child = |seq: u64, event: &Envelope| {
            let Delivered::Event(event) = &event.event else {
                unreachable!("events")
            };
            envelope(
                seq,
                AgentEvent::ChildEvent {
                    path: vec!["helper".to_owned()],
                    tool_call_id: "c1".to_owned(),
                    event: Box::new(event.clone()),
                },
            )
        };
        let own = streamed(&["mine"]);
        let theirs = streamed(&["theirs", "!"]);
        // The reader saw its agent's message start, not the sub-agent's.
        let mut cursor = Cursor::new(Updates::Lean);
        cursor.frame(&own[0]);
        let sub = value(&cursor.frame(&child(1, &theirs[2])).json());
        assert_eq!(
            sub["event"]["event"]["message"]["content"][0]["text"],
            "theirs"
        );
        assert!(
            value(&cursor.frame(&own[1]).json())["event"]
                .get("message")
                .is_none()
        );
        let again = value(&cursor.frame(&child(3, &theirs[3])).json());
        assert!(again["event"]["event"].get("message").is_none());

        // Rebuilt apart: each message from its own pieces.
        let mut rebuild = Rebuild::default();
        for envelope in [&own[0], &own[1], &own[2]] {
            rebuild
                .envelope(&envelope.lean().json())
                .unwrap_or_else(|error| panic!("{error}"));
        }
        let rebuilt = rebuild.envelope(&serde_json::to_vec(&sub).unwrap_or_default());
        assert_eq!(rebuilt.ok(), Some(child(1, &theirs[2])));
    }
}
