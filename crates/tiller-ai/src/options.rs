//! Per-request settings: sampling, thinking, credentials, cancellation, retries, timeouts.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::breaker::Breakers;
use crate::limits::StreamLimits;
use crate::model::Headers;
use crate::ratelimit::{RateLimitObserver, RateLimits};
use crate::retry::RetryPolicy;

/// Settings for one streamed request. `StreamOptions::default()` is a sensible start.
///
/// It serializes as settings (durations in milliseconds), without what belongs to
/// one process or is secret, which is its [`Transport`]: the headers, the key,
/// the cancellation token, the HTTP client, the rate limits and breakers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    /// Sampling temperature; the provider's default when `None`.
    pub temperature: Option<f32>,
    /// The most tokens the answer may hold; the provider's default (or, for
    /// Anthropic, the model's limit) when `None`.
    pub max_tokens: Option<u32>,
    /// Whether and which tool the model must call; the provider's default (the model
    /// decides) when `None`. Not sent when the context declares no tools.
    pub tool_choice: Option<ToolChoice>,
    /// How hard a reasoning model should think. Ignored by models that do not reason.
    pub thinking: ThinkingLevel,
    /// Token budgets per thinking level, for providers that take a budget.
    pub thinking_budgets: ThinkingBudgets,
    /// An identifier of the conversation, forwarded to providers that use one for
    /// prompt caching (OpenAI's `prompt_cache_key`).
    pub session_id: Option<String>,
    /// Retries before the first byte of a response.
    pub retry: RetryPolicy,
    /// A stream that sends no event for this long ends with a "stalled" error
    /// (keep-alive comments do not count as events); `None` waits forever.
    #[serde(rename = "idle_timeout_ms", with = "crate::millis::option")]
    pub idle_timeout: Option<Duration>,
    /// The longest a whole response may take, from the request to its last event,
    /// retries included; `None` has no deadline. Default 30 minutes.
    #[serde(rename = "response_deadline_ms", with = "crate::millis::option")]
    pub response_deadline: Option<Duration>,
    /// How much of a response is accepted.
    pub limits: StreamLimits,
    /// The account's name, when the caller names it (a named LLM configuration):
    /// requests of the same name, model and key share one pace wherever they go.
    /// Unnamed, an account is its key at the provider's address.
    pub account: Option<String>,
    /// A JSON Schema the answer's text must follow: OpenAI-compatible servers get
    /// it as `response_format` (llama.cpp turns it into a grammar), the Responses
    /// API as `text.format`, Gemini as `responseJsonSchema`; Anthropic and Bedrock
    /// get a tool whose input schema it is, the call forced (`any` beside other
    /// tools, that tool alone otherwise; thinking off), and the call comes back as
    /// the answer's text; the faux model reads [`OutputSchema::instructions`] after
    /// the system prompt (a provider of the host's gets this field and does as it
    /// sees fit). Tool calls stay possible; the schema applies to the answer.
    pub output_schema: Option<OutputSchema>,
    /// Provider-specific keys added to the top level of the request's JSON body
    /// as they are (vLLM's `top_k`, llama.cpp's `min_p`, OpenAI's `service_tier`,
    /// …). A key the request sets itself (`model`, `messages`, `stream`, a set
    /// `temperature`, …) is never replaced: such a key here is left out. The
    /// body goes out unchanged when it is empty (the default).
    pub extra_body: serde_json::Map<String, Value>,
    /// What of the request belongs to this process (credentials, cancellation,
    /// the HTTP client, pacing, breakers); never serialized.
    #[serde(skip)]
    pub transport: Transport,
}

/// The process-local parts of a request: what cannot be written down and sent
/// elsewhere, kept apart from the settings a [`StreamOptions`] serializes.
#[derive(Debug, Clone, Default)]
pub struct Transport {
    /// Extra HTTP headers for this request; they override the model's headers.
    pub headers: Headers,
    /// The API key; when `None`, it is read from the provider's environment variable.
    pub api_key: Option<ApiKey>,
    /// Cancelling this token ends the stream with stop reason `aborted`.
    pub cancel: CancellationToken,
    /// The HTTP client to use; a shared default client when `None`.
    pub http_client: Option<reqwest::Client>,
    /// The rate limits the request shares with others of its account
    /// ([`crate::ratelimit`]); `None` paces nothing (each 429 is retried alone).
    pub rate_limits: Option<RateLimits>,
    /// The tenant the request is made for: an account's turns are shared among
    /// tenants by their weights ([`RateLimits::set_weight`]), not first come,
    /// first served.
    pub tenant: Option<Arc<str>>,
    /// Told of each wait for the account's turn before it starts.
    pub on_rate_limited: Option<RateLimitObserver>,
    /// The circuit breakers the request's endpoint shares with others
    /// ([`crate::Breakers`]); `None` sends every request.
    pub breakers: Option<Breakers>,
}

