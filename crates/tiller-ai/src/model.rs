//! Models: which API a model speaks, where it lives, what it accepts and costs.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::provider::{CustomProvider, Provider};

/// The wire protocol a model is reached through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Api {
    /// OpenAI chat completions, spoken by OpenAI and most compatible servers
    /// (llama.cpp, vLLM, Ollama's `/v1`, OpenRouter, Groq, DeepSeek, Mistral).
    #[serde(rename = "openai-completions")]
    OpenAiCompletions,
    /// OpenAI's Responses API, which carries reasoning items between turns.
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// Anthropic's messages API.
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
    /// Google's Gemini API (`streamGenerateContent`).
    #[serde(rename = "google-generative-ai")]
    GoogleGenerativeAi,
    /// Amazon Bedrock's Converse API, streamed, signed with SigV4.
    #[serde(rename = "bedrock-converse-stream")]
    BedrockConverseStream,
    /// The scripted in-process provider of [`crate::faux`], for tests and demos.
    #[serde(rename = "faux")]
    Faux,
    /// pi's proxy endpoint (`POST /api/stream`, as `tiller serve` answers it): the
    /// proxy holds the provider's key and makes the call ([`crate::pi`]).
    #[serde(rename = "pi-proxy")]
    PiProxy,
}

impl Api {
    /// The API's name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenAiCompletions => "openai-completions",
            Api::OpenAiResponses => "openai-responses",
            Api::AnthropicMessages => "anthropic-messages",
            Api::GoogleGenerativeAi => "google-generative-ai",
            Api::BedrockConverseStream => "bedrock-converse-stream",
            Api::Faux => "faux",
            Api::PiProxy => "pi-proxy",
        }
    }

    /// The API named `name` (as in JSON), if Tiller speaks it.
    pub fn named(name: &str) -> Option<Api> {
        [
            Api::OpenAiCompletions,
            Api::OpenAiResponses,
            Api::AnthropicMessages,
            Api::GoogleGenerativeAi,
            Api::BedrockConverseStream,
            Api::Faux,
            Api::PiProxy,
        ]
        .into_iter()
        .find(|api| api.as_str() == name)
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kind of input a model accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    /// Text.
    Text,
    /// Images.
    Image,
}

/// Prices in US dollars per million tokens, per token class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelCost {
    /// Uncached prompt tokens.
    pub input: f64,
    /// Generated tokens.
    pub output: f64,
    /// Prompt tokens read from the cache.
    pub cache_read: f64,
    /// Prompt tokens written to the cache.
    pub cache_write: f64,
}

/// A model and everything needed to reach and bill it.
///
/// Built-in models come from [`crate::catalog`]; any other model, such as one served
/// by a local llama.cpp server, is described by hand:
///
/// ```
/// use tiller_ai::Model;
/// let model = Model::openai_compatible("http://127.0.0.1:8080/v1", "smollm2")
///     .with_provider("llamacpp");
/// assert_eq!(model.provider, "llamacpp");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// The id sent to the provider, such as `gpt-4o-mini`.
    pub id: String,
    /// A human-readable name.
    pub name: String,
    /// The wire protocol.
    pub api: Api,
    /// The provider's name, such as `openai`, `anthropic` or `llamacpp`; it also picks
    /// the environment variable an API key is read from.
    pub provider: String,
    /// Where the API lives, including its version prefix (`https://api.openai.com/v1`).
    pub base_url: String,
    /// Whether the model reasons (and accepts a thinking level).
    pub reasoning: bool,
    /// The kinds of input the model accepts.
    pub input: Vec<InputKind>,
    /// Prices per million tokens.
    pub cost: ModelCost,
    /// The context window, in tokens.
    pub context_window: u32,
    /// The most tokens one response may hold.
    pub max_tokens: u32,
    /// Extra HTTP headers sent with every request to this model.
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// A provider of the host's that answers for this model in place of its
    /// API's built-in one (the faux model's script is one); not part of the
    /// model's data.
    #[serde(skip)]
    pub(crate) custom: Option<CustomProvider>,
}

impl Model {
    /// A model on any server speaking OpenAI chat completions, with no known prices.
    pub fn openai_compatible(base_url: impl Into<String>, id: impl Into<String>) -> Self {
        Self::hand_described(Api::OpenAiCompletions, "openai-compatible", base_url, id)
    }

    /// A model on any server speaking Anthropic messages, with no known prices.
    pub fn anthropic_compatible(base_url: impl Into<String>, id: impl Into<String>) -> Self {
        Self::hand_described(Api::AnthropicMessages, "anthropic-compatible", base_url, id)
    }

