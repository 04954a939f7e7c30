//! Choosing a model from the environment, so a program can be pointed at a real
//! provider without code changes.
//!
//! | variable | meaning |
//! |---|---|
//! | `TILLER_MODEL` | `provider/model-id`, such as `openai/gpt-4o-mini` or `anthropic/claude-sonnet-4-5`; a bare model id with `TILLER_PROVIDER` or `TILLER_BASE_URL` |
//! | `TILLER_PROVIDER` | a provider from [`crate::catalog::providers`] (its default model unless `TILLER_MODEL` names one) |
//! | `TILLER_BASE_URL` | any OpenAI-compatible server (llama.cpp, vLLM, Ollama): `http://127.0.0.1:8080/v1` |
//! | `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, … | the provider's key; when only a key is set, its provider's default model is used |
//!
//! With none of these set, [`model_from_env`] answers `None` and the caller picks
//! its own default (Tiller's examples use the scripted faux model).

use crate::catalog::{self, UnknownModel};
use crate::model::{Api, Model};

/// A model chosen by the environment (see the module docs); `None` when nothing is set.
pub fn model_from_env() -> Result<Option<Model>, EnvError> {
    model_from(|name| {
        std::env::var(name)
            .ok()
            .filter(|value| !value.trim().is_empty())
    })
}

/// [`model_from_env`] over any source of variables.
pub fn model_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<Model>, EnvError> {
    let spec = var("TILLER_MODEL");
    let provider = var("TILLER_PROVIDER");
    if let Some(base_url) = var("TILLER_BASE_URL") {
        let provider_name = provider.as_deref().unwrap_or("openai-compatible");
        let api = catalog::provider(provider_name).map_or(Api::OpenAiCompletions, |p| p.api);
        let id = spec.as_deref().map_or("default", |spec| {
            spec.strip_prefix(provider_name)
                .and_then(|rest| rest.strip_prefix('/'))
                .unwrap_or(spec)
        });
        let model = match api {
            Api::AnthropicMessages => Model::anthropic_compatible(base_url, id),
            _ => Model::openai_compatible(base_url, id),
        };
        return Ok(Some(model.with_provider(provider_name)));
    }
    if let Some(spec) = spec {
        let resolved = match &provider {
            Some(name) if !spec.starts_with(&format!("{name}/")) => {
                catalog::resolve(&format!("{name}/{spec}"))
            }
            _ if spec.contains('/') => catalog::resolve(&spec),
            _ => {
                return Err(EnvError {
                    variable: "TILLER_MODEL",
                    value: spec,
                    reason: "name the provider too (`provider/model-id`), or give a provider or a base URL".to_owned(),
                });
            }
        };
        return resolved.map(Some).map_err(|error: UnknownModel| EnvError {
            variable: "TILLER_MODEL",
            value: spec,
            reason: error.to_string(),
        });
    }
    if let Some(name) = provider {
        return catalog::resolve(&name).map(Some).map_err(|error| EnvError {
            variable: "TILLER_PROVIDER",
            value: name,
            reason: error.to_string(),
        });
    }
    let keyed = catalog::providers()
        .iter()
        .find(|p| p.api_key_env.is_some_and(|env| var(env).is_some()));
    Ok(keyed.map(|p| p.model(p.default_model)))
}

/// An environment variable that does not name a usable model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value}: {reason}")]
pub struct EnvError {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn model(vars: &[(&str, &str)]) -> Result<Option<Model>, EnvError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        model_from(|name| vars.get(name).cloned())
    }

    #[test]
    fn nothing_set_means_no_model() {
        assert_eq!(model(&[]), Ok(None));
    }

    #[test]
    fn a_key_alone_picks_its_provider() {
        let chosen = model(&[("ANTHROPIC_API_KEY", "k")]).unwrap().unwrap();
        assert_eq!(
            (chosen.provider.as_str(), chosen.id.as_str()),
            ("anthropic", "claude-haiku-4-5")
        );
        let chosen = model(&[("OPENAI_API_KEY", "k"), ("ANTHROPIC_API_KEY", "k")])
            .unwrap()
            .unwrap();
        assert_eq!(chosen.provider, "openai");
    }

    #[test]
    fn a_model_spec_names_provider_and_model() {
        let chosen = model(&[("TILLER_MODEL", "anthropic/claude-sonnet-4-5")])
            .unwrap()
            .unwrap();
        assert_eq!(chosen.api, Api::AnthropicMessages);
        assert_eq!(chosen.cost.input, 3.0);
        let chosen = model(&[("TILLER_MODEL", "gpt-4.1"), ("TILLER_PROVIDER", "openai")])
            .unwrap()
            .unwrap();
        assert_eq!(chosen.id, "gpt-4.1");
        let err = model(&[("TILLER_MODEL", "gpt-4.1")]).unwrap_err();
        assert_eq!(err.variable, "TILLER_MODEL");
        let err = model(&[("TILLER_MODEL", "acme/x")]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("TILLER_MODEL=acme/x: unknown model"),
            "{err}"
        );
    }

    #[test]
    fn a_base_url_points_at_a_compatible_server() {
        let chosen = model(&[
            ("TILLER_BASE_URL", "http://127.0.0.1:8080/v1"),
            ("TILLER_MODEL", "smollm2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(chosen.base_url, "http://127.0.0.1:8080/v1");
        assert_eq!(chosen.id, "smollm2");
        assert_eq!(chosen.api, Api::OpenAiCompletions);
        assert_eq!(chosen.provider, "openai-compatible");
        let chosen = model(&[
            ("TILLER_BASE_URL", "http://127.0.0.1:9000/v1"),
            ("TILLER_PROVIDER", "anthropic"),
            ("TILLER_MODEL", "anthropic/claude-x"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(chosen.api, Api::AnthropicMessages);
        assert_eq!(chosen.id, "claude-x");
    }
}
