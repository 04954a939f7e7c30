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
//! This crate is a facade: the runtime is [`tiller_runtime`], agents as
//! definitions (agent files, delegation, LLM configurations, command tools) are
//! [`tiller_agents`], the loop is [`tiller_core`] and the wire [`tiller_ai`]. The
//! guarantees — what happens on abort, reset, failure, lag and shutdown — are
//! written down in [`runtime_semantics`]; the layers, the path of one prompt and
//! where each fact lives, in [`architecture`].
//!
//! Features (all on by default): `sqlite` and `postgres`, the session stores;
//! `mcp`, tools from MCP servers and tools served to MCP hosts ([`tiller_mcp`]).

pub use tiller_runtime::{
    self, AgentCode, AgentDefinition, AgentError, AgentHandle, AgentId, AgentInfo, AgentMsg,
    AgentSettings, AgentSpec, AgentState, AgentStatus, DefinitionPatch, Delivered, Envelope, Event,
    EventError, EventSink, MAX_ID_BYTES, Notice, OnMessage, OnReload, Op, PatchError, QueueLimits,
    QueueMode, Queues, Relay, RunOutcome, RunSummary, SettingsChange, Shards, SpawnError,
    Submission, Subscription, Supervisor, SupervisorConfig, SystemPromptFn, Workload, architecture,
    runtime_semantics, wire,
};

pub use tiller_agents::{
    self, ASK_AGENT_TOOL, AgentAsTool, Arrival, AskAgent, AskAgentConfig, CommandTool, Compression,
    Definitions, DefinitionsError, LOOKUP_TOOL, LlmConfigError, LlmConfigs, ModelChoice,
    ModelChoiceError, ModelSources, Named, Spawned, Spawner, ToolRegistry, Trigger, Triggers,
    WindowLimits, WindowQuota, agent_file, choose_model, command_tool, trigger,
};
pub use tiller_ai::{
    self, ApiKey, AssistantEvent, AssistantMessage, Content, ImageContent, Limit, Message, Model,
    OutputSchema, StopReason, StreamLimits, StreamOptions, ThinkingLevel, ToolCall, ToolChoice,
    Usage, catalog, env, faux,
};
pub use tiller_core::compaction;
pub use tiller_core::{
    self, ActionTool, AgentContext, AgentEvent, AgentMessage, AgentTool, Approval, Budget,
    BudgetExceeded, Budgets, CompactionPolicy, CompactionReason, CompactionReport, ContextIds,
    ContextOverrides, ContextState, ContinueError, CustomMessage, DEFAULT_TENANT, DEFAULT_USER,
    FnTool, Guardrail, GuardrailStage, GuardrailTripped, Guardrails, IntoToolOutput, Output,
    OutputError, Prompt, Reply, RunEnd, RunHooks, RunOptions, SteeringDelivery, StoredContext,
    ToolContext, ToolError, ToolExecution, ToolExecutionMode, ToolFilter, ToolOutput, ToolSet,
    ToolSetError, TranscriptError, UserRequest, Verdict, WidgetTool, check_transcript, hook,
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
#[cfg(feature = "mcp")]
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
