//! An agent's settings: its data ([`AgentDefinition`]) and its code
//! ([`AgentCode`]: tools, hooks, prompt functions).
//!
//! Settings are shared copy-on-write: many agents spawned from one template hold one
//! copy until one of them changes a setting.

use std::fmt;
use std::sync::Arc;

use tiller_ai::{Model, OutputSchema, ThinkingLevel, ToolChoice};
use tiller_core::{AgentContext, RunHooks, ToolSet};

use crate::AgentMessage;
use crate::definition::AgentDefinition;
use crate::patch::{DefinitionPatch, PatchError};
use crate::subscription::AgentId;

/// Runs in the agent for every message added to its transcript, in order, before
/// subscribers see it (after the store was given it). A panic here fails the agent,
/// which its supervisor restarts from its session.
pub type OnMessage = Arc<dyn Fn(&AgentId, &AgentMessage) + Send + Sync>;

/// Changes, in place, a transcript reloaded from the store: the messages the
/// model sees, the first of them at the place (the `u64`) in the stored transcript.
pub type OnReload = Arc<dyn Fn(u64, &mut [Arc<AgentMessage>]) + Send + Sync>;

/// Writes a run's instructions from the agent's context, at the start of each run.
pub type SystemPromptFn = Arc<dyn Fn(&AgentContext) -> String + Send + Sync>;

/// The code that goes with an agent's [`AgentDefinition`]: what no store can keep,
/// and a resuming host supplies again.
#[derive(Clone, Default)]
pub struct AgentCode {
    /// The tools the definition names.
    pub tools: ToolSet,
    /// The application's callbacks around each run.
    pub hooks: RunHooks,
    /// Writes the instructions for each run from the agent's context, in place of
    /// the definition's `system_prompt` (which is still what the session stores).
    pub system_prompt_fn: Option<SystemPromptFn>,
    /// Runs for every message added to the transcript.
    pub on_message: Option<OnMessage>,
    /// Runs on a transcript reloaded from the store (a resume, a restart, a
    /// thaw) before the agent holds it: to shorten it, say (see
    /// `tiller_agents::Compression`). The store keeps every message as it was.
    pub on_reload: Option<OnReload>,
}

impl fmt::Debug for AgentCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |present: bool| if present { "set" } else { "none" };
        f.debug_struct("AgentCode")
            .field("tools", &self.tools)
            .field("hooks", &self.hooks)
            .field("system_prompt_fn", &set(self.system_prompt_fn.is_some()))
            .field("on_message", &set(self.on_message.is_some()))
            .field("on_reload", &set(self.on_reload.is_some()))
            .finish()
    }
}

/// What an agent is spawned with: its data, [`AgentDefinition`], and its code,
/// [`AgentCode`]. Shared copy-on-write: many agents spawned from one template hold
/// one copy until one of them changes.
///
/// ```
/// use tiller::{AgentSettings, run::{RunHooks, hook}};
/// # let model = tiller::faux::FauxProvider::new().model();
/// let mut settings = AgentSettings::new(model).with_hooks(RunHooks {
///     stop_when: Some(hook::stop_when(|turn| turn.called("finish"))),
///     ..RunHooks::default()
/// });
/// settings.definition.run.max_turns = 8;
/// settings.definition.run.stream.temperature = Some(0.2);
/// # let _ = settings;
/// ```
#[derive(Clone, Debug, Default)]
pub struct AgentSettings {
    /// The data: model, instructions, tool names, options.
    pub definition: AgentDefinition,
    /// The code: tools, hooks, prompt functions.
    pub code: AgentCode,
}

impl From<tiller_ai::env::EnvModel> for AgentSettings {
    /// Default settings with the model the environment chose
    /// ([`tiller_ai::env::from_env`]), passing the key it chose to pass.
    fn from(chosen: tiller_ai::env::EnvModel) -> Self {
        let mut settings = AgentSettings::new(chosen.model);
        settings.definition.run.stream.transport.api_key = chosen.api_key;
        settings
    }
}

impl AgentSettings {
    /// Default settings with this model.
    pub fn new(model: Model) -> Self {
        AgentSettings {
            definition: AgentDefinition::new(model),
            code: AgentCode::default(),
        }
    }

    /// The same settings with a system prompt.
    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.definition.system_prompt = Some(prompt.into());
        self
    }

    /// The same settings writing each run's instructions from the agent's context
    /// (who it works for, the host's extensions).
    pub fn with_system_prompt_fn(
        mut self,
        prompt: impl Fn(&AgentContext) -> String + Send + Sync + 'static,
    ) -> Self {
        self.code.system_prompt_fn = Some(Arc::new(prompt));
        self
    }

    /// The same settings requiring each run's final answer to match `schema`
    /// (see [`tiller_ai::StreamOptions::output_schema`]); `run.output_retries`
    /// failing answers go back to the model with their errors.
    pub fn with_output_schema(mut self, schema: OutputSchema) -> Self {
        self.definition.run.stream.output_schema = Some(schema);
        self
    }

    /// The same settings with these tools.
    pub fn with_tools(mut self, tools: ToolSet) -> Self {
        self.set_tools(tools);
        self
    }

    /// Gives the agent these tools: their code, and their names in the
    /// definition (what the session stores and a resuming host must supply). Set
    /// tools this way rather than through `code.tools` alone.
    pub fn set_tools(&mut self, tools: ToolSet) {
        self.definition.tools = tools
            .definitions()
            .iter()
            .map(|tool| tool.name.clone())
            .collect();
        self.code.tools = tools;
    }

    /// The same settings with a thinking level.
    pub fn with_thinking_level(mut self, level: ThinkingLevel) -> Self {
        self.definition.run.stream.thinking = level;
        self
    }

    /// The same settings asking the model for `choice` at the start of each run, and
    /// for `after` once it has called a tool when `choice` forces a call.
    pub fn with_tool_choice(mut self, choice: ToolChoice, after: Option<ToolChoice>) -> Self {
        self.definition.run.stream.tool_choice = Some(choice);
        self.definition.run.tool_choice_after_tools = after;
        self
    }

    /// The same settings with these run hooks.
    pub fn with_hooks(mut self, hooks: RunHooks) -> Self {
        self.code.hooks = hooks;
        self
    }

    /// The same settings running `hook` for every message added to the transcript.
    pub fn with_on_message(mut self, hook: OnMessage) -> Self {
        self.code.on_message = Some(hook);
        self
    }

    /// The same settings with `patch` applied (see [`DefinitionPatch::apply`]).
    pub fn with_patch(mut self, patch: &DefinitionPatch) -> Result<Self, PatchError> {
        patch.apply(&mut self.definition)?;
        Ok(self)
    }
}