    /// A model on any server speaking `api`, with no known prices, under the
    /// provider name `<api>-compatible`; `bedrock` for Bedrock's (an endpoint of
    /// AWS's, or one standing in for it), and `openai-compatible` for the APIs
    /// without servers of their own (faux, pi's proxy).
    ///
    /// ```
    /// use tiller_ai::{Api, Model};
    /// let model = Model::speaking(Api::GoogleGenerativeAi, "http://127.0.0.1:9000/v1beta", "gemini-2.5-flash");
    /// assert_eq!(model.provider, "google-generative-ai-compatible");
    /// ```
    pub fn speaking(api: Api, base_url: impl Into<String>, id: impl Into<String>) -> Self {
        match api {
            Api::AnthropicMessages => Self::anthropic_compatible(base_url, id),
            Api::GoogleGenerativeAi => {
                Self::hand_described(api, "google-generative-ai-compatible", base_url, id)
            }
            Api::OpenAiResponses => {
                Self::hand_described(api, "openai-responses-compatible", base_url, id)
            }
            Api::BedrockConverseStream => Self::hand_described(api, "bedrock", base_url, id),
            Api::OpenAiCompletions | Api::Faux | Api::PiProxy => {
                Self::openai_compatible(base_url, id)
            }
        }
    }

    /// The model `provider`/`id` reached through a pi proxy at `proxy_url` (such
    /// as `tiller serve`'s address): the proxy decides where the call goes and
    /// with which key. The proxy's token is the request's
    /// [`api_key`](crate::Transport::api_key), else `$TILLER_PROXY_TOKEN`.
    ///
    /// ```
    /// use tiller_ai::{Api, Model};
    /// let model = Model::pi_proxy("http://127.0.0.1:8787", "openai", "gpt-4o-mini");
    /// assert_eq!((model.api, model.provider.as_str()), (Api::PiProxy, "openai"));
    /// ```
    pub fn pi_proxy(
        proxy_url: impl Into<String>,
        provider: impl Into<String>,
        id: impl Into<String>,
    ) -> Self {
        Self::hand_described(Api::PiProxy, provider, proxy_url, id)
    }

    fn hand_described(
        api: Api,
        provider: impl Into<String>,
        base_url: impl Into<String>,
        id: impl Into<String>,
    ) -> Self {
        let id = id.into();
        Model {
            name: id.clone(),
            id,
            api,
            provider: provider.into(),
            base_url: base_url.into(),
            reasoning: false,
            input: vec![InputKind::Text],
            cost: ModelCost::default(),
            context_window: 128_000,
            max_tokens: 8_192,
            headers: Headers::default(),
            custom: None,
        }
    }

    /// The same model answered by `provider` (another API, a proxy or gateway in
    /// front of a built-in dialect, a test stub) instead of its API's built-in
    /// provider.
    pub fn with_custom_provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.custom = Some(CustomProvider(provider));
        self
    }

    /// The provider of the host's that answers for this model, if any.
    pub fn custom_provider(&self) -> Option<&Arc<dyn Provider>> {
        self.custom.as_ref().map(|custom| &custom.0)
    }

    /// The same model under another provider name.
    pub fn with_provider(mut self, provider: impl Into<String>) -> Self {
        self.provider = provider.into();
        self
    }

    /// The same model, marked as reasoning or not.
    pub fn with_reasoning(mut self, reasoning: bool) -> Self {
        self.reasoning = reasoning;
        self
    }

    /// The same model, marked as accepting images.
    pub fn with_images(mut self) -> Self {
        if !self.accepts_images() {
            self.input.push(InputKind::Image);
        }
        self
    }

    /// The same model with these prices.
    pub fn with_cost(mut self, cost: ModelCost) -> Self {
        self.cost = cost;
        self
    }

    /// The same model with another output token limit.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// The same model with another context window, in tokens (a local server's
    /// `-c`, say, which no catalog knows).
    pub fn with_context_window(mut self, context_window: u32) -> Self {
        self.context_window = context_window;
        self
    }

    /// Whether the model accepts images.
    pub fn accepts_images(&self) -> bool {
        self.input.contains(&InputKind::Image)
    }
}

/// HTTP headers by name. `Debug` shows only the names, since values are often secrets.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Headers::default()
    }

    /// Sets a header, replacing an earlier value.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }

    /// The headers, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Headers(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}
