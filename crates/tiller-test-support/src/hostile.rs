//! Responses of hostile or broken servers, each one fault, for the hardening tests of
//! the library and of the `tiller` command: every one must end a stream with a typed
//! error, in bounded memory.

use std::time::Duration;

use serde_json::json;

use crate::server::MockResponse;
use crate::sse;

/// An Anthropic stream whose second block claims index 2^40 (a decoder that sizes a
/// buffer by the index asks for terabytes).
pub fn anthropic_huge_index() -> MockResponse {
    let mut events = sse::anthropic_text_events(&["Hi"]);
    let huge = sse::named(
        "content_block_start",
        &json!({"type": "content_block_start", "index": 1u64 << 40, "content_block": {"type": "text", "text": ""}}),
    );
    events.insert(4, huge);
    MockResponse::sse(events.concat())
}

/// A `429` asking to retry after `value` (`1e20` seconds, say).
pub fn retry_after(value: &str) -> MockResponse {
    MockResponse::status(429, "slow down").header("retry-after", value)
}

/// A `429` asking to retry after `value` milliseconds.
pub fn retry_after_ms(value: &str) -> MockResponse {
    MockResponse::status(429, "slow down").header("retry-after-ms", value)
}

/// An OpenAI stream that starts a reply, then sends a keep-alive comment every
/// `every`, forever.
pub fn keep_alive_forever(every: Duration) -> MockResponse {
    let mut events = sse::openai_text_events(&["Hel"]);
    events.truncate(2);
    events.push(": keep-alive\n\n".to_owned());
    MockResponse::sse("")
        .chunks(events)
        .chunk_delay(every)
        .repeat_last()
}

/// An OpenAI stream of text deltas, one every `every`, forever.
pub fn endless_text(every: Duration) -> MockResponse {
    let events = sse::openai_text_events(&["Hel", "lo "]);
    MockResponse::sse("")
        .chunks(events[..3].to_vec())
        .chunk_delay(every)
        .repeat_last()
}

/// An OpenAI stream whose first event's `data:` line never ends.
pub fn endless_line() -> MockResponse {
    MockResponse::sse("")
        .chunks([
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"",
            &"a".repeat(64 * 1024),
        ])
        .repeat_last()
}

/// An OpenAI stream whose first event gains `data:` lines forever, never ending.
pub fn endless_event() -> MockResponse {
    MockResponse::sse("")
        .chunks([
            "data: {\n".to_owned(),
            format!("data: {}\n", "a".repeat(1024)),
        ])
        .repeat_last()
}

/// An OpenAI stream that starts `count` tool calls, each at its own index.
pub fn many_tool_calls(count: u32) -> MockResponse {
    let mut body = String::new();
    for index in 0..count {
        body.push_str(&sse::openai_delta(json!({"tool_calls": [{
            "index": index, "id": format!("call_{index}"), "type": "function",
            "function": {"name": "noop", "arguments": "{}"}
        }]})));
    }
    body.push_str(&sse::openai_finish("tool_calls"));
    body.push_str(sse::OPENAI_DONE);
    MockResponse::sse(body)
}

/// A Gemini stream of text chunks, one every `every`, forever.
pub fn gemini_endless_text(every: Duration) -> MockResponse {
    MockResponse::sse("")
        .chunks(vec![
            sse::gemini_chunk(json!([{"text": "Hel"}]), None),
            sse::gemini_chunk(json!([{"text": "lo "}]), None),
        ])
        .chunk_delay(every)
        .repeat_last()
}

/// A Gemini stream whose one chunk holds `count` function calls.
pub fn gemini_many_tool_calls(count: u32) -> MockResponse {
    let calls: Vec<_> = (0..count)
        .map(|index| json!({"functionCall": {"name": "noop", "args": {"n": index}}}))
        .collect();
    MockResponse::sse(sse::gemini_chunk(json!(calls), Some("STOP")))
}

/// An OpenAI Responses stream of text deltas, one every `every`, forever.
pub fn responses_endless_text(every: Duration) -> MockResponse {
    let event = |value: serde_json::Value| sse::data(&value);
    MockResponse::sse("")
        .chunks(vec![
            event(json!({"type": "response.output_item.added", "output_index": 0,
                         "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}})),
            event(json!({"type": "response.content_part.added", "output_index": 0, "content_index": 0,
                         "part": {"type": "output_text", "text": ""}})),
            event(json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "Hel"})),
            event(json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "lo "})),
        ])
        .chunk_delay(every)
        .repeat_last()
}

/// An OpenAI Responses stream that adds `count` function calls, each its own item.
pub fn responses_many_tool_calls(count: u32) -> MockResponse {
    let mut body = String::new();
    for index in 0..count {
        body.push_str(&sse::data(&json!({
            "type": "response.output_item.added", "output_index": index,
            "item": {"type": "function_call", "id": format!("fc_{index}"), "call_id": format!("call_{index}"),
                     "name": "noop", "arguments": ""}
        })));
        body.push_str(&sse::data(&json!({
            "type": "response.output_item.done", "output_index": index,
            "item": {"type": "function_call", "id": format!("fc_{index}"), "call_id": format!("call_{index}"),
                     "name": "noop", "arguments": "{}"}
        })));
    }
    body.push_str(&sse::data(
        &json!({"type": "response.completed", "response": {}}),
    ));
    MockResponse::sse(body)
}

/// A Bedrock stream (AWS's binary event stream) of text deltas, one every
/// `every`, forever.
pub fn bedrock_endless_text(every: Duration) -> MockResponse {
    use crate::eventstream::event;
    let delta = |text: &str| {
        event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"text": text}}),
        )
    };
    MockResponse::recorded(200, "application/vnd.amazon.eventstream", Vec::new())
        .chunks(vec![
            event("messageStart", &json!({"role": "assistant"})),
            delta("Hel"),
            delta("lo "),
        ])
        .chunk_delay(every)
        .repeat_last()
}

/// A Bedrock stream that starts `count` tool uses, each at its own block index.
pub fn bedrock_many_tool_calls(count: u32) -> MockResponse {
    use crate::eventstream::{event, response};
    let mut messages = vec![event("messageStart", &json!({"role": "assistant"}))];
    for index in 0..count {
        messages.push(event(
            "contentBlockStart",
            &json!({"contentBlockIndex": index,
            "start": {"toolUse": {"toolUseId": format!("tooluse_{index}"), "name": "noop"}}}),
        ));
        messages.push(event(
            "contentBlockStop",
            &json!({"contentBlockIndex": index}),
        ));
    }
    messages.push(event("messageStop", &json!({"stopReason": "tool_use"})));
    response(messages)
}
