//! The OpenAI API's responses in front of Tiller's agents: `POST /v1/responses`
//! runs the definition its `model` names, streamed (`"stream": true`) or not.
//!
//! A request starts a session (an agent of that definition) whose transcript
//! is the `input`'s messages before the last, and whose prompt is the last, a
//! user's. `previous_response_id` continues the session that response belongs
//! to, and `conversation` (an id the client chooses) the session of that
//! conversation, made on its first request; either way the session holds what
//! came before, and the input's messages, each the user's, are the prompt. A
//! response id names its session, which the store keeps: a restarted server
//! continues it (the session's agent is brought up from its definition). It
//! continues the session where it stands: a response other than the latest is
//! not a point to branch from.
//!
//! The agent runs its own tools: the output is the text of the run's answers,
//! one `message` item for each text, never a function call for the client. A
//! run that ends otherwise than completed is `incomplete`, its
//! `incomplete_details.reason` the run's end as Tiller names it (`parked` when
//! a call waits for the user's approval or answer, given through
//! `POST /agents/{id}/reply`; `budget_exceeded`, …), and one that failed is
//! `failed`, with the error (as is a stream cut before the run ended). Refusals
//! are OpenAI's error objects.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tiller::ai::Usage;
use tiller::{AgentMessage, Op, RunEnd, RunOutcome};

use super::chat::SESSION_HEADER;
use super::openai::OpenAiError;
use super::{Asked, Block, Conversation, Said, Speaker, Step, answers, named, now_secs, texts};
use crate::Shared;
use crate::error::{Problem, decode};
use crate::events::sse_data;

/// `POST /v1/responses`'s body: what Tiller reads of it (other fields are
/// taken and left unused; `instructions` too: the definition's stand).
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    /// The definition to run.
    model: String,
    /// A user's text, or the conversation's messages.
    input: Input,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    conversation: Option<ConversationId>,
    #[serde(default)]
    stream: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// A conversation's id, or the object that holds it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ConversationId {
    Id(String),
    Object { id: String },
}

impl ConversationId {
    fn id(&self) -> &str {
        match self {
            ConversationId::Id(id) | ConversationId::Object { id } => id,
        }
    }
}

