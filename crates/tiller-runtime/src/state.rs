//! What an agent looks like from outside: a snapshot of its state, its status, and
//! the outcome of a run.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller_ai::{AssistantMessage, StopReason, ToolCall, Usage};
use tiller_core::{
    BudgetExceeded, CompactionReport, ContextIds, GuardrailTripped, Output, OutputError, RunEnd,
    UserRequest,
};

use crate::AgentMessage;
use crate::definition::AgentDefinition;
use crate::subscription::AgentId;

/// A snapshot of an agent's state; serializes as the server shows it (the
/// model's headers, the key and the approvals are never part of it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentState {
    /// Its id.
    pub id: AgentId,
    /// Its unique name, if it has one.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether it is working, or waits for the user.
    #[serde(flatten)]
    pub status: AgentStatus,
    /// The session the store keeps the agent in.
    pub session_id: String,
    /// Who the agent works for (its extensions are not shown).
    pub context: ContextIds,
    /// Its data: model, instructions, tool names and options.
    #[serde(serialize_with = "AgentDefinition::serialize_shown")]
    pub definition: AgentDefinition,
    /// The transcript; grows by one message each `message_end`.
    pub messages: Vec<AgentMessage>,
    /// The place (from 0) in the stored transcript of `messages`' first
    /// message: past 0 after a compaction, whose summary it is (the store
    /// keeps what came before). A fork at a message names this place.
    #[serde(default)]
    pub messages_from: u64,
    /// Queued steering messages, oldest first.
    pub steering_queue: Vec<AgentMessage>,
    /// Queued follow-up messages, oldest first.
    pub follow_up_queue: Vec<AgentMessage>,
    /// Whether a run is active.
    pub is_streaming: bool,
    /// The assistant message being streamed, as far as it got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming_message: Option<AssistantMessage>,
    /// Ids of tool calls started and not yet finished.
    pub pending_tool_calls: Vec<String>,
    /// The error of the last run's last turn, if it ended in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Tool calls parked on the user's reply, oldest first (see
    /// [`tiller_core::request`]); a reply names the one it resolves by its
    /// `tool_call_id`.
    pub waiting: Vec<UserRequest>,
    /// The number the agent's next event will get: the state is as of every
    /// event numbered below it, so a stream read from here goes on from it.
    #[serde(default)]
    pub next_seq: u64,
}

impl AgentState {
    /// Tokens and cost of every response in the transcript.
    pub fn usage(&self) -> Usage {
        total_usage(&self.messages)
    }

    /// Where each message of `messages` stands (see [`message_statuses`]).
    pub fn message_statuses(&self) -> Vec<MessageStatus> {
        message_statuses(&self.messages, false, self.is_streaming)
    }
}

/// Where a message stands in its processing. A user's message is `pending`
/// until the agent works on it, `streaming` while it does (its run is
/// active), and `done` once a response follows it; a response is `done`, or
/// `failed` when it ended in an error or was aborted; anything else (a tool's
/// result, a summary) is `done`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Waiting to be worked on.
    Pending,
    /// Being worked on: its response is under way.
    Streaming,
    /// Answered, or finished.
    Done,
    /// A response that ended in an error or was aborted.
    Failed,
}

/// The status of each of `messages` (a stretch of a transcript), read from
/// the messages themselves: `answered_after` says whether a response follows
/// the stretch, and `working` whether the agent is working on its unanswered
/// messages. One pass, from the end.
pub fn message_statuses<M: std::borrow::Borrow<AgentMessage>>(
    messages: &[M],
    answered_after: bool,
    working: bool,
) -> Vec<MessageStatus> {
    let mut answered = answered_after;
    let mut statuses: Vec<MessageStatus> = messages
        .iter()
        .rev()
        .map(|message| {
            let message = message.borrow();
            if let Some(response) = message.as_assistant() {
                answered = true;
                return match response.stop_reason {
                    StopReason::Error | StopReason::Aborted => MessageStatus::Failed,
                    _ => MessageStatus::Done,
                };
            }
            match (message.as_user(), answered, working) {
                (None, _, _) | (Some(_), true, _) => MessageStatus::Done,
                (Some(_), false, true) => MessageStatus::Streaming,
                (Some(_), false, false) => MessageStatus::Pending,
            }
        })
        .collect();
    statuses.reverse();
    statuses
}

/// Whether an agent is working.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AgentStatus {
    /// Waiting for work.
    Idle,
    /// A run is active.
    Running,
    /// A run is parked on the user: a tool's question or a call's approval
    /// ([`AgentHandle::answer`](crate::AgentHandle::answer),
    /// [`approve`](crate::AgentHandle::approve), [`deny`](crate::AgentHandle::deny)).
    /// A waiting agent that hibernated still shows this status: the reply thaws it.
    WaitingForInput,
    /// Idle long enough to be put away: no actor, no state in memory; the next
    /// request brings it back from the store.
    Hibernated,
    /// Stopped for good.
    Stopped {
        /// Why.
        reason: String,
    },
}

/// What an agent has to do, in brief: no transcript is copied to tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Workload {
    /// Whether a run is active.
    pub running: bool,
    /// Whether a request waits for the user's reply.
    pub waiting: bool,
    /// Steering and follow-up messages queued.
    pub queued: usize,
}

impl Workload {
    /// Whether the agent has work left without a user's reply: a run, or queued
    /// messages for one.
    pub fn is_busy(&self) -> bool {
        self.running || self.queued > 0
    }
}

