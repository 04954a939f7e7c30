//! Tiller's runtime: every agent a long-lived ractor actor that owns its state.
//!
//! Everything a caller can ask of an agent is an [`Op`], plain and serializable;
//! an [`AgentHandle`] is sugar over them, and the agent's actor carries each out.
//! The [`Supervisor`] spawns agents (new or resumed from a session store),
//! restarts a failing one within its budget, hibernates idle ones and shuts them
//! all down. An agent is spawned with [`AgentSettings`]: its data, an
//! [`AgentDefinition`] (stored with its session), and its code, [`AgentCode`].
//! This crate knows nothing of agent files, delegation or LLM configurations:
//! those are `tiller-agents`, built on the hooks and the [`AgentContext`] this one
//! offers. Most hosts add the `tiller` facade instead.
//!
//! ```
//! use tiller_runtime::{AgentSettings, AgentSpec, Op, Supervisor};
//! use tiller_ai::faux::{FauxProvider, FauxTurn};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let faux = FauxProvider::new();
//! faux.push(FauxTurn::text("Hello."));
//! let supervisor = Supervisor::start().await?;
//! let agent = supervisor.spawn(AgentSpec::new(AgentSettings::new(faux.model()))).await?;
//! agent.submit(Op::from(tiller_core::Prompt::from("Hi"))).await?;
//! agent.wait_for_idle().await;
//! assert_eq!(agent.state().await?.messages.len(), 2);
//! supervisor.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! The guarantees — what happens on abort, reset, failure, lag and shutdown — are
//! written down in [`runtime_semantics`]; where each fact lives and the path of one
//! prompt, in [`architecture`].

mod actor;
mod agent;
mod branch;
mod definition;
mod error;
mod event;
mod handle;
mod message;
mod op;
mod patch;
mod route;
mod runtime;
mod settings;
mod shards;
mod state;
mod subscription;
mod supervisor;
mod wakes;
pub mod wire;

#[doc = include_str!("../../../docs/runtime-semantics.md")]
pub mod runtime_semantics {}

#[doc = include_str!("../../../docs/architecture.md")]
pub mod architecture {}

pub use branch::fork_stored;
pub use definition::{AgentDefinition, QueueLimits, QueueMode};
pub use error::{AgentError, SpawnError};
pub use event::{Event, EventError, EventSink, MAX_TOPIC_BYTES};
pub use handle::AgentHandle;
pub use message::{AgentMsg, SettingsChange, Submission};
pub use op::{Op, Queues};
pub use patch::{DefinitionPatch, PatchError};
pub use runtime::SupervisorConfig;
pub use settings::{AgentCode, AgentSettings, OnMessage, OnReload, SystemPromptFn};
pub use shards::Shards;
pub use state::{
    AgentInfo, AgentState, AgentStatus, MessageStatus, RunOutcome, RunSummary, Workload,
    message_statuses,
};
pub use subscription::{AgentId, Delivered, Envelope, Notice, Relay, Subscription};
pub use supervisor::{AgentSpec, MAX_ID_BYTES, Supervisor, check_id};

// Paths the modules name the loop's types by.
use tiller_core::{AgentContext, AgentMessage, ContextIds};
