//! The OpenAI API's chat completions in front of Tiller's agents, for clients
//! that already speak it (the `openai` packages, most chat UIs and agent tools):
//! `GET /v1/models` lists the caller's definitions as models, and
//! `POST /v1/chat/completions` runs the definition its `model` names.
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
//! the usage when `stream_options.include_usage` asks, and `data: [DONE]`.
//! Refusals are OpenAI's error objects, with Tiller's problem kind as `code`.

use std::borrow::Cow;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tiller::agents::DefinitionsError;
use tiller::ai::{
    AssistantContent, AssistantMessage, Message, Model, StopReason, TextContent, Usage,
};
use tiller::wire::Updates;
use tiller::{AgentMessage, Envelope, Op, RunEnd, RunOutcome};

use crate::Shared;
use crate::agents::check_client_id;
use crate::error::{Problem, SaidInJson, as_problem, decode};
use crate::events::event_stream;
use crate::reach::Origin;
use crate::shutdown::until_closing;
use crate::tenants::Caller;

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

/// `GET /v1/models`: the definitions the caller may run, as models.
pub(crate) async fn models(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<Value>, OpenAiError> {
    shared.caller(&headers)?;
    let data: Vec<Value> = shared
        .definitions
        .iter()
        .map(|file| json!({"id": file.name, "object": "model", "created": 0, "owned_by": "tiller"}))
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiError> {
    let caller = shared.caller(&headers)?;
    let request: ChatRequest = decode(body)?;
    let (history, prompt) = conversation(&request.messages)?;
    let session = session_of(&shared, &caller, &headers, &request.model, history).await?;
    let op = Op::Prompt {
        messages: vec![AgentMessage::user(prompt)],
    };
    let mut response = if request.stream {
        // Counted with the caller's other event streams, while it lasts.
        let slot = shared.stream_slot(&caller)?;
        // Followed before the prompt: nothing of the run is missed.
        let events = shared
            .events_of(&caller, &session, None, Updates::Lean)
            .await?;
        shared
            .submit(&caller, &headers, &session, || Ok(op))
            .await?;
        let usage = request
            .stream_options
            .is_some_and(|options| options.include_usage);
        let chunks = chunks(
            until_closing(events, &shared.closing),
            Completion::new(&request.model),
            usage,
        )
        .map(move |chunk| {
            let _ = &slot;
            chunk
        });
        event_stream(chunks, shared.config.keep_alive)
    } else {
        let outcome = shared.run(&caller, &headers, &session, op).await?;
        Json(Completion::new(&request.model).whole(&outcome)).into_response()
    };
    if let Ok(value) = HeaderValue::from_str(&session) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    Ok(response)
}

/// A message of the transcript a request starts a session with: whether it is
/// the assistant's, and its text.
type Turn = (bool, String);

/// The request's messages before the last, as a transcript, and the last, the
/// prompt: a user's text.
fn conversation(messages: &[ChatMessage]) -> Result<(Vec<Turn>, String), Problem> {
    let Some((last, before)) = messages.split_last() else {
        return Err(Problem::invalid(
            Some("messages".to_owned()),
            "`messages` must end with a user's message",
        ));
    };
    if last.role != "user" {
        return Err(Problem::invalid(
            Some(format!("messages[{}].role", before.len())),
            "the last message must be the user's (`role: user`)",
        ));
    }
    let prompt = last.content.text(before.len())?;
    let mut history = Vec::with_capacity(before.len());
    for (at, message) in before.iter().enumerate() {
        let text = message.content.text(at)?;
        match message.role.as_str() {
            "user" => history.push((false, text)),
            "assistant" => history.push((true, text)),
            // The definition's instructions stand.
            "system" | "developer" => {}
            role => {
                return Err(Problem::invalid(
                    Some(format!("messages[{at}].role")),
                    format!(
                        "a `{role}` message is not taken: the agent runs its own tools (user, assistant and system messages only)"
                    ),
                ));
            }
        }
    }
    Ok((history, prompt))
}

/// The session the request continues (its `X-Tiller-Session`, when the caller
/// may reach it), or a new one of the definition `model`, its transcript
/// `history`.
async fn session_of(
    shared: &Shared,
    caller: &Caller,
    headers: &HeaderMap,
    model: &str,
    history: Vec<Turn>,
) -> Result<String, Problem> {
    let named = match headers.get(SESSION_HEADER) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .filter(|id| !id.is_empty())
                .ok_or_else(|| {
                    Problem::invalid(
                        Some("X-Tiller-Session".to_owned()),
                        "a session id is visible text",
                    )
                })?
                .to_owned(),
        ),
    };
    if let Some(id) = &named
        && shared.reach(caller, id).await.is_ok()
    {
        return Ok(id.clone());
    }
    if let Some(id) = &named {
        if caller.tenant.is_some() {
            // Ids are one namespace for every tenant: a client names only its own.
            return Err(Problem::unknown_agent(id));
        }
        check_client_id(id, "X-Tiller-Session")?;
    }
    let spec = match shared.definitions.spec(model, None) {
        Ok(spec) => spec,
        Err(DefinitionsError::Unknown { .. }) => {
            return Err(Problem::new(
                StatusCode::NOT_FOUND,
                "unknown-model",
                format!("no definition is named `{model}` (`GET /v1/models` lists them)"),
            ));
        }
        Err(error) => return Err(error.into()),
    };
    let answered_by =
        (spec.settings.definition.model.clone()).unwrap_or_else(tiller::faux::demo_model);
    let history = history
        .into_iter()
        .map(|(assistant, text)| transcribed(assistant, text, &answered_by))
        .collect();
    let spec = spec.with_messages(history);
    let origin = Origin {
        definition: Some(model.to_owned()),
        version: None,
        inline: None,
        context: caller.context.ids().clone(),
    };
    let spec = spec.with_context(caller.context.clone());
    let spec = match named {
        Some(id) => spec.with_id(id),
        None => spec,
    };
    let agent = shared.spawn(spec, caller.scope(), &origin).await?;
    Ok(agent.id.to_string())
}