/// An agent as a supervisor lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentInfo {
    /// Its id.
    pub id: AgentId,
    /// Its unique name, if it has one.
    pub name: Option<String>,
    /// Whether it is working.
    #[serde(flatten)]
    pub status: AgentStatus,
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The messages the run added, in order.
    pub messages: Vec<AgentMessage>,
    /// Why the run ended.
    pub end: RunEnd,
    /// What came of the structured output, when the agent has an output schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Output>,
    /// What the run's compactions did, in order (see [`tiller_core::compaction`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compactions: Vec<CompactionReport>,
    /// The whole conversation after the run, as the model sees it (from the last
    /// compaction's summary on), this run's messages at its end; shared with the
    /// agent, not copied. Empty for a run followed on another host of a cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversation: Vec<Arc<AgentMessage>>,
    /// The budget that ran out, when one ended the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_exceeded: Option<BudgetExceeded>,
    /// The guardrail that tripped, when one ended the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guardrail_tripped: Option<GuardrailTripped>,
}

impl RunSummary {
    /// Whether the run failed: it ended in an error (a context overflow among
    /// them), or its last response did.
    pub fn has_error(&self) -> bool {
        self.error.is_some() || matches!(self.end, RunEnd::Error | RunEnd::ContextOverflow)
    }
}

/// A run's result in brief — why it ended, its answer, usage and error — with
/// its own messages and the whole conversation beside them: what
/// [`RunOutcome::summary`] gives, serialisable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Why the run ended.
    pub end: RunEnd,
    /// The text of the last answer.
    pub text: String,
    /// The validated structured answer, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Why the structured answer was refused, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_error: Option<OutputError>,
    /// The tool calls of the final turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tokens and cost of every response of the run.
    pub usage: Usage,
    /// Why the last response ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    /// The last response's error, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The messages the run added, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<AgentMessage>,
    /// The whole conversation after the run ([`RunOutcome::conversation`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversation: Vec<AgentMessage>,
    /// The budget that ran out, when one ended the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_exceeded: Option<BudgetExceeded>,
    /// The guardrail that tripped, when one ended the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guardrail_tripped: Option<GuardrailTripped>,
}

impl RunOutcome {
    /// The run's last assistant message.
    pub fn final_message(&self) -> Option<&AssistantMessage> {
        self.messages
            .iter()
            .rev()
            .find_map(AgentMessage::as_assistant)
    }

    /// The text of the last assistant message.
    pub fn text(&self) -> String {
        self.final_message()
            .map(AssistantMessage::text)
            .unwrap_or_default()
    }

    /// The tool calls of the final turn.
    pub fn tool_calls(&self) -> Vec<&ToolCall> {
        self.final_message()
            .map(|m| m.tool_calls().collect())
            .unwrap_or_default()
    }

    /// Tokens and cost of every response of the run.
    pub fn usage(&self) -> Usage {
        total_usage(&self.messages)
    }

    /// Why the last response ended.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.final_message().map(|m| m.stop_reason)
    }

    /// The last response's error, if it failed.
    pub fn error(&self) -> Option<&str> {
        self.final_message()
            .and_then(|m| m.error_message.as_deref())
    }

    /// The validated structured answer, when the agent has an output schema and
    /// the answer matched it.
    pub fn structured(&self) -> Option<&Value> {
        self.output.as_ref().and_then(Output::value)
    }

    /// Why the structured answer was refused after the retries.
    pub fn output_error(&self) -> Option<&OutputError> {
        match &self.output {
            Some(Output::Invalid(error)) => Some(error),
            _ => None,
        }
    }

    /// The result in brief.
    pub fn summary(&self) -> RunSummary {
        RunSummary {
            end: self.end,
            text: self.text(),
            output: self.structured().cloned(),
            output_error: self.output_error().cloned(),
            tool_calls: self.tool_calls().into_iter().cloned().collect(),
            usage: self.usage(),
            stop_reason: self.stop_reason(),
            error: self.error().map(str::to_owned),
            messages: self.messages.clone(),
            conversation: self
                .conversation
                .iter()
                .map(|message| (**message).clone())
                .collect(),
            budget_exceeded: self.budget_exceeded,
            guardrail_tripped: self.guardrail_tripped.clone(),
        }
    }
}

/// The usage of the assistant messages among `messages`, summed.
fn total_usage(messages: &[AgentMessage]) -> Usage {
    let mut total = Usage::default();
    for message in messages.iter().filter_map(AgentMessage::as_assistant) {
        total += message.usage;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use MessageStatus::{Done, Failed, Pending, Streaming};

    fn response(stop: StopReason) -> AgentMessage {
        let model = tiller_ai::faux::FauxProvider::new().model();
        let mut message = AssistantMessage::empty(&model);
        message.stop_reason = stop;
        message.into()
    }

    #[test]
    fn a_message_is_pending_until_worked_on_and_done_once_answered() {
        let transcript = [
            AgentMessage::user("one"),
            response(StopReason::Stop),
            AgentMessage::user("two"),
            AgentMessage::user("and three"),
            response(StopReason::Error),
            AgentMessage::user("four"),
            response(StopReason::Aborted),
            AgentMessage::user("five"),
        ];
        let read = |answered_after, working| message_statuses(&transcript, answered_after, working);
        assert_eq!(
            read(false, false),
            [Done, Done, Done, Done, Failed, Done, Failed, Pending]
        );
        assert_eq!(read(false, true).last(), Some(&Streaming));
        assert_eq!(read(true, false).last(), Some(&Done));
        assert!(message_statuses::<AgentMessage>(&[], false, true).is_empty());
    }
}