/// `POST /v1/responses`.
pub(crate) async fn responses(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiError> {
    let caller = shared.caller(&headers)?;
    let request: ResponsesRequest = decode(body)?;
    let Conversation { history, prompt } = conversation(&request.input)?;
    let conversation = request
        .conversation
        .as_ref()
        .map(|conversation| conversation.id().to_owned());
    let asked = match (&request.previous_response_id, &conversation) {
        (Some(_), Some(_)) => {
            return Err(Problem::invalid(
                Some("conversation".to_owned()),
                "`previous_response_id` and `conversation` each name a session: give one",
            )
            .into());
        }
        (Some(previous), None) => Asked::Existing(session_of(previous)?),
        (None, Some(id)) => Asked::Client {
            id: id.clone(),
            field: "conversation",
            create: true,
        },
        (None, None) => Asked::New,
    };
    // A stream is counted before anything is made for it.
    let slot = match request.stream {
        true => Some(shared.stream_slot(&caller)?),
        false => None,
    };
    let (session, continued) = shared
        .converse(&caller, asked, &request.model, history.clone())
        .await?;
    // Going on, the input's messages are all new: each is the user's, and all
    // are the prompt.
    let mut messages = Vec::with_capacity(1);
    if continued {
        for (said, text) in history {
            if said != Said::User {
                return Err(Problem::invalid(
                    Some("input".to_owned()),
                    "the input that goes on with a session holds the user's messages only: the session holds the rest",
                )
                .into());
            }
            messages.push(AgentMessage::user(text));
        }
    }
    messages.push(AgentMessage::user(prompt));
    let op = Op::Prompt { messages };
    let answer = Answer {
        id: response_id(&session),
        model: request.model,
        created_at: now_secs(),
        previous_response_id: request.previous_response_id,
        conversation,
        output: Vec::new(),
    };
    let mut response = if let Some(slot) = slot {
        let telling = Telling {
            answer,
            sequence: 0,
            item: None,
        };
        shared
            .speak(&caller, &session, slot, vec![op], telling)
            .await?
    } else {
        let outcome = shared.run(&caller, &headers, &session, op).await?;
        let mut answer = answer;
        for text in answers(&outcome.messages).flat_map(texts) {
            answer.output.push(message_item(
                &format!("msg_{}", tiller::ai::new_id()),
                text,
                "completed",
            ));
        }
        Json(answer.object(Some(&outcome))).into_response()
    };
    if let Ok(value) = HeaderValue::from_str(&session) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    Ok(response)
}

/// A new response's id: it names its session.
fn response_id(session: &str) -> String {
    let hex: String = session.bytes().map(|byte| format!("{byte:02x}")).collect();
    format!("resp_{hex}_{}", tiller::ai::new_id())
}

/// The session the response `id` belongs to.
fn session_of(id: &str) -> Result<String, Problem> {
    let malformed = || {
        Problem::invalid(
            Some("previous_response_id".to_owned()),
            "not the id of a response of this server",
        )
    };
    let hex = id
        .strip_prefix("resp_")
        .and_then(|rest| rest.split('_').next())
        .filter(|hex| !hex.is_empty() && hex.len() % 2 == 0)
        .ok_or_else(malformed)?;
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(hex.get(at..at + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| malformed())?;
    String::from_utf8(bytes).map_err(|_| malformed())
}

/// The input's messages: a text is the user's; `system` and `developer`
/// messages are left out (the definition's instructions stand), and items of
/// other types (a function call's output) refused: the agent runs its own
/// tools.
fn conversation(input: &Input) -> Result<Conversation, Problem> {
    let items = match input {
        Input::Text(text) => {
            return Conversation::new(vec![(Said::User, text.clone())], String::new);
        }
        Input::Items(items) => items,
    };
    let mut kept = Vec::with_capacity(items.len());
    for (at, item) in items.iter().enumerate() {
        let refused = |why: String| Problem::invalid(Some(format!("input[{at}]")), why);
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        if kind != "message" {
            return Err(refused(format!(
                "an item of type `{kind}` is not taken: the agent runs its own tools (messages only)"
            )));
        }
        let said = match item.get("role").and_then(Value::as_str) {
            Some("user") => Said::User,
            Some("assistant") => Said::Assistant,
            Some("system" | "developer") => continue,
            role => {
                return Err(refused(format!(
                    "a message of role `{}` is not taken (user, assistant, system and developer)",
                    role.unwrap_or("none")
                )));
            }
        };
        let text = match item.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (index, part) in parts.iter().enumerate() {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("input_text" | "output_text" | "text"), Some(piece)) => {
                            text.push_str(piece)
                        }
                        (kind, _) => {
                            return Err(Problem::invalid(
                                Some(format!("input[{at}].content[{index}]")),
                                format!(
                                    "a part of type `{}` is not taken here: text parts only",
                                    kind.unwrap_or("none")
                                ),
                            ));
                        }
                    }
                }
                text
            }
            _ => {
                return Err(refused(
                    "a message's `content` is a text or a list of text parts".to_owned(),
                ));
            }
        };
        kept.push((said, text));
    }
    let last = items.len().saturating_sub(1);
    Conversation::new(kept, || format!("input[{last}]"))
}

/// What the objects of one response share, and its output so far.
struct Answer {
    id: String,
    model: String,
    created_at: u64,
    previous_response_id: Option<String>,
    conversation: Option<String>,
    output: Vec<Value>,
}

impl Answer {
    /// The response object: in progress, or ended as the run of `outcome`
    /// did.
    fn object(&self, ended: Option<&RunOutcome>) -> Value {
        let (status, error, incomplete, usage) = match ended {
            None => ("in_progress", Value::Null, Value::Null, Value::Null),
            Some(outcome) => {
                let usage = usage(&outcome.usage());
                match status(outcome.end) {
                    "failed" => {
                        let message = outcome.error().unwrap_or("the run failed");
                        let error = json!({"code": "server_error", "message": message});
                        ("failed", error, Value::Null, usage)
                    }
                    "incomplete" => {
                        let incomplete = json!({"reason": named(outcome.end)});
                        ("incomplete", Value::Null, incomplete, usage)
                    }
                    status => (status, Value::Null, Value::Null, usage),
                }
            }
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": self.output,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": null,
            "metadata": {},
            "parallel_tool_calls": false,
            "previous_response_id": self.previous_response_id,
            "conversation": self.conversation.as_ref().map(|id| json!({"id": id})),
            "temperature": null,
            "tool_choice": "auto",
            "tools": [],
            "top_p": null,
            "store": true,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": usage,
        })
    }
}

/// The status of a response whose run ended as `end`.
fn status(end: RunEnd) -> &'static str {
    match end {
        RunEnd::Completed | RunEnd::StopCondition | RunEnd::ToolsTerminated => "completed",
        RunEnd::Error => "failed",
        _ => "incomplete",
    }
}

/// An output message item of `text`.
fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": if status == "completed" { json!([output_text(text)]) } else { json!([]) },
    })
}

