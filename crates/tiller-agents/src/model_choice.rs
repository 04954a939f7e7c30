//! Choosing the model an agent runs with, the same way for every command and
//! host: `tiller run`, `tiller chat`, `tiller serve` and a host's own code.
//!
//! The model comes from the first of these that names anything: the caller's own
//! choice (such as command-line options), each falling back to its
//! `TILLER_PROVIDER`/`TILLER_MODEL`/`TILLER_BASE_URL` variable; the agent file's
//! `model` (or its `llm`); a provider whose API key is set. With none, the
//! scripted faux model answers, and the choice says so.
//!
//! A provider's key from the environment goes only to the provider's own host
//! (the wire withholds it otherwise). Pointing a provider elsewhere with a base URL
//! of the caller's own is the caller's choice, so the key goes there too; an agent
//! file's `base_url` is not, so its key must be named with `api_key_env`.
//!
//! ```
//! use tiller_agents::{ModelSources, choose_model};
//!
//! let chosen = choose_model(ModelSources::default(), |_| None).unwrap();
//! assert_eq!(chosen.model.provider, "faux");
//! assert!(chosen.notice.is_some());
//! ```

use tiller_ai::env::{EnvError, chosen_from};

use crate::agent_file::AgentFile;
use crate::{ApiKey, Model};
use tiller_runtime::DefinitionPatch;

/// A setting and where it came from (`--model gpt-4o`, `TILLER_MODEL=…`, a file's
/// field), for the error that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The setting.
    pub value: String,
    /// Where it came from.
    pub source: String,
}

/// What may name the model, strongest first (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct ModelSources<'a> {
    /// The caller's own provider, over `TILLER_PROVIDER`.
    pub provider: Option<Named>,
    /// The caller's own model, over `TILLER_MODEL`.
    pub model: Option<Named>,
    /// The caller's own server, over `TILLER_BASE_URL`.
    pub base_url: Option<Named>,
    /// An agent file and its model settings (its LLM configuration with its own
    /// fields over it), when no caller's setting or variable names one.
    pub file: Option<(&'a AgentFile, &'a DefinitionPatch)>,
}

/// The model chosen and the key to pass with it.
#[derive(Debug, Clone)]
pub struct ModelChoice {
    /// The model.
    pub model: Model,
    /// The key to send, when the environment's key goes with this choice.
    pub api_key: Option<ApiKey>,
    /// Said to the user when nothing named a model and the faux model answers.
    pub notice: Option<String>,
}

/// Why the model named cannot be used: where it was named, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {reason}")]
pub struct ModelChoiceError {
    /// Where the model was named: an option, a variable or an agent file's field.
    pub origin: String,
    /// What is wrong.
    pub reason: String,
}

/// The model `sources` and the environment (`var`) choose.
pub fn choose_model(
    sources: ModelSources<'_>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<ModelChoice, ModelChoiceError> {
    let or_variable = |given: Option<Named>, variable: &str| {
        given.or_else(|| {
            var(variable).map(|value| Named {
                source: format!("{variable}={value}"),
                value,
            })
        })
    };
    let mut provider = or_variable(sources.provider, "TILLER_PROVIDER");
    let mut model = or_variable(sources.model, "TILLER_MODEL");
    let mut base_url = or_variable(sources.base_url, "TILLER_BASE_URL");
    let from_file = provider.is_none() && model.is_none() && base_url.is_none();
    if from_file && let Some((file, patch)) = sources.file {
        let own = file.patch.model.is_some() || file.patch.provider.is_some();
        let field = if own { "model" } else { "llm" };
        let source = format!("{}: json_schema_extra.{field}", file.path.display());
        let named = |value: &Option<String>| {
            value.clone().map(|value| Named {
                value,
                source: source.clone(),
            })
        };
        provider = named(&patch.provider);
        model = named(&patch.model);
        base_url = named(&patch.base_url);
    }
    let chosen = chosen_from(|name| match name {
        "TILLER_PROVIDER" => provider.as_ref().map(|n| n.value.clone()),
        "TILLER_MODEL" => model.as_ref().map(|n| n.value.clone()),
        "TILLER_BASE_URL" => base_url.as_ref().map(|n| n.value.clone()),
        key => var(key),
    })
    .map_err(
        |EnvError {
             variable, reason, ..
         }| {
            let named = match variable {
                "TILLER_PROVIDER" => &provider,
                "TILLER_BASE_URL" => &base_url,
                _ => &model,
            };
            ModelChoiceError {
                origin: named
                    .as_ref()
                    .map_or_else(|| variable.to_owned(), |n| n.source.clone()),
                reason,
            }
        },
    )?;
    Ok(match chosen {
        // A file's server is not the caller's own choice: it gets no key unless
        // the file names one (`api_key_env`).
        Some(chosen) => ModelChoice {
            model: chosen.model,
            api_key: if from_file { None } else { chosen.api_key },
            notice: None,
        },
        None => ModelChoice {
            model: tiller_ai::faux::demo_model(),
            api_key: None,
            notice: Some(
                "no provider configured (use --provider, --base-url or --model, or set a \
                 provider's key such as OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY): \
                 using the scripted faux model"
                    .to_owned(),
            ),
        },
    })
}
