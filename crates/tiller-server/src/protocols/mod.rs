//! Tiller's agents behind the protocols clients already speak, one module per
//! protocol: the OpenAI API's models and errors ([`openai`]), chat completions
//! ([`chat`]) and responses ([`responses`]), the AI SDK's UI message stream
//! ([`ui_stream`]) and AG-UI ([`ag_ui`]).
//!
//! Each is a mapping and nothing more. A request becomes a [`Conversation`] on
//! a session ([`Shared::converse`]); its prompt goes to the agent as any
//! client's does; and the agent's lean event stream, read as [`Step`]s, becomes
//! the protocol's events through its [`Speaker`] ([`Shared::speak`]). The run
//! (its tools, approvals, budgets, durability) is the agent's, whichever
//! protocol asked.
//!
//! A streamed answer reads no `Idempotency-Key`: the run it streams can be
//! told only once, so a request sent again is a prompt again (these protocols'
//! clients send none). Where a session exists, the definition it was made of
//! answers, whatever the request names.

pub(crate) mod ag_ui;
pub(crate) mod chat;
pub(crate) mod openai;
pub(crate) mod responses;
pub(crate) mod ui_stream;

use std::borrow::Cow;

use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tiller::ai::{AssistantContent, AssistantMessage, Message, Model, TextContent};
use tiller::run::UserRequest;
use tiller::wire::{Frame, Updates};
use tiller::{AgentMessage, Envelope, Op, RunEnd, RunOutcome, ToolOutput};

use crate::Shared;
use crate::agents::check_client_id;
use crate::error::Problem;
use crate::events::event_stream;
use crate::quota::StreamSlot;
use crate::reach::Origin;
use crate::shutdown::until_closing;
use crate::tenants::Caller;

/// The longest id a client may give its own conversation (a chat's id, an
/// AG-UI thread, a `conversation`), in bytes.
pub(crate) const MAX_CLIENT_ID_BYTES: usize = 128;

/// Who said a message of a conversation a client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Said {
    User,
    Assistant,
}

/// A conversation as a client sends it: what was said before, and the prompt,
/// the user's last message.
#[derive(Debug)]
pub(crate) struct Conversation {
    pub(crate) history: Vec<(Said, String)>,
    pub(crate) prompt: String,
}

impl Conversation {
    /// The conversation of `messages` (those a protocol keeps, in order), the
    /// last a user's; `last` names that message's role for the error when it
    /// is not.
    pub(crate) fn new(
        mut messages: Vec<(Said, String)>,
        last: impl FnOnce() -> String,
    ) -> Result<Conversation, Problem> {
        match messages.pop() {
            Some((Said::User, prompt)) => Ok(Conversation {
                history: messages,
                prompt,
            }),
            _ => Err(Problem::invalid(
                Some(last()),
                "the conversation must end with the user's message",
            )),
        }
    }
}