/// The content part of an output message that holds `text`.
fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn usage(usage: &Usage) -> Value {
    let input = usage.input + usage.cache_read + usage.cache_write;
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": usage.cache_read},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + usage.output,
    })
}

/// A response stream as it reads the run's events: `response.created` and
/// `response.in_progress`, each text of an answer as a message item (added,
/// its part added, its deltas, done), and `response.completed`,
/// `response.incomplete` or `response.failed`.
struct Telling {
    answer: Answer,
    sequence: u64,
    /// The message item being written: its id and its text so far.
    item: Option<(String, String)>,
}

impl Telling {
    /// The event `kind` with `fields`, numbered.
    fn event(&mut self, out: &mut Vec<u8>, kind: &str, mut fields: Value) {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.push(b'\n');
        sse_data(out, &fields);
    }

    /// Closes the item being written, if one is.
    fn close_item(&mut self, out: &mut Vec<u8>) {
        let Some((id, text)) = self.item.take() else {
            return;
        };
        let index = self.answer.output.len();
        let at = json!({"item_id": id, "output_index": index, "content_index": 0});
        let mut done = at.clone();
        done["text"] = json!(text);
        done["logprobs"] = json!([]);
        self.event(out, "response.output_text.done", done);
        let mut part = at;
        part["part"] = output_text(&text);
        self.event(out, "response.content_part.done", part);
        let item = message_item(&id, &text, "completed");
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.answer.output.push(item);
    }
}

impl Speaker for Telling {
    fn open(&mut self, out: &mut Vec<u8>) {
        let response = self.answer.object(None);
        self.event(
            out,
            "response.created",
            json!({"response": response.clone()}),
        );
        self.event(out, "response.in_progress", json!({"response": response}));
    }

    fn step(&mut self, step: Step<'_>, out: &mut Vec<u8>) {
        match step {
            Step::Text(Block::Start) => {
                self.close_item(out);
                let id = format!("msg_{}", tiller::ai::new_id());
                let index = self.answer.output.len();
                let item = message_item(&id, "", "in_progress");
                self.event(
                    out,
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                );
                let part = output_text("");
                self.event(
                    out,
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                self.item = Some((id, String::new()));
            }
            Step::Text(Block::Delta(delta)) if !delta.is_empty() => {
                let Some((id, text)) = &mut self.item else {
                    return;
                };
                text.push_str(&delta);
                let fields = json!({
                    "item_id": id,
                    "output_index": self.answer.output.len(),
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": [],
                });
                self.event(out, "response.output_text.delta", fields);
            }
            Step::Text(Block::End) => self.close_item(out),
            Step::End(outcome) => {
                self.close_item(out);
                let kind = format!("response.{}", status(outcome.end));
                let response = self.answer.object(Some(&outcome));
                self.event(out, &kind, json!({"response": response}));
            }
            _ => {}
        }
    }

    fn cut(&mut self, out: &mut Vec<u8>) {
        self.close_item(out);
        let mut response = self.answer.object(None);
        response["status"] = json!("failed");
        response["error"] = json!({
            "code": "server_error",
            "message": "the stream was cut before the run ended: the server is closing, the client fell behind, or the agent stopped",
        });
        self.event(out, "response.failed", json!({"response": response}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_id_names_its_session() {
        let id = response_id("chat_1-ü");
        assert!(id.starts_with("resp_"));
        assert_eq!(session_of(&id).unwrap(), "chat_1-ü");
        for malformed in ["resp_", "resp_zz_1", "msg_00", "resp_a_1", "resp_ff_1"] {
            let refused = session_of(malformed).unwrap_err();
            assert_eq!(
                refused.field.as_deref(),
                Some("previous_response_id"),
                "{malformed}"
            );
        }
    }

    #[test]
    fn the_input_is_a_text_or_messages_ending_with_the_users() {
        let text = conversation(&Input::Text("hi".into())).unwrap();
        assert_eq!((text.prompt.as_str(), text.history.len()), ("hi", 0));
        let items: Vec<Value> = serde_json::from_value(json!([
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
            {"role": "user", "content": "Who?"},
        ]))
        .unwrap();
        let Conversation { history, prompt } = conversation(&Input::Items(items)).unwrap();
        assert_eq!(prompt, "Who?");
        assert_eq!(
            history,
            [
                (Said::User, "Hi".to_owned()),
                (Said::Assistant, "Hello.".to_owned())
            ]
        );
        let output: Vec<Value> = serde_json::from_value(json!([
            {"type": "function_call_output", "call_id": "c", "output": "42"},
        ]))
        .unwrap();
        assert_eq!(
            conversation(&Input::Items(output))
                .unwrap_err()
                .field
                .as_deref(),
            Some("input[0]")
        );
    }
}
