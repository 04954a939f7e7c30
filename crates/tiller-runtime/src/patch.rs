//! [`DefinitionPatch`]: changes to an [`AgentDefinition`], every field optional.
//! The one shape for a named LLM configuration, a run's own settings, an agent
//! file's model and options, and the command line's flags; patches layer with
//! [`DefinitionPatch::merged`] and land with [`DefinitionPatch::apply`].
//!
//! ```
//! use tiller::{AgentSettings, runtime::DefinitionPatch};
//!
//! let local = DefinitionPatch {
//!     base_url: Some("http://127.0.0.1:8080/v1".into()),
//!     model: Some("smollm2".into()),
//!     temperature: Some(0.2),
//!     ..DefinitionPatch::default()
//! };
//! let careful = local.merged(&DefinitionPatch {
//!     temperature: Some(0.0),
//!     ..DefinitionPatch::default()
//! });
//! let settings = AgentSettings::default().with_patch(&careful).unwrap();
//! assert_eq!(settings.definition.model.as_ref().unwrap().id, "smollm2");
//! assert_eq!(settings.definition.run.stream.temperature, Some(0.0));
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tiller_ai::{
    ApiKey, Model, OutputSchema, StreamOptions, ThinkingBudgets, ThinkingLevel, ToolChoice,
};
use tiller_core::Budgets;

use crate::definition::AgentDefinition;

/// Changes to an agent's definition: a field set here replaces the definition's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefinitionPatch {
    /// The provider: `openai`, `anthropic`, `llamacpp`, … (see
    /// [`catalog::providers`](tiller_ai::catalog::providers)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model: `provider/id` or, with `provider` or `base_url`, its id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Any OpenAI-compatible server (`http://127.0.0.1:8080/v1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable holding the key to send; the provider's own
    /// variable when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Instructions in place of the definition's (and, for a run, of the agent's
    /// system-prompt function).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// Instructions for an agent that has none of its own (a named LLM
    /// configuration's house prompt): used only when neither the definition nor
    /// a patch gives a system prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_system_prompt: Option<String>,
    /// The sampling temperature.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The most tokens an answer may hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The model's context window, in tokens, in place of the catalog's (a local
    /// server's `-c`, which no catalog knows); compaction keeps the transcript
    /// inside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// How hard a reasoning model thinks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<ThinkingLevel>,
    /// Token budgets per thinking level, for providers that take a budget
    /// (Anthropic's `thinking.budget_tokens`, Gemini's `thinkingBudget`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_budgets: Option<ThinkingBudgets>,
    /// Provider-specific keys added to the top level of each request's JSON body
    /// as they are ([`StreamOptions::extra_body`](tiller_ai::StreamOptions::extra_body));
    /// merged key by key with the layers below.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub extra_body: Map<String, Value>,
    /// The most turns a run makes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// The tool choice at the start of each run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// The tool choice once a forced call was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice_after_tools: Option<ToolChoice>,
    /// A schema the final answer must match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<OutputSchema>,
    /// The models asked, in order, when the one before fails in a way retrying
    /// did not fix, each `provider/id` (in files, `model: [primary, fallback, …]`
    /// says the same).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallbacks: Option<Vec<String>>,
    /// What a run and the agent may spend (see [`tiller_core::budget`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budgets>,
    /// The name of the account whose rate limits the requests share with every
    /// request of that name, model and key (see [`tiller_ai::ratelimit`]); a
    /// named LLM configuration's name by default. Unnamed, an account is its key
    /// at the provider's address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

/// Why a patch cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PatchError {
    /// Its model (or a fallback) cannot be made (an unknown provider or model).
    #[error("{0}")]
    Model(String),
    /// The key variable it names is not set.
    #[error("{0} is not set")]
    MissingKey(String),
    /// The request options it sets cannot be read as request options.
    #[error("its request options cannot be used: {0}")]
    Options(String),
}

