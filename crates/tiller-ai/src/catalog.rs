//! The providers and models Tiller knows by name.
//!
//! Models are named `provider/model-id`. [`find`] answers only for models in the
//! built-in table (with context window, output limit and prices); [`resolve`] also
//! accepts any model id of a known provider, with that provider's address and
//! unknown prices. Anything else is described by hand with [`Model::openai_compatible`],
//! [`Model::anthropic_compatible`] or, for any API, [`Model::speaking`].
//!
//! ```
//! let model = tiller_ai::catalog::find("openai/gpt-4o-mini").unwrap();
//! assert_eq!(model.context_window, 128_000);
//! assert!(tiller_ai::catalog::find("openai/no-such-model").is_none());
//! assert_eq!(tiller_ai::catalog::resolve("openai/no-such-model").unwrap().id, "no-such-model");
//! ```

use crate::model::{Api, Headers, InputKind, Model, ModelCost};

/// A provider Tiller knows: its API, address and where its key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderInfo {
    /// The provider's name, the first part of a `provider/model-id`.
    pub name: &'static str,
    /// The wire protocol it speaks.
    pub api: Api,
    /// Its API address.
    pub base_url: &'static str,
    /// The environment variables holding its API key, the first set one winning;
    /// none for local servers that need no key.
    pub api_key_env: &'static [&'static str],
    /// The model used when only the provider is named.
    pub default_model: &'static str,
}

impl ProviderInfo {
    /// A model of this provider by id: from the built-in table when listed there,
    /// otherwise with this provider's address and unknown prices.
    pub fn model(&self, id: &str) -> Model {
        if let Some(model) = find_listed(self.name, id) {
            return model;
        }
        Model::speaking(self.api, self.base_url, id).with_provider(self.name)
    }

    /// Its API key as `var` reads it, with the variable it came from: the first
    /// of [`ProviderInfo::api_key_env`] holding a key.
    pub fn api_key_from(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Option<(&'static str, String)> {
        self.api_key_env.iter().find_map(|name| {
            let key = var(name)?;
            let key = key.trim();
            (!key.is_empty()).then(|| (*name, key.to_owned()))
        })
    }
}

const PROVIDERS: &[ProviderInfo] = &[
    ProviderInfo {
        name: "openai",
        api: Api::OpenAiCompletions,
        base_url: "https://api.openai.com/v1",
        api_key_env: &["OPENAI_API_KEY"],
        default_model: "gpt-4o-mini",
    },
    ProviderInfo {
        name: "anthropic",
        api: Api::AnthropicMessages,
        base_url: "https://api.anthropic.com/v1",
        api_key_env: &["ANTHROPIC_API_KEY"],
        default_model: "claude-haiku-4-5",
    },
    ProviderInfo {
        name: "gemini",
        api: Api::GoogleGenerativeAi,
        base_url: "https://generativelanguage.googleapis.com/v1beta",
        api_key_env: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        default_model: "gemini-2.5-flash",
    },
    ProviderInfo {
        name: "openai-responses",
        api: Api::OpenAiResponses,
        base_url: "https://api.openai.com/v1",
        api_key_env: &["OPENAI_API_KEY"],
        default_model: "gpt-5-mini",
    },
    ProviderInfo {
        name: "bedrock",
        api: Api::BedrockConverseStream,
        base_url: crate::providers::bedrock::DEFAULT_ENDPOINT,
        api_key_env: &[],
        default_model: "amazon.nova-lite-v1:0",
    },
    ProviderInfo {
        name: "openrouter",
        api: Api::OpenAiCompletions,
        base_url: "https://openrouter.ai/api/v1",
        api_key_env: &["OPENROUTER_API_KEY"],
        default_model: "openai/gpt-4o-mini",
    },
    ProviderInfo {
        name: "groq",
        api: Api::OpenAiCompletions,
        base_url: "https://api.groq.com/openai/v1",
        api_key_env: &["GROQ_API_KEY"],
        default_model: "llama-3.3-70b-versatile",
    },
    ProviderInfo {
        name: "deepseek",
        api: Api::OpenAiCompletions,
        base_url: "https://api.deepseek.com/v1",
        api_key_env: &["DEEPSEEK_API_KEY"],
        default_model: "deepseek-chat",
    },
    ProviderInfo {
        name: "mistral",
        api: Api::OpenAiCompletions,
        base_url: "https://api.mistral.ai/v1",
        api_key_env: &["MISTRAL_API_KEY"],
        default_model: "mistral-small-latest",
    },
    ProviderInfo {
        name: "llamacpp",
        api: Api::OpenAiCompletions,
        base_url: "http://127.0.0.1:8080/v1",
        api_key_env: &[],
        default_model: "default",
    },
    ProviderInfo {
        name: "vllm",
        api: Api::OpenAiCompletions,
        base_url: "http://127.0.0.1:8000/v1",
        api_key_env: &[],
        default_model: "default",
    },
    ProviderInfo {
        name: "ollama",
        api: Api::OpenAiCompletions,
        base_url: "http://127.0.0.1:11434/v1",
        api_key_env: &[],
        default_model: "llama3.2",
    },
];

/// The providers Tiller knows, in a stable order.
pub fn providers() -> &'static [ProviderInfo] {
    PROVIDERS
}

