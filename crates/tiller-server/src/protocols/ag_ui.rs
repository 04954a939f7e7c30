//! AG-UI in front of Tiller's agents: `POST /ag-ui/{definition}` takes a
//! `RunAgentInput` and answers with the run as AG-UI events (server-sent
//! events, one JSON event each).
//!
//! The input's `threadId` is its session: the first run starts it (its
//! transcript the text of the messages before the last), the next ones
//! continue it, the last message, a user's, the prompt. A run that `resume`s
//! answers the interrupts the run before ended with instead (one entry each,
//! its `interruptId` the waiting call's id): `{"status": "resolved",
//! "payload": {"approved": true}}` approves a call, `{"approved": false,
//! "reason": …}` or `"status": "cancelled"` denies it, and `{"answer": …}` (or
//! a text payload) answers a tool's question. The runs of several answers are
//! told as one. A thread with none to answer is a 404.
//!
//! The events: `RUN_STARTED`; `STATE_SNAPSHOT`, the state the agent's tools
//! keep (its context's, as the session stores it); each answer's text as
//! `TEXT_MESSAGE_START`/`_CONTENT`/`_END` and its reasoning as `REASONING_*`;
//! its tool calls as `TOOL_CALL_START`/`_ARGS`/`_END` and what the agent's runs
//! of them gave as `TOOL_CALL_RESULT`; `STATE_DELTA` (a JSON Patch) when a
//! tool sets state; and `RUN_FINISHED`, its `outcome` `success`, `interrupt`
//! (a call waits for the user's approval, `reason: "approval"`, or asks a
//! question, `reason: "input"`, its `message`; every request still open, those
//! a `resume` left unanswered too), or `cancelled` (aborted, or paused between
//! two turns); or
//! `RUN_ERROR`, its `code` the run's end as Tiller names it (`error`,
//! `budget_exceeded`, `guardrail_tripped`, …; `stream_cut` when the stream
//! ends before the run: the server closing, the client too far behind, the
//! agent stopped). Whatever an aborted answer left open is ended first. The
//! client's `tools`, `context` and `state` are not read: the agent's own tools
//! and state stand.

use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tiller::run::{Reply, UserRequest};
use tiller::{AgentMessage, Op, RunEnd, ToolOutput};

use super::chat::SESSION_HEADER;
use super::{Asked, Block, Conversation, Said, Speaker, Step, named};
use crate::Shared;
use crate::error::{Problem, decode};
use crate::events::sse_data;

/// The most interrupts one run may answer.
pub(crate) const MAX_RESUMED: usize = 64;

/// What Tiller reads of a `RunAgentInput`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunAgentInput {
    thread_id: String,
    run_id: String,
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    resume: Vec<Resumed>,
}

/// An answer to an interrupt.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Resumed {
    interrupt_id: String,
    status: String,
    #[serde(default)]
    payload: Value,
}

/// `POST /ag-ui/{definition}`.
pub(crate) async fn run(
    State(shared): State<Arc<Shared>>,
    Path(definition): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    let input: RunAgentInput = decode(body)?;
    let replies = replies(&input.resume)?;
    let resuming = !replies.is_empty();
    let (history, prompt) = match resuming {
        false => {
            let Conversation { history, prompt } = conversation(&input.messages)?;
            (history, Some(prompt))
        }
        true => (Vec::new(), None),
    };
    // Only a thread that is there has interrupts to answer.
    let asked = Asked::Client {
        id: input.thread_id.clone(),
        field: "threadId",
        create: !resuming,
    };
    // The stream is counted before anything is made for it.
    let slot = shared.stream_slot(&caller)?;
    let (session, _) = shared
        .converse(&caller, asked, &definition, history)
        .await?;
    // What stays open once the answers are in: an interrupt still, as no
    // event of these runs says again.
    let mut interrupts = Vec::new();
    if resuming {
        let (state, _) = shared.state(&caller, &session).await?;
        let answered = |id: &str| replies.iter().any(|reply| reply.request_id() == id);
        interrupts = state
            .waiting
            .iter()
            .filter(|request| !answered(request.tool_call_id()))
            .map(interrupt_of)
            .collect();
    }
    let ops: Vec<Op> = match prompt {
        Some(prompt) => vec![Op::Prompt {
            messages: vec![AgentMessage::user(prompt)],
        }],
        None => replies.into_iter().map(Op::Reply).collect(),
    };
    let state = match shared.find_session(&caller, &session).await? {
        Some(info) => info
            .record
            .context
            .decode::<Kept>()
            .map(|kept| kept.states)
            .unwrap_or_default(),
        None => Map::new(),
    };
    let running = Running {
        thread_id: input.thread_id,
        run_id: input.run_id,
        state,
        messages: 0,
        open: None,
        calls: Vec::new(),
        interrupts,
        // Each answer but the last finishes a run that parks again while an
        // interrupt is open: one stream tells them all.
        ends_to_skip: ops.len() - 1,
    };
    let mut response = shared.speak(&caller, &session, slot, ops, running).await?;
    if let Ok(value) = HeaderValue::from_str(&session) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    Ok(response)
}

