//! Builders for event-stream bodies in the OpenAI and Anthropic dialects.

use serde_json::{Value, json};

/// One `data:` event.
pub fn data(json: &Value) -> String {
    format!("data: {json}\n\n")
}

/// One named event (`event:` and `data:`), as Anthropic sends them.
pub fn named(event: &str, json: &Value) -> String {
    format!("event: {event}\ndata: {json}\n\n")
}

/// An OpenAI chunk whose first choice carries `delta`.
pub fn openai_delta(delta: Value) -> String {
    data(
        &json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]}),
    )
}

/// An OpenAI chunk with a finish reason.
pub fn openai_finish(reason: &str) -> String {
    data(
        &json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}),
    )
}

/// An OpenAI usage chunk.
pub fn openai_usage(prompt: u64, completion: u64) -> String {
    data(
        &json!({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}),
    )
}

/// The end of an OpenAI stream.
pub const OPENAI_DONE: &str = "data: [DONE]\n\n";

/// The events of an OpenAI text reply, one chunk per piece, ending with `stop`,
/// usage and `[DONE]`.
pub fn openai_text_events(pieces: &[&str]) -> Vec<String> {
    let mut events = vec![openai_delta(json!({"role": "assistant", "content": ""}))];
    events.extend(pieces.iter().map(|p| openai_delta(json!({"content": p}))));
    events.push(openai_finish("stop"));
    events.push(openai_usage(10, pieces.len() as u64));
    events.push(OPENAI_DONE.to_owned());
    events
}

/// [`openai_text_events`] as one body.
pub fn openai_text(pieces: &[&str]) -> String {
    openai_text_events(pieces).concat()
}

/// The events of an Anthropic text reply, ending with `end_turn` and `message_stop`.
pub fn anthropic_text_events(pieces: &[&str]) -> Vec<String> {
    let mut events = vec![
        named(
            "message_start",
            &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-test", "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        ),
        named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    events.extend(pieces.iter().map(|p| {
        named("content_block_delta", &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}))
    }));
    events.push(named(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(named("message_delta", &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": pieces.len()}})));
    events.push(named("message_stop", &json!({"type": "message_stop"})));
    events
}

/// [`anthropic_text_events`] as one body.
pub fn anthropic_text(pieces: &[&str]) -> String {
    anthropic_text_events(pieces).concat()
}

/// The events of an OpenAI reply calling one tool, its arguments sent in two pieces,
/// ending with `tool_calls`, usage and `[DONE]`.
pub fn openai_tool_call(id: &str, name: &str, arguments: &Value) -> String {
    let arguments = arguments.to_string();
    let (head, tail) = arguments.split_at(arguments.floor_char_boundary(arguments.len() / 2));
    [
        openai_delta(json!({"role": "assistant", "content": null})),
        openai_delta(
            json!({"tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": head}}]}),
        ),
        openai_delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": tail}}]})),
        openai_finish("tool_calls"),
        openai_usage(10, 5),
        OPENAI_DONE.to_owned(),
    ]
    .concat()
}

/// The events of an Anthropic reply calling one tool, its input sent in two pieces,
/// ending with `tool_use` and `message_stop`.
pub fn anthropic_tool_call(id: &str, name: &str, input: &Value) -> String {
    let input = input.to_string();
    let (head, tail) = input.split_at(input.floor_char_boundary(input.len() / 2));
    let delta = |partial: &str| {
        named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": partial}}),
        )
    };
    [
        named(
            "message_start",
            &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-test", "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        ),
        named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        ),
        delta(head),
        delta(tail),
        named(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ),
        named(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
        ),
        named("message_stop", &json!({"type": "message_stop"})),
    ]
    .concat()
}

/// A Gemini `streamGenerateContent` chunk: `parts` of candidate 0, with a
/// `finishReason` when given.
pub fn gemini_chunk(parts: Value, finish_reason: Option<&str>) -> String {
    let mut candidate = json!({"index": 0, "content": {"role": "model", "parts": parts}});
    if let Some(reason) = finish_reason {
        candidate["finishReason"] = json!(reason);
    }
    data(&json!({"candidates": [candidate]}))
}

/// A Gemini stream of the text `pieces`, one chunk each, the last finishing it.
pub fn gemini_text_events(pieces: &[&str]) -> Vec<String> {
    pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            let last = i + 1 == pieces.len();
            gemini_chunk(json!([{"text": piece}]), last.then_some("STOP"))
        })
        .collect()
}
