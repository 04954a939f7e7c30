//! The AI SDK's UI message stream in front of Tiller's agents: the protocol of
//! the `ai` package's `useChat` and its chat transports.
//! `POST /ai-sdk/{definition}` takes what the transport posts (`id`, the
//! chat's, and `messages`, each with its `parts`) and answers with the run as a
//! UI message stream (server-sent events, `x-vercel-ai-ui-message-stream: v1`).
//!
//! The chat's `id` is its session: the first request starts it (its transcript
//! the text of the messages before the last), the next ones continue it, the
//! text of their last message, a user's, the prompt (a regeneration sends it
//! again: it is asked again). Without an `id`, each request is a new session.
//!
//! The stream: `start`; for each answer of the model a step (`start-step`,
//! `finish-step`) holding its `text-*` and `reasoning-*` parts, its tool calls
//! as `tool-input-start`/`-delta`/`-available` (dynamic tools: the agent's,
//! not the client's), and what the agent's runs of them gave
//! (`tool-output-available`, or `tool-output-error`); `error` when the run
//! failed (`end: error`; a run ended otherwise, by a budget or a guardrail,
//! finishes with `finishReason: other` and its `end`); `finish`; `[DONE]`. A
//! stream cut before the run ended (the server closing, the client too far
//! behind, the agent stopped) ends with `abort`. Tiller's own requests are data parts, each with
//! the call's id as its `id`: `data-tiller-approval` (`{toolCallId, toolName,
//! input, reason}`: a call waits for the user's approval) and
//! `data-tiller-question` (`{toolCallId, toolName, field, question}`: a tool
//! asks), answered through `POST /agents/{id}/reply`; and
//! `data-tiller-state` (the state a tool set, by name). `finish`'s
//! `messageMetadata` is `{session, end}`: the session (the agent's id) and the
//! run's end as Tiller names it (`completed`, `parked`, …).

use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tiller::run::UserRequest;
use tiller::{AgentMessage, Op, RunEnd, ToolOutput};

use super::chat::SESSION_HEADER;
use super::{Asked, Block, Conversation, DONE, Said, Speaker, Step, named};
use crate::Shared;
use crate::error::{Problem, decode};
use crate::events::sse_data;

/// The header that marks a UI message stream, and its version.
const STREAM_HEADER: &str = "x-vercel-ai-ui-message-stream";

/// What a chat transport posts: what Tiller reads of it.
#[derive(Debug, Deserialize)]
struct ChatPost {
    #[serde(default)]
    id: Option<String>,
    messages: Vec<UiMessage>,
}

#[derive(Debug, Deserialize)]
struct UiMessage {
    role: String,
    #[serde(default)]
    parts: Vec<Value>,
}

