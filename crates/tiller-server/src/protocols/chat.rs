//! The OpenAI API's chat completions in front of Tiller's agents, for clients
//! that already speak it (the `openai` packages, most chat UIs and agent
//! tools): `POST /v1/chat/completions` runs the definition its `model` names.
//!
//! A request without an `X-Tiller-Session` header starts a session (an agent of
//! that definition) whose transcript is the request's messages before the last,
//! and whose prompt is the last, a user's; a request with the header continues
//! that session, its last user message the prompt (the session holds the rest;
//! its own definition answers, whatever `model` says).
//! Every answer names its session in `X-Tiller-Session`. The agent runs its own
//! tools: what it writes (in every turn of the run) is the answer's text, never a
//! client tool call. `finish_reason` is `stop` (or `length`), else the run's end
//! as Tiller names it: `parked` when a tool call waits for the user's approval or
//! answer (given through Tiller's own `POST /agents/{id}/reply`),
//! `budget_exceeded`, `guardrail_tripped`, `error`, …
//!
//! A stream (`"stream": true`) is the agent's lean event stream mapped as it
//! comes: each text piece a `chat.completion.chunk`, then one with the finish,
//! the usage when `stream_options.include_usage` asks, and `data: [DONE]`; a
//! stream cut before the run ended (the server closing, the client too far
//! behind, the agent stopped) finishes with `error`.
//! Refusals are OpenAI's error objects, with Tiller's problem kind as `code`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tiller::ai::{AssistantMessage, StopReason, Usage};
use tiller::{AgentMessage, Op, RunEnd, RunOutcome};

use super::openai::OpenAiError;
use super::{Asked, Block, Conversation, DONE, Said, Speaker, Step, answers, named, now_secs};
use crate::Shared;
use crate::error::{Problem, decode};
use crate::events::sse_data;

/// The header that names a session to continue, and names the one an answer
/// belongs to.
pub(crate) const SESSION_HEADER: &str = "x-tiller-session";

/// `POST /v1/chat/completions`'s body: what Tiller reads of it (other fields
/// are taken and left unused).
#[derive(Debug, Deserialize)]
struct ChatRequest {
    /// The definition to run.
    model: String,
    /// The conversation, the last a user's message.
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<ChatStreamOptions>,
}

#[derive(Debug, Deserialize)]
struct ChatStreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// One message of a request.
#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: ChatContent,
}

/// A message's content: a text, or parts of which the text ones are read.
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
enum ChatContent {
    #[default]
    None,
    Text(String),
    Parts(Vec<ChatPart>),
}

#[derive(Debug, Deserialize)]
struct ChatPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

impl ChatContent {
    /// Its text, or why it has none Tiller can read.
    fn text(&self, at: usize) -> Result<String, Problem> {
        match self {
            ChatContent::None => Ok(String::new()),
            ChatContent::Text(text) => Ok(text.clone()),
            ChatContent::Parts(parts) => parts
                .iter()
                .enumerate()
                .map(|(index, part)| match (part.kind.as_str(), &part.text) {
                    ("text", Some(text)) => Ok(text.as_str()),
                    (kind, _) => Err(Problem::invalid(
                        Some(format!("messages[{at}].content[{index}]")),
                        format!("a part of type `{kind}` is not taken here: text parts only"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|texts| texts.concat()),
        }
    }
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiError> {
    let caller = shared.caller(&headers)?;
    let request: ChatRequest = decode(body)?;
    let Conversation { history, prompt } = conversation(&request.messages)?;
    let asked = match named_session(&headers)? {
        Some(id) => Asked::Named {
            id,
            field: "X-Tiller-Session",
        },
        None => Asked::New,
    };
    // A stream is counted before anything is made for it.
    let slot = match request.stream {
        true => Some(shared.stream_slot(&caller)?),
        false => None,
    };
    let (session, _) = shared
        .converse(&caller, asked, &request.model, history)
        .await?;
    let op = Op::Prompt {
        messages: vec![AgentMessage::user(prompt)],
    };
    let completion = Completion::new(&request.model);
    let mut response = match slot {
        Some(slot) => {
            let include_usage = request
                .stream_options
                .is_some_and(|options| options.include_usage);
            let reading = Reading {
                completion,
                include_usage,
                wrote: false,
                new_message: false,
            };
            shared
                .speak(&caller, &session, slot, vec![op], reading)
                .await?
        }
        None => {
            let outcome = shared.run(&caller, &headers, &session, op).await?;
            Json(completion.whole(&outcome)).into_response()
        }
    };
    if let Ok(value) = HeaderValue::from_str(&session) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    Ok(response)
}

/// The session `X-Tiller-Session` names, if it names one.
fn named_session(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let Some(value) = headers.get(SESSION_HEADER) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .filter(|id| !id.is_empty())
        .map(|id| Some(id.to_owned()))
        .ok_or_else(|| {
            Problem::invalid(
                Some("X-Tiller-Session".to_owned()),
                "a session id is visible text",
            )
        })
}

/// The request's messages: system and developer messages are left out (the
/// definition's instructions stand), and a tool's is refused (the agent runs
/// its own tools).
fn conversation(messages: &[ChatMessage]) -> Result<Conversation, Problem> {
    let mut kept = Vec::with_capacity(messages.len());
    for (at, message) in messages.iter().enumerate() {
        let said = match message.role.as_str() {
            "user" => Said::User,
            "assistant" => Said::Assistant,
            "system" | "developer" => continue,
            role => {
                return Err(Problem::invalid(
                    Some(format!("messages[{at}].role")),
                    format!(
                        "a `{role}` message is not taken: the agent runs its own tools (user, assistant and system messages only)"
                    ),
                ));
            }
        };
        kept.push((said, message.content.text(at)?));
    }
    let last = messages.len().saturating_sub(1);
    Conversation::new(kept, || match messages.is_empty() {
        true => "messages".to_owned(),
        false => format!("messages[{last}].role"),
    })
}

/// The texts of the answers among a run's `messages`, a blank line apart.
fn answered(messages: &[AgentMessage]) -> String {
    answers(messages)
        .map(AssistantMessage::text)
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// What every object of one completion shares.
struct Completion {
    id: String,
    model: String,
    created: u64,
}

impl Completion {
    fn new(model: &str) -> Self {
        Completion {
            id: format!("chatcmpl-{}", tiller::ai::new_id()),
            model: model.to_owned(),
            created: now_secs(),
        }
    }

    /// The `chat.completion` of a run that ended with `outcome`.
    fn whole(&self, outcome: &RunOutcome) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": answered(&outcome.messages)},
                "finish_reason": finish_reason(outcome.end, outcome.stop_reason()),
            }],
            "usage": usage(&outcome.usage()),
        })
    }

    /// A `chat.completion.chunk` of `delta`, with `finish` when it is the last.
    fn chunk(&self, out: &mut Vec<u8>, delta: Value, finish: Option<&str>) {
        self.object(
            out,
            json!([{"index": 0, "delta": delta, "finish_reason": finish}]),
            None,
        );
    }

    /// A chunk of `choices`, with `usage` when given, as a server-sent event.
    fn object(&self, out: &mut Vec<u8>, choices: Value, usage: Option<Value>) {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        sse_data(out, &chunk);
    }
}

fn usage(usage: &Usage) -> Value {
    let prompt = usage.input + usage.cache_read + usage.cache_write;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
    })
}

