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

use crate::context::ContextRef;
use crate::error::StreamError;
use crate::file::FileContent;
use crate::message::{Content, Message};
use crate::model::Model;

/// What the model reads of the tool that carries a structured answer, where the
/// answer comes as a forced call of it (Anthropic, Bedrock).
pub(crate) const OUTPUT_TOOL_DESCRIPTION: &str =
    "Give your final answer by calling this tool: its input is the answer.";

/// Refuses, before anything is sent, a conversation holding a file the API does
/// not take: `accepts` answers for a file in a user message (`false`) or in a tool
/// result (`true`).
pub(crate) fn check_files(
    model: &Model,
    context: ContextRef<'_>,
    accepts: impl Fn(&FileContent, bool) -> bool,
) -> Result<(), StreamError> {
    for message in context.messages {
        let (content, in_tool_result) = match message {
            Message::User(user) => (&user.content, false),
            Message::ToolResult(result) => (&result.content, true),
            Message::Assistant(_) => continue,
        };
        for block in content {
            if let Content::File(file) = block
                && !accepts(file, in_tool_result)
            {
                return Err(StreamError::UnsupportedFile {
                    provider: model.provider.clone(),
                    mime_type: file.mime_type.clone(),
                    in_tool_result,
                });
            }
        }
    }
    Ok(())
}

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

/// `id` as one path segment (or one query value): everything but unreserved
/// characters percent-encoded (`amazon.nova-lite-v1:0` →
/// `amazon.nova-lite-v1%3A0`), so a model id cannot reach another endpoint.
pub fn path_segment(id: &str) -> String {
    let mut segment = String::with_capacity(id.len() + 4);
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            segment.push(char::from(byte));
        } else {
            segment.push_str(&format!("%{byte:02X}"));
        }
    }
    segment
}

/// A tool call id in the characters Anthropic and Bedrock accept (`[A-Za-z0-9_-]`),
/// the others replaced the same way in calls and results.
pub(crate) fn safe_tool_id(id: &str) -> std::borrow::Cow<'_, str> {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if id.chars().all(valid) {
        std::borrow::Cow::Borrowed(id)
    } else {
        std::borrow::Cow::Owned(id.chars().map(|c| if valid(c) { c } else { '_' }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_stay_in_their_path_segment() {
        assert_eq!(path_segment("gemini-2.5-flash"), "gemini-2.5-flash");
        assert_eq!(
            path_segment("amazon.nova-lite-v1:0"),
            "amazon.nova-lite-v1%3A0"
        );
        assert_eq!(path_segment("../files?x=1"), "..%2Ffiles%3Fx%3D1");
    }
}