/// Which session a request is for.
pub(crate) enum Asked {
    /// A new one.
    New,
    /// Tiller's id of one that exists (a response's): unknown, it is a 404.
    Existing(String),
    /// Tiller's id of one (`X-Tiller-Session`): on an open server, made with
    /// that id when there is none; on a server of tenants, a 404 (ids are one
    /// namespace for every tenant, and a client names only its own).
    Named { id: String, field: &'static str },
    /// The client's own id for its conversation (a chat's, a thread's): the
    /// session's id on an open server; on a server of tenants, an id made from
    /// it and the caller, so that two tenants' (or users') never meet. Made on
    /// the first request when `create`, else a 404 when there is none.
    Client {
        id: String,
        field: &'static str,
        create: bool,
    },
}

impl Shared {
    /// The session a request continues or starts: the one `asked` names, held
    /// by an agent (brought up from its stored origin when none holds it, after
    /// a restart), or a new one of the definition `definition` whose transcript
    /// is `history`; and whether it went on with one that was there.
    pub(crate) async fn converse(
        &self,
        caller: &Caller,
        asked: Asked,
        definition: &str,
        history: Vec<(Said, String)>,
    ) -> Result<(String, bool), Problem> {
        let id = match asked {
            Asked::New => None,
            Asked::Existing(id) => {
                return match self.hold(caller, &id).await? {
                    true => Ok((id, true)),
                    false => Err(Problem::unknown_session(&id)),
                };
            }
            Asked::Named { id, field } => {
                if self.hold(caller, &id).await? {
                    return Ok((id, true));
                }
                if caller.tenant.is_some() {
                    return Err(Problem::unknown_agent(&id));
                }
                check_client_id(&id, field)?;
                Some(id)
            }
            Asked::Client { id, field, create } => {
                let id = client_session(caller, &id, field)?;
                if self.hold(caller, &id).await? {
                    return Ok((id, true));
                }
                if !create {
                    return Err(Problem::unknown_session(&id));
                }
                Some(id)
            }
        };
        let spec = self
            .definitions
            .spec(definition, None)
            .map_err(|error| match error {
                tiller::agents::DefinitionsError::Unknown { .. } => Problem::new(
                    axum::http::StatusCode::NOT_FOUND,
                    "unknown-model",
                    format!(
                        "no definition is named `{definition}` (`GET /v1/models` and `GET /definitions` list them)"
                    ),
                ),
                error => error.into(),
            })?;
        let answered_by =
            (spec.settings.definition.model.clone()).unwrap_or_else(tiller::faux::demo_model);
        let history = history
            .into_iter()
            .map(|(said, text)| transcribed(said, text, &answered_by))
            .collect();
        let origin = Origin {
            definition: Some(definition.to_owned()),
            version: None,
            inline: None,
            context: caller.context.ids().clone(),
        };
        let spec = spec
            .with_messages(history)
            .with_context(caller.context.clone());
        let spec = match &id {
            Some(id) => spec.with_id(id.clone()),
            None => spec,
        };
        match self.spawn(spec, caller.scope(), &origin).await {
            Ok(agent) => Ok((agent.id.to_string(), false)),
            // Another request made it meanwhile: this one goes on with it.
            Err(problem) if problem.kind.ends_with("id-taken") => match id {
                Some(id) if self.hold(caller, &id).await? => Ok((id, true)),
                _ => Err(problem),
            },
            Err(problem) => Err(problem),
        }
    }

