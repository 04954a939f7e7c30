//! The events of an agent run: the public contract hosts and interfaces rely on.
//!
//! A run emits `agent_start`, then turns. A turn is `turn_start`; the messages
//! delivered before the model is asked (the prompts, steering or follow-ups), each
//! as `message_start` and `message_end`; the assistant's response as
//! `message_start`, one `message_update` per streamed block event, `message_end`;
//! for each tool call `tool_execution_start`, any `tool_execution_update`s,
//! `tool_execution_end`, and its result's `message_start`/`message_end`; and
//! `turn_end` with the response and its results. The run ends with exactly one
//! `agent_end` holding only this run's new messages — also when it fails.
//!
//! A run that parks on the user (see [`crate::request`]) ends its turn differently:
//! each parked call has its `tool_execution_start` but no end; after the other
//! calls' results come each request's `message_start`/`message_end` (a custom
//! message) and `input_requested` or `approval_requested`, then `turn_end` and
//! `agent_end` with [`RunEnd::Parked`]. A sub-agent's events arrive as
//! `child_event`s among the events of the call that started it.
//!
//! A compaction (see [`crate::compaction`]) is `compaction_start` and
//! `compaction_end`: before the model call of a turn that needs it (after that
//! turn's delivered messages), or as a run of its own between `agent_start` and
//! `agent_end` when asked for. A request the provider refused as too long shows
//! no `message_start` of its own: the compaction, then the response asked again.
//!
//! Messages in events are boxed so that every event, the many `message_update`s
//! above all, stays small to move.
//!
//! With tools run in parallel every `tool_execution_start` comes first (in call
//! order), each `tool_execution_end` when its tool finishes, and the results'
//! messages after all of them, in call order.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller_ai::{AssistantEvent, AssistantMessage, StreamedMessage, ToolResultMessage};

use tiller_ai::ratelimit::WaitCause;

use crate::budget::{Amount, BudgetExceeded, BudgetLimit, BudgetScope};
use crate::compaction::{CompactionReason, CompactionReport};
use crate::guardrail::{GuardrailStage, GuardrailTripped};
use crate::message::AgentMessage;
use crate::output::Output;
use crate::request::UserRequest;
use crate::tool::ToolOutput;

