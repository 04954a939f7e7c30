//! Named LLM configurations: [`LlmConfig`] (provider, model, server, key
//! variable, temperature, token limit, thinking level) and [`LlmConfigs`], a
//! registry of them by name. An agent names one and overrides what it needs:
//!
//! ```
//! use tiller::{AgentSettings, LlmConfig, LlmConfigs};
//!
//! let llms = LlmConfigs::new().with(
//!     "local",
//!     LlmConfig {
//!         base_url: Some("http://127.0.0.1:8080/v1".into()),
//!         model: Some("smollm2".into()),
//!         temperature: Some(0.2),
//!         ..LlmConfig::default()
//!     },
//! );
//! let careful = llms.get("local").unwrap().merged(&LlmConfig {
//!     temperature: Some(0.0),
//!     ..LlmConfig::default()
//! });
//! let settings = AgentSettings::default().with_llm(&careful).unwrap();
//! assert_eq!(settings.model.as_ref().unwrap().id, "smollm2");
//! assert_eq!(settings.run.stream.temperature, Some(0.0));
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{AgentSettings, ApiKey, Model, ThinkingLevel};

/// A model and how to call it. Every field is optional, so a configuration can
/// override another field by field ([`LlmConfig::merged`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// The provider: `openai`, `anthropic`, `llamacpp`, … (see
    /// [`catalog::providers`](crate::catalog::providers)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model: `provider/id` or, with `provider` or `base_url`, its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Any OpenAI-compatible server (`http://127.0.0.1:8080/v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable holding the key to send; the provider's own
    /// variable when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// The sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The most tokens an answer may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// How hard a reasoning model thinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<ThinkingLevel>,
}

/// Why a configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    /// No configuration has that name.
    #[error("no LLM configuration `{name}` ({})", if known.is_empty() { "there are none".to_owned() } else { format!("known: {}", known.join(", ")) })]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: Vec<String>,
    },
    /// Its model cannot be made (an unknown provider or model).
    #[error("{0}")]
    Model(String),
    /// The key variable it names is not set.
    #[error("{0} is not set")]
    MissingKey(String),
    /// A configuration file could not be read.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

impl LlmConfig {
    /// This configuration with `over`'s fields where `over` sets them; naming a
    /// model or a provider in `over` starts the model over (its server too).
    pub fn merged(&self, over: &LlmConfig) -> LlmConfig {
        let new_model = over.provider.is_some() || over.model.is_some();
        let pick = |mine: &Option<String>, theirs: &Option<String>| {
            theirs.clone().or_else(|| mine.clone())
        };
        LlmConfig {
            provider: if new_model {
                over.provider.clone()
            } else {
                self.provider.clone()
            },
            model: if new_model {
                over.model.clone()
            } else {
                self.model.clone()
            },
            base_url: if new_model {
                over.base_url.clone()
            } else {
                pick(&self.base_url, &over.base_url)
            },
            api_key_env: pick(&self.api_key_env, &over.api_key_env),
            temperature: over.temperature.or(self.temperature),
            max_tokens: over.max_tokens.or(self.max_tokens),
            thinking: over.thinking.or(self.thinking),
        }
    }

    /// The model it names, if it names one (`faux` is the scripted demo model).
    pub fn model(&self) -> Result<Option<Model>, LlmError> {
        if self.provider.is_none() && self.model.is_none() && self.base_url.is_none() {
            return Ok(None);
        }
        if crate::faux::is_named(self.provider.as_deref(), self.model.as_deref()) {
            return Ok(Some(crate::faux::demo_model()));
        }
        crate::env::model_from(|variable| match variable {
            "TILLER_PROVIDER" => self.provider.clone(),
            "TILLER_MODEL" => self.model.clone(),
            "TILLER_BASE_URL" => self.base_url.clone(),
            _ => None,
        })
        .map_err(|error| LlmError::Model(error.reason))
    }