    /// Sends `ops` to the agent `session`, one run after the other, and
    /// answers with a `text/event-stream` of what `speaker` makes of their
    /// events (from the first run's start), up to its last step. The events are
    /// followed before the first op is sent, so nothing of the runs is missed
    /// while the caller's stream `slot` is held; a stream that falls behind or
    /// loses its agent is cut ([`Speaker::cut`]).
    pub(crate) async fn speak(
        &self,
        caller: &Caller,
        session: &str,
        slot: StreamSlot,
        mut ops: Vec<Op>,
        speaker: impl Speaker,
    ) -> Result<Response, Problem> {
        let events = self.events_of(caller, session, None, Updates::Lean).await?;
        let last = ops
            .pop()
            .ok_or_else(|| Problem::invalid(None, "a stream tells at least one run"))?;
        // No idempotency key: the runs are told once, here.
        let unkeyed = HeaderMap::new();
        for op in ops {
            self.run(caller, &unkeyed, session, op).await?;
        }
        self.submit(caller, &unkeyed, session, async move || Ok(last))
            .await?;
        let said = spoken(until_closing(events, &self.closing), speaker).map(move |bytes| {
            let _ = &slot;
            bytes
        });
        Ok(event_stream(said, self.config.keep_alive))
    }
}

/// The session of the client's own conversation `id` for `caller`.
fn client_session(caller: &Caller, id: &str, field: &str) -> Result<String, Problem> {
    if id.is_empty() || id.len() > MAX_CLIENT_ID_BYTES || id.chars().any(char::is_control) {
        return Err(Problem::invalid(
            Some(field.to_owned()),
            format!("an id is 1 to {MAX_CLIENT_ID_BYTES} bytes of visible text"),
        ));
    }
    let Some(tenant) = &caller.tenant else {
        check_client_id(id, field)?;
        return Ok(id.to_owned());
    };
    let user = caller.scope().user.unwrap_or_default();
    let mut hash = Sha256::new();
    for part in [tenant.as_str(), user.as_str(), id] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let hex: String = digest[..16]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Ok(format!("conversation-{hex}"))
}

/// A message of a client's conversation as the transcript holds it: the
/// assistant's as answered by `model`.
fn transcribed(said: Said, text: String, model: &Model) -> AgentMessage {
    match said {
        Said::User => AgentMessage::user(text),
        Said::Assistant => AgentMessage::Llm(Message::Assistant(Box::new(AssistantMessage {
            content: vec![AssistantContent::Text(TextContent::new(text))],
            ..AssistantMessage::empty(model)
        }))),
    }
}

/// A piece of a block of an answer (its text, its reasoning): one is open at
/// a time.
pub(crate) enum Block<'a> {
    Start,
    Delta(Cow<'a, str>),
    End,
}

/// What of an agent's lean events the protocols read, in the order the run
/// makes them.
pub(crate) enum Step<'a> {
    /// An answer of the model began.
    AnswerStart,
    /// Its text.
    Text(Block<'a>),
    /// Its reasoning.
    Reasoning(Block<'a>),
    /// It began a tool call, the block `index`.
    CallStart {
        index: usize,
        id: Cow<'a, str>,
        name: Cow<'a, str>,
    },
    /// A piece of the arguments of the call of block `index`, as JSON text.
    CallDelta { index: usize, delta: Cow<'a, str> },
    /// The call is complete.
    CallEnd {
        id: String,
        name: String,
        args: Value,
    },
    /// The agent ran a call.
    ToolEnd {
        id: Cow<'a, str>,
        output: ToolOutput,
        is_error: bool,
    },
    /// A tool set the agent's state: each name's new value.
    State(serde_json::Map<String, Value>),
    /// A call waits for the user: an approval, or an answer to a tool's
    /// question.
    Request(UserRequest),
    /// The run ended (boxed: it is the largest step, and the last).
    End(Box<RunOutcome>),
}

/// What a lean event is to a protocol's stream: the start of a run, a loss
/// (the stream fell behind, or its agent stopped), or a step of the run.
pub(crate) enum Read<'a> {
    Start,
    Lost,
    Step(Step<'a>),
    /// An answer ended, with the text of its blocks: what [`spoken`] says
    /// when none of it was streamed (held back from the events under the
    /// child-content rule, or as a restatement).
    Answered(Vec<String>),
}

impl Read<'_> {
    /// What the lean event `json` is, if it is one the protocols read.
    pub(crate) fn of(json: &[u8]) -> Option<Read<'_>> {
        let text = std::str::from_utf8(json).ok()?;
        // Most events say nothing here: read no further than their type.
        if !matches!(
            Envelope::type_in(text),
            "agent_start"
                | "lagged"
                | "agent_stopped"
                | "message_start"
                | "message_update"
                | "message_end"
                | "tool_execution_end"
                | "approval_requested"
                | "input_requested"
                | "agent_end"
        ) {
            return None;
        }
        let Lean { event } = serde_json::from_str(text).ok()?;
        let id = || event.tool_call_id.clone().unwrap_or_default();
        let name = || event.tool_name.clone().unwrap_or_default().into_owned();
        let step = match event.kind.as_ref() {
            "agent_start" => return Some(Read::Start),
            "lagged" | "agent_stopped" => return Some(Read::Lost),
            "message_start" => match event.message?.role.as_ref() {
                "assistant" => Step::AnswerStart,
                _ => return None,
            },
            "message_update" => event.assistant_message_event?.step()?,
            "message_end" => {
                let message = event.message?;
                if message.role == "assistant" {
                    let texts = message
                        .content
                        .iter()
                        .filter(|block| block["type"] == "text")
                        .filter_map(|block| block["text"].as_str())
                        .filter(|text| !text.is_empty())
                        .map(str::to_owned)
                        .collect();
                    return Some(Read::Answered(texts));
                }
                match message.state.is_empty() {
                    true => return None,
                    false => Step::State(message.state),
                }
            }
            "tool_execution_end" => Step::ToolEnd {
                id: id(),
                output: event.result.unwrap_or_default(),
                is_error: event.is_error,
            },
            "approval_requested" => Step::Request(UserRequest::Approval {
                tool_call_id: id().into_owned(),
                tool_name: name(),
                args: event.args.unwrap_or_default(),
                reason: event
                    .reason
                    .and_then(|reason| reason.as_str().map(str::to_owned)),
            }),
            "input_requested" => Step::Request(UserRequest::Input {
                tool_call_id: id().into_owned(),
                tool_name: name(),
                field: event.field.unwrap_or_default(),
                question: event.question.unwrap_or_default(),
                current_data: Value::Null,
            }),
            _ => Step::End(Box::new(RunOutcome {
                messages: event.messages.unwrap_or_default(),
                end: event
                    .reason
                    .and_then(|reason| serde_json::from_value(reason).ok())
                    .unwrap_or(RunEnd::Error),
                output: None,
                compactions: Vec::new(),
                conversation: Vec::new(),
                budget_exceeded: None,
                guardrail_tripped: None,
            })),
        };
        Some(Read::Step(step))
    }
}

/// The name Tiller gives the run's end `end`, as its events write it
/// (`parked`, `budget_exceeded`, …).
pub(crate) fn named(end: RunEnd) -> String {
    serde_json::to_value(end)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The texts of `answer`, each block's, leaving out empty ones.
pub(crate) fn texts(answer: &AssistantMessage) -> impl Iterator<Item = &str> {
    answer.content.iter().filter_map(|block| match block {
        AssistantContent::Text(text) if !text.text.is_empty() => Some(text.text.as_str()),
        _ => None,
    })
}

/// The answers among a run's `messages`.
pub(crate) fn answers(
    messages: &[AgentMessage],
) -> impl DoubleEndedIterator<Item = &AssistantMessage> {
    messages.iter().filter_map(AgentMessage::as_assistant)
}

/// The lean event, as far as the protocols read it.
#[derive(Deserialize)]
struct Lean<'a> {
    #[serde(borrow)]
    event: LeanEvent<'a>,
}

#[derive(Deserialize)]
struct LeanEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    assistant_message_event: Option<Piece<'a>>,
    #[serde(default, borrow)]
    message: Option<Role<'a>>,
    #[serde(default, borrow)]
    tool_call_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_name: Option<Cow<'a, str>>,
    #[serde(default)]
    args: Option<Value>,
    #[serde(default)]
    result: Option<ToolOutput>,
    #[serde(default)]
    is_error: bool,
    #[serde(default)]
    field: Option<String>,
    #[serde(default)]
    question: Option<String>,
    /// An approval's reason, or the run's end.
    #[serde(default)]
    reason: Option<Value>,
    #[serde(default)]
    messages: Option<Vec<AgentMessage>>,
}

