//! Events as lines of text, so that whole sequences compare exactly.

use tiller_core::{AgentEvent, RunEnd};

use crate::transcript::label;

/// One line per event: its type and what identifies it.
pub fn describe(events: &[AgentEvent]) -> Vec<String> {
    events.iter().map(line).collect()
}

/// One event's line.
fn line(event: &AgentEvent) -> String {
    if let Some(line) = tool_line(event) {
        return line;
    }
    match event {
        AgentEvent::AgentStart => "agent_start".to_owned(),
        AgentEvent::TurnStart => "turn_start".to_owned(),
        AgentEvent::MessageStart { message } => format!("message_start {}", label(message)),
        AgentEvent::MessageEnd { message } => format!("message_end {}", label(message)),
        AgentEvent::MessageUpdate {
            assistant_message_event,
            ..
        } => {
            let value = serde_json::to_value(assistant_message_event).unwrap();
            format!("message_update {}", value["type"].as_str().unwrap())
        }
        AgentEvent::CompactionStart { reason, .. } => {
            format!("compaction_start {}", serde_json::to_value(reason).unwrap())
        }
        AgentEvent::CompactionEnd {
            reason,
            summary_id,
            kept,
            error,
            ..
        } => match (summary_id, error) {
            (Some(id), _) => format!(
                "compaction_end {} summary {id} kept {kept}",
                serde_json::to_value(reason).unwrap()
            ),
            (None, error) => format!(
                "compaction_end {} failed: {}",
                serde_json::to_value(reason).unwrap(),
                error.as_deref().unwrap_or_default()
            ),
        },
        AgentEvent::ChildEvent { path, event, .. } => {
            format!("child {} {}", path.join("/"), line(event))
        }
        AgentEvent::TurnEnd {
            message,
            tool_results,
        } => format!(
            "turn_end {:?} {:?}",
            message.stop_reason,
            tool_results
                .iter()
                .map(|r| r.tool_call_id.as_str())
                .collect::<Vec<_>>()
        ),
        AgentEvent::RateLimited { wait_ms, cause, .. } => {
            format!("rate_limited {cause:?} {wait_ms}ms")
        }
        AgentEvent::ModelFallback { from, to, .. } => format!("model_fallback {from} -> {to}"),
        AgentEvent::BudgetExceeded {
            scope,
            limit,
            max,
            spent,
        } => format!("budget_exceeded {scope:?} {limit:?} {spent}/{max}"),
        AgentEvent::GuardrailTripped {
            stage,
            guardrail,
            reason,
        } => format!("guardrail_tripped {stage:?} {guardrail}: {reason}"),
        AgentEvent::AgentEnd {
            messages,
            reason,
            output: None,
        } => format!("agent_end {reason:?} {}", messages.len()),
        AgentEvent::AgentEnd {
            messages,
            reason,
            output: Some(output),
        } => format!(
            "agent_end {reason:?} {} {}",
            messages.len(),
            serde_json::to_string(output).unwrap()
        ),
        // An event this list does not know yet: its type.
        other => serde_json::to_value(other).unwrap()["type"]
            .as_str()
            .unwrap()
            .to_owned(),
    }
}

/// The line of an event of a tool call, if `event` is one.
fn tool_line(event: &AgentEvent) -> Option<String> {
    Some(match event {
        AgentEvent::ToolExecutionStart { tool_call_id, .. } => {
            format!("tool_execution_start {tool_call_id}")
        }
        AgentEvent::ToolExecutionUpdate {
            tool_call_id,
            partial_result,
            ..
        } => {
            format!(
                "tool_execution_update {tool_call_id} {}",
                partial_result.text_content()
            )
        }
        AgentEvent::Action {
            tool_call_id,
            action_type,
            payload,
        } => format!("action {tool_call_id} {action_type} {payload}"),
        AgentEvent::ToolExecutionEnd {
            tool_call_id,
            is_error,
            ..
        } => {
            format!(
                "tool_execution_end {tool_call_id}{}",
                if *is_error { " error" } else { "" }
            )
        }
        AgentEvent::InputRequested {
            tool_call_id,
            field,
            ..
        } => format!("input_requested {tool_call_id} {field}"),
        AgentEvent::ApprovalRequested { tool_call_id, .. } => {
            format!("approval_requested {tool_call_id}")
        }
        _ => return None,
    })
}

/// The reason of the last `agent_end`.
pub fn end_reason(events: &[AgentEvent]) -> RunEnd {
    match events.last() {
        Some(AgentEvent::AgentEnd { reason, .. }) => *reason,
        other => panic!("not agent_end: {other:?}"),
    }
}

/// Strings, for comparing with [`describe`].
pub fn lines(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| (*l).to_owned()).collect()
}