impl Transport {
    /// A transport that sends `key`, the rest as by default.
    pub fn keyed(key: ApiKey) -> Self {
        Transport {
            api_key: Some(key),
            ..Transport::default()
        }
    }
}

impl StreamOptions {
    /// The most tokens a response of `model` to a request with these options
    /// may hold, its thinking included (Anthropic's and Bedrock's Claude add the
    /// thinking budget to the answer's, within the model's limit).
    pub fn output_cap(&self, model: &crate::Model) -> u32 {
        match model.api {
            crate::Api::AnthropicMessages | crate::Api::BedrockConverseStream => {
                crate::providers::anthropic::token_limits(model, self).0
            }
            _ => self.max_tokens.unwrap_or(model.max_tokens),
        }
    }

    /// These options with a response of `model` held to `most` tokens, thinking
    /// included: `max_tokens` lowered to it, and thinking turned off when its
    /// budget would go past it. `None` when they hold to it already.
    pub fn capped(&self, model: &crate::Model, most: u32) -> Option<StreamOptions> {
        if self.output_cap(model) <= most {
            return None;
        }
        let mut capped = StreamOptions {
            max_tokens: Some(most),
            ..self.clone()
        };
        if capped.output_cap(model) > most {
            capped.thinking = ThinkingLevel::Off;
        }
        Some(capped)
    }
}

/// A JSON Schema for the model's answer (structured output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputSchema {
    /// A name for it (OpenAI wants letters, digits, `_` and `-`).
    pub name: String,
    /// The JSON Schema.
    pub schema: Value,
    /// Whether OpenAI should enforce it strictly (`strict`: every property
    /// required, no additional properties); off by default, as arbitrary schemas
    /// fail OpenAI's strict subset.
    #[serde(default)]
    pub strict: bool,
}

impl OutputSchema {
    /// A schema named `name`, not strict.
    pub fn new(name: impl Into<String>, schema: Value) -> Self {
        OutputSchema {
            name: name.into(),
            schema,
            strict: false,
        }
    }

    /// The same schema, enforced strictly where the provider can.
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }

    /// What a model without a native structured-output mechanism is told after the
    /// system prompt.
    pub fn instructions(&self) -> String {
        format!(
            "Your final answer must be a single JSON value, and nothing else (no prose, no code fence), that matches this JSON Schema:\n{}",
            self.schema
        )
    }
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            temperature: None,
            max_tokens: None,
            tool_choice: None,
            thinking: ThinkingLevel::Off,
            thinking_budgets: ThinkingBudgets::default(),
            session_id: None,
            retry: RetryPolicy::default(),
            idle_timeout: Some(Duration::from_secs(120)),
            response_deadline: Some(Duration::from_secs(30 * 60)),
            limits: StreamLimits::default(),
            account: None,
            output_schema: None,
            extra_body: serde_json::Map::new(),
            transport: Transport::default(),
        }
    }
}

/// Whether the model may, must or must not call a tool, or which one it must call.
///
/// In JSON and YAML: `"auto"`, `"none"`, `"required"`, or `{"tool": "name"}`.
/// OpenAI-compatible servers receive `"auto"`, `"none"`, `"required"` or
/// `{"type": "function", "function": {"name": ...}}`; Anthropic receives
/// `{"type": "auto" | "none" | "any"}` or `{"type": "tool", "name": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides whether to call tools.
    Auto,
    /// The model must answer without calling a tool.
    None,
    /// The model must call at least one tool, of its choosing.
    Required,
    /// The model must call this tool.
    Tool(String),
}

impl ToolChoice {
    /// Whether this choice makes the model call a tool (`required` or a named tool).
    pub fn forces_a_call(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Tool(_))
    }
}

impl fmt::Display for ToolChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolChoice::Auto => f.write_str("auto"),
            ToolChoice::None => f.write_str("none"),
            ToolChoice::Required => f.write_str("required"),
            ToolChoice::Tool(name) => write!(f, "tool `{name}`"),
        }
    }
}

/// How hard a reasoning model should think.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingLevel {
    /// No reasoning beyond the model's default.
    #[default]
    Off,
    /// The least reasoning the provider offers.
    Minimal,
    /// Light reasoning.
    Low,
    /// Moderate reasoning.
    Medium,
    /// Thorough reasoning.
    High,
    /// The most reasoning the provider offers.
    Xhigh,
}

