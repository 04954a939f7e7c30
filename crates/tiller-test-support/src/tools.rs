//! Tools for tests: ones that record what they did, and one that waits for its
//! cancellation.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tiller_core::{AgentTool, FnTool, ToolError, ToolOutput, ToolSet};

/// An agent file (`tooled`) of command tools: `cat` echoes its arguments, and
/// `remove` (a `cat` too) asks the user's approval first.
pub const TOOLED_AGENT_FILE: &str = "
type: object
description: You use tools.
json_schema_extra:
  kind: agent
  name: tooled
  tools:
    - {name: cat, description: Echo, command: [cat]}
    - {name: remove, description: Remove, command: [cat]}
  approvals: {remove: ask}
";

/// A shared log of what tools did.
pub type Log = Arc<Mutex<Vec<String>>>;

/// An empty log.
pub fn log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

/// What the log holds.
pub fn logged(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

/// An object schema with one string property `value`.
pub fn value_schema() -> Value {
    json!({"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]})
}

/// An `echo` tool answering `echoed: {value}` (with the value in the details),
/// recording each value it ran with in `log`.
pub fn echo(log: &Log) -> Arc<dyn AgentTool> {
    let log = log.clone();
    Arc::new(FnTool::new(
        "echo",
        "Echo tool",
        value_schema(),
        move |args, _ctx| {
            let log = log.clone();
            async move {
                let value = args["value"].as_str().unwrap_or_default().to_owned();
                log.lock().unwrap().push(value.clone());
                Ok(ToolOutput::text(format!("echoed: {value}"))
                    .with_details(json!({"value": value})))
            }
        },
    ))
}

/// A `remind` tool that asks `question` for its `due` date when the call has
/// none; records each reminder it set in `log`, as `{what} @ {due}`.
pub fn remind(log: &Log, question: &'static str) -> Arc<dyn AgentTool> {
    let log = log.clone();
    Arc::new(FnTool::new(
        "remind",
        "Set a reminder",
        json!({"type": "object", "properties": {"what": {"type": "string"}, "due": {"type": "string"}}, "required": ["what"]}),
        move |args, _ctx| {
            let log = log.clone();
            async move {
                let Some(due) = args["due"].as_str() else {
                    return Err(ToolError::needs_input("due", question));
                };
                log.lock().unwrap().push(format!(
                    "{} @ {due}",
                    args["what"].as_str().unwrap_or_default()
                ));
                Ok(ToolOutput::text(format!("Reminder set for {due}.")))
            }
        },
    ))
}

/// A tool that waits for its run to be cancelled, then says so.
pub fn patient() -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        "patient",
        "Waits to be cancelled",
        json!({"type": "object"}),
        |_, ctx| async move {
            ctx.cancel().cancelled().await;
            Err(ToolError::new("cancelled"))
        },
    ))
}

/// Tools as a set.
pub fn tools(tools: Vec<Arc<dyn AgentTool>>) -> ToolSet {
    ToolSet::new(tools).unwrap()
}
