//! Runs that wait for the user: a tool that needs input, a call that needs approval.
//!
//! A tool that answers [`ToolError::NeedsInput`](crate::ToolError::NeedsInput), or a
//! call whose [`Approval`] says to ask, gets no result yet. The run records a
//! [`UserRequest`] in the transcript (a custom message of kind `input_request` or
//! `approval_request`, which the model never sees), emits `input_requested` or
//! `approval_requested`, lets the turn's other calls finish and ends with
//! [`RunEnd::Parked`](crate::RunEnd::Parked). Being part of the transcript, a request
//! is exactly as durable as the messages around it.
//!
//! A run started with [`Prompt::Reply`](crate::Prompt::Reply) resolves the open
//! request the reply names by its `request_id` (the call's id,
//! [`UserRequest::tool_call_id`]), whatever order several were asked in:
//! - an [`Reply::Answer`] goes into the waiting call's arguments, under the field
//!   the tool asked for, and the call runs again at once, with no model turn
//!   (its arguments checked, its approval asked again if its tool's policy asks);
//!   an `input_answered` custom message `{tool_call_id, field, answer}` is
//!   committed first, so that after a crash the call is answered "interrupted"
//!   rather than asked again. With [`Answers::ToModel`] (or arguments that are
//!   not an object) the answer becomes the call's result instead, holding the
//!   question and the answer, and the model (called next) issues the call again;
//! - [`Reply::Approve`] runs the call as the model made it (a tool that asked for
//!   approval itself runs again and finds [`ToolContext::approved`](crate::ToolContext::approved) set);
//! - [`Reply::Deny`] answers it with an error result.
//!
//! When other requests of the same turn are still open the run parks again;
//! otherwise it goes on as after any tool round.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tiller_ai::{ToolCall, ToolResultMessage};

use crate::message::{AgentMessage, CustomMessage};

/// The custom message kind of a request for input.
pub const INPUT_REQUEST: &str = "input_request";
/// The custom message kind of a request for approval.
pub const APPROVAL_REQUEST: &str = "approval_request";
/// The custom message kind of an approval given: `{"tool_call_id": …}`, written
/// (and committed) before the approved call runs, so that a call whose tool may
/// have started is never taken for one still waiting.
pub const APPROVAL_GRANTED: &str = "approval_granted";
/// The custom message kind of an answer merged into its call:
/// `{"tool_call_id": …, "field": …, "answer": …}`, committed before the call
/// runs again, for the same reason.
pub const INPUT_ANSWERED: &str = "input_answered";

/// Where the user's answer to a tool's question goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answers {
    /// Into the waiting call's arguments, under the field asked for; the call
    /// runs again at once, without a model turn.
    #[default]
    ToTool,
    /// To the model, as the call's result; the model decides what to call next.
    ToModel,
}

/// What a parked call waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum UserRequest {
    /// The tool asked for something only the user knows.
    Input {
        /// The call waiting.
        tool_call_id: String,
        /// Its tool.
        tool_name: String,
        /// The argument that is missing or unclear.
        field: String,
        /// What to ask the user.
        question: String,
        /// The call's arguments when it asked (answers merged so far included),
        /// for an interface to show what is known.
        #[serde(default, skip_serializing_if = "Value::is_null")]
        current_data: Value,
    },
    /// The call waits for the user's approval before it runs (or, with a
    /// `reason`, before it goes on: the tool asked).
    Approval {
        /// The call waiting.
        tool_call_id: String,
        /// Its tool.
        tool_name: String,
        /// The arguments it would run with.
        args: Value,
        /// What the tool wants approved, when the tool itself asked
        /// ([`ToolError::NeedsApproval`](crate::ToolError::NeedsApproval)).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl UserRequest {
    /// The call waiting.
    pub fn tool_call_id(&self) -> &str {
        match self {
            UserRequest::Input { tool_call_id, .. }
            | UserRequest::Approval { tool_call_id, .. } => tool_call_id,
        }
    }

    /// The request in brief, for messages to people: what the tool asks, or
    /// that it needs approval.
    pub fn describe(&self) -> String {
        match self {
            UserRequest::Input {
                tool_name,
                question,
                ..
            } => format!("`{tool_name}` asks: {question}"),
            UserRequest::Approval { tool_name, .. } => format!("`{tool_name}` needs approval"),
        }
    }

    /// The request as the transcript keeps it.
    pub fn to_message(&self) -> AgentMessage {
        let kind = match self {
            UserRequest::Input { .. } => INPUT_REQUEST,
            UserRequest::Approval { .. } => APPROVAL_REQUEST,
        };
        let payload = serde_json::to_value(self).unwrap_or_default();
        CustomMessage::new(kind, payload).into()
    }

    /// The request a transcript message records, if it records one.
    pub fn from_message(message: &AgentMessage) -> Option<UserRequest> {
        let AgentMessage::Custom(custom) = message else {
            return None;
        };
        if custom.kind != INPUT_REQUEST && custom.kind != APPROVAL_REQUEST {
            return None;
        }
        serde_json::from_value(custom.payload.clone()).ok()
    }
}

