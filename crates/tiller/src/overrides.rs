//! [`RunOverrides`]: what one run changes of its agent's settings (the model
//! configuration, instructions, turn limit, output schema, stop conditions),
//! leaving the settings themselves as they were.

use std::fmt;

use tiller_core::StopWhen;

use crate::llm::{LlmConfig, LlmError};
use crate::{AgentSettings, OutputSchema};

/// Settings for one run only: `handle.run_with(prompt, overrides)`.
///
/// ```
/// use tiller::{RunOverrides, hook};
/// let overrides = RunOverrides {
///     system_prompt: Some("Answer in one word.".into()),
///     max_turns: Some(3),
///     // "Run until": the run goes on until the answer says DONE (or 3 turns).
///     run_until: Some(hook::stop_when(|turn| turn.text().contains("DONE"))),
///     ..RunOverrides::default()
/// };
/// # let _ = overrides;
/// ```
#[derive(Clone, Default)]
pub struct RunOverrides {
    /// A model configuration over the agent's (see [`LlmConfig::apply`]).
    pub llm: Option<LlmConfig>,
    /// Instructions in place of the agent's (and of its system-prompt function).
    pub system_prompt: Option<String>,
    /// The turn limit.
    pub max_turns: Option<u32>,
    /// A schema the final answer must match.
    pub output_schema: Option<OutputSchema>,
    /// Stops the run after a turn when it answers `true`.
    pub stop_when: Option<StopWhen>,
    /// Keeps the run going until it answers `true` (see `RunHooks::run_until`).
    pub run_until: Option<StopWhen>,
}

impl RunOverrides {
    /// `settings` with these overrides.
    pub fn applied_to(&self, settings: &AgentSettings) -> Result<AgentSettings, LlmError> {
        let mut settings = settings.clone();
        if let Some(llm) = &self.llm {
            llm.apply(&mut settings)?;
        }
        if let Some(prompt) = &self.system_prompt {
            settings.system_prompt = Some(prompt.clone());
            settings.system_prompt_fn = None;
        }
        if let Some(max_turns) = self.max_turns {
            settings.run.max_turns = max_turns;
        }
        if let Some(schema) = &self.output_schema {
            settings.run.stream.output_schema = Some(schema.clone());
        }
        if let Some(stop) = &self.stop_when {
            settings.run.hooks.stop_when = Some(stop.clone());
        }
        if let Some(until) = &self.run_until {
            settings.run.hooks.run_until = Some(until.clone());
        }
        Ok(settings)
    }
}

impl fmt::Debug for RunOverrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOverrides")
            .field("llm", &self.llm)
            .field("system_prompt", &self.system_prompt)
            .field("max_turns", &self.max_turns)
            .field("output_schema", &self.output_schema)
            .field("stop_when", &self.stop_when.as_ref().map(|_| "set"))
            .field("run_until", &self.run_until.as_ref().map(|_| "set"))
            .finish()
    }
}
