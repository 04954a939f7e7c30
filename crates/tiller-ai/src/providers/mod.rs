//! The wire formats: how each API's requests are written and its streams read.
//!
//! Each provider has a `request` module (context and options to an HTTP request,
//! borrowing from the context rather than copying it) and a `decode` module (its
//! event stream to builder calls). SSE and event-stream framing, HTTP, retries and
//! JSON repair are shared and live outside this folder.

pub(crate) mod anthropic;
pub(crate) mod bedrock;
pub(crate) mod gemini;
pub(crate) mod openai;
pub(crate) mod openai_responses;
pub(crate) mod pi_proxy;

use serde::Deserialize;

use crate::error::StreamError;

/// Parses one event's JSON data, naming the event's start when it is malformed.
pub(crate) fn parse_data<'a, T: Deserialize<'a>>(data: &'a str) -> Result<T, StreamError> {
    serde_json::from_str(data).map_err(|error| StreamError::Malformed {
        message: format!("{error} in event data `{}`", excerpt(data, 200)),
    })
}

/// At most `max` bytes of `text`, cut at a character boundary, marked when cut.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
