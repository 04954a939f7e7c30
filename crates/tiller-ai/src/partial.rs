//! A message as it streams: [`PartialMessage`] applies each [`AssistantEvent`] in
//! place, so keeping the growing message costs what each delta costs;
//! [`StreamedMessage`] is the message as of one event, built only when read.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::event::AssistantEvent;
use crate::json;
use crate::message::{AssistantContent, AssistantMessage, TextContent, ThinkingContent, ToolCall};

/// Argument text up to this size is re-parsed on every delta; beyond it, only once
/// it has grown by a quarter, so a very long argument stays linear to stream.
const EAGER_PARSE_LIMIT: usize = 4 * 1024;

/// An assistant message kept current by applying the events of its stream.
///
/// While a tool call streams, its `arguments` hold a best-effort parse of the JSON
/// received so far; the call's `tool_call_end` replaces them with the final parse.
///
/// ```
/// use tiller_ai::{AssistantEvent, PartialMessage};
/// # let model = tiller_ai::Model::openai_compatible("http://localhost/v1", "m");
/// let mut partial = PartialMessage::new(tiller_ai::AssistantMessage::empty(&model));
/// partial.apply(&AssistantEvent::TextStart { content_index: 0 });
/// partial.apply(&AssistantEvent::TextDelta { content_index: 0, delta: "Hel".into() });
/// partial.apply(&AssistantEvent::TextDelta { content_index: 0, delta: "lo".into() });
/// assert_eq!(partial.message().text(), "Hello");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PartialMessage {
    message: AssistantMessage,
    arguments: Vec<ArgumentText>,
}

/// The raw argument text of a tool call that is still streaming.
#[derive(Debug, Clone, PartialEq)]
struct ArgumentText {
    content_index: usize,
    json: String,
    parsed_len: usize,
}

impl PartialMessage {
    /// Starts from `message` (normally the empty message of a `start` event).
    pub fn new(message: AssistantMessage) -> Self {
        PartialMessage {
            message,
            arguments: Vec::new(),
        }
    }

    /// The message as it stands.
    pub fn message(&self) -> &AssistantMessage {
        &self.message
    }

    /// The message as it stands, taken.
    pub fn into_message(self) -> AssistantMessage {
        self.message
    }

    /// Applies one event. Events that do not fit the message (a delta for a block
    /// that does not exist, say) are ignored rather than trusted.
    pub fn apply(&mut self, event: &AssistantEvent) {
        let content = &mut self.message.content;
        match event {
            AssistantEvent::Start { message } => *self = PartialMessage::new((**message).clone()),
            AssistantEvent::TextStart { content_index } => {
                if *content_index == content.len() {
                    content.push(AssistantContent::Text(TextContent::new("")));
                }
            }
            AssistantEvent::TextDelta {
                content_index,
                delta,
            } => {
                if let Some(AssistantContent::Text(text)) = content.get_mut(*content_index) {
                    text.text.push_str(delta);
                }
            }
            AssistantEvent::TextEnd {
                content_index,
                signature,
            } => {
                if let (Some(AssistantContent::Text(text)), Some(signature)) =
                    (content.get_mut(*content_index), signature)
                {
                    text.signature = Some(signature.clone());
                }
            }
            AssistantEvent::ThinkingStart {
                content_index,
                redacted,
            } => {
                if *content_index == content.len() {
                    content.push(AssistantContent::Thinking(ThinkingContent {
                        thinking: String::new(),
                        signature: None,
                        redacted: *redacted,
                    }));
                }
            }
            AssistantEvent::ThinkingDelta {
                content_index,
                delta,
            } => {
                if let Some(AssistantContent::Thinking(thinking)) = content.get_mut(*content_index)
                {
                    thinking.thinking.push_str(delta);
                }
            }
            AssistantEvent::ThinkingEnd {
                content_index,
                signature,
            } => {
                if let (Some(AssistantContent::Thinking(thinking)), Some(signature)) =
                    (content.get_mut(*content_index), signature)
                {
                    thinking.signature = Some(signature.clone());
                }
            }
            AssistantEvent::ToolCallStart {
                content_index,
                id,
                name,
            } => {
                if *content_index == content.len() {
                    content.push(AssistantContent::ToolCall(Box::new(ToolCall {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: Value::Object(Map::new()),
                        arguments_error: None,
                        signature: None,
                    })));
                    self.arguments.push(ArgumentText {
                        content_index: *content_index,
                        json: String::new(),
                        parsed_len: 0,
                    });
                }
            }
            AssistantEvent::ToolCallDelta {
                content_index,
                delta,
            } => self.push_arguments(*content_index, delta),
            AssistantEvent::ToolCallEnd {
                content_index,
                tool_call,
            } => {
                if let Some(AssistantContent::ToolCall(call)) = content.get_mut(*content_index) {
                    call.clone_from(tool_call);
                }
                self.arguments.retain(|a| a.content_index != *content_index);
            }
            AssistantEvent::Done { message, .. } | AssistantEvent::Error { message, .. } => {
                self.message = (**message).clone();
                self.arguments.clear();
            }
        }
    }

