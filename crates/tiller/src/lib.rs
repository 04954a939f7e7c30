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
//! // `tiller::ai::catalog::find("openai/gpt-4o-mini")`.
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
//! This crate is a facade. Its root holds what a host uses every day: the
//! supervisor, agent specs and settings, the ops and events, prompts, tools and
//! their context, definitions and the model. The rest is by module, one per
//! layer: [`runtime`] (the supervisor and its actors), [`run`] (the loop:
//! guardrails, budgets, hooks, compaction, user requests), [`agents`] (agent
//! files, delegation, LLM configurations, triggers), [`ai`] (providers,
//! messages, request options, the model catalog), [`store`] (sessions) and
//! `mcp`. The guarantees — what happens on abort, reset, failure, lag and
//! shutdown — are written down in [`runtime::runtime_semantics`]; the layers,
//! the path of one prompt and where each fact lives, in
//! [`runtime::architecture`].
//!
//! Features (all on by default): `sqlite` and `postgres`, the session stores;
//! `mcp`, tools from MCP servers and tools served to MCP hosts (`tiller::mcp`).

pub use tiller_runtime::{
    AgentDefinition, AgentError, AgentHandle, Delivered, Envelope, Op, RunOutcome, SpawnError,
    Supervisor, SupervisorConfig, wire,
};
pub use tiller_runtime::{AgentSettings, AgentSpec};

pub use tiller_agents::Definitions;
pub use tiller_ai::{Model, faux};
pub use tiller_core::{
    AgentContext, AgentEvent, AgentMessage, AgentTool, FnTool, Prompt, RunEnd, ToolContext,
    ToolError, ToolOutput, ToolSet,
};

/// The runtime: supervisor, agents as actors, their ops, state and events
/// (the [`tiller_runtime`] crate).
pub use tiller_runtime as runtime;

/// The loop and what it runs with: tools, guardrails, budgets, hooks,
/// compaction, user requests (the [`tiller_core`] crate).
pub use tiller_core as run;

/// Agents as definitions: agent files, delegation, LLM configurations, command
/// tools, triggers (the [`tiller_agents`] crate).
pub use tiller_agents as agents;

/// The wire to the models: providers, messages, streaming options, the model
/// catalog (the [`tiller_ai`] crate).
pub use tiller_ai as ai;

/// Where sessions are kept (the [`tiller_store`] crate).
pub use tiller_store as store;

/// Evaluations: suites of cases run over models and repetitions, checked by
/// expectations and judges, compared with a baseline (the [`tiller_eval`] crate).
pub use tiller_eval as eval;

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

/// Tools from MCP servers, and an agent's tools served to MCP hosts (the
/// [`tiller_mcp`] crate).
#[cfg(feature = "mcp")]
pub use tiller_mcp as mcp;

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