/// A known provider by name.
pub fn provider(name: &str) -> Option<&'static ProviderInfo> {
    PROVIDERS.iter().find(|p| p.name == name)
}

struct Listed {
    provider: &'static str,
    id: &'static str,
    name: &'static str,
    reasoning: bool,
    images: bool,
    /// input, output, cache read, cache write; $ per million tokens.
    prices: [f64; 4],
    context_window: u32,
    max_tokens: u32,
}

const fn listed(
    provider: &'static str,
    id: &'static str,
    name: &'static str,
    reasoning: bool,
    prices: [f64; 4],
    context_window: u32,
    max_tokens: u32,
) -> Listed {
    Listed {
        provider,
        id,
        name,
        reasoning,
        images: true,
        prices,
        context_window,
        max_tokens,
    }
}

#[rustfmt::skip]
const MODELS: &[Listed] = &[
    listed("openai", "gpt-4o", "GPT-4o", false, [2.50, 10.00, 1.25, 0.0], 128_000, 16_384),
    listed("openai", "gpt-4o-mini", "GPT-4o mini", false, [0.15, 0.60, 0.075, 0.0], 128_000, 16_384),
    listed("openai", "gpt-4.1", "GPT-4.1", false, [2.00, 8.00, 0.50, 0.0], 1_047_576, 32_768),
    listed("openai", "gpt-4.1-mini", "GPT-4.1 mini", false, [0.40, 1.60, 0.10, 0.0], 1_047_576, 32_768),
    listed("openai", "gpt-4.1-nano", "GPT-4.1 nano", false, [0.10, 0.40, 0.025, 0.0], 1_047_576, 32_768),
    listed("openai", "o3", "o3", true, [2.00, 8.00, 0.50, 0.0], 200_000, 100_000),
    listed("openai", "o4-mini", "o4-mini", true, [1.10, 4.40, 0.275, 0.0], 200_000, 100_000),
    listed("openai", "gpt-5", "GPT-5", true, [1.25, 10.00, 0.125, 0.0], 400_000, 128_000),
    listed("openai", "gpt-5-mini", "GPT-5 mini", true, [0.25, 2.00, 0.025, 0.0], 400_000, 128_000),
    listed("openai", "gpt-5-nano", "GPT-5 nano", true, [0.05, 0.40, 0.005, 0.0], 400_000, 128_000),
    listed("openai-responses", "gpt-5.1", "GPT-5.1", true, [1.25, 10.00, 0.125, 0.0], 400_000, 128_000),
    listed("openai-responses", "gpt-5", "GPT-5", true, [1.25, 10.00, 0.125, 0.0], 400_000, 128_000),
    listed("openai-responses", "gpt-5-mini", "GPT-5 mini", true, [0.25, 2.00, 0.025, 0.0], 400_000, 128_000),
    listed("openai-responses", "gpt-5-nano", "GPT-5 nano", true, [0.05, 0.40, 0.005, 0.0], 400_000, 128_000),
    listed("openai-responses", "o3", "o3", true, [2.00, 8.00, 0.50, 0.0], 200_000, 100_000),
    listed("openai-responses", "o4-mini", "o4-mini", true, [1.10, 4.40, 0.275, 0.0], 200_000, 100_000),
    listed("openai-responses", "gpt-4.1", "GPT-4.1", false, [2.00, 8.00, 0.50, 0.0], 1_047_576, 32_768),
    listed("openai-responses", "gpt-4o", "GPT-4o", false, [2.50, 10.00, 1.25, 0.0], 128_000, 16_384),
    listed("bedrock", "global.anthropic.claude-sonnet-4-5-20250929-v1:0", "Claude Sonnet 4.5 (Bedrock)", true, [3.00, 15.00, 0.30, 3.75], 200_000, 64_000),
    listed("bedrock", "global.anthropic.claude-haiku-4-5-20251001-v1:0", "Claude Haiku 4.5 (Bedrock)", true, [1.00, 5.00, 0.10, 1.25], 200_000, 64_000),
    listed("bedrock", "amazon.nova-pro-v1:0", "Amazon Nova Pro", false, [0.80, 3.20, 0.20, 0.0], 300_000, 10_000),
    listed("bedrock", "amazon.nova-lite-v1:0", "Amazon Nova Lite", false, [0.06, 0.24, 0.015, 0.0], 300_000, 10_000),
    listed("bedrock", "amazon.nova-micro-v1:0", "Amazon Nova Micro", false, [0.035, 0.14, 0.00875, 0.0], 128_000, 10_000),
    listed("anthropic", "claude-opus-4-6", "Claude Opus 4.6", true, [5.00, 25.00, 0.50, 6.25], 1_000_000, 128_000),
    listed("anthropic", "claude-sonnet-4-6", "Claude Sonnet 4.6", true, [3.00, 15.00, 0.30, 3.75], 1_000_000, 64_000),
    listed("anthropic", "claude-opus-4-5", "Claude Opus 4.5", true, [5.00, 25.00, 0.50, 6.25], 200_000, 64_000),
    listed("anthropic", "claude-sonnet-4-5", "Claude Sonnet 4.5", true, [3.00, 15.00, 0.30, 3.75], 200_000, 64_000),
    listed("anthropic", "claude-haiku-4-5", "Claude Haiku 4.5", true, [1.00, 5.00, 0.10, 1.25], 200_000, 64_000),
    listed("anthropic", "claude-opus-4-1", "Claude Opus 4.1", true, [15.00, 75.00, 1.50, 18.75], 200_000, 32_000),
    listed("gemini", "gemini-3-pro-preview", "Gemini 3 Pro (preview)", true, [2.00, 12.00, 0.20, 0.0], 1_048_576, 65_536),
    listed("gemini", "gemini-3-flash-preview", "Gemini 3 Flash (preview)", true, [0.50, 3.00, 0.05, 0.0], 1_048_576, 65_536),
    listed("gemini", "gemini-2.5-pro", "Gemini 2.5 Pro", true, [1.25, 10.00, 0.125, 0.0], 1_048_576, 65_536),
    listed("gemini", "gemini-2.5-flash", "Gemini 2.5 Flash", true, [0.30, 2.50, 0.03, 0.0], 1_048_576, 65_536),
    listed("gemini", "gemini-2.5-flash-lite", "Gemini 2.5 Flash-Lite", true, [0.10, 0.40, 0.01, 0.0], 1_048_576, 65_536),
];

