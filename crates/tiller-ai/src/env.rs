//! Choosing a model from the environment, so a program can be pointed at a real
//! provider without code changes.
//!
//! | variable | meaning |
//! |---|---|
//! | `TILLER_MODEL` | `provider/model-id`, such as `openai/gpt-4o-mini` or `anthropic/claude-sonnet-4-5`; a bare model id with `TILLER_PROVIDER` or `TILLER_BASE_URL` |
//! | `TILLER_PROVIDER` | a provider from [`crate::catalog::providers`] (its default model unless `TILLER_MODEL` names one) |
//! | `TILLER_BASE_URL` | any OpenAI-compatible server (llama.cpp, vLLM, Ollama): `http://127.0.0.1:8080/v1`; with `TILLER_PROVIDER`, a server of that provider's API |
//! | `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY` (or `GOOGLE_API_KEY`), … | the provider's key; when only a key is set, its provider's default model is used |
//!
//! With none of these set, [`from_env`] answers `None` and the caller picks its own
//! default (Tiller's examples use the scripted faux model).
//!
//! A provider's key goes with the model only where its owner meant it to: to the
//! provider's own API, or to the server `TILLER_BASE_URL` names (the user's own
//! choice). A model at another address is sent no key from the environment; one
//! without a key of its own (a local llama.cpp server) needs none.

use crate::catalog::{self, UnknownModel};
use crate::model::{Api, Model};
use crate::options::ApiKey;

/// The model the environment chose, with the key to send it explicitly: the
/// provider's key when `TILLER_BASE_URL` points the provider at a server of the
/// user's choosing. (At the provider's own address the key is read when a request
/// is made, and needs no passing.)
#[derive(Debug, Clone, PartialEq)]
pub struct EnvModel {
    /// The model.
    pub model: Model,
    /// The key to pass with it ([`Transport::api_key`](crate::Transport::api_key)).
    pub api_key: Option<ApiKey>,
}

/// What the environment chooses: a model and the key to pass with it; `None` when
/// nothing is set. The one way every `tiller` command and host reads it.
pub fn from_env() -> Result<Option<EnvModel>, EnvError> {
    chosen_from(env_var)
}

/// [`from_env`] over any source of variables (a command's options over the
/// environment, say).
pub fn chosen_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<EnvModel>, EnvError> {
    let Some(model) = model_from(&var)? else {
        return Ok(None);
    };
    let api_key = var("TILLER_BASE_URL")
        .and_then(|_| catalog::provider(&model.provider)?.api_key_from(&var))
        .map(|(_, key)| ApiKey::new(key));
    Ok(Some(EnvModel { model, api_key }))
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// The model alone of [`from_env`], over any source of variables; `None` when
/// nothing is set. `faux` (as the provider, or the model without one) is the
/// scripted demo model.
pub fn model_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<Model>, EnvError> {
    let spec = var("TILLER_MODEL");
    let provider = var("TILLER_PROVIDER");
    if crate::faux::is_named(provider.as_deref(), spec.as_deref()) {
        return Ok(Some(crate::faux::demo_model()));
    }
    if let Some(base_url) = var("TILLER_BASE_URL") {
        let provider_name = provider.as_deref().unwrap_or("openai-compatible");
        let api = catalog::provider(provider_name).map_or(Api::OpenAiCompletions, |p| p.api);
        let id = spec.as_deref().map_or("default", |spec| {
            spec.strip_prefix(provider_name)
                .and_then(|rest| rest.strip_prefix('/'))
                .unwrap_or(spec)
        });
        return Ok(Some(
            Model::speaking(api, base_url, id).with_provider(provider_name),
        ));
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
        .find(|p| p.api_key_from(&var).is_some());
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
        let chosen = model(&[("GOOGLE_API_KEY", "k")]).unwrap().unwrap();
        assert_eq!(
            (chosen.provider.as_str(), chosen.id.as_str(), chosen.api),
            ("gemini", "gemini-2.5-flash", Api::GoogleGenerativeAi)
        );
    }

    #[test]
    fn a_gemini_base_url_speaks_gemini_and_takes_its_key() {
        let vars: HashMap<&str, &str> = [
            ("TILLER_PROVIDER", "gemini"),
            ("TILLER_BASE_URL", "http://127.0.0.1:9/v1beta"),
            ("TILLER_MODEL", "gemini-2.5-pro"),
            ("GOOGLE_API_KEY", " g-key "),
        ]
        .into();
        let chosen = chosen_from(|name| vars.get(name).map(|v| (*v).to_owned()))
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                chosen.model.api,
                chosen.model.id.as_str(),
                chosen.model.base_url.as_str()
            ),
            (
                Api::GoogleGenerativeAi,
                "gemini-2.5-pro",
                "http://127.0.0.1:9/v1beta"
            )
        );
        assert_eq!(chosen.api_key.unwrap().expose(), "g-key");
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
    fn a_key_goes_with_a_base_url_of_the_users_choosing_only() {
        let vars = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            chosen_from(|name| vars.get(name).cloned())
                .unwrap()
                .unwrap()
        };
        let local = vars(&[
            ("TILLER_PROVIDER", "openai"),
            ("TILLER_BASE_URL", "http://127.0.0.1:8080/v1"),
            ("OPENAI_API_KEY", "sk-mine"),
        ]);
        assert_eq!(local.model.base_url, "http://127.0.0.1:8080/v1");
        assert_eq!(local.api_key, Some(ApiKey::new("sk-mine")));
        let keyless = vars(&[
            ("TILLER_PROVIDER", "openai"),
            ("TILLER_BASE_URL", "http://127.0.0.1:8080/v1"),
        ]);
        assert_eq!(keyless.api_key, None);
        // At the provider's own address, the request reads the key itself.
        let own = vars(&[("OPENAI_API_KEY", "sk-mine")]);
        assert_eq!((own.model.provider.as_str(), own.api_key), ("openai", None));
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