/// What of a session's stored context is read: its state.
#[derive(Deserialize)]
struct Kept {
    #[serde(default)]
    states: Map<String, Value>,
}

/// The replies the `resume` entries give.
fn replies(resume: &[Resumed]) -> Result<Vec<Reply>, Problem> {
    if resume.len() > MAX_RESUMED {
        return Err(Problem::invalid(
            Some("resume".to_owned()),
            format!("at most {MAX_RESUMED} interrupts are answered at once"),
        ));
    }
    resume
        .iter()
        .enumerate()
        .map(|(at, entry)| {
            let id = entry.interrupt_id.clone();
            let payload = &entry.payload;
            let reason = || payload.get("reason").and_then(Value::as_str).map(str::to_owned);
            match (entry.status.as_str(), payload) {
                ("cancelled", _) => Ok(Reply::deny(id, reason())),
                ("resolved", Value::String(answer)) => Ok(Reply::answer(id, answer.clone())),
                ("resolved", _) => {
                    if let Some(answer) = payload.get("answer").and_then(Value::as_str) {
                        return Ok(Reply::answer(id, answer));
                    }
                    match payload.get("approved").and_then(Value::as_bool) {
                        Some(true) => Ok(Reply::approve(id)),
                        Some(false) => Ok(Reply::deny(id, reason())),
                        None => Err(Problem::invalid(
                            Some(format!("resume[{at}].payload")),
                            "a resolved interrupt's payload is `{\"approved\": true|false}`, `{\"answer\": TEXT}` or a text",
                        )),
                    }
                }
                (status, _) => Err(Problem::invalid(
                    Some(format!("resume[{at}].status")),
                    format!("`{status}` is not a status: `resolved` or `cancelled`"),
                )),
            }
        })
        .collect()
}

