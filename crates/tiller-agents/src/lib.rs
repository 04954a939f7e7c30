//! Agents as definitions, for Tiller: agent files (YAML or JSON) and
//! [`Definitions`] of them by name and version; named LLM configurations
//! ([`LlmConfigs`]); command tools; `ask_agent`, with which agents hand work to
//! each other, and agents as tools; the [`ToolRegistry`] files name tools from;
//! [`Triggers`], which start agents on published events; and transcript
//! [`Compression`] with its `lookup` tool. It is built on
//! `tiller-runtime`'s hooks and [`AgentContext`](tiller_core::AgentContext), and
//! the runtime knows nothing of it.
//!
//! ```
//! use tiller_agents::{Definitions, agent_file::AgentFile};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let folder = std::env::temp_dir().join(format!("tiller-agents-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&folder)?;
//! std::fs::write(
//!     folder.join("helper.yaml"),
//!     "type: object\ndescription: You help.\njson_schema_extra: {kind: agent, name: helper, model: faux}\n",
//! )?;
//! let definitions = Definitions::load_dir(&folder)?;
//! let spec = definitions.spec("helper", None)?;
//! assert_eq!(spec.settings.definition.system_prompt.as_deref(), Some("You help."));
//! # std::fs::remove_dir_all(&folder)?;
//! # Ok(())
//! # }
//! ```

pub mod agent_file;
mod agent_tool;
mod ask_agent;
pub mod command_tool;
mod compress;
mod definitions;
pub mod guardrail;
mod llm;
mod memory;
mod model_choice;
pub mod schedule;
mod tool_registry;
pub mod trigger;

pub use agent_tool::AgentAsTool;
pub use ask_agent::{ASK_AGENT_TOOL, AskAgent, AskAgentConfig};
pub use command_tool::CommandTool;
pub use compress::{Compression, LOOKUP_TOOL};
pub use definitions::{Definitions, DefinitionsError};
pub use guardrail::{GuardrailNames, agent_guardrail};
pub use llm::{LlmConfigError, LlmConfigs};
pub use memory::{
    EMBED_DEADLINE, EmbeddingsConfig, MemoryConfig, RECALL_TOOL, REMEMBER_TOOL,
    WORKING_MEMORY_TOOL, owner_of,
};
pub use model_choice::{ModelChoice, ModelChoiceError, ModelSources, Named, choose_model};
pub use schedule::Schedules;
pub use tool_registry::ToolRegistry;
pub use trigger::{
    Arrival, DEFAULT_WINDOW_BYTES, DEFAULT_WINDOWS, MAX_BATCH, MAX_DEBOUNCE_MS, Spawned, Spawner,
    Trigger, Triggers, WindowLimits, WindowQuota,
};

// Paths the modules name the runtime's, the loop's and the wire's types by.
use tiller_ai::{ApiKey, Model, OutputSchema, ThinkingLevel, ToolChoice};
use tiller_core::{
    ActionTool, AgentMessage, AgentTool, FnTool, ToolContext, ToolError, ToolOutput, ToolSet,
    ToolSetError, WidgetTool,
};
use tiller_runtime::{AgentHandle, AgentSettings, AgentSpec, RunOutcome, Supervisor};