impl DefinitionPatch {
    /// This patch with `over`'s fields where `over` sets them (`extra_body` key
    /// by key); naming a model or a provider in `over` starts the model over (its
    /// server too). Merged field by field as their JSON, so that a new field of
    /// the patch merges with no code of its own. A patch holding a value no
    /// patch can be read with (a negative cost, a temperature that is not a
    /// number) gives way to `over` whole.
    pub fn merged(&self, over: &DefinitionPatch) -> DefinitionPatch {
        let mut merged = fields(self);
        if over.provider.is_some() || over.model.is_some() {
            for field in ["provider", "model", "base_url"] {
                merged.remove(field);
            }
        }
        for (field, value) in fields(over) {
            match (merged.get_mut(&field), value) {
                (Some(Value::Object(mine)), Value::Object(theirs)) if field == "extra_body" => {
                    mine.extend(theirs);
                }
                (_, value) => {
                    merged.insert(field, value);
                }
            }
        }
        // Only a patch holding what a patch cannot be read with (a negative
        // cost, a temperature that is not a number) fails here: `over` wins whole.
        serde_json::from_value(Value::Object(merged)).unwrap_or_else(|_| over.clone())
    }

    /// The fallback models it names, each made as [`DefinitionPatch::model`]
    /// makes the model.
    pub fn fallback_models(&self) -> Result<Option<Vec<Model>>, PatchError> {
        let Some(names) = &self.fallbacks else {
            return Ok(None);
        };
        names
            .iter()
            .map(|name| {
                let named = tiller_ai::env::model_from(|variable| {
                    (variable == "TILLER_MODEL").then(|| name.clone())
                });
                match named {
                    Ok(Some(model)) => Ok(model),
                    Ok(None) => Err(PatchError::Model(format!(
                        "fallback `{name}`: no such model"
                    ))),
                    Err(error) => Err(PatchError::Model(format!(
                        "fallback `{name}`: {}",
                        error.reason
                    ))),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The model it names, if it names one (`faux` is the scripted demo model;
    /// see [`tiller_ai::env::model_from`]).
    pub fn model(&self) -> Result<Option<Model>, PatchError> {
        if self.provider.is_none() && self.model.is_none() && self.base_url.is_none() {
            return Ok(None);
        }
        tiller_ai::env::model_from(|variable| match variable {
            "TILLER_PROVIDER" => self.provider.clone(),
            "TILLER_MODEL" => self.model.clone(),
            "TILLER_BASE_URL" => self.base_url.clone(),
            _ => None,
        })
        .map_err(|error| PatchError::Model(error.reason))
    }

    /// Sets what it sets in `definition`: the model when it names one, the key
    /// its variable holds, the instructions and the options. Nothing changes when
    /// it cannot be used.
    pub fn apply(&self, definition: &mut AgentDefinition) -> Result<(), PatchError> {
        let model = self.model()?;
        let fallbacks = self.fallback_models()?;
        let key = match &self.api_key_env {
            Some(variable) => Some(
                std::env::var(variable)
                    .ok()
                    .filter(|key| !key.trim().is_empty())
                    .map(|key| ApiKey::new(key.trim()))
                    .ok_or_else(|| PatchError::MissingKey(variable.clone()))?,
            ),
            None => None,
        };
        let mut stream = self.onto(&definition.run.stream)?;
        if key.is_some() {
            stream.transport.api_key = key;
        }
        if model.is_some() {
            definition.model = model;
        }
        if let Some(fallbacks) = fallbacks {
            definition.fallbacks = fallbacks;
        }
        if let (Some(window), Some(model)) = (self.context_window, definition.model.as_mut()) {
            model.context_window = window;
        }
        if let Some(prompt) = &self.system_prompt {
            definition.system_prompt = Some(prompt.clone());
        } else if definition.system_prompt.is_none() {
            definition.system_prompt = self.default_system_prompt.clone();
        }
        let run = &mut definition.run;
        if let Some(budget) = self.budget {
            run.budget = budget;
        }
        if let Some(max_turns) = self.max_turns {
            run.max_turns = max_turns;
        }
        if let Some(after) = &self.tool_choice_after_tools {
            run.tool_choice_after_tools = Some(after.clone());
        }
        run.stream = stream;
        Ok(())
    }

    /// `stream` with the request options this patch sets: each field of the
    /// patch named as a field of [`StreamOptions`] is that option (`extra_body`
    /// key by key), so that a new request option is patched with no code of its
    /// own. The transport stays; the other options are read back as they
    /// serialize (durations to the millisecond) when the patch sets any.
    fn onto(&self, stream: &StreamOptions) -> Result<StreamOptions, PatchError> {
        let unreadable = |error: serde_json::Error| PatchError::Options(error.to_string());
        let Value::Object(mut options) = serde_json::to_value(stream).map_err(unreadable)? else {
            unreachable!("request options are a JSON object")
        };
        let mut patched = false;
        for (field, value) in fields(self) {
            match (options.get_mut(&field), value) {
                (Some(Value::Object(mine)), Value::Object(theirs)) if field == "extra_body" => {
                    mine.extend(theirs);
                }
                (Some(option), value) => *option = value,
                (None, _) => continue,
            }
            patched = true;
        }
        if !patched {
            // Read back only when changed: durations are kept in milliseconds.
            return Ok(stream.clone());
        }
        let mut patched: StreamOptions =
            serde_json::from_value(Value::Object(options)).map_err(unreadable)?;
        patched.transport = stream.transport.clone();
        Ok(patched)
    }

    /// The model and request options `definition` runs with, as a patch (never a
    /// key).
    pub fn of(definition: &AgentDefinition) -> DefinitionPatch {
        let stream = &definition.run.stream;
        let model = definition.model.as_ref();
        DefinitionPatch {
            provider: model.map(|m| m.provider.clone()),
            model: model.map(|m| m.id.clone()),
            base_url: model.map(|m| m.base_url.clone()),
            temperature: stream.temperature,
            max_tokens: stream.max_tokens,
            thinking: Some(stream.thinking),
            thinking_budgets: (stream.thinking_budgets != ThinkingBudgets::default())
                .then_some(stream.thinking_budgets),
            extra_body: stream.extra_body.clone(),
            ..DefinitionPatch::default()
        }
    }
}

/// The fields a patch sets, as JSON.
fn fields(patch: &DefinitionPatch) -> Map<String, Value> {
    match serde_json::to_value(patch) {
        Ok(Value::Object(fields)) => fields,
        _ => unreachable!("a patch is a JSON object"),
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    /// A patch that sets every field.
    fn every_field() -> DefinitionPatch {
        let mut budget = Budgets::default();
        budget.run.output_tokens = Some(500);
        budget.agent.cost_usd = Some(1.5);
        DefinitionPatch {
            provider: Some("openai".into()),
            model: Some("gpt-4o-mini".into()),
            base_url: Some("http://127.0.0.1:8080/v1".into()),
            api_key_env: Some("LOCAL_KEY".into()),
            system_prompt: Some("Be brief.".into()),
            default_system_prompt: Some("You help.".into()),
            temperature: Some(0.2),
            max_tokens: Some(256),
            context_window: Some(8_192),
            thinking: Some(ThinkingLevel::High),
            thinking_budgets: Some(ThinkingBudgets {
                minimal: 1,
                low: 2,
                medium: 3,
                high: 4,
                xhigh: 5,
            }),
            extra_body: serde_json::json!({"top_k": 40})
                .as_object()
                .unwrap()
                .clone(),
            max_turns: Some(7),
            tool_choice: Some(ToolChoice::Tool("search".into())),
            tool_choice_after_tools: Some(ToolChoice::None),
            output_schema: Some(OutputSchema::new(
                "answer",
                serde_json::json!({"type": "object"}),
            )),
            fallbacks: Some(vec!["anthropic/claude-haiku-4-5".into()]),
            budget: Some(budget),
            account: Some("team".into()),
        }
    }

    #[test]
    fn a_patch_setting_every_field_merges_whole_over_and_under_nothing() {
        let full = every_field();
        assert_eq!(DefinitionPatch::default().merged(&full), full);
        assert_eq!(full.merged(&DefinitionPatch::default()), full);
        let more = full.merged(&DefinitionPatch {
            extra_body: serde_json::json!({"seed": 1}).as_object().unwrap().clone(),
            ..DefinitionPatch::default()
        });
        assert_eq!(
            Value::Object(more.extra_body),
            serde_json::json!({"top_k": 40, "seed": 1})
        );
    }

    #[test]
    fn every_request_option_a_patch_sets_reaches_the_stream_and_the_transport_stays() {
        let patch = DefinitionPatch {
            provider: None,
            model: None,
            base_url: None,
            api_key_env: None,
            fallbacks: None,
            ..every_field()
        };
        let mut definition = AgentDefinition::new(tiller_ai::faux::demo_model());
        let stream = &mut definition.run.stream;
        stream.extra_body = serde_json::json!({"seed": 1}).as_object().unwrap().clone();
        stream.transport.api_key = Some(ApiKey::new("kept"));
        let cancel = stream.transport.cancel.clone();
        patch.apply(&mut definition).unwrap();
        let stream = &definition.run.stream;
        assert_eq!(
            (stream.temperature, stream.max_tokens, stream.thinking),
            (patch.temperature, patch.max_tokens, ThinkingLevel::High)
        );
        assert_eq!(Some(stream.thinking_budgets), patch.thinking_budgets);
        assert_eq!(stream.tool_choice, patch.tool_choice);
        assert_eq!(stream.output_schema, patch.output_schema);
        assert_eq!(stream.account, patch.account);
        assert_eq!(
            Value::Object(stream.extra_body.clone()),
            serde_json::json!({"seed": 1, "top_k": 40})
        );
        let key = stream.transport.api_key.as_ref().map(ApiKey::expose);
        assert_eq!(key, Some("kept"));
        cancel.cancel();
        assert!(stream.transport.cancel.is_cancelled(), "the same token");
        let run = &definition.run;
        assert_eq!(
            (Some(run.max_turns), Some(run.budget)),
            (patch.max_turns, patch.budget)
        );
        assert_eq!(run.tool_choice_after_tools, patch.tool_choice_after_tools);
    }

    #[test]
    fn later_patches_win_field_by_field_and_a_new_model_drops_the_server() {
        let base = DefinitionPatch {
            base_url: Some("http://127.0.0.1:8080/v1".into()),
            model: Some("smollm2".into()),
            temperature: Some(0.7),
            max_tokens: Some(256),
            ..DefinitionPatch::default()
        };
        assert_eq!(
            base.merged(&DefinitionPatch {
                temperature: Some(0.0),
                max_turns: Some(3),
                ..DefinitionPatch::default()
            }),
            DefinitionPatch {
                temperature: Some(0.0),
                max_turns: Some(3),
                ..base.clone()
            }
        );
        assert_eq!(
            base.merged(&DefinitionPatch {
                model: Some("openai/gpt-4o-mini".into()),
                ..DefinitionPatch::default()
            }),
            DefinitionPatch {
                model: Some("openai/gpt-4o-mini".into()),
                temperature: Some(0.7),
                max_tokens: Some(256),
                ..DefinitionPatch::default()
            }
        );
    }

    #[test]
    fn a_patch_that_cannot_be_used_changes_nothing() {
        let mut definition = AgentDefinition::new(tiller_ai::faux::demo_model());
        let before = serde_json::to_value(&definition).unwrap();
        let error = DefinitionPatch {
            temperature: Some(0.1),
            api_key_env: Some("TILLER_TEST_NO_SUCH_KEY".into()),
            ..DefinitionPatch::default()
        }
        .apply(&mut definition)
        .unwrap_err();
        assert_eq!(
            error,
            PatchError::MissingKey("TILLER_TEST_NO_SUCH_KEY".into())
        );
        let error = DefinitionPatch {
            model: Some("nowhere/none".into()),
            ..DefinitionPatch::default()
        }
        .apply(&mut definition)
        .unwrap_err();
        assert!(matches!(error, PatchError::Model(_)), "{error:?}");
        assert_eq!(serde_json::to_value(&definition).unwrap(), before);
    }

    #[test]
    fn a_patch_names_a_model_of_every_provider() {
        use tiller_ai::Api;
        for (provider, id, base_url, api, at) in [
            (
                "gemini",
                "gemini-2.5-pro",
                None,
                Api::GoogleGenerativeAi,
                "https://generativelanguage.googleapis.com/v1beta",
            ),
            (
                "openai-responses",
                "gpt-5-mini",
                None,
                Api::OpenAiResponses,
                "https://api.openai.com/v1",
            ),
            (
                "bedrock",
                "amazon.nova-lite-v1:0",
                None,
                Api::BedrockConverseStream,
                "https://bedrock-runtime.us-east-1.amazonaws.com",
            ),
            (
                "gemini",
                "g",
                Some("http://127.0.0.1:9/v1beta"),
                Api::GoogleGenerativeAi,
                "http://127.0.0.1:9/v1beta",
            ),
            (
                "bedrock",
                "b",
                Some("http://127.0.0.1:9"),
                Api::BedrockConverseStream,
                "http://127.0.0.1:9",
            ),
        ] {
            let model = DefinitionPatch {
                provider: Some(provider.into()),
                model: Some(id.into()),
                base_url: base_url.map(str::to_owned),
                ..DefinitionPatch::default()
            }
            .model()
            .unwrap()
            .unwrap();
            assert_eq!(
                (
                    model.api,
                    model.id.as_str(),
                    model.base_url.as_str(),
                    model.provider.as_str()
                ),
                (api, id, at, provider)
            );
        }
    }
}