/// A message's role, and the state a tool's result set.
#[derive(Deserialize)]
struct Role<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default)]
    state: serde_json::Map<String, Value>,
    #[serde(default)]
    content: Vec<Value>,
}

/// A `message_update`'s piece.
#[derive(Deserialize)]
struct Piece<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    content_index: usize,
    #[serde(default, borrow)]
    delta: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_call: Option<CallMade>,
}

#[derive(Deserialize)]
struct CallMade {
    id: String,
    name: String,
    #[serde(default)]
    arguments: Value,
}

impl<'a> Piece<'a> {
    fn step(self) -> Option<Step<'a>> {
        let index = self.content_index;
        let delta = || self.delta.clone().unwrap_or_default();
        Some(match self.kind.as_ref() {
            "text_start" => Step::Text(Block::Start),
            "text_delta" => Step::Text(Block::Delta(delta())),
            "text_end" => Step::Text(Block::End),
            "thinking_start" => Step::Reasoning(Block::Start),
            "thinking_delta" => Step::Reasoning(Block::Delta(delta())),
            "thinking_end" => Step::Reasoning(Block::End),
            "tool_call_start" => Step::CallStart {
                index,
                id: self.id.unwrap_or_default(),
                name: self.name.unwrap_or_default(),
            },
            "tool_call_delta" => Step::CallDelta {
                index,
                delta: delta(),
            },
            "tool_call_end" => {
                let call = self.tool_call?;
                Step::CallEnd {
                    id: call.id,
                    name: call.name,
                    args: call.arguments,
                }
            }
            _ => return None,
        })
    }
}

/// A protocol's side of a stream: what opens it, what each step of the run
/// adds, and what ends it when it ends before the run does.
pub(crate) trait Speaker: Send + 'static {
    /// What opens the stream.
    fn open(&mut self, out: &mut Vec<u8>);

    /// What `step` adds.
    fn step(&mut self, step: Step<'_>, out: &mut Vec<u8>);

    /// Whether `step` is the stream's last: the run's end.
    fn is_last(&self, step: &Step<'_>) -> bool {
        matches!(step, Step::End(_))
    }

    /// What ends a stream cut before the run ended (the server is closing).
    fn cut(&mut self, _out: &mut Vec<u8>) {}
}

