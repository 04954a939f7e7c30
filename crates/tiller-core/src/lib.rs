//! The agent loop of Tiller: a stateless function of (prompts, context, config,
//! cancellation) that streams the model's turns, runs its tool calls and emits
//! typed [`AgentEvent`]s, returning only the messages it added.
//!
//! The loop knows nothing of actors, queues or stores: steering and follow-up
//! messages come from callbacks in its [`LoopConfig`], and it never mutates the
//! caller's context. Its event order follows pi-agent-core (see [`event`]); what it
//! adds is that every run ends with `agent_end` whatever fails, every tool call is
//! answered exactly once (also after an abort, a skip or a panic), arguments are
//! validated against each tool's JSON Schema before it runs, and tool calls cut off
//! by the token limit never run.
//!
//! ```
//! use futures::StreamExt;
//! use serde_json::json;
//! use std::sync::Arc;
//! use tiller_ai::faux::{FauxProvider, FauxTurn};
//! use tiller_core::{LoopContext, AgentEvent, AgentMessage, FnTool, LoopConfig, ToolOutput, ToolSet};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A scripted model that calls the tool, then answers.
//! let faux = FauxProvider::new();
//! faux.push(FauxTurn::tool_call("add", json!({"a": 2, "b": "3"})));
//! faux.push(FauxTurn::text("2 + 3 = 5"));
//!
//! let add = FnTool::new(
//!     "add",
//!     "Add two integers",
//!     json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}),
//!     |args, _ctx| async move {
//!         Ok(ToolOutput::text((args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)).to_string()))
//!     },
//! );
//! let context = LoopContext {
//!     system_prompt: Some("Use the tools.".into()),
//!     messages: vec![],
//!     tools: ToolSet::new([Arc::new(add) as Arc<dyn tiller_core::AgentTool>]).unwrap(),
//!     ..LoopContext::default()
//! };
//! let config = LoopConfig::new(faux.model());
//! let mut events = tiller_core::agent_loop(vec![AgentMessage::user("What is 2 + 3?")], context, config, Default::default());
//! while let Some(event) = events.next().await {
//!     match event {
//!         AgentEvent::ToolExecutionEnd { tool_name, result, .. } => println!("{tool_name} → {}", result.text_content()),
//!         AgentEvent::TurnEnd { message, .. } if !message.text().is_empty() => println!("{}", message.text()),
//!         _ => {}
//!     }
//! }
//! let added = events.result().await;
//! assert_eq!(added.len(), 4); // the prompt, the call, its result, the answer
//! # }
//! ```

pub mod budget;
pub mod compaction;
pub mod event;
pub mod guardrail;
pub mod hook;

mod action;
mod config;
mod context;
mod failure;
mod message;
mod output;
pub mod process;
mod repair;
pub mod request;
pub mod restate;
mod run;
mod stream;
mod tool;
mod toolset;
mod transcript;
mod validate;

pub use action::{ActionTool, MAX_WIDGETS, ShownWidgets, Widget, WidgetTool, widgets_of};
pub use budget::{
    Budget, BudgetExceeded, Budgets, CallHold, Reserved, Spending, Spent, Tally, TenantLedger,
};
pub use compaction::default_convert_to_llm;
pub use compaction::{CompactionPolicy, CompactionReason, CompactionReport, ContextTokens};
pub use config::{
    AfterToolCall, AfterToolCallHook, ApiKeyResolver, BeforeToolCall, BeforeToolCallHook,
    ConvertToLlm, Instructions, LoopConfig, MessageSource, RUN_UNTIL_NUDGE, RunHooks, RunOptions,
    SteeringDelivery, StopWhen, ToolCallInfo, ToolExecutionMode, TransformContext, TurnSummary,
    WriteAhead,
};
pub use context::{
    AgentContext, ContextIds, ContextOverrides, ContextState, DEFAULT_TENANT, DEFAULT_USER,
    StoredContext,
};
pub use event::{AgentEvent, RunEnd};
pub use failure::{BoxError, panic_text};
pub use guardrail::{
    Guardrail, GuardrailInput, GuardrailStage, GuardrailTripped, Guardrails, Verdict,
};
pub use message::{AgentMessage, CustomMessage};
pub use output::{Output, OutputError};
pub use request::{Answers, Approval, Reply, UserRequest, cancel_requests, open_requests};
pub use run::{
    ContinueError, EventSink, LoopContext, Prompt, Start, check_continue, check_prompt,
    check_reply, check_start, run_from, run_loop,
};
pub use stream::{AgentLoop, agent_loop, agent_loop_continue};
pub use tool::{
    AgentTool, FnTool, IntoToolOutput, ToolContext, ToolError, ToolExecution, ToolOutput,
    decode_arguments, json_len, parameters_schema, tool_result,
};
pub use toolset::{ToolFilter, ToolSet, ToolSetError};
pub use transcript::{TranscriptError, answer_open_calls, check_transcript};