/// A message of a request's conversation as the transcript holds it: the
/// assistant's as answered by `model`.
fn transcribed(assistant: bool, text: String, model: &Model) -> AgentMessage {
    if !assistant {
        return AgentMessage::user(text);
    }
    AgentMessage::Llm(Message::Assistant(Box::new(AssistantMessage {
        content: vec![AssistantContent::Text(TextContent::new(text))],
        ..AssistantMessage::empty(model)
    })))
}

/// What every object of one completion shares.
struct Completion {
    id: String,
    model: String,
    created: u64,
}

impl Completion {
    fn new(model: &str) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        Completion {
            id: format!("chatcmpl-{}", tiller::ai::new_id()),
            model: model.to_owned(),
            created,
        }
    }

    /// The `chat.completion` of a run that ended with `outcome`.
    fn whole(&self, outcome: &RunOutcome) -> Value {
        let text = outcome
            .messages
            .iter()
            .filter_map(AgentMessage::as_assistant)
            .map(AssistantMessage::text)
            .filter(|text| !text.is_empty())
            .collect::<Vec<_>>()
            .join("\n\n");
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason(outcome.end, outcome.stop_reason()),
            }],
            "usage": usage(&outcome.usage()),
        })
    }

    /// A `chat.completion.chunk` of `delta`, with `finish` when it is the last.
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Bytes {
        self.object(
            json!([{"index": 0, "delta": delta, "finish_reason": finish}]),
            None,
        )
    }

    /// The chunk with the run's usage and no choices.
    fn usage_chunk(&self, usage: &Usage) -> Bytes {
        self.object(json!([]), Some(self::usage(usage)))
    }

    /// A chunk of `choices`, with `usage` when given, as a server-sent event.
    fn object(&self, choices: Value, usage: Option<Value>) -> Bytes {
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
        sse_data(&chunk)
    }
}

fn sse_data(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
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
        end => serde_json::to_value(end)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_else(|| "stop".to_owned()),
    }
}

/// What of a lean event a completion stream reads.
#[derive(Deserialize)]
struct Lean<'a> {
    #[serde(borrow)]
    event: LeanEvent<'a>,
}

#[derive(Deserialize)]
struct LeanEvent<'a> {
    #[serde(rename = "type")]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    assistant_message_event: Option<Piece<'a>>,
    #[serde(default)]
    reason: Option<RunEnd>,
    #[serde(default)]
    messages: Option<Vec<AgentMessage>>,
}

#[derive(Deserialize)]
struct Piece<'a> {
    #[serde(rename = "type")]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    delta: Option<Cow<'a, str>>,
}

