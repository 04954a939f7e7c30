//! [`AgentDefinition`]: the part of an agent's settings a session store keeps (the
//! model, instructions, tool names and options), and how a resumed agent takes it
//! back. Tools and hooks are code: a resuming host supplies them.

use serde::{Deserialize, Serialize};
use tiller_ai::{Model, ThinkingLevel};

use tiller_core::{SteeringDelivery, ToolExecutionMode};

use crate::compress::LOOKUP_TOOL;
use crate::settings::{AgentSettings, QueueMode};

/// An agent's settings as stored with its session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDefinition {
    /// The model, without its headers (which may hold secrets).
    pub model: Option<Model>,
    /// Instructions sent ahead of the conversation.
    pub system_prompt: Option<String>,
    /// How hard the model thinks.
    pub thinking_level: ThinkingLevel,
    /// The names of the agent's tools.
    pub tools: Vec<String>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// The most tokens one response may hold.
    pub max_tokens: Option<u32>,
    /// The most turns one run makes.
    pub max_turns: u32,
    /// How many steering messages one delivery takes.
    pub steering_mode: QueueMode,
    /// How many follow-up messages one delivery takes.
    pub follow_up_mode: QueueMode,
    /// When steering reaches the model.
    pub steering_delivery: SteeringDelivery,
    /// How a turn's tool calls run.
    pub tool_execution: ToolExecutionMode,
}

impl AgentDefinition {
    /// What the store keeps of `settings`.
    pub fn of(settings: &AgentSettings) -> Self {
        AgentDefinition {
            model: settings.model.as_ref().map(|model| {
                let mut model = model.clone();
                model.headers = Default::default();
                model
            }),
            system_prompt: settings.system_prompt.clone(),
            thinking_level: settings.run.stream.thinking,
            // The built-in lookup tool comes with the compression setting, not the store.
            tools: settings
                .tools
                .definitions()
                .iter()
                .filter(|tool| tool.name != LOOKUP_TOOL)
                .map(|tool| tool.name.clone())
                .collect(),
            temperature: settings.run.stream.temperature,
            max_tokens: settings.run.stream.max_tokens,
            max_turns: settings.run.max_turns,
            steering_mode: settings.steering_mode,
            follow_up_mode: settings.follow_up_mode,
            steering_delivery: settings.run.steering_delivery,
            tool_execution: settings.run.tool_execution,
        }
    }

    /// `settings` with this definition applied: the stored model (unless `settings`
    /// has the same provider and id, whose own model keeps its headers), the stored
    /// instructions and options. Tools and hooks stay those of `settings`; the
    /// names of stored tools it lacks are returned as the error.
    pub fn apply_to(&self, settings: &AgentSettings) -> Result<AgentSettings, Vec<String>> {
        let own = AgentDefinition::of(settings).tools;
        let missing: Vec<String> = self
            .tools
            .iter()
            .filter(|name| !own.contains(name))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        let mut applied = settings.clone();
        let same_model = match (&settings.model, &self.model) {
            (Some(own), Some(stored)) => own.provider == stored.provider && own.id == stored.id,
            _ => false,
        };
        if !same_model {
            applied.model = self.model.clone();
        }
        applied.system_prompt = self.system_prompt.clone();
        applied.run.stream.thinking = self.thinking_level;
        applied.run.stream.temperature = self.temperature;
        applied.run.stream.max_tokens = self.max_tokens;
        applied.run.max_turns = self.max_turns;
        applied.steering_mode = self.steering_mode;
        applied.follow_up_mode = self.follow_up_mode;
        applied.run.steering_delivery = self.steering_delivery;
        applied.run.tool_execution = self.tool_execution;
        Ok(applied)
    }
}