/// The transcript's record that the user approved `call`: it closes the call's
/// request (see [`open_requests`]).
pub fn granted(call: &ToolCall) -> AgentMessage {
    CustomMessage::new(APPROVAL_GRANTED, json!({"tool_call_id": call.id})).into()
}

/// The transcript's record that the user's `answer` to the question for `field`
/// goes into `call`, which runs again: it closes the call's request.
pub(crate) fn answer_merged(call: &ToolCall, field: &str, answer: &str) -> AgentMessage {
    CustomMessage::new(
        INPUT_ANSWERED,
        json!({"tool_call_id": call.id, "field": field, "answer": answer}),
    )
    .into()
}

/// `call` with the arguments it asked with (`current`: earlier answers merged in;
/// its own when that is not an object) and `answer` under `field`; `None` when
/// they are not an object.
pub(crate) fn merged(
    call: &ToolCall,
    current: &Value,
    field: &str,
    answer: &str,
) -> Option<ToolCall> {
    let mut merged = call.clone();
    if current.is_object() {
        merged.arguments = current.clone();
    }
    merged
        .arguments
        .as_object_mut()?
        .insert(field.to_owned(), Value::String(answer.to_owned()));
    Some(merged)
}

/// The call whose approval, or merged answer, `message` records, if it records
/// one: either closes the call's request.
fn granted_call(message: &AgentMessage) -> Option<&str> {
    match message {
        AgentMessage::Custom(custom)
            if custom.kind == APPROVAL_GRANTED || custom.kind == INPUT_ANSWERED =>
        {
            custom.payload["tool_call_id"].as_str()
        }
        _ => None,
    }
}

/// The user's reply to one open request, named by its `request_id` (the
/// waiting call's id). On the wire: `{"type": "approve", "request_id": "call_1"}`,
/// `{"type": "deny", "request_id": …, "reason"?: …}`,
/// `{"type": "answer", "request_id": …, "text": …}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// The answer to a tool's question.
    Answer {
        /// The request answered: the id of the call that asked.
        request_id: String,
        /// What the user said.
        text: String,
    },
    /// Run the call.
    Approve {
        /// The request answered: the id of the call waiting for approval.
        request_id: String,
    },
    /// Do not run the call; it gets an error result.
    Deny {
        /// The request answered: the id of the call waiting for approval.
        request_id: String,
        /// Why, for the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl Reply {
    /// The answer `text` to the question of the call `request_id`.
    pub fn answer(request_id: impl Into<String>, text: impl Into<String>) -> Self {
        Reply::Answer {
            request_id: request_id.into(),
            text: text.into(),
        }
    }

    /// Approves the call `request_id`.
    pub fn approve(request_id: impl Into<String>) -> Self {
        Reply::Approve {
            request_id: request_id.into(),
        }
    }

    /// Denies the call `request_id`, saying `reason` to the model if given.
    pub fn deny(request_id: impl Into<String>, reason: Option<String>) -> Self {
        Reply::Deny {
            request_id: request_id.into(),
            reason,
        }
    }

    /// The request it answers: the id of the waiting call.
    pub fn request_id(&self) -> &str {
        match self {
            Reply::Answer { request_id, .. }
            | Reply::Approve { request_id }
            | Reply::Deny { request_id, .. } => request_id,
        }
    }

    /// Whether this reply fits `request` (an answer for a question, approve or
    /// deny for an approval).
    pub fn fits(&self, request: &UserRequest) -> bool {
        matches!(
            (self, request),
            (Reply::Answer { .. }, UserRequest::Input { .. })
                | (
                    Reply::Approve { .. } | Reply::Deny { .. },
                    UserRequest::Approval { .. }
                )
        )
    }
}

/// The requests of the transcript's last response that no result answers and no
/// approval closes yet, oldest first (a call's latest request only).
pub fn open_requests<M: Borrow<AgentMessage>>(messages: &[M]) -> Vec<UserRequest> {
    let Some(last) = messages
        .iter()
        .rposition(|m| m.borrow().as_assistant().is_some())
    else {
        return Vec::new();
    };
    let tail = &messages[last + 1..];
    let answered: HashSet<&str> = tail
        .iter()
        .filter_map(|m| m.borrow().as_tool_result())
        .map(|result| result.tool_call_id.as_str())
        .collect();
    let mut open: Vec<UserRequest> = Vec::new();
    for message in tail {
        if let Some(call) = granted_call(message.borrow()) {
            // Approved: the call ran, or may have (until its result says).
            open.retain(|earlier| earlier.tool_call_id() != call);
            continue;
        }
        let Some(request) = UserRequest::from_message(message.borrow()) else {
            continue;
        };
        if answered.contains(request.tool_call_id()) {
            continue;
        }
        // A later request for the same call (approved, then asking) replaces it.
        open.retain(|earlier| earlier.tool_call_id() != request.tool_call_id());
        open.push(request);
    }
    open
}

