//! An agent's settings: the model, its instructions and tools, how its runs behave
//! ([`RunOptions`], shared with the loop), how its queues deliver, and its hooks.
//!
//! Settings are shared copy-on-write: many agents spawned from one template hold one
//! copy until one of them changes a setting.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tiller_ai::{Model, OutputSchema, ThinkingLevel, ToolChoice};
use tiller_core::{AgentContext, RunHooks, RunOptions, ToolSet};

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

/// How much a steering or follow-up queue holds at most: past either bound, a
/// message is refused with [`crate::AgentError::QueueFull`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLimits {
    /// The most messages one queue holds (default 256).
    pub max_messages: usize,
    /// The most bytes one queue holds, counted as the messages' JSON (default 1 MiB).
    pub max_bytes: usize,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            max_messages: 256,
            max_bytes: 1 << 20,
        }
    }
}

/// Runs in the agent for every message added to its transcript, in order, before
/// subscribers see it (after the store was given it). A panic here fails the agent,
/// which its supervisor restarts from its session.
pub type OnMessage = Arc<dyn Fn(&AgentId, &AgentMessage) + Send + Sync>;

/// Writes a run's instructions from the agent's context, at the start of each run.
pub type SystemPromptFn = Arc<dyn Fn(&AgentContext) -> String + Send + Sync>;

/// Everything about an agent except its transcript and queues. How its runs behave
/// lives in one place, [`AgentSettings::run`], which each run takes whole.
///
/// ```
/// use tiller::{AgentSettings, RunHooks, hook};
/// # let model = tiller::faux::FauxProvider::new().model();
/// let mut settings = AgentSettings::new(model).with_hooks(RunHooks {
///     stop_when: Some(hook::stop_when(|turn| turn.called("finish"))),
///     ..RunHooks::default()
/// });
/// settings.run.max_turns = 8;
/// settings.run.stream.temperature = Some(0.2);
/// # let _ = settings;
/// ```
#[derive(Clone)]
pub struct AgentSettings {
    /// Instructions sent ahead of the conversation.
    pub system_prompt: Option<String>,
    /// Writes the instructions for each run from the agent's context, in place of
    /// `system_prompt` (which is still what the session stores).
    pub system_prompt_fn: Option<SystemPromptFn>,
    /// The model; an agent without one refuses to run.
    pub model: Option<Model>,
    /// The tools the model may call.
    pub tools: ToolSet,
    /// How its runs behave: request options (`run.stream`: thinking level, the
    /// session id forwarded to the provider, temperature, token limit, tool choice,
    /// retries, timeouts, headers, key), the tool choice after a forced call,
    /// steering delivery, tool execution, the turn limit, the grace after an abort,
    /// the tool-output limit and the run hooks.
    pub run: RunOptions,
    /// How many steering messages one delivery takes.
    pub steering_mode: QueueMode,
    /// How many follow-up messages one delivery takes.
    pub follow_up_mode: QueueMode,
    /// How much each of the steering and follow-up queues holds at most.
    pub queue_limits: QueueLimits,
    /// Runs for every message added to the transcript.
    pub on_message: Option<OnMessage>,
    /// How a transcript reloaded from the store is compressed (long assistant
    /// answers cut, the `lookup` tool to read them whole); `None`, the default,
    /// reloads everything as it is.
    pub compression: Option<Compression>,
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            system_prompt: None,
            system_prompt_fn: None,
            model: None,
            tools: ToolSet::empty(),
            run: RunOptions::default(),
            steering_mode: QueueMode::OneAtATime,
            follow_up_mode: QueueMode::OneAtATime,
            queue_limits: QueueLimits::default(),
            on_message: None,
            compression: None,
        }
    }
}

impl fmt::Debug for AgentSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentSettings")
            .field("system_prompt", &self.system_prompt)
            .field(
                "system_prompt_fn",
                &self.system_prompt_fn.as_ref().map(|_| "set"),
            )
            .field("model", &self.model)
            .field("tools", &self.tools)
            .field("run", &self.run)
            .field("steering_mode", &self.steering_mode)
            .field("follow_up_mode", &self.follow_up_mode)
            .field("queue_limits", &self.queue_limits)
            .field("on_message", &self.on_message.as_ref().map(|_| "set"))
            .field("compression", &self.compression)
            .finish()
    }
}

impl From<tiller_ai::env::EnvModel> for AgentSettings {
    /// Default settings with the model the environment chose
    /// ([`crate::env::from_env`]), passing the key it chose to pass.
    fn from(chosen: tiller_ai::env::EnvModel) -> Self {
        let mut settings = AgentSettings::new(chosen.model);
        settings.run.stream.api_key = chosen.api_key;
        settings
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

    /// The same settings writing each run's instructions from the agent's context
    /// (who it works for, the host's extensions).
    pub fn with_system_prompt_fn(
        mut self,
        prompt: impl Fn(&AgentContext) -> String + Send + Sync + 'static,
    ) -> Self {
        self.system_prompt_fn = Some(Arc::new(prompt));
        self
    }

    /// The same settings requiring each run's final answer to match `schema`
    /// (see [`tiller_ai::StreamOptions::output_schema`]); `run.output_retries`
    /// failing answers go back to the model with their errors.
    pub fn with_output_schema(mut self, schema: OutputSchema) -> Self {
        self.run.stream.output_schema = Some(schema);
        self
    }

    /// The same settings with these tools.
    pub fn with_tools(mut self, tools: ToolSet) -> Self {
        self.tools = tools;
        self
    }

    /// The same settings with a thinking level.
    pub fn with_thinking_level(mut self, level: ThinkingLevel) -> Self {
        self.run.stream.thinking = level;
        self
    }

    /// The same settings asking the model for `choice` at the start of each run, and
    /// for `after` once it has called a tool when `choice` forces a call.
    pub fn with_tool_choice(mut self, choice: ToolChoice, after: Option<ToolChoice>) -> Self {
        self.run.stream.tool_choice = Some(choice);
        self.run.tool_choice_after_tools = after;
        self
    }

    /// The same settings with these run hooks.
    pub fn with_hooks(mut self, hooks: RunHooks) -> Self {
        self.run.hooks = hooks;
        self
    }

    /// The same settings running `hook` for every message added to the transcript.
    pub fn with_on_message(mut self, hook: OnMessage) -> Self {
        self.on_message = Some(hook);
        self
    }
}
