//! Telling a provider's "the request is longer than the context window" apart
//! from its other errors, in each dialect's own form:
//!
//! | Provider | What it answers |
//! |---|---|
//! | OpenAI, vLLM, llama-cpp-python | 400, `code: "context_length_exceeded"`, "This model's maximum context length is N tokens…" |
//! | OpenAI Responses | `response.failed` / `error` with `code: "context_length_exceeded"` |
//! | Anthropic | 400 `invalid_request_error`, "prompt is too long: M tokens > N maximum" |
//! | Gemini | 400 `INVALID_ARGUMENT`, "The input token count (M) exceeds the maximum number of tokens allowed (N)." |
//! | Bedrock | `ValidationException`, "Input is too long for requested model." or "too many input tokens" |
//! | llama.cpp's `llama-server` | 400, `type: "exceed_context_size_error"`, `n_ctx: N` |
//!
//! Where the answer names the window (N above), it is read back, so a caller that
//! did not know the model's window learns it from the refusal.

use crate::error::StreamError;

/// A provider's refusal of a request longer than the model's context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContextOverflow {
    /// The window the provider named, in tokens, when it named one.
    pub context_window: Option<u32>,
}

impl StreamError {
    /// Whether this error is the provider saying the request does not fit the
    /// model's context window (see the module's table), and the window it named.
    pub fn context_overflow(&self) -> Option<ContextOverflow> {
        let (code, text) = match self {
            StreamError::Http { message, body, .. } => (None, [message.as_str(), body.as_str()]),
            StreamError::Provider { code, message, .. } => {
                (code.as_deref(), [message.as_str(), ""])
            }
            _ => return None,
        };
        let lower = |s: &str| s.to_ascii_lowercase();
        let said = text.map(lower).join("\n");
        let code = code.map(lower).unwrap_or_default();
        let overflowed =
            code == "context_length_exceeded" || MARKERS.iter().any(|marker| said.contains(marker));
        overflowed.then(|| ContextOverflow {
            context_window: WINDOW_BEFORE
                .iter()
                .find_map(|before| number_after(&said, before)),
        })
    }
}

/// Words that only a context overflow's error carries, lowercased.
const MARKERS: [&str; 9] = [
    "context_length_exceeded",
    "exceed_context_size_error",
    "maximum context length",
    "exceeds the available context size",
    "exceeds the context window",
    "prompt is too long",
    "input is too long",
    "too many input tokens",
    "exceeds the maximum number of tokens allowed",
];

/// What comes right before the window's size in each dialect's error, lowercased.
const WINDOW_BEFORE: [&str; 5] = [
    "\"n_ctx\":",
    "available context size (",
    "maximum context length is ",
    "tokens > ",
    "maximum number of tokens allowed (",
];

/// The whole number right after the first `before` in `text`.
fn number_after(text: &str, before: &str) -> Option<u32> {
    let rest = text[text.find(before)? + before.len()..].trim_start();
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16, body: &str) -> StreamError {
        StreamError::Http {
            provider: "p".into(),
            status,
            message: String::new(),
            body: body.into(),
            retry_after_ms: None,
        }
    }

    fn provider(code: Option<&str>, message: &str) -> StreamError {
        StreamError::Provider {
            provider: "p".into(),
            code: code.map(str::to_owned),
            message: message.into(),
        }
    }

    #[test]
    fn each_dialects_overflow_is_recognised_with_its_window() {
        let cases = [
            (
                http(
                    400,
                    r#"{"error":{"code":400,"message":"request (5012 tokens) exceeds the available context size (4096 tokens), try increasing it","n_ctx":4096,"n_prompt_tokens":5012,"type":"exceed_context_size_error"}}"#,
                ),
                Some(4096),
            ),
            (
                http(
                    400,
                    r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130563 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
                ),
                Some(128_000),
            ),
            (
                http(
                    400,
                    r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#,
                ),
                Some(200_000),
            ),
            (
                http(
                    400,
                    r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
                ),
                Some(1_048_576),
            ),
            (
                provider(
                    Some("ValidationException"),
                    "Input is too long for requested model.",
                ),
                None,
            ),
            (
                provider(
                    Some("context_length_exceeded"),
                    "Your input exceeds the context window of this model. Please adjust your input and try again.",
                ),
                None,
            ),
        ];
        for (error, window) in cases {
            assert_eq!(
                error.context_overflow(),
                Some(ContextOverflow {
                    context_window: window
                }),
                "{error:?}"
            );
        }
    }

    #[test]
    fn other_errors_are_not_overflows() {
        for error in [
            http(
                404,
                r#"{"error":{"message":"model: claude-nonexistent","type":"not_found_error"}}"#,
            ),
            http(
                429,
                r#"{"error":{"message":"Rate limit reached for tokens"}}"#,
            ),
            provider(Some("overloaded_error"), "Overloaded"),
            StreamError::Aborted,
        ] {
            assert_eq!(error.context_overflow(), None, "{error:?}");
        }
    }
}