/// `POST /ai-sdk/{definition}`.
pub(crate) async fn chat(
    State(shared): State<Arc<Shared>>,
    Path(definition): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    let post: ChatPost = decode(body)?;
    let Conversation { history, prompt } = conversation(&post.messages)?;
    let asked = match post.id {
        Some(id) => Asked::Client {
            id,
            field: "id",
            create: true,
        },
        None => Asked::New,
    };
    // The stream is counted before anything is made for it.
    let slot = shared.stream_slot(&caller)?;
    let (session, _) = shared
        .converse(&caller, asked, &definition, history)
        .await?;
    let op = Op::Prompt {
        messages: vec![AgentMessage::user(prompt)],
    };
    let streaming = Streaming {
        session: session.clone(),
        message_id: format!("msg-{}", tiller::ai::new_id()),
        ..Streaming::default()
    };
    let mut response = shared
        .speak(&caller, &session, slot, vec![op], streaming)
        .await?;
    let headers = response.headers_mut();
    headers.insert(STREAM_HEADER, HeaderValue::from_static("v1"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Ok(value) = HeaderValue::from_str(&session) {
        headers.insert(SESSION_HEADER, value);
    }
    Ok(response)
}

/// The messages' texts: their text parts; an assistant's other parts (its tool
/// calls, its reasoning, steps) are the agent's and left out, and a user's
/// part that is not text is refused. A system message is left out: the
/// definition's instructions stand.
fn conversation(messages: &[UiMessage]) -> Result<Conversation, Problem> {
    let mut kept = Vec::with_capacity(messages.len());
    for (at, message) in messages.iter().enumerate() {
        let said = match message.role.as_str() {
            "user" => Said::User,
            "assistant" => Said::Assistant,
            "system" => continue,
            role => {
                return Err(Problem::invalid(
                    Some(format!("messages[{at}].role")),
                    format!("a message of role `{role}` is not taken (user, assistant, system)"),
                ));
            }
        };
        let mut text = String::new();
        for (index, part) in message.parts.iter().enumerate() {
            match part.get("type").and_then(Value::as_str) {
                Some("text") => {
                    text.push_str(part.get("text").and_then(Value::as_str).unwrap_or_default())
                }
                _ if said == Said::Assistant => {}
                kind => {
                    return Err(Problem::invalid(
                        Some(format!("messages[{at}].parts[{index}]")),
                        format!(
                            "a part of type `{}` is not taken here: text parts only",
                            kind.unwrap_or("none")
                        ),
                    ));
                }
            }
        }
        kept.push((said, text));
    }
    let last = messages.len().saturating_sub(1);
    Conversation::new(kept, || format!("messages[{last}].role"))
}

/// A UI message stream as it reads the run's events.
#[derive(Default)]
struct Streaming {
    session: String,
    message_id: String,
    /// Whether a step is open.
    in_step: bool,
    /// How many parts were opened: each part's id is its number.
    parts: u64,
    /// The text or reasoning part open: its kind (`text`, `reasoning`) and its
    /// id.
    open_part: Option<(&'static str, String)>,
    /// The calls of the answer being written, by block index: their ids.
    calls: Vec<(usize, String)>,
}

impl Streaming {
    fn chunk(out: &mut Vec<u8>, chunk: Value) {
        sse_data(out, &chunk);
    }

    /// The chunks of `block` of a part of `kind` (`text`, `reasoning`).
    fn block(&mut self, kind: &'static str, block: Block<'_>, out: &mut Vec<u8>) {
        match block {
            Block::Start => {
                self.parts += 1;
                let id = self.parts.to_string();
                Self::chunk(out, json!({"type": format!("{kind}-start"), "id": id}));
                self.open_part = Some((kind, id));
            }
            Block::Delta(delta) => {
                if let Some((_, id)) = &self.open_part {
                    let kind = format!("{kind}-delta");
                    Self::chunk(out, json!({"type": kind, "id": id, "delta": delta}));
                }
            }
            Block::End => self.end_part(out),
        }
    }

    /// Ends the text or reasoning part open, if one is.
    fn end_part(&mut self, out: &mut Vec<u8>) {
        if let Some((kind, id)) = self.open_part.take() {
            Self::chunk(out, json!({"type": format!("{kind}-end"), "id": id}));
        }
    }

    fn finish_step(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.in_step) {
            Self::chunk(out, json!({"type": "finish-step"}));
        }
    }
}

impl Speaker for Streaming {
    fn open(&mut self, out: &mut Vec<u8>) {
        Self::chunk(out, json!({"type": "start", "messageId": self.message_id}));
    }

    fn step(&mut self, step: Step<'_>, out: &mut Vec<u8>) {
        match step {
            Step::AnswerStart => {
                self.finish_step(out);
                self.in_step = true;
                self.calls.clear();
                Self::chunk(out, json!({"type": "start-step"}));
            }
            Step::Text(block) => self.block("text", block, out),
            Step::Reasoning(block) => self.block("reasoning", block, out),
            Step::CallStart { index, id, name } => {
                Self::chunk(
                    out,
                    json!({"type": "tool-input-start", "toolCallId": id, "toolName": name, "dynamic": true}),
                );
                self.calls.push((index, id.into_owned()));
            }
            Step::CallDelta { index, delta } => {
                if let Some((_, id)) = self.calls.iter().find(|(at, _)| *at == index) {
                    Self::chunk(
                        out,
                        json!({"type": "tool-input-delta", "toolCallId": id, "inputTextDelta": delta}),
                    );
                }
            }
            Step::CallEnd { id, name, args, .. } => Self::chunk(
                out,
                json!({"type": "tool-input-available", "toolCallId": id, "toolName": name, "input": args, "dynamic": true}),
            ),
            Step::ToolEnd {
                id,
                output,
                is_error,
            } => {
                let text = ToolOutput::text_content(&output);
                let chunk = match is_error {
                    true => {
                        json!({"type": "tool-output-error", "toolCallId": id, "errorText": text, "dynamic": true})
                    }
                    false => {
                        json!({"type": "tool-output-available", "toolCallId": id, "output": text, "dynamic": true})
                    }
                };
                Self::chunk(out, chunk);
            }
            Step::Request(UserRequest::Approval {
                tool_call_id,
                tool_name,
                args,
                reason,
            }) => Self::chunk(
                out,
                json!({"type": "data-tiller-approval", "id": tool_call_id, "data": {
                    "toolCallId": tool_call_id, "toolName": tool_name, "input": args, "reason": reason,
                }}),
            ),
            Step::Request(UserRequest::Input {
                tool_call_id,
                tool_name,
                field,
                question,
                ..
            }) => Self::chunk(
                out,
                json!({"type": "data-tiller-question", "id": tool_call_id, "data": {
                    "toolCallId": tool_call_id, "toolName": tool_name, "field": field, "question": question,
                }}),
            ),
            Step::State(changed) => {
                Self::chunk(out, json!({"type": "data-tiller-state", "data": changed}));
            }
            Step::End(outcome) => {
                // What an aborted answer left open is closed.
                self.end_part(out);
                self.finish_step(out);
                if outcome.end == RunEnd::Error {
                    let error = outcome.error().unwrap_or("the run failed");
                    Self::chunk(out, json!({"type": "error", "errorText": error}));
                }
                let finish = match outcome.end {
                    RunEnd::Completed | RunEnd::StopCondition | RunEnd::ToolsTerminated => "stop",
                    RunEnd::Error => "error",
                    _ => "other",
                };
                Self::chunk(
                    out,
                    json!({"type": "finish", "finishReason": finish, "messageMetadata": {
                        "session": self.session, "end": named(outcome.end),
                    }}),
                );
                out.extend_from_slice(DONE);
            }
        }
    }

    fn cut(&mut self, out: &mut Vec<u8>) {
        let reason = "the stream was cut before the run ended: the server is closing, the client fell behind, or the agent stopped";
        Self::chunk(out, json!({"type": "abort", "reason": reason}));
        out.extend_from_slice(DONE);
    }
}
