//! Tiller: every LLM agent a long-lived, supervised actor.
//!
//! A [`Supervisor`] spawns agents; an [`AgentHandle`] prompts one, steers it while it
//! works, queues follow-ups, subscribes to its events, aborts and resets it. Each run
//! is [`tiller_core`]'s stateless loop on its own task, streaming model turns
//! ([`tiller_ai`]) and tool executions back to the agent's actor, which keeps the
//! agent's state and fans the events out to subscribers. This crate re-exports what a
//! host needs, so `tiller` is the one dependency to add.
//!
//! ```
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use serde_json::json;
//! use tiller::{AgentSettings, AgentSpec, FnTool, Supervisor, ToolOutput, ToolSet};
//! use tiller::faux::{FauxProvider, FauxTurn};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A scripted model: it calls the clock, then answers. Use a real one with
//! // `tiller::catalog::find("openai/gpt-4o-mini")`.
//! let faux = FauxProvider::new();
//! faux.push(FauxTurn::tool_call("clock", json!({})));
//! faux.push(FauxTurn::text("It is noon.").chunk_size(4));
//!
//! let clock = FnTool::new("clock", "The current time", json!({"type": "object"}), |_, _| async {
//!     Ok(ToolOutput::text("12:00"))
//! });
//! let settings = AgentSettings::new(faux.model())
//!     .with_system_prompt("Answer briefly.")
//!     .with_tools(ToolSet::new([Arc::new(clock) as Arc<dyn tiller::AgentTool>])?);
//!
//! let supervisor = Supervisor::start().await?;
//! let agent = supervisor.spawn(AgentSpec::new(settings).with_name("assistant")).await?;
//! let mut events = agent.subscribe();
//! agent.prompt("What time is it?").await?;
//! while let Some(envelope) = events.next().await {
//!     if let tiller::Delivered::Event(tiller::AgentEvent::AgentEnd { .. }) = envelope.event {
//!         break;
//!     }
//! }
//! let state = agent.state().await?;
//! assert_eq!(state.messages.len(), 4); // question, tool call, tool result, answer
//! supervisor.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! The guarantees — what happens on abort, reset, failure, lag and shutdown — are
//! written down in [`runtime_semantics`].

mod actor;
mod agent;
pub mod agent_file;
mod agent_tool;
mod ask_agent;
pub mod command_tool;
mod compress;
mod definition;
mod definitions;
mod error;
mod handle;
mod llm;
mod message;
mod op;
mod patch;
mod route;
mod runtime;
mod settings;
mod state;
mod subscription;
mod supervisor;
mod tool_registry;

#[doc = include_str!("../../../docs/runtime-semantics.md")]
pub mod runtime_semantics {}

pub use command_tool::CommandTool;
pub use compress::{Compression, LOOKUP_TOOL};
pub use definition::{AgentDefinition, QueueLimits, QueueMode};
pub use definitions::{Definitions, DefinitionsError};
pub use error::{AgentError, SpawnError};
pub use handle::AgentHandle;
pub use llm::LlmConfigs;
pub use message::{AgentMsg, SettingsChange, Submission};
pub use op::{Op, Queues};
pub use patch::{DefinitionPatch, PatchError};
pub use settings::{AgentCode, AgentSettings, OnMessage, SystemPromptFn};
pub use state::{AgentInfo, AgentState, AgentStatus, RunOutcome, RunSummary};
pub use subscription::{AgentId, Delivered, Envelope, Notice, Relay, Subscription};
pub use supervisor::{AgentSpec, MAX_ID_BYTES, Supervisor, SupervisorConfig};
pub use tiller_core::ToolFilter;
pub use tool_registry::ToolRegistry;

pub use agent_tool::AgentAsTool;
pub use ask_agent::{ASK_AGENT_TOOL, AgentPath, AskAgent, AskAgentConfig};
pub use tiller_ai::{
    self, ApiKey, AssistantEvent, AssistantMessage, Content, ImageContent, Limit, Message, Model,
    OutputSchema, StopReason, StreamLimits, StreamOptions, ThinkingLevel, ToolCall, ToolChoice,
    Usage, catalog, env, faux,
};
pub use tiller_core::{
    self, ActionTool, AgentContext, AgentEvent, AgentMessage, AgentTool, Approval, ContextIds,
    ContinueError, CustomMessage, FnTool, IntoToolOutput, Output, OutputError, Prompt, Reply,
    RunEnd, RunHooks, RunOptions, SteeringDelivery, ToolContext, ToolError, ToolExecution,
    ToolExecutionMode, ToolOutput, ToolSet, ToolSetError, TranscriptError, UserRequest,
    check_transcript, hook,
};
/// Makes an agent tool of a Rust function: a unit struct `{Name}Tool`, named
/// after the function, whose name, description (the doc comment) and parameter
/// schema (the argument types, through `schemars`) come from the function.
///
/// ```
/// use tiller::{AgentTool, ToolContext, ToolError, tool};
///
/// /// Look a word up.
/// #[tool(params(word = "The word"), sequential)]
/// async fn define(word: String, ctx: &ToolContext) -> Result<String, ToolError> {
///     let user = ctx.agent().user_id().unwrap_or("someone");
///     Ok(format!("{word}: asked by {user}"))
/// }
///
/// assert_eq!(DefineTool.name(), "define");
/// assert_eq!(DefineTool.description(), "Look a word up.");
/// assert_eq!(DefineTool.parameters()["required"], serde_json::json!(["word"]));
/// ```
///
/// On an impl block, each method taking `&self` becomes a tool holding the value
/// in an `Arc` (`Notes::add` → `NotesAddTool`), a method's own `#[tool(...)]` sets
/// its options, and `Notes::tools(&Arc<Notes>)` gives them all; keep other methods
/// in another impl block.
///
/// Options: `name = "..."` (the name the model calls), `params(arg = "...")`
/// (argument descriptions), `sequential` (the tool runs alone). An argument of
/// type `ToolContext` or `&ToolContext` receives the call's context; the others
/// are decoded from the model's arguments. The function returns a `Result` whose
/// `Ok` is a `String`, a `serde_json::Value` or a [`ToolOutput`], and whose `Err`
/// converts into a [`ToolError`].
pub use tiller_macros::tool;
pub use tiller_mcp::{self, McpClient, McpServer, McpToolServer};
pub use tiller_store::{self, SessionStore};

// `#[tool]`'s generated code names `::tiller`, also inside this crate.
extern crate self as tiller;

/// What `#[tool]`'s generated code uses; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use futures::future::BoxFuture;
    pub use schemars;
    pub use serde;
    pub use serde_json;
    pub use tiller_core::{decode_arguments, parameters_schema, tool_result};
}