    fn push_arguments(&mut self, content_index: usize, delta: &str) {
        let Some(text) = self
            .arguments
            .iter_mut()
            .find(|a| a.content_index == content_index)
        else {
            return;
        };
        text.json.push_str(delta);
        let len = text.json.len();
        if len > EAGER_PARSE_LIMIT && len < text.parsed_len + text.parsed_len / 4 {
            return;
        }
        text.parsed_len = len;
        if let (Some(view), Some(AssistantContent::ToolCall(call))) = (
            json::parse_partial(&text.json),
            self.message.content.get_mut(content_index),
        ) {
            call.arguments = view;
        }
    }

    /// The message, for the producer of the events to finish it.
    pub(crate) fn message_mut(&mut self) -> &mut AssistantMessage {
        &mut self.message
    }

    /// The argument text received so far for the tool call at `content_index`.
    pub(crate) fn argument_text(&self, content_index: usize) -> Option<&str> {
        self.arguments
            .iter()
            .find(|a| a.content_index == content_index)
            .map(|a| a.json.as_str())
    }

    /// The tool calls still streaming, by content index, with their text so far;
    /// forgets them.
    pub(crate) fn take_open_arguments(&mut self) -> Vec<(usize, String)> {
        self.arguments
            .drain(..)
            .map(|a| (a.content_index, a.json))
            .collect()
    }
}

/// An assistant message as it stood at one event of its stream, built only when
/// read: making one for each event costs a shared pointer and that event, whatever
/// the message's length, so a subscriber that never reads it pays nothing for it.
/// Reading ([`StreamedMessage::get`]) replays the stream's events up to that one
/// on its start message. It serializes as the message (with its `role`), as pi's
/// `message_update` carries it, and comes back from JSON already built.
#[derive(Clone)]
pub struct StreamedMessage(Streamed);

#[derive(Clone)]
enum Streamed {
    /// Built: read back from JSON, or the start of a stream.
    Ready(Arc<AssistantMessage>),
    /// An event of a stream.
    Event(Arc<Link>),
}

/// One event of a stream, linked to the event before it (none for the first).
struct Link {
    event: AssistantEvent,
    before: Option<Arc<Link>>,
    start: Arc<AssistantMessage>,
}

impl Drop for Link {
    /// Unlinks a long chain one link at a time, rather than by recursion.
    fn drop(&mut self) {
        let mut before = self.before.take();
        while let Some(link) = before {
            before = match Arc::try_unwrap(link) {
                Ok(mut link) => link.before.take(),
                Err(_) => None,
            };
        }
    }
}

impl StreamedMessage {
    /// The message as it stands before any event: the stream's start message.
    pub fn start(message: AssistantMessage) -> Self {
        StreamedMessage(Streamed::Ready(Arc::new(message)))
    }

    /// The message after `event` too.
    pub fn then(&self, event: AssistantEvent) -> Self {
        let (before, start) = match &self.0 {
            Streamed::Ready(message) => (None, message.clone()),
            Streamed::Event(link) => (Some(link.clone()), link.start.clone()),
        };
        StreamedMessage(Streamed::Event(Arc::new(Link {
            event,
            before,
            start,
        })))
    }

    /// The message as it stood: built by replaying the events up to this one
    /// (linear in their number).
    pub fn get(&self) -> AssistantMessage {
        let link = match &self.0 {
            Streamed::Ready(message) => return (**message).clone(),
            Streamed::Event(link) => link,
        };
        let mut events = vec![&link.event];
        let mut at = link.before.as_deref();
        while let Some(earlier) = at {
            events.push(&earlier.event);
            at = earlier.before.as_deref();
        }
        let mut partial = PartialMessage::new((*link.start).clone());
        for event in events.into_iter().rev() {
            partial.apply(event);
        }
        partial.into_message()
    }
}

impl fmt::Debug for StreamedMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

impl PartialEq for StreamedMessage {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Serialize for StreamedMessage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::Message::Assistant(Box::new(self.get())).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StreamedMessage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match crate::Message::deserialize(deserializer)? {
            crate::Message::Assistant(message) => Ok(StreamedMessage::start(*message)),
            _ => Err(serde::de::Error::custom(
                "a streamed message is an assistant message",
            )),
        }
    }
}

#[cfg(test)]
mod streamed_tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn text(delta: &str) -> AssistantEvent {
        AssistantEvent::TextDelta {
            content_index: 0,
            delta: delta.into(),
        }
    }

    /// Each event's message is the message as of that event; it serializes with
    /// its role and comes back equal; a chain of a million events drops without
    /// exhausting the stack.
    #[test]
    fn each_event_sees_the_message_as_it_stood() {
        let model = crate::Model::openai_compatible("http://localhost/v1", "m");
        let start = StreamedMessage::start(AssistantMessage::empty(&model));
        let opened = start.then(AssistantEvent::TextStart { content_index: 0 });
        let first = opened.then(text("Hel"));
        let second = first.then(text("lo"));
        assert_eq!(
            (start.get().text(), first.get().text(), second.get().text()),
            (String::new(), "Hel".to_owned(), "Hello".to_owned())
        );
        let json = serde_json::to_value(&second).unwrap();
        assert_eq!(
            (&json["role"], &json["content"][0]["text"]),
            (&Value::from("assistant"), &Value::from("Hello"))
        );
        assert_eq!(
            serde_json::from_value::<StreamedMessage>(json).unwrap(),
            second
        );

        let mut long = opened;
        for _ in 0..1_000_000 {
            long = long.then(text("x"));
        }
        drop(long);
    }
}