    /// Sets it in `settings`: the model when it names one, and the request
    /// options it sets (temperature, token limit, thinking, the key its variable
    /// holds).
    pub fn apply(&self, settings: &mut AgentSettings) -> Result<(), LlmError> {
        if let Some(model) = self.model()? {
            settings.model = Some(model);
        }
        let stream = &mut settings.run.stream;
        stream.temperature = self.temperature.or(stream.temperature);
        stream.max_tokens = self.max_tokens.or(stream.max_tokens);
        if let Some(thinking) = self.thinking {
            stream.thinking = thinking;
        }
        if let Some(variable) = &self.api_key_env {
            let key = std::env::var(variable)
                .ok()
                .filter(|key| !key.trim().is_empty())
                .ok_or_else(|| LlmError::MissingKey(variable.clone()))?;
            stream.api_key = Some(ApiKey::new(key.trim()));
        }
        Ok(())
    }

    /// The configuration `settings` run with (their model and request options;
    /// never a key).
    pub fn of(settings: &AgentSettings) -> LlmConfig {
        let stream = &settings.run.stream;
        LlmConfig {
            provider: settings.model.as_ref().map(|m| m.provider.clone()),
            model: settings.model.as_ref().map(|m| m.id.clone()),
            base_url: settings.model.as_ref().map(|m| m.base_url.clone()),
            api_key_env: None,
            temperature: stream.temperature,
            max_tokens: stream.max_tokens,
            thinking: Some(stream.thinking),
        }
    }
}

/// Named [`LlmConfig`]s.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LlmConfigs {
    by_name: BTreeMap<String, LlmConfig>,
}

impl LlmConfigs {
    /// None.
    pub fn new() -> Self {
        LlmConfigs::default()
    }

    /// The same registry with `config` under `name`.
    pub fn with(mut self, name: impl Into<String>, config: LlmConfig) -> Self {
        self.by_name.insert(name.into(), config);
        self
    }

    /// Reads a YAML (or, for a `.json` file, JSON) map of names to
    /// configurations.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LlmError> {
        let path = path.as_ref();
        let failed = |reason: String| LlmError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        if path.extension().is_some_and(|ext| ext == "json") {
            serde_json::from_str(&text).map_err(|e| failed(e.to_string()))
        } else {
            serde_saphyr::from_str(&text).map_err(|e| failed(e.to_string()))
        }
    }

    /// Every configuration with its name, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &LlmConfig)> {
        self.by_name
            .iter()
            .map(|(name, config)| (name.as_str(), config))
    }

    /// The configuration named `name`.
    pub fn get(&self, name: &str) -> Result<&LlmConfig, LlmError> {
        self.by_name.get(name).ok_or_else(|| LlmError::Unknown {
            name: name.to_owned(),
            known: self.by_name.keys().cloned().collect(),
        })
    }
}

impl AgentSettings {
    /// The same settings with `config` applied (see [`LlmConfig::apply`]).
    pub fn with_llm(mut self, config: &LlmConfig) -> Result<Self, LlmError> {
        config.apply(&mut self)?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn overrides_win_field_by_field_and_a_new_model_drops_the_server() {
        let base = LlmConfig {
            base_url: Some("http://127.0.0.1:8080/v1".into()),
            model: Some("smollm2".into()),
            temperature: Some(0.7),
            max_tokens: Some(256),
            ..LlmConfig::default()
        };
        assert_eq!(
            base.merged(&LlmConfig {
                temperature: Some(0.0),
                ..LlmConfig::default()
            }),
            LlmConfig {
                temperature: Some(0.0),
                ..base.clone()
            }
        );
        assert_eq!(
            base.merged(&LlmConfig {
                model: Some("openai/gpt-4o-mini".into()),
                ..LlmConfig::default()
            }),
            LlmConfig {
                model: Some("openai/gpt-4o-mini".into()),
                temperature: Some(0.7),
                max_tokens: Some(256),
                ..LlmConfig::default()
            }
        );
    }

    #[test]
    fn unknown_names_and_models_say_what_is_known() {
        let llms = LlmConfigs::new().with("fast", LlmConfig::default());
        assert_eq!(
            llms.get("smart").unwrap_err().to_string(),
            "no LLM configuration `smart` (known: fast)"
        );
        let error = LlmConfig {
            model: Some("nowhere/none".into()),
            ..LlmConfig::default()
        }
        .model()
        .unwrap_err();
        assert!(matches!(error, LlmError::Model(_)), "{error:?}");
    }
}
