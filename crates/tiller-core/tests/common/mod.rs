//! Helpers for the loop tests: tools that record what they did, and a compact
//! rendering of events so whole sequences can be compared exactly.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde_json::{Value, json};
use tiller_ai::Message;
use tiller_ai::faux::FauxProvider;
use tiller_core::{
    AgentEvent, AgentLoop, AgentMessage, AgentTool, FnTool, LoopConfig, LoopContext, RunEnd,
    ToolOutput, ToolSet, agent_loop,
};

/// Every event of a run and the messages it returned.
pub(crate) async fn collect(mut run: AgentLoop) -> (Vec<AgentEvent>, Vec<AgentMessage>) {
    let mut events = Vec::new();
    while let Some(event) = run.next().await {
        events.push(event);
    }
    let AgentEvent::AgentEnd { messages, .. } = events.last().cloned().unwrap() else {
        panic!("the run did not end with agent_end: {events:#?}");
    };
    assert_eq!(
        run.result().await,
        messages,
        "result() returns agent_end's messages"
    );
    assert_valid(&messages);
    (events, messages)
}

/// Asserts that every tool call in `messages` has exactly one result in place.
pub(crate) fn assert_valid(messages: &[AgentMessage]) {
    if let Err(error) = tiller_core::check_transcript(messages) {
        panic!("invalid transcript: {error}\n{messages:#?}");
    }
}

/// Runs the loop on one user prompt to the end: its events and new messages.
pub(crate) async fn prompt(
    text: &str,
    context: LoopContext,
    config: LoopConfig,
) -> (Vec<AgentEvent>, Vec<AgentMessage>) {
    collect(agent_loop(
        vec![AgentMessage::user(text)],
        context,
        config,
        Default::default(),
    ))
    .await
}

/// One line per event: its type and what identifies it.
pub(crate) fn describe(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event {
            AgentEvent::AgentStart => "agent_start".to_owned(),
            AgentEvent::TurnStart => "turn_start".to_owned(),
            AgentEvent::MessageStart { message } => format!("message_start {}", label(message)),
            AgentEvent::MessageEnd { message } => format!("message_end {}", label(message)),
            AgentEvent::MessageUpdate {
                assistant_message_event,
            } => {
                let value = serde_json::to_value(assistant_message_event).unwrap();
                format!("message_update {}", value["type"].as_str().unwrap())
            }
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
            AgentEvent::ChildEvent { path, event, .. } => {
                format!(
                    "child {} {}",
                    path.join("/"),
                    describe(std::slice::from_ref(event))[0]
                )
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
        })
        .collect()
}

/// A message as `role` or `role:text` for user messages and `tool_result:id`.
pub(crate) fn label(message: &AgentMessage) -> String {
    match message {
        AgentMessage::Llm(Message::User(_)) => {
            format!("user:{}", user_text(message).unwrap_or_default())
        }
        AgentMessage::Llm(Message::Assistant(_)) => "assistant".to_owned(),
        AgentMessage::Llm(Message::ToolResult(result)) => {
            format!("tool_result:{}", result.tool_call_id)
        }
        AgentMessage::Custom(custom) => format!("custom:{}", custom.kind),
    }
}

pub(crate) fn user_text(message: &AgentMessage) -> Option<String> {
    message.as_user().map(|user| user.text_content())
}

/// The roles of messages, in order.
pub(crate) fn roles(messages: &[AgentMessage]) -> Vec<&'static str> {
    messages.iter().map(AgentMessage::role).collect()
}

/// The text of a tool result message.
pub(crate) fn result_text(message: &AgentMessage) -> String {
    message.as_tool_result().unwrap().text_content()
}

/// The reason of the last `agent_end`.
pub(crate) fn end_reason(events: &[AgentEvent]) -> RunEnd {
    match events.last() {
        Some(AgentEvent::AgentEnd { reason, .. }) => *reason,
        other => panic!("not agent_end: {other:?}"),
    }
}

/// An object schema with one string property `value`.
pub(crate) fn value_schema() -> Value {
    json!({"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]})
}

/// An `echo` tool that records each value it ran with.
pub(crate) fn echo(log: &Arc<Mutex<Vec<String>>>) -> Arc<dyn AgentTool> {
    let log = log.clone();
    Arc::new(FnTool::new(
        "echo",
        "Echo tool",
        value_schema(),
        move |args, _ctx| {
            let log = log.clone();
            async move {
                let value = args["value"].as_str().unwrap().to_owned();
                log.lock().unwrap().push(value.clone());
                Ok(ToolOutput::text(format!("echoed: {value}"))
                    .with_details(json!({"value": value})))
            }
        },
    ))
}

/// A context with these tools and messages.
pub(crate) fn context(tools: Vec<Arc<dyn AgentTool>>, messages: Vec<AgentMessage>) -> LoopContext {
    LoopContext {
        system_prompt: Some("You are helpful.".into()),
        messages,
        tools: ToolSet::new(tools).unwrap(),
    }
}

/// A config for a faux model.
pub(crate) fn config(faux: &FauxProvider) -> LoopConfig {
    LoopConfig::new(faux.model())
}

/// A shared log.
pub(crate) fn log() -> Arc<Mutex<Vec<String>>> {
    Arc::new(Mutex::new(Vec::new()))
}

/// What the log holds.
pub(crate) fn logged(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    log.lock().unwrap().clone()
}

/// Strings, for comparing with `describe`.
pub(crate) fn lines(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| (*l).to_owned()).collect()
}