/// One step of an agent run; serialized as `{"type": "<snake_case>", ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// The run began.
    AgentStart,
    /// A turn (one model response and its tool calls) began.
    TurnStart,
    /// A message began: a delivered message, or the assistant's response as it starts.
    MessageStart {
        /// The message (for the assistant, still empty).
        message: Box<AgentMessage>,
    },
    /// The assistant's response grew; apply the event to a
    /// [`tiller_ai::PartialMessage`] to follow it.
    MessageUpdate {
        /// The block event of the response stream.
        assistant_message_event: AssistantEvent,
        /// The response as it stands after this event, built only when read
        /// (so it costs nothing to a subscriber that does not read it; see
        /// [`StreamedMessage`]).
        message: StreamedMessage,
    },
    /// A message is complete and part of the transcript.
    MessageEnd {
        /// The message.
        message: Box<AgentMessage>,
    },
    /// A tool call began.
    ToolExecutionStart {
        /// The call's id.
        tool_call_id: String,
        /// The tool's name.
        tool_name: String,
        /// What interfaces show for the tool ([`AgentTool::label`](crate::AgentTool::label));
        /// the name when the tool has no label or is unknown.
        #[serde(default)]
        label: String,
        /// The arguments as the model sent them.
        args: Value,
    },
    /// A tool reported progress.
    ToolExecutionUpdate {
        /// The call's id.
        tool_call_id: String,
        /// The tool's name.
        tool_name: String,
        /// The call's arguments (shared by the call's updates, not copied).
        args: Arc<Value>,
        /// The partial result.
        partial_result: ToolOutput,
    },
    /// A tool declared an action for the application (the built-in `action`
    /// tool, or any tool through [`ToolContext::act`](crate::ToolContext::act)):
    /// a typed request beside the text, such as "show this chart" or "open this
    /// page".
    Action {
        /// The call that declared it.
        tool_call_id: String,
        /// The action's type.
        action_type: String,
        /// Its data.
        payload: Value,
    },
    /// A tool call finished.
    ToolExecutionEnd {
        /// The call's id.
        tool_call_id: String,
        /// The tool's name.
        tool_name: String,
        /// What the model will read.
        result: ToolOutput,
        /// Whether the call failed (or was refused, skipped or aborted).
        is_error: bool,
    },
    /// A tool asked the user for something it needs; the run parks once the
    /// turn's other calls are done (see [`crate::request`]).
    InputRequested {
        /// The call waiting.
        tool_call_id: String,
        /// Its tool.
        tool_name: String,
        /// The argument that is missing or unclear.
        field: String,
        /// What to ask the user.
        question: String,
        /// The call's arguments when it asked (answers merged so far included).
        #[serde(default, skip_serializing_if = "Value::is_null")]
        current_data: Value,
    },
    /// A call waits for the user's approval before it runs; the run parks once
    /// the turn's other calls are done.
    ApprovalRequested {
        /// The call waiting.
        tool_call_id: String,
        /// Its tool.
        tool_name: String,
        /// The arguments it would run with.
        args: Value,
        /// What the tool wants approved, when the tool itself asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// An event of a sub-agent this run's tool started (`ask_agent`), in the order
    /// the sub-agent emitted it.
    ChildEvent {
        /// The agents it came through, from this agent to the one that emitted
        /// it, such as `["planner", "researcher"]`.
        path: Vec<String>,
        /// The call of this run that started the sub-agent.
        tool_call_id: String,
        /// The sub-agent's event.
        event: Box<AgentEvent>,
    },
    /// The transcript is being compacted (see [`crate::compaction`]): before a
    /// model call, when it passed `context_window − reserve_tokens` or the
    /// provider said it did not fit; or as asked.
    CompactionStart {
        /// Why.
        reason: CompactionReason,
        /// The transcript's tokens before.
        tokens_before: u64,
    },
    /// A compaction ended. With a summary, the messages before the last `kept`
    /// are replaced by it (the store keeps them); without one, it failed and
    /// the transcript is as it was.
    CompactionEnd {
        /// Why it ran.
        reason: CompactionReason,
        /// The transcript's tokens before.
        tokens_before: u64,
        /// The transcript's tokens after (estimated); `tokens_before` when it failed.
        tokens_after: u64,
        /// The summary's id: its place in the session's stored transcript.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary_id: Option<u64>,
        /// The summary, a custom message of kind `compaction`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<Box<AgentMessage>>,
        /// How many of the latest messages were kept as they are, after the summary.
        kept: u64,
        /// Why it failed, when it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A turn ended.
    TurnEnd {
        /// The assistant's response.
        message: Box<AssistantMessage>,
        /// The results of its tool calls, in call order.
        tool_results: Vec<ToolResultMessage>,
    },
    /// A model call waits its turn at its provider account, shared with the other
    /// agents of the process (see [`tiller_ai::ratelimit`]).
    RateLimited {
        /// The account: provider and model, with a fingerprint of the key or the
        /// name it was given.
        account: String,
        /// How long the call is expected to wait, in milliseconds.
        wait_ms: u64,
        /// Why: the account's pace, or a 429.
        cause: WaitCause,
    },
    /// A model failed in a way retrying did not fix (see
    /// [`StreamError::is_unavailable`](tiller_ai::StreamError::is_unavailable))
    /// before it streamed anything: the call goes to the next model of the
    /// agent's list. The response's `message_end` names the model that answered.
    ModelFallback {
        /// The model that failed, as `provider/id`.
        from: String,
        /// The model asked next, as `provider/id`.
        to: String,
        /// Why the first failed.
        error: String,
    },
    /// A budget ran out (see [`crate::budget`]): the run ends with
    /// [`RunEnd::BudgetExceeded`].
    BudgetExceeded {
        /// Whose budget.
        scope: BudgetScope,
        /// Which bound.
        limit: BudgetLimit,
        /// The bound.
        max: Amount,
        /// What was spent.
        spent: Amount,
    },
    /// A guardrail failed (see [`crate::guardrail`]): the run ends with
    /// [`RunEnd::GuardrailTripped`].
    GuardrailTripped {
        /// What it checked.
        stage: GuardrailStage,
        /// Its name.
        guardrail: String,
        /// Why it failed.
        reason: String,
    },
    /// The run ended.
    AgentEnd {
        /// Only the messages this run added, in order.
        messages: Vec<AgentMessage>,
        /// Why it ended.
        reason: RunEnd,
        /// What came of the structured output, when the run had an output schema
        /// (`None` also when it ended before a final answer).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Output>,
    },
}

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunEnd {
    /// The model answered and nothing was left to do.
    Completed,
    /// The run was aborted.
    Aborted,
    /// The model's response failed, or a callback of the run did; the last message
    /// says why.
    Error,
    /// The turn limit was reached with work left.
    TurnLimit,
    /// The stop condition said so.
    StopCondition,
    /// Every tool result of the last turn asked to stop.
    ToolsTerminated,
    /// The final answer did not match the output schema after the retries.
    InvalidOutput,
    /// A tool call waits for the user: an answer or an approval (see
    /// [`crate::request`]); a [`Prompt::Reply`](crate::Prompt::Reply) goes on.
    Parked,
    /// The provider refused the request as longer than the model's context
    /// window, again after the transcript was compacted (or compaction is off);
    /// the last message says why.
    ContextOverflow,
    /// Paused between two turns ([`LoopConfig::pause`](crate::LoopConfig::pause)),
    /// work left: [`Prompt::Continue`](crate::Prompt::Continue) goes on.
    Paused,
    /// A budget ran out; the `budget_exceeded` event before says which.
    BudgetExceeded,
    /// A guardrail failed; the `guardrail_tripped` event before says which and why.
    GuardrailTripped,
}

impl From<BudgetExceeded> for AgentEvent {
    fn from(exceeded: BudgetExceeded) -> Self {
        let BudgetExceeded {
            scope,
            limit,
            max,
            spent,
        } = exceeded;
        AgentEvent::BudgetExceeded {
            scope,
            limit,
            max,
            spent,
        }
    }
}

impl From<GuardrailTripped> for AgentEvent {
    fn from(tripped: GuardrailTripped) -> Self {
        let GuardrailTripped {
            stage,
            guardrail,
            reason,
        } = tripped;
        AgentEvent::GuardrailTripped {
            stage,
            guardrail,
            reason,
        }
    }
}

impl AgentEvent {
    /// The budget this `budget_exceeded` says ran out.
    pub fn budget_exceeded(&self) -> Option<BudgetExceeded> {
        match self {
            AgentEvent::BudgetExceeded {
                scope,
                limit,
                max,
                spent,
            } => Some(BudgetExceeded {
                scope: *scope,
                limit: *limit,
                max: *max,
                spent: *spent,
            }),
            _ => None,
        }
    }

    /// The guardrail this `guardrail_tripped` says tripped, and why.
    pub fn guardrail_tripped(&self) -> Option<GuardrailTripped> {
        match self {
            AgentEvent::GuardrailTripped {
                stage,
                guardrail,
                reason,
            } => Some(GuardrailTripped {
                stage: *stage,
                guardrail: guardrail.clone(),
                reason: reason.clone(),
            }),
            _ => None,
        }
    }

    /// What the compaction this `compaction_end` ends did.
    pub fn compaction_report(&self) -> Option<CompactionReport> {
        match self {
            AgentEvent::CompactionEnd {
                reason,
                tokens_before,
                tokens_after,
                summary_id,
                error,
                ..
            } => Some(CompactionReport {
                reason: *reason,
                tokens_before: *tokens_before,
                tokens_after: *tokens_after,
                summary_id: *summary_id,
                error: error.clone(),
            }),
            _ => None,
        }
    }

    /// The event announcing `request`.
    pub fn requested(request: &UserRequest) -> Self {
        match request.clone() {
            UserRequest::Input {
                tool_call_id,
                tool_name,
                field,
                question,
                current_data,
            } => AgentEvent::InputRequested {
                tool_call_id,
                tool_name,
                field,
                question,
                current_data,
            },
            UserRequest::Approval {
                tool_call_id,
                tool_name,
                args,
                reason,
            } => AgentEvent::ApprovalRequested {
                tool_call_id,
                tool_name,
                args,
                reason,
            },
        }
    }
}