fn to_model(entry: &Listed) -> Option<Model> {
    let provider = provider(entry.provider)?;
    let mut input = vec![InputKind::Text];
    if entry.images {
        input.push(InputKind::Image);
    }
    let [input_price, output, cache_read, cache_write] = entry.prices;
    Some(Model {
        id: entry.id.to_owned(),
        name: entry.name.to_owned(),
        api: provider.api,
        provider: provider.name.to_owned(),
        base_url: provider.base_url.to_owned(),
        reasoning: entry.reasoning,
        input,
        cost: ModelCost {
            input: input_price,
            output,
            cache_read,
            cache_write,
        },
        context_window: entry.context_window,
        max_tokens: entry.max_tokens,
        headers: Headers::default(),
        custom: None,
    })
}

fn find_listed(provider: &str, id: &str) -> Option<Model> {
    MODELS
        .iter()
        .find(|m| m.provider == provider && m.id == id)
        .and_then(to_model)
}

/// The built-in models.
pub fn models() -> impl Iterator<Item = Model> {
    MODELS.iter().filter_map(to_model)
}

/// A built-in model named `provider/model-id`.
pub fn find(spec: &str) -> Option<Model> {
    let (provider, id) = spec.split_once('/')?;
    find_listed(provider, id)
}

/// A model named `provider/model-id` (or just `provider`, for its default model):
/// a built-in one, or any id of a known provider.
pub fn resolve(spec: &str) -> Result<Model, UnknownModel> {
    let (provider_name, id) = spec.split_once('/').unwrap_or((spec, ""));
    let info = provider(provider_name).ok_or_else(|| UnknownModel {
        spec: spec.to_owned(),
    })?;
    let id = if id.is_empty() {
        info.default_model
    } else {
        id
    };
    Ok(info.model(id))
}

/// A model name whose provider Tiller does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown model `{spec}`: expected `provider/model-id` with a provider among {}",
    known_provider_names()
)]
pub struct UnknownModel {
    /// The name as given.
    pub spec: String,
}

fn known_provider_names() -> String {
    PROVIDERS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_model_has_a_known_provider() {
        assert_eq!(models().count(), MODELS.len());
    }

    #[test]
    fn resolve_names_a_default_model_for_a_bare_provider() {
        let model = resolve("anthropic").unwrap();
        assert_eq!(model.id, "claude-haiku-4-5");
        assert_eq!(model.api, Api::AnthropicMessages);
        let err = resolve("nobody/x").unwrap_err();
        assert!(err.to_string().contains("openai, anthropic"), "{err}");
    }

    #[test]
    fn a_key_comes_from_the_first_of_its_variables_that_holds_one() {
        let gemini = provider("gemini").unwrap();
        let vars = |set: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                set.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            gemini.api_key_from(vars(&[("GOOGLE_API_KEY", "g"), ("GEMINI_API_KEY", "m")])),
            Some(("GEMINI_API_KEY", "m".to_owned()))
        );
        assert_eq!(
            gemini.api_key_from(vars(&[("GOOGLE_API_KEY", "g"), ("GEMINI_API_KEY", " ")])),
            Some(("GOOGLE_API_KEY", "g".to_owned()))
        );
        assert_eq!(gemini.api_key_from(vars(&[])), None);
        assert_eq!(provider("llamacpp").unwrap().api_key_from(vars(&[])), None);
    }

    #[test]
    fn ids_may_contain_slashes() {
        let model = resolve("openrouter/anthropic/claude-sonnet-4").unwrap();
        assert_eq!(model.id, "anthropic/claude-sonnet-4");
        assert_eq!(model.base_url, "https://openrouter.ai/api/v1");
    }
}
