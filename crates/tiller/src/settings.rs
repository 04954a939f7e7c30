//! An agent's settings: the model and how to call it, its instructions and tools,
//! how its queues and tools behave, and its hooks.
//!
//! Settings are shared copy-on-write: many agents spawned from one template hold one
//! copy until one of them changes a setting.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tiller_ai::{Model, StreamOptions, ThinkingLevel, ToolChoice};
use tiller_core::{
    AfterToolCallHook, ApiKeyResolver, BeforeToolCallHook, ConvertToLlm, SteeringDelivery,
    StopWhen, ToolExecutionMode, ToolSet, TransformContext,
};

use crate::AgentMessage;
use crate::compress::Compression;
use crate::subscription::AgentId;

/// How many queued messages one delivery takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueMode {
    /// One message each time the queue is read, so each gets its own response.
    #[default]
    OneAtATime,
    /// Every queued message at once.
    All,
}

/// Runs in the agent for every message added to its transcript, in order, before
/// subscribers see it: the seam for persistence. A panic here fails the agent, which
/// its supervisor restarts.
pub type OnMessage = Arc<dyn Fn(&AgentId, &AgentMessage) + Send + Sync>;

/// The hooks of an agent's runs and of its transcript. [`crate::hook`] makes them
/// from closures:
///
/// ```
/// use tiller::{AgentHooks, hook};
/// let hooks = AgentHooks {
///     stop_when: Some(hook::stop_when(|turn| turn.called("finish"))),
///     ..AgentHooks::default()
/// };
/// # let _ = hooks;
/// ```
#[derive(Clone, Default)]
pub struct AgentHooks {
    /// What the model sees of the transcript (default: LLM messages, custom ones dropped).
    pub convert_to_llm: Option<ConvertToLlm>,
    /// Applied to the transcript before every model call.
    pub transform_context: Option<TransformContext>,
    /// Asked for the API key before every model call.
    pub api_key_resolver: Option<ApiKeyResolver>,
    /// Runs before each validated tool call.
    pub before_tool_call: Option<BeforeToolCallHook>,
    /// Runs after each tool call.
    pub after_tool_call: Option<AfterToolCallHook>,
    /// Stops a run after a turn when it answers `true`.
    pub stop_when: Option<StopWhen>,
    /// Runs for every message added to the transcript.
    pub on_message: Option<OnMessage>,
}

impl fmt::Debug for AgentHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set: Vec<&str> = [
            ("convert_to_llm", self.convert_to_llm.is_some()),
            ("transform_context", self.transform_context.is_some()),
            ("api_key_resolver", self.api_key_resolver.is_some()),
            ("before_tool_call", self.before_tool_call.is_some()),
            ("after_tool_call", self.after_tool_call.is_some()),
            ("stop_when", self.stop_when.is_some()),
            ("on_message", self.on_message.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, present)| present.then_some(name))
        .collect();
        f.debug_tuple("AgentHooks").field(&set).finish()
    }
}

/// Everything about an agent except its transcript and queues.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// Instructions sent ahead of the conversation.
    pub system_prompt: Option<String>,
    /// The model; an agent without one refuses to run.
    pub model: Option<Model>,
    /// How hard the model should think.
    pub thinking_level: ThinkingLevel,
    /// The tools the model may call.
    pub tools: ToolSet,
    /// The conversation's id, forwarded to the provider.
    pub session_id: Option<String>,
    /// Other request options (temperature, token limit, tool choice, retries,
    /// timeouts, headers, API key); their cancellation token is ignored.
    pub stream: StreamOptions,
    /// The tool choice once the model has called a tool in a run, when
    /// `stream.tool_choice` forces a call; `None` leaves it to the provider.
    pub tool_choice_after_tools: Option<ToolChoice>,
    /// How many steering messages one delivery takes.
    pub steering_mode: QueueMode,
    /// How many follow-up messages one delivery takes.
    pub follow_up_mode: QueueMode,
    /// When steering reaches the model.
    pub steering_delivery: SteeringDelivery,
    /// How a turn's tool calls run.
    pub tool_execution: ToolExecutionMode,
    /// The most turns one run makes.
    pub max_turns: u32,
    /// Hooks.
    pub hooks: AgentHooks,
    /// How a transcript reloaded from the store is compressed (long assistant
    /// answers cut, the `lookup` tool to read them whole); `None`, the default,
    /// reloads everything as it is.
    pub compression: Option<Compression>,
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            system_prompt: None,
            model: None,
            thinking_level: ThinkingLevel::Off,
            tools: ToolSet::empty(),
            session_id: None,
            stream: StreamOptions::default(),
            tool_choice_after_tools: None,
            steering_mode: QueueMode::OneAtATime,
            follow_up_mode: QueueMode::OneAtATime,
            steering_delivery: SteeringDelivery::Interrupt,
            tool_execution: ToolExecutionMode::Parallel,
            max_turns: 50,
            hooks: AgentHooks::default(),
            compression: None,
        }
    }
}

impl AgentSettings {
    /// Default settings with this model.
    pub fn new(model: Model) -> Self {
        AgentSettings {
            model: Some(model),
            ..AgentSettings::default()
        }
    }

    /// The same settings with a system prompt.
    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// The same settings with these tools.
    pub fn with_tools(mut self, tools: ToolSet) -> Self {
        self.tools = tools;
        self
    }

    /// The same settings with a thinking level.
    pub fn with_thinking_level(mut self, level: ThinkingLevel) -> Self {
        self.thinking_level = level;
        self
    }

    /// The same settings asking the model for `choice` at the start of each run, and
    /// for `after` once it has called a tool when `choice` forces a call.
    pub fn with_tool_choice(mut self, choice: ToolChoice, after: Option<ToolChoice>) -> Self {
        self.stream.tool_choice = Some(choice);
        self.tool_choice_after_tools = after;
        self
    }

    /// The same settings with these hooks.
    pub fn with_hooks(mut self, hooks: AgentHooks) -> Self {
        self.hooks = hooks;
        self
    }
}