impl ThinkingLevel {
    /// Every level, from `off` to `xhigh`.
    pub const ALL: [ThinkingLevel; 6] = [
        ThinkingLevel::Off,
        ThinkingLevel::Minimal,
        ThinkingLevel::Low,
        ThinkingLevel::Medium,
        ThinkingLevel::High,
        ThinkingLevel::Xhigh,
    ];

    /// The level's name as it appears in JSON and on command lines.
    pub fn as_str(self) -> &'static str {
        match self {
            ThinkingLevel::Off => "off",
            ThinkingLevel::Minimal => "minimal",
            ThinkingLevel::Low => "low",
            ThinkingLevel::Medium => "medium",
            ThinkingLevel::High => "high",
            ThinkingLevel::Xhigh => "xhigh",
        }
    }
}

impl fmt::Display for ThinkingLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ThinkingLevel {
    type Err = UnknownThinkingLevel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ThinkingLevel::ALL
            .into_iter()
            .find(|level| level.as_str() == s)
            .ok_or_else(|| UnknownThinkingLevel(s.to_owned()))
    }
}

/// A thinking level name that is not one of `off`, `minimal`, `low`, `medium`, `high`, `xhigh`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown thinking level `{0}`: expected off, minimal, low, medium, high or xhigh")]
pub struct UnknownThinkingLevel(pub String);

/// Thinking token budgets per level, for providers that take a budget (Anthropic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ThinkingBudgets {
    /// Budget for `minimal`.
    pub minimal: u32,
    /// Budget for `low`.
    pub low: u32,
    /// Budget for `medium`.
    pub medium: u32,
    /// Budget for `high`.
    pub high: u32,
    /// Budget for `xhigh`.
    pub xhigh: u32,
}

impl Default for ThinkingBudgets {
    fn default() -> Self {
        ThinkingBudgets {
            minimal: 1_024,
            low: 2_048,
            medium: 8_192,
            high: 16_384,
            xhigh: 32_768,
        }
    }
}

impl ThinkingBudgets {
    /// The budget for `level`; `None` for `off`.
    pub fn for_level(&self, level: ThinkingLevel) -> Option<u32> {
        match level {
            ThinkingLevel::Off => None,
            ThinkingLevel::Minimal => Some(self.minimal),
            ThinkingLevel::Low => Some(self.low),
            ThinkingLevel::Medium => Some(self.medium),
            ThinkingLevel::High => Some(self.high),
            ThinkingLevel::Xhigh => Some(self.xhigh),
        }
    }
}

/// An API key. It has no `Display`, and its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key the environment variable `name` holds, trimmed; `None` when it is
    /// unset or blank.
    pub(crate) fn from_env(name: &str) -> Option<Self> {
        let key = std::env::var(name).ok()?;
        let key = key.trim();
        (!key.is_empty()).then(|| ApiKey::new(key))
    }

    /// The key itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The key as an `authorization: Bearer …` header, for the request builder.
    pub(crate) fn bearer(&self) -> (&'static str, String) {
        ("authorization", format!("Bearer {}", self.expose()))
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> Self {
        ApiKey(key)
    }
}

impl From<&str> for ApiKey {
    fn from(key: &str) -> Self {
        ApiKey(key.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_debug_hides_the_key() {
        let options = StreamOptions {
            transport: crate::Transport::keyed(ApiKey::new("sk-secret-123")),
            ..StreamOptions::default()
        };
        let debug = format!("{options:?}");
        assert!(!debug.contains("sk-secret-123"), "{debug}");
        assert!(debug.contains("ApiKey(<redacted>)"), "{debug}");
    }

    #[test]
    fn tool_choices_read_as_words_or_a_named_tool() {
        let read = |json: &str| serde_json::from_str::<ToolChoice>(json).unwrap();
        assert_eq!(read(r#""auto""#), ToolChoice::Auto);
        assert_eq!(read(r#""none""#), ToolChoice::None);
        assert_eq!(read(r#""required""#), ToolChoice::Required);
        assert_eq!(read(r#"{"tool":"add"}"#), ToolChoice::Tool("add".into()));
        assert!(serde_json::from_str::<ToolChoice>(r#""any""#).is_err());
        assert_eq!(
            serde_json::to_string(&ToolChoice::Tool("add".into())).unwrap(),
            r#"{"tool":"add"}"#
        );
    }

    #[test]
    fn thinking_levels_round_trip_through_their_names() {
        for level in ThinkingLevel::ALL {
            assert_eq!(level.as_str().parse::<ThinkingLevel>(), Ok(level));
        }
        assert!("extreme".parse::<ThinkingLevel>().is_err());
    }
}