/// The messages' texts: a user's content (a text, or parts of which the text
/// ones are read), an assistant's; other roles (tools', reasoning, activity)
/// are the agent's or the client's own and left out, as are system and
/// developer messages (the definition's instructions stand).
fn conversation(messages: &[Value]) -> Result<Conversation, Problem> {
    let mut kept = Vec::with_capacity(messages.len());
    for (at, message) in messages.iter().enumerate() {
        let said = match message.get("role").and_then(Value::as_str) {
            Some("user") => Said::User,
            Some("assistant") => Said::Assistant,
            _ => continue,
        };
        let text = match message.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (index, part) in parts.iter().enumerate() {
                    match part.get("type").and_then(Value::as_str) {
                        Some("text") => text
                            .push_str(part.get("text").and_then(Value::as_str).unwrap_or_default()),
                        kind => {
                            return Err(Problem::invalid(
                                Some(format!("messages[{at}].content[{index}]")),
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
            _ => String::new(),
        };
        kept.push((said, text));
    }
    let last = messages.len().saturating_sub(1);
    Conversation::new(kept, || format!("messages[{last}].role"))
}

/// An AG-UI run as it reads the agent's events.
struct Running {
    thread_id: String,
    run_id: String,
    /// The state before the run.
    state: Map<String, Value>,
    /// How many messages (texts, reasoning, results) were opened: each one's id
    /// is the run's id and its number.
    messages: u64,
    /// The text or reasoning message open: its id, and whether it is reasoning.
    open: Option<(String, bool)>,
    /// The calls of the answer being written, by block index: their ids, and
    /// whether they ended.
    calls: Vec<(usize, String, bool)>,
    /// What the run waits for when it parks.
    interrupts: Vec<Value>,
    /// How many of the runs' ends are not the stream's.
    ends_to_skip: usize,
}

impl Running {
    fn event(out: &mut Vec<u8>, kind: &str, mut fields: Value) {
        fields["type"] = json!(kind);
        sse_data(out, &fields);
    }

    fn new_message(&mut self) -> String {
        self.messages += 1;
        format!("{}-{}", self.run_id, self.messages)
    }
}

impl Speaker for Running {
    fn open(&mut self, out: &mut Vec<u8>) {
        let started = json!({"threadId": self.thread_id, "runId": self.run_id});
        Self::event(out, "RUN_STARTED", started);
        let snapshot = json!({"snapshot": std::mem::take(&mut self.state)});
        Self::event(out, "STATE_SNAPSHOT", snapshot);
    }

    fn step(&mut self, step: Step<'_>, out: &mut Vec<u8>) {
        match step {
            Step::AnswerStart => self.calls.clear(),
            Step::Text(Block::Start) => {
                let id = self.new_message();
                Self::event(
                    out,
                    "TEXT_MESSAGE_START",
                    json!({"messageId": id, "role": "assistant"}),
                );
                self.open = Some((id, false));
            }
            Step::Reasoning(Block::Start) => {
                let id = self.new_message();
                Self::event(out, "REASONING_START", json!({"messageId": id}));
                Self::event(
                    out,
                    "REASONING_MESSAGE_START",
                    json!({"messageId": id, "role": "reasoning"}),
                );
                self.open = Some((id, true));
            }
            Step::Text(Block::Delta(delta)) | Step::Reasoning(Block::Delta(delta)) => {
                if let Some((id, reasoning)) = &self.open
                    && !delta.is_empty()
                {
                    let kind = match reasoning {
                        true => "REASONING_MESSAGE_CONTENT",
                        false => "TEXT_MESSAGE_CONTENT",
                    };
                    Self::event(out, kind, json!({"messageId": id, "delta": delta}));
                }
            }
            Step::Text(Block::End) | Step::Reasoning(Block::End) => self.end_message(out),
            Step::CallStart { index, id, name } => {
                Self::event(
                    out,
                    "TOOL_CALL_START",
                    json!({"toolCallId": id, "toolCallName": name}),
                );
                self.calls.push((index, id.into_owned(), false));
            }
            Step::CallDelta { index, delta } => {
                if let Some((_, id, _)) = self.calls.iter().find(|(at, ..)| *at == index)
                    && !delta.is_empty()
                {
                    Self::event(
                        out,
                        "TOOL_CALL_ARGS",
                        json!({"toolCallId": id, "delta": delta}),
                    );
                }
            }
            Step::CallEnd { id, .. } => {
                if let Some(call) = self.calls.iter_mut().find(|(_, open, _)| *open == id) {
                    call.2 = true;
                }
                Self::event(out, "TOOL_CALL_END", json!({"toolCallId": id}));
            }
            Step::ToolEnd { id, output, .. } => {
                let message = self.new_message();
                let content = ToolOutput::text_content(&output);
                Self::event(
                    out,
                    "TOOL_CALL_RESULT",
                    json!({"messageId": message, "toolCallId": id, "content": content, "role": "tool"}),
                );
            }
            Step::State(changed) => {
                let delta: Vec<Value> = changed
                    .into_iter()
                    .map(|(name, value)| json!({"op": "add", "path": pointer(&name), "value": value}))
                    .collect();
                Self::event(out, "STATE_DELTA", json!({"delta": delta}));
            }
            Step::Request(request) => self.interrupts.push(interrupt_of(&request)),
            Step::End(_) if self.ends_to_skip > 0 => self.ends_to_skip -= 1,
            Step::End(ended) => {
                self.close_open(out);
                let outcome = match ended.end {
                    RunEnd::Completed | RunEnd::StopCondition | RunEnd::ToolsTerminated => {
                        json!({"type": "success"})
                    }
                    RunEnd::Parked => {
                        json!({"type": "interrupt", "interrupts": std::mem::take(&mut self.interrupts)})
                    }
                    // Stopped before it was done, and nothing waited for.
                    RunEnd::Aborted | RunEnd::Paused => json!({"type": "cancelled"}),
                    end => {
                        let message = ended.error().map_or_else(
                            || format!("the run ended: {}", named(end)),
                            str::to_owned,
                        );
                        Self::event(
                            out,
                            "RUN_ERROR",
                            json!({"message": message, "code": named(end)}),
                        );
                        return;
                    }
                };
                let finished = json!({
                    "threadId": self.thread_id,
                    "runId": self.run_id,
                    "outcome": outcome,
                    "result": {"end": named(ended.end)},
                });
                Self::event(out, "RUN_FINISHED", finished);
            }
        }
    }

    fn is_last(&self, step: &Step<'_>) -> bool {
        matches!(step, Step::End(_)) && self.ends_to_skip == 0
    }

    fn cut(&mut self, out: &mut Vec<u8>) {
        self.close_open(out);
        let error = json!({
            "message": "the stream was cut before the run ended: the server is closing, the client fell behind, or the agent stopped",
            "code": "stream_cut",
        });
        Self::event(out, "RUN_ERROR", error);
    }
}

impl Running {
    /// Ends the text or reasoning message open, if one is.
    fn end_message(&mut self, out: &mut Vec<u8>) {
        match self.open.take() {
            Some((id, false)) => Self::event(out, "TEXT_MESSAGE_END", json!({"messageId": id})),
            Some((id, true)) => {
                Self::event(out, "REASONING_MESSAGE_END", json!({"messageId": id}));
                Self::event(out, "REASONING_END", json!({"messageId": id}));
            }
            None => {}
        }
    }

    /// Ends what an aborted answer left open: its message, its reasoning, its
    /// calls (an AG-UI run ends with none open).
    fn close_open(&mut self, out: &mut Vec<u8>) {
        self.end_message(out);
        for (_, id, ended) in self.calls.drain(..) {
            if !ended {
                Self::event(out, "TOOL_CALL_END", json!({"toolCallId": id}));
            }
        }
    }
}

/// The interrupt of an open request: its id is the waiting call's.
fn interrupt_of(request: &UserRequest) -> Value {
    match request {
        UserRequest::Approval {
            tool_call_id,
            tool_name,
            args,
            reason,
        } => json!({
            "id": tool_call_id,
            "reason": "approval",
            "message": reason.clone().unwrap_or_else(|| format!("`{tool_name}` waits for approval")),
            "toolCallId": tool_call_id,
            "metadata": {"toolName": tool_name, "args": args},
        }),
        UserRequest::Input {
            tool_call_id,
            tool_name,
            field,
            question,
            ..
        } => json!({
            "id": tool_call_id,
            "reason": "input",
            "message": question,
            "toolCallId": tool_call_id,
            "metadata": {"toolName": tool_name, "field": field},
        }),
    }
}

/// The JSON Pointer to the member `name` of the state.
fn pointer(name: &str) -> String {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::Read;

    fn resumed(value: Value) -> Vec<Resumed> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn resume_entries_are_replies() {
        let replies = replies(&resumed(json!([
            {"interruptId": "a", "status": "resolved", "payload": {"approved": true}},
            {"interruptId": "b", "status": "resolved", "payload": {"approved": false, "reason": "no"}},
            {"interruptId": "c", "status": "cancelled"},
            {"interruptId": "d", "status": "resolved", "payload": {"answer": "blue"}},
            {"interruptId": "e", "status": "resolved", "payload": "green"},
        ])))
        .unwrap();
        assert_eq!(
            replies,
            [
                Reply::approve("a"),
                Reply::deny("b", Some("no".into())),
                Reply::deny("c", None),
                Reply::answer("d", "blue"),
                Reply::answer("e", "green"),
            ]
        );
        let unread = super::replies(&resumed(
            json!([{"interruptId": "a", "status": "resolved", "payload": {}}]),
        ));
        assert_eq!(
            unread.unwrap_err().field.as_deref(),
            Some("resume[0].payload")
        );
        let status = super::replies(&resumed(json!([{"interruptId": "a", "status": "maybe"}])));
        assert_eq!(
            status.unwrap_err().field.as_deref(),
            Some("resume[0].status")
        );
    }

    #[test]
    fn the_state_a_tools_result_sets_is_a_state_delta() {
        let json = br#"{"agent_id":"a","seq":7,"event":{"type":"message_end","message":{"role":"tool_result","tool_call_id":"c","tool_name":"count","content":[],"is_error":false,"timestamp":0,"state":{"counter":{"n":2},"a/b~c":1}}}}"#;
        let Some(Read::Step(step)) = Read::of(json) else {
            panic!("a tool result's end is a step");
        };
        let mut running = Running {
            thread_id: "t".into(),
            run_id: "r".into(),
            state: Map::new(),
            messages: 0,
            open: None,
            calls: Vec::new(),
            interrupts: Vec::new(),
            ends_to_skip: 0,
        };
        let mut out = Vec::new();
        running.step(step, &mut out);
        let data = String::from_utf8(out).unwrap();
        let event: Value =
            serde_json::from_str(data.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(
            event,
            json!({"type": "STATE_DELTA", "delta": [
                {"op": "add", "path": "/a~1b~0c", "value": 1},
                {"op": "add", "path": "/counter", "value": {"n": 2}},
            ]})
        );
    }
}