/// `finish_reason` for a run that ended as `end`, its last answer stopping for
/// `stop`.
fn finish_reason(end: RunEnd, stop: Option<StopReason>) -> String {
    match end {
        RunEnd::Completed if stop == Some(StopReason::Length) => "length".to_owned(),
        RunEnd::Completed | RunEnd::StopCondition | RunEnd::ToolsTerminated => "stop".to_owned(),
        end => named(end),
    }
}

/// A completion stream as it reads the run's events: the role first, each
/// text piece, the finish, the usage if asked, and `[DONE]`.
struct Reading {
    completion: Completion,
    include_usage: bool,
    /// Whether any text went out.
    wrote: bool,
    /// Whether an answer started since the last text.
    new_message: bool,
}

impl Speaker for Reading {
    fn open(&mut self, out: &mut Vec<u8>) {
        let role = json!({"role": "assistant", "content": ""});
        self.completion.chunk(out, role, None);
    }

    fn step(&mut self, step: Step<'_>, out: &mut Vec<u8>) {
        match step {
            Step::AnswerStart => self.new_message = true,
            Step::Text(Block::Delta(delta)) if !delta.is_empty() => {
                // The texts of the run's answers, a blank line apart.
                let text = match self.new_message && self.wrote {
                    true => format!("\n\n{delta}"),
                    false => delta.into_owned(),
                };
                self.new_message = false;
                self.wrote = true;
                self.completion.chunk(out, json!({"content": text}), None);
            }
            Step::End(outcome) => {
                let finish = finish_reason(outcome.end, outcome.stop_reason());
                self.completion.chunk(out, json!({}), Some(&finish));
                if self.include_usage {
                    let spent = usage(&outcome.usage());
                    self.completion.object(out, json!([]), Some(spent));
                }
                out.extend_from_slice(DONE);
            }
            _ => {}
        }
    }

    fn cut(&mut self, out: &mut Vec<u8>) {
        self.completion.chunk(out, json!({}), Some("error"));
        out.extend_from_slice(DONE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: Value) -> ChatMessage {
        serde_json::from_value(json!({"role": role, "content": content})).unwrap()
    }

    #[test]
    fn the_last_users_message_is_the_prompt_and_the_rest_the_transcript() {
        let Conversation { history, prompt } = conversation(&[
            message("system", json!("Be brief.")),
            message("user", json!("Hi")),
            message("assistant", json!("Hello.")),
            message(
                "user",
                json!([{"type": "text", "text": "Who "}, {"type": "text", "text": "are you?"}]),
            ),
        ])
        .unwrap();
        assert_eq!(prompt, "Who are you?");
        let said: Vec<Said> = history.iter().map(|(said, _)| *said).collect();
        assert_eq!(said, [Said::User, Said::Assistant]);
    }

    #[test]
    fn a_conversation_not_ending_with_the_user_or_with_a_tool_message_is_refused() {
        let ends_with_assistant = conversation(&[message("assistant", json!("Hello."))]);
        assert_eq!(
            ends_with_assistant.unwrap_err().field.as_deref(),
            Some("messages[0].role")
        );
        let tool = conversation(&[message("tool", json!("42")), message("user", json!("So?"))]);
        assert_eq!(tool.unwrap_err().field.as_deref(), Some("messages[0].role"));
        let image = conversation(&[message("user", json!([{"type": "image_url"}]))]);
        assert_eq!(
            image.unwrap_err().field.as_deref(),
            Some("messages[0].content[0]")
        );
        assert!(conversation(&[]).is_err());
    }

    #[test]
    fn a_finish_names_the_runs_end_where_openai_has_no_word_for_it() {
        assert_eq!(
            finish_reason(RunEnd::Completed, Some(StopReason::Stop)),
            "stop"
        );
        assert_eq!(
            finish_reason(RunEnd::Completed, Some(StopReason::Length)),
            "length"
        );
        assert_eq!(finish_reason(RunEnd::Parked, None), "parked");
        assert_eq!(
            finish_reason(RunEnd::BudgetExceeded, None),
            "budget_exceeded"
        );
    }
}
