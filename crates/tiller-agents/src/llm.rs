//! Named LLM configurations: [`LlmConfigs`], a registry of
//! [`DefinitionPatch`]es by name (provider, model, server, key variable,
//! temperature, token limit, thinking level, …). An agent file names one and
//! overrides what it needs:
//!
//! ```
//! use tiller::{AgentSettings, runtime::DefinitionPatch, agents::LlmConfigs};
//!
//! let llms = LlmConfigs::new().with(
//!     "local",
//!     DefinitionPatch {
//!         base_url: Some("http://127.0.0.1:8080/v1".into()),
//!         model: Some("smollm2".into()),
//!         temperature: Some(0.2),
//!         ..DefinitionPatch::default()
//!     },
//! );
//! let careful = llms.get("local").unwrap().merged(&DefinitionPatch {
//!     temperature: Some(0.0),
//!     ..DefinitionPatch::default()
//! });
//! let settings = AgentSettings::default().with_patch(&careful).unwrap();
//! assert_eq!(settings.definition.model.as_ref().unwrap().id, "smollm2");
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use tiller_runtime::DefinitionPatch;

/// Why a named configuration cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LlmConfigError {
    /// No configuration has that name.
    #[error("no LLM configuration `{name}` ({})", if known.is_empty() { "there are none".to_owned() } else { format!("known: {}", known.join(", ")) })]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: Vec<String>,
    },
    /// A file of configurations could not be read.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Named [`DefinitionPatch`]es: the LLM configurations agent files refer to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LlmConfigs {
    by_name: BTreeMap<String, DefinitionPatch>,
}

impl LlmConfigs {
    /// None.
    pub fn new() -> Self {
        LlmConfigs::default()
    }

    /// The same registry with `config` under `name`.
    pub fn with(mut self, name: impl Into<String>, config: DefinitionPatch) -> Self {
        self.by_name.insert(name.into(), config);
        self
    }

    /// Reads a YAML (or, for a `.json` file, JSON) map of names to
    /// configurations. A configuration's `model` may be a list: the first is its
    /// model, the rest its fallbacks, in order.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LlmConfigError> {
        let path = path.as_ref();
        let failed = |reason: String| LlmConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        let mut value: serde_json::Value = if path.extension().is_some_and(|ext| ext == "json") {
            serde_json::from_str(&text).map_err(|e| failed(e.to_string()))?
        } else {
            serde_saphyr::from_str(&text).map_err(|e| failed(e.to_string()))?
        };
        for (name, config) in value.as_object_mut().into_iter().flatten() {
            let Some(config) = config.as_object_mut() else {
                continue;
            };
            if let Some(serde_json::Value::Array(models)) = config.get("model").cloned() {
                let mut models = models.into_iter();
                let primary = models
                    .next()
                    .ok_or_else(|| failed(format!("{name}.model: expected at least one model")))?;
                config.insert("model".into(), primary);
                config.insert("fallbacks".into(), models.collect());
            }
        }
        serde_json::from_value(value).map_err(|e| failed(e.to_string()))
    }

    /// Every configuration with its name, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &DefinitionPatch)> {
        self.by_name
            .iter()
            .map(|(name, config)| (name.as_str(), config))
    }

    /// The configuration named `name`.
    pub fn get(&self, name: &str) -> Result<&DefinitionPatch, LlmConfigError> {
        self.by_name
            .get(name)
            .ok_or_else(|| LlmConfigError::Unknown {
                name: name.to_owned(),
                known: self.by_name.keys().cloned().collect(),
            })
    }
}
