//! Why a stream failed, as a value a caller can act on.

use serde::{Deserialize, Serialize};

use crate::limits::Limit;

/// Why a streamed response failed. Carried by [`crate::AssistantEvent::Error`]; its
/// `Display` text becomes the final message's `error_message`. No variant ever holds
/// an API key or a request header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StreamError {
    /// No API key was passed and the provider's environment variable is unset.
    #[error(
        "no API key for provider `{provider}`: set {env_var} or pass an API key in the stream options"
    )]
    MissingApiKey {
        /// The provider that needs a key.
        provider: String,
        /// Where the key is read from: the environment variable (or variables), or,
        /// for Bedrock, where its credentials live.
        env_var: String,
    },
    /// The provider's key from the environment was not sent, because the model is
    /// not at the provider's own address: a key goes only where its owner meant it
    /// to. Pass the key explicitly (`Transport::api_key`; for the `tiller`
    /// command, `--base-url` or an agent file's `api_key_env`) to send it there.
    #[error(
        "{env_var} is sent only to {provider}'s own API, not to {host}: pass the key explicitly to use it there"
    )]
    KeyWithheld {
        /// The provider whose key it is.
        provider: String,
        /// The environment variable holding the key.
        env_var: String,
        /// The host the model points at.
        host: String,
    },
    /// The request could not be built (an invalid header, say).
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// What was wrong.
        message: String,
    },
    /// The conversation holds a file this provider's API does not take (audio in
    /// Anthropic's, any file in a tool result of OpenAI's): nothing was sent.
    #[error("{provider} does not take {mime_type} files{}", if *in_tool_result { " in tool results" } else { "" })]
    UnsupportedFile {
        /// The provider, as the model names it.
        provider: String,
        /// The file's media type.
        mime_type: String,
        /// Whether the file was in a tool result (elsewhere it may be taken).
        in_tool_result: bool,
    },
    /// The server could not be reached, after any retries.
    #[error("could not reach {url} ({attempts} attempts): {message}")]
    Connection {
        /// The address tried.
        url: String,
        /// How many times it was tried.
        attempts: u32,
        /// What the network layer said.
        message: String,
    },
    /// The server answered with an error status, after any retries.
    #[error("HTTP {status} from {provider}: {message}")]
    Http {
        /// The provider that answered.
        provider: String,
        /// The HTTP status.
        status: u16,
        /// The provider's own error message, or the start of the body.
        message: String,
        /// The response body as received (at most 16 KiB).
        body: String,
        /// The wait the server asked for, in milliseconds, if any.
        retry_after_ms: Option<u64>,
    },
    /// The server asked to wait longer than the retry policy allows, so the request
    /// failed at once instead of hanging.
    #[error(
        "HTTP {status} from {provider}: the server asked to retry after {}, more than the {}s the retry policy allows",
        wait_text(*retry_after_ms),
        max_retry_after_ms / 1000
    )]
    RetryAfterTooLong {
        /// The provider that answered.
        provider: String,
        /// The HTTP status.
        status: u16,
        /// The wait the server asked for, in milliseconds.
        retry_after_ms: u64,
        /// The longest wait the policy allows, in milliseconds.
        max_retry_after_ms: u64,
        /// The response body as received (at most 16 KiB).
        body: String,
    },
    /// The server answered with a success status, then ended or cut the body before
    /// its first byte: no stream at all. (llama-cpp-python's server does this when it
    /// cannot stream what was asked.)
    #[error("HTTP {status} from {provider} with an empty body: the server streamed nothing")]
    EmptyBody {
        /// The provider that answered.
        provider: String,
        /// The HTTP status.
        status: u16,
    },
    /// Nothing arrived for the idle timeout.
    #[error("the stream stalled: nothing arrived for {}s", *idle_timeout_ms as f64 / 1000.0)]
    Stalled {
        /// The idle timeout that passed, in milliseconds.
        idle_timeout_ms: u64,
    },
    /// The whole response took longer than its deadline
    /// ([`crate::StreamOptions::response_deadline`]), however steadily it streamed.
    #[error("the response took longer than its deadline of {}s", *deadline_ms as f64 / 1000.0)]
    DeadlineExceeded {
        /// The deadline that passed, in milliseconds.
        deadline_ms: u64,
    },
    /// The response went past one of its [`crate::StreamLimits`]; what arrived
    /// before is kept.
    #[error("the response went past a limit: more than {max} {limit}")]
    LimitExceeded {
        /// Which limit.
        limit: Limit,
        /// The limit's value.
        max: u64,
    },
    /// The connection ended before the response was complete.
    #[error("the response ended before it was complete: {message}")]
    Incomplete {
        /// What was missing, or what the network layer said.
        message: String,
    },
    /// The stream could not be decoded.
    #[error("malformed stream: {message}")]
    Malformed {
        /// What could not be decoded.
        message: String,
    },
    /// The provider reported an error inside the stream.
    #[error("{provider} reported an error: {message}")]
    Provider {
        /// The provider.
        provider: String,
        /// The provider's error type or code, if it sent one.
        code: Option<String>,
        /// The provider's message.
        message: String,
    },
    /// The model refused to answer.
    #[error("the model refused: {message}")]
    Refused {
        /// The refusal, as the model worded it (empty when it gave none).
        message: String,
    },
    /// The provider's content filter stopped the response.
    #[error("the response was stopped by the provider's content filter")]
    ContentFiltered,
    /// The response ended for a reason Tiller does not know.
    #[error("the response ended for an unknown reason `{reason}`")]
    UnknownStopReason {
        /// The provider's stop reason.
        reason: String,
    },
    /// The caller cancelled the request.
    #[error("the request was aborted")]
    Aborted,
    /// The endpoint's circuit breaker is open after repeated failures: no
    /// request went out (see [`crate::Breakers`]).
    #[error("{endpoint} is failing: its circuit is open for {}", wait_text(*retry_in_ms))]
    CircuitOpen {
        /// The provider and its address.
        endpoint: String,
        /// How long until the breaker lets a probe through, in milliseconds.
        retry_in_ms: u64,
    },
}

impl StreamError {
    /// Whether the provider failed in a way retrying did not fix and another
    /// model might not: a 5xx (or 408) after the retries, an overloaded
    /// provider, a timeout, no connection, an empty body, an open circuit. A
    /// fallback model is tried after these; they count against the endpoint's
    /// circuit breaker. A 4xx (a bad request or key, a 429 the rate limiter
    /// waits out) and anything the model said are not.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StreamError::Http { status, .. } | StreamError::RetryAfterTooLong { status, .. } => {
                *status >= 500 || *status == 408
            }
            StreamError::Connection { .. }
            | StreamError::Stalled { .. }
            | StreamError::DeadlineExceeded { .. }
            | StreamError::EmptyBody { .. }
            | StreamError::CircuitOpen { .. } => true,
            StreamError::Provider { code, message, .. } => {
                let overloaded = |text: &str| text.to_ascii_lowercase().contains("overloaded");
                code.as_deref().is_some_and(overloaded) || overloaded(message)
            }
            _ => false,
        }
    }
}

/// A wait a server asked for, in words: whole seconds, or "longer than can be
/// represented" for one that saturated (`retry-after: 1e20`).
fn wait_text(ms: u64) -> String {
    if ms == u64::MAX {
        "longer than can be represented".to_owned()
    } else {
        format!("{}s", ms.div_ceil(1000))
    }
}