/// The completion's chunks from the agent's lean `frames`, up to the run's
/// end: the role first, each text piece, the finish, the usage if asked, and
/// `[DONE]`.
fn chunks(
    frames: impl Stream<Item = tiller::wire::Frame> + Send + 'static,
    completion: Completion,
    include_usage: bool,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let opening = completion.chunk(json!({"role": "assistant", "content": ""}), None);
    let reading = Reading {
        completion,
        include_usage,
        wrote: false,
        new_message: false,
        ended: false,
    };
    let pieces = futures::stream::unfold(
        (Box::pin(frames), reading),
        |(mut frames, mut reading)| async move {
            while !reading.ended {
                let frame = frames.next().await?;
                if let Some(bytes) = reading.chunk_of(&frame.json()) {
                    return Some((bytes, (frames, reading)));
                }
            }
            None
        },
    );
    futures::stream::once(std::future::ready(opening)).chain(pieces)
}

/// A completion stream as it reads the run's events.
struct Reading {
    completion: Completion,
    include_usage: bool,
    /// Whether any text went out.
    wrote: bool,
    /// Whether a message started since the last text.
    new_message: bool,
    /// Whether the run ended.
    ended: bool,
}

impl Reading {
    /// What the event `json` adds to the stream, if anything.
    fn chunk_of(&mut self, json: &[u8]) -> Option<Bytes> {
        // Most events say nothing here: read no further than their type.
        let kind = Envelope::type_in(std::str::from_utf8(json).ok()?);
        if !matches!(kind, "message_start" | "message_update" | "agent_end") {
            return None;
        }
        let Lean { event } = serde_json::from_slice(json).ok()?;
        match event.kind.as_ref() {
            "message_start" => {
                self.new_message = true;
                None
            }
            "message_update" => {
                let piece = event.assistant_message_event?;
                let delta = piece
                    .delta
                    .filter(|delta| piece.kind == "text_delta" && !delta.is_empty())?;
                // The texts of the run's answers, a blank line apart.
                let text = if self.new_message && self.wrote {
                    format!("\n\n{delta}")
                } else {
                    delta.into_owned()
                };
                self.new_message = false;
                self.wrote = true;
                Some(self.completion.chunk(json!({"content": text}), None))
            }
            "agent_end" => {
                self.ended = true;
                let messages = event.messages.unwrap_or_default();
                let answers = || messages.iter().filter_map(AgentMessage::as_assistant);
                let stop = answers().next_back().map(|answer| answer.stop_reason);
                let reason = finish_reason(event.reason.unwrap_or(RunEnd::Error), stop);
                let mut last = self.completion.chunk(json!({}), Some(&reason)).to_vec();
                if self.include_usage {
                    let mut total = Usage::default();
                    for answer in answers() {
                        total += answer.usage;
                    }
                    last.extend_from_slice(&self.completion.usage_chunk(&total));
                }
                last.extend_from_slice(b"data: [DONE]\n\n");
                Some(Bytes::from(last))
            }
            _ => None,
        }
    }
}

/// A refusal in the OpenAI API's form: `{"error": {message, type, param,
/// code}}`, with the problem's status.
pub(crate) struct OpenAiError(Problem);

impl From<Problem> for OpenAiError {
    fn from(problem: Problem) -> Self {
        OpenAiError(problem)
    }
}

impl OpenAiError {
    /// `response` with any refusal in it said as an OpenAI error object: the
    /// problems the middleware answers with (a full queue, a body too large, a
    /// server shutting down), and a plain-text refusal.
    pub(crate) async fn reworded(response: Response) -> Response {
        let response = as_problem(response).await;
        match response.extensions().get::<Problem>() {
            Some(problem) => OpenAiError(problem.clone()).into_response(),
            None => response,
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let Problem {
            kind,
            status,
            detail,
            field,
            ..
        } = self.0;
        let code = kind.rsplit(':').next().unwrap_or_default().to_owned();
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let error =
            json!({"error": {"message": detail, "type": kind, "param": field, "code": code}});
        let mut response = (status, Json(error)).into_response();
        response.extensions_mut().insert(SaidInJson);
        response
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
        let (history, prompt) = conversation(&[
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
        let assistant: Vec<bool> = history.iter().map(|(assistant, _)| *assistant).collect();
        assert_eq!(assistant, [false, true]);
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