/// The result that carries the user's `answer` to `request`'s question back to the
/// model, which is asked to call the tool again.
pub(crate) fn answered(
    call: &ToolCall,
    field: &str,
    question: &str,
    answer: &str,
) -> ToolResultMessage {
    let text = format!(
        "The tool needs `{field}` and asked the user: {question}\nThe user answered: {answer}\nCall the tool again with this."
    );
    let mut result = ToolResultMessage::text(call, text, true);
    result.details =
        json!({"needs_input": {"field": field, "question": question, "answer": answer}});
    result
}

/// How many times `tool` asked the user since the last user message: the asks in
/// a row the cap counts, wherever the answers went.
pub(crate) fn asks_in_a_row(messages: &[AgentMessage], tool: &str) -> u32 {
    let mut asks = 0;
    for message in messages.iter().rev() {
        if message.as_user().is_some() {
            break;
        }
        if let Some(UserRequest::Input { tool_name, .. }) = UserRequest::from_message(message)
            && tool_name == tool
        {
            asks += 1;
        }
    }
    asks
}

/// Answers every open request of `messages` with an error result saying `reason`
/// (the user gave up on them); returns the results to append.
pub fn cancel_requests<M: Borrow<AgentMessage>>(messages: &[M], reason: &str) -> Vec<AgentMessage> {
    let calls: Vec<&ToolCall> = messages
        .iter()
        .rev()
        .find_map(|m| m.borrow().as_assistant())
        .map(|assistant| assistant.tool_calls().collect())
        .unwrap_or_default();
    open_requests(messages)
        .iter()
        .filter_map(|request| calls.iter().find(|call| call.id == request.tool_call_id()))
        .map(|call| {
            let text = format!("Tool call \"{}\" was not executed: {reason}", call.name);
            ToolResultMessage::text(call, text, true).into()
        })
        .collect()
}

/// Whether a tool's calls need the user's approval before they run.
#[derive(Clone, Default)]
pub enum Approval {
    /// They run without asking (the default).
    #[default]
    Always,
    /// Each call waits for the user's approval.
    Ask,
    /// They never run: each call is answered with an error result.
    Never,
    /// A call waits for approval when this returns `true` for its arguments.
    AskIf(Arc<dyn Fn(&Value) -> bool + Send + Sync>),
}

impl Approval {
    /// A policy asking when `predicate` holds for a call's arguments.
    pub fn ask_if(predicate: impl Fn(&Value) -> bool + Send + Sync + 'static) -> Self {
        Approval::AskIf(Arc::new(predicate))
    }
}

impl fmt::Debug for Approval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Approval::Always => "Always",
            Approval::Ask => "Ask",
            Approval::Never => "Never",
            Approval::AskIf(_) => "AskIf(..)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::tests as messages;

    #[test]
    fn a_request_is_open_until_its_call_has_a_result() {
        let request = UserRequest::Input {
            tool_call_id: "a".into(),
            tool_name: "t".into(),
            field: "due".into(),
            question: "When?".into(),
            current_data: Value::Null,
        };
        let mut transcript: Vec<AgentMessage> = vec![
            AgentMessage::user("remind me"),
            messages::assistant(&["a", "b"]).into(),
            messages::result("b").into(),
            request.to_message(),
        ];
        assert_eq!(open_requests(&transcript), vec![request.clone()]);
        let cancelled = cancel_requests(&transcript, "cancelled.");
        assert_eq!(cancelled.len(), 1);
        assert_eq!(cancelled[0].as_tool_result().unwrap().tool_call_id, "a");
        transcript.extend(cancelled);
        assert!(open_requests(&transcript).is_empty());
    }

    #[test]
    fn replies_fit_their_kind_of_request() {
        let approval = UserRequest::Approval {
            tool_call_id: "a".into(),
            tool_name: "t".into(),
            args: json!({}),
            reason: None,
        };
        assert!(Reply::approve("a").fits(&approval));
        assert!(Reply::deny("a", None).fits(&approval));
        assert!(!Reply::answer("a", "x").fits(&approval));
    }

    #[test]
    fn a_reply_names_its_request_on_the_wire() {
        let reply: Reply =
            serde_json::from_value(json!({"type": "approve", "request_id": "b"})).unwrap();
        assert_eq!(reply, Reply::approve("b"));
        assert!(serde_json::from_value::<Reply>(json!({"type": "approve"})).is_err());
        assert!(
            serde_json::from_value::<Reply>(json!({"type": "deny", "request_id": "b", "id": 1}))
                .is_err()
        );
    }
}