/// What `speaker` makes of the agent's lean `frames`, up to the run's end.
fn spoken(
    frames: impl Stream<Item = Frame> + Send + 'static,
    mut speaker: impl Speaker,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let mut opening = Vec::new();
    speaker.open(&mut opening);
    let going = futures::stream::unfold(
        Some((Box::pin(frames), speaker, false, false)),
        |going| async move {
            // Whether the run started; whether the answer streamed any text.
            let (mut frames, mut speaker, mut started, mut streamed) = going?;
            let mut out = Vec::new();
            loop {
                let Some(frame) = frames.next().await else {
                    speaker.cut(&mut out);
                    return (!out.is_empty()).then(|| (Bytes::from(out), None));
                };
                let json = frame.json();
                let step = match Read::of(&json) {
                    // What a run before this one said is not this one's.
                    Some(Read::Start) => {
                        started = true;
                        continue;
                    }
                    Some(Read::Lost) => {
                        speaker.cut(&mut out);
                        return (!out.is_empty()).then(|| (Bytes::from(out), None));
                    }
                    // An answer none of whose text streamed says it now.
                    Some(Read::Answered(texts)) if started && !streamed && !texts.is_empty() => {
                        speaker.step(Step::Text(Block::Start), &mut out);
                        let text = texts.join("\n\n");
                        speaker.step(Step::Text(Block::Delta(Cow::Owned(text))), &mut out);
                        speaker.step(Step::Text(Block::End), &mut out);
                        streamed = true;
                        return Some((
                            Bytes::from(out),
                            Some((frames, speaker, started, streamed)),
                        ));
                    }
                    Some(Read::Step(step)) if started => step,
                    _ => continue,
                };
                match &step {
                    Step::AnswerStart => streamed = false,
                    Step::Text(Block::Delta(delta)) if !delta.is_empty() => streamed = true,
                    _ => {}
                }
                let last = speaker.is_last(&step);
                speaker.step(step, &mut out);
                if last {
                    return Some((Bytes::from(out), None));
                }
                if !out.is_empty() {
                    return Some((Bytes::from(out), Some((frames, speaker, started, streamed))));
                }
            }
        },
    );
    futures::stream::once(std::future::ready(Bytes::from(opening)))
        .filter(|bytes| std::future::ready(!bytes.is_empty()))
        .chain(going)
}

/// The last event of a stream that ends with `data: [DONE]` (OpenAI's chat
/// completions, the AI SDK's UI message stream).
pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    tiller::ai::now_ms() / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_ends_with_the_users_message() {
        let conversation = Conversation::new(
            vec![
                (Said::User, "Hi".into()),
                (Said::Assistant, "Hello.".into()),
                (Said::User, "Who?".into()),
            ],
            || "messages[2]".into(),
        )
        .unwrap();
        assert_eq!(conversation.prompt, "Who?");
        assert_eq!(conversation.history.len(), 2);
        let refused = Conversation::new(vec![(Said::Assistant, "Hello.".into())], || {
            "messages[0].role".into()
        });
        assert_eq!(
            refused.unwrap_err().field.as_deref(),
            Some("messages[0].role")
        );
        assert!(Conversation::new(Vec::new(), || "messages".into()).is_err());
    }

    #[test]
    fn steps_are_read_from_lean_events_and_others_skipped() {
        let delta = br#"{"agent_id":"a","seq":3,"event":{"type":"message_update","assistant_message_event":{"type":"text_delta","content_index":0,"delta":"Hi"}}}"#;
        assert!(
            matches!(Read::of(delta), Some(Read::Step(Step::Text(Block::Delta(text)))) if text == "Hi")
        );
        let turn = br#"{"agent_id":"a","seq":1,"event":{"type":"turn_start"}}"#;
        assert!(Read::of(turn).is_none());
        let end = br#"{"agent_id":"a","seq":9,"event":{"type":"agent_end","messages":[],"reason":"parked"}}"#;
        assert!(matches!(
            Read::of(end),
            Some(Read::Step(Step::End(outcome))) if outcome.end == RunEnd::Parked
        ));
    }
}
