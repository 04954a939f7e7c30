//! Helpers for the replay tests: reading what a recording says independently of
//! the decoder under test, importing recorded requests as contexts, projecting
//! request bodies to what must match, and checking event order.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tiller_ai::{
    Api, ApiKey, ArgumentsError, AssistantContent, AssistantEvent, AssistantMessage, Content,
    Context, ImageContent, Message, Model, ResponseDecoder, StopReason, StreamError, StreamOptions,
    TextContent, ThinkingContent, Tool, ToolCall, ToolChoice, ToolResultMessage, UserMessage,
};
use tiller_test_support::{Cassette, Exchange, MockServer};

/// An OpenAI model served by `server`.
pub(crate) fn openai(server: &MockServer) -> Model {
    Model::openai_compatible(server.base_url(), "gpt-test").with_provider("openai")
}

/// An Anthropic model served by `server`.
pub(crate) fn anthropic(server: &MockServer) -> Model {
    Model::anthropic_compatible(server.base_url(), "claude-test").with_provider("anthropic")
}

/// A model of OpenAI's Responses API served by `server`.
pub(crate) fn responses(server: &MockServer) -> Model {
    Model::speaking(Api::OpenAiResponses, server.base_url(), "gpt-test")
        .with_provider("openai-responses")
}

/// A Bedrock model served by `server`.
pub(crate) fn bedrock(server: &MockServer) -> Model {
    Model::speaking(
        Api::BedrockConverseStream,
        server.origin(),
        "amazon.nova-lite-v1:0",
    )
    .with_provider("bedrock")
}

/// A Gemini model served by `server`.
pub(crate) fn gemini(server: &MockServer) -> Model {
    Model::speaking(
        Api::GoogleGenerativeAi,
        format!("{}/v1beta", server.origin()),
        "gemini-test",
    )
    .with_provider("gemini")
}

/// Streams `context` to the end: the final message and the terminal error, if any.
pub(crate) async fn run_to_end(
    model: &Model,
    context: &Context,
    options: &StreamOptions,
) -> (AssistantMessage, Option<StreamError>) {
    use futures::StreamExt;
    let events: Vec<_> = tiller_ai::stream(model, context, options).collect().await;
    match events.last().unwrap() {
        AssistantEvent::Done { message, .. } => ((**message).clone(), None),
        AssistantEvent::Error { message, error, .. } => ((**message).clone(), Some(error.clone())),
        other => panic!("not terminal: {other:?}"),
    }
}

/// Options with a key and no idle timeout, for the loopback-server tests.
pub(crate) fn options() -> StreamOptions {
    StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        idle_timeout: None,
        ..StreamOptions::default()
    }
}

/// The dialect a cassette speaks: its provider folder's, except for OpenAI's
/// Responses API, which the `openai` folder holds some recordings of too.
pub(crate) fn dialect(cassette: &Cassette) -> &str {
    if cassette.exchanges[0].request.path.ends_with("/responses") {
        "openai-responses"
    } else {
        &cassette.provider
    }
}

/// The model a cassette's requests were made to, served by `base_url` (a server's
/// `/v1` root; Gemini's recordings name their own version in the path).
pub(crate) fn model_for(cassette: &Cassette, request_body: &Value, base_url: &str) -> Model {
    if cassette.provider == "gemini" {
        let path = &cassette.exchanges[0].request.path;
        let (version, rest) = path.split_once("/models/").unwrap();
        let id = rest.strip_suffix(":streamGenerateContent").unwrap();
        let base = format!("{}{version}", base_url.strip_suffix("/v1").unwrap());
        return Model::speaking(Api::GoogleGenerativeAi, base, id).with_provider("gemini");
    }
    if cassette.provider == "bedrock" {
        let path = &cassette.exchanges[0].request.path;
        let id = path
            .strip_prefix("/model/")
            .and_then(|rest| rest.strip_suffix("/converse-stream"))
            .unwrap()
            .replace("%3A", ":");
        let origin = base_url.strip_suffix("/v1").unwrap();
        return Model::speaking(Api::BedrockConverseStream, origin, id).with_provider("bedrock");
    }
    let id = request_body["model"].as_str().unwrap();
    match dialect(cassette) {
        "anthropic" => Model::anthropic_compatible(base_url, id).with_provider("anthropic"),
        "openai-responses" => Model::speaking(Api::OpenAiResponses, base_url, id)
            .with_provider(cassette.provider.as_str()),
        provider => Model::openai_compatible(base_url, id).with_provider(provider),
    }
}

/// What a tool call id is compared as: an id this library made up (a UUID, for a
/// call the provider gave none) is `generated`, as it differs on every decode.
pub(crate) fn shown_id(id: &str) -> String {
    let made_up = id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    if made_up {
        "generated".to_owned()
    } else {
        id.to_owned()
    }
}

fn without_generated_ids(message: &mut AssistantMessage) {
    for block in &mut message.content {
        if let AssistantContent::ToolCall(call) = block {
            call.id = shown_id(&call.id);
        }
    }
}

/// Decodes a whole body, fed in the given chunk sizes (cycled), into events.
pub(crate) fn decode(model: &Model, body: &[u8], chunk_sizes: &[usize]) -> Vec<AssistantEvent> {
    let mut decoder = ResponseDecoder::new(model).unwrap();
    let mut rest = body;
    let mut sizes = chunk_sizes.iter().cycle();
    while !rest.is_empty() {
        let size = (*sizes.next().unwrap_or(&usize::MAX)).clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(size);
        decoder.feed(chunk);
        rest = tail;
    }
    decoder.end();
    std::iter::from_fn(|| decoder.next_event()).collect()
}

/// Events with every timestamp zeroed and every made-up call id shown as
/// `generated` ([`shown_id`]), for comparing two decodes.
pub(crate) fn comparable(events: Vec<AssistantEvent>) -> Vec<AssistantEvent> {
    events
        .into_iter()
        .map(|mut event| {
            match &mut event {
                AssistantEvent::Start { message }
                | AssistantEvent::Done { message, .. }
                | AssistantEvent::Error { message, .. } => {
                    message.timestamp = 0;
                    without_generated_ids(message);
                }
                AssistantEvent::ToolCallStart { id, .. } => *id = shown_id(id),
                AssistantEvent::ToolCallEnd { tool_call, .. } => {
                    tool_call.id = shown_id(&tool_call.id)
                }
                _ => {}
            }
            event
        })
        .collect()
}

/// The final message of a stream's events.
pub(crate) fn final_message(events: &[AssistantEvent]) -> &AssistantMessage {
    match events.last() {
        Some(AssistantEvent::Done { message, .. } | AssistantEvent::Error { message, .. }) => {
            message
        }
        other => panic!("the stream did not end with a terminal event: {other:?}"),
    }
}

/// Checks the event contract: `start` first, one terminal event last, blocks opened
/// in index order, deltas and ends only for open blocks of their kind, and (after
/// `done`) every block closed.
pub(crate) fn assert_well_formed(events: &[AssistantEvent]) {
    assert!(
        matches!(events.first(), Some(AssistantEvent::Start { .. })),
        "{events:#?}"
    );
    let terminal = events.iter().filter(|e| e.is_terminal()).count();
    assert_eq!(terminal, 1, "exactly one terminal event: {events:#?}");
    assert!(events.last().unwrap().is_terminal());
    let mut open: BTreeMap<usize, &str> = BTreeMap::new();
    let mut next = 0;
    for event in &events[1..events.len() - 1] {
        let (index, kind, action) = match event {
            AssistantEvent::TextStart { content_index } => (*content_index, "text", "start"),
            AssistantEvent::TextDelta { content_index, .. } => (*content_index, "text", "delta"),
            AssistantEvent::TextEnd { content_index, .. } => (*content_index, "text", "end"),
            AssistantEvent::ThinkingStart { content_index, .. } => {
                (*content_index, "thinking", "start")
            }
            AssistantEvent::ThinkingDelta { content_index, .. } => {
                (*content_index, "thinking", "delta")
            }
            AssistantEvent::ThinkingEnd { content_index, .. } => {
                (*content_index, "thinking", "end")
            }
            AssistantEvent::ToolCallStart { content_index, .. } => {
                (*content_index, "tool", "start")
            }
            AssistantEvent::ToolCallDelta { content_index, .. } => {
                (*content_index, "tool", "delta")
            }
            AssistantEvent::ToolCallEnd { content_index, .. } => (*content_index, "tool", "end"),
            other => panic!("unexpected event in the middle: {other:?}"),
        };
        match action {
            "start" => {
                assert_eq!(index, next, "blocks open in order");
                next += 1;
                open.insert(index, kind);
            }
            "delta" => assert_eq!(open.get(&index), Some(&kind), "delta for an open block"),
            _ => assert_eq!(open.remove(&index), Some(kind), "end for an open block"),
        }
    }
    let message = final_message(events);
    assert_eq!(message.content.len(), next, "every block was announced");
    if matches!(events.last(), Some(AssistantEvent::Done { .. })) {
        assert!(open.is_empty(), "blocks left open: {open:?}");
    }
}

/// What a decoded message must hold, read from a recording by simple concatenation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expected {
    pub(crate) text: String,
    pub(crate) thinking: Vec<(String, Option<String>, bool)>,
    pub(crate) tool_calls: Vec<(String, String, Value, Option<ArgumentsError>)>,
    pub(crate) outcome: Outcome,
    pub(crate) usage: [u64; 5],
}

/// How a response ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Done(StopReason),
    Refused(String),
    Http(u16),
}

/// The same summary of a message we decoded.
pub(crate) fn summarize(message: &AssistantMessage, error: Option<&StreamError>) -> Expected {
    let mut thinking = Vec::new();
    let mut tool_calls = Vec::new();
    for block in &message.content {
        match block {
            AssistantContent::Thinking(t) => {
                thinking.push((t.thinking.clone(), t.signature.clone(), t.redacted))
            }
            AssistantContent::ToolCall(c) => tool_calls.push((
                shown_id(&c.id),
                c.name.clone(),
                c.arguments.clone(),
                c.arguments_error.clone(),
            )),
            AssistantContent::Text(_) => {}
        }
    }
    let outcome = match error {
        None => Outcome::Done(message.stop_reason),
        Some(StreamError::Refused { message }) => Outcome::Refused(message.clone()),
        Some(StreamError::Http { status, .. }) => Outcome::Http(*status),
        Some(other) => panic!("unexpected stream error: {other}"),
    };
    let u = &message.usage;
    Expected {
        text: message.text(),
        thinking,
        tool_calls,
        outcome,
        usage: [u.input, u.output, u.cache_read, u.cache_write, u.reasoning],
    }
}

/// The `data:` payloads of a recorded body with their `event:` names.
fn recorded_events(body: &str) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    let mut name = String::new();
    for line in body.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            name = value.trim().to_owned();
        } else if let Some(data) = line.strip_prefix("data:") {
            let data = data.trim();
            if data != "[DONE]" {
                events.push((name.clone(), serde_json::from_str(data).unwrap()));
            }
        }
    }
    events
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or(0)
}

/// Reads a recorded response the plain way: concatenating its pieces.
pub(crate) fn expected(provider: &str, exchange: &Exchange) -> Expected {
    let response = &exchange.response;
    if response.status != 200 {
        return Expected {
            text: String::new(),
            thinking: vec![],
            tool_calls: vec![],
            outcome: Outcome::Http(response.status),
            usage: [0; 5],
        };
    }
    match provider {
        "anthropic" => expected_anthropic(&response.body),
        "gemini" => expected_gemini(&response.body),
        "openai-responses" => expected_responses(&response.body),
        "bedrock" => expected_bedrock(&response.bytes()),
        _ => expected_openai(&response.body),
    }
}

fn finished_arguments(text: &str, cut_off: bool) -> (Value, Option<ArgumentsError>) {
    let text = if text.trim().is_empty() { "{}" } else { text };
    match serde_json::from_str(text) {
        Ok(value) => (value, None),
        Err(_) if cut_off => (
            json!({}),
            Some(ArgumentsError::Truncated {
                received: text.to_owned(),
            }),
        ),
        Err(e) => panic!("recorded arguments are not JSON: {e}: {text}"),
    }
}

fn expected_openai(body: &str) -> Expected {
    let mut text = String::new();
    let mut refusal = String::new();
    let mut reasoning = String::new();
    let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    let mut finish = String::new();
    let mut usage = [0; 5];
    for (_, chunk) in recorded_events(body) {
        if let Some(report) = chunk.get("usage").filter(|v| v.is_object()) {
            let cached = u(&report["prompt_tokens_details"]["cached_tokens"]);
            usage = [
                u(&report["prompt_tokens"]) - cached,
                u(&report["completion_tokens"]),
                cached,
                0,
                u(&report["completion_tokens_details"]["reasoning_tokens"]),
            ];
        }
        for choice in chunk["choices"].as_array().into_iter().flatten() {
            if u(&choice["index"]) != 0 {
                continue;
            }
            let delta = &choice["delta"];
            text.push_str(delta["content"].as_str().unwrap_or(""));
            refusal.push_str(delta["refusal"].as_str().unwrap_or(""));
            let thought = delta["reasoning_content"]
                .as_str()
                .or(delta["reasoning"].as_str());
            reasoning.push_str(thought.unwrap_or(""));
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let entry = calls.entry(u(&call["index"])).or_default();
                if entry.0.is_empty() {
                    entry.0 = call["id"].as_str().unwrap_or("").to_owned();
                }
                if entry.1.is_empty() {
                    entry.1 = call["function"]["name"].as_str().unwrap_or("").to_owned();
                }
                entry
                    .2
                    .push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = reason.to_owned();
            }
        }
    }
    let cut_off = finish == "length";
    let tool_calls: Vec<_> = calls
        .into_values()
        .map(|(id, name, args)| {
            let (arguments, error) = finished_arguments(&args, cut_off);
            (id, name, arguments, error)
        })
        .collect();
    let outcome = if !refusal.is_empty() {
        Outcome::Refused(refusal.clone())
    } else {
        Outcome::Done(match finish.as_str() {
            "stop" if !tool_calls.is_empty() => StopReason::ToolUse,
            "stop" => StopReason::Stop,
            "length" => StopReason::Length,
            "tool_calls" => StopReason::ToolUse,
            other => panic!("unexpected recorded finish reason {other}"),
        })
    };
    Expected {
        text: text + &refusal,
        thinking: if reasoning.is_empty() {
            vec![]
        } else {
            vec![(reasoning, None, false)]
        },
        tool_calls,
        outcome,
        usage,
    }
}

/// The messages of an AWS event stream, read plainly (no CRC checks): each
/// message's `:event-type` and JSON payload.
fn event_stream_messages(mut body: &[u8]) -> Vec<(String, Value)> {
    let be32 = |bytes: &[u8]| u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
    let mut messages = Vec::new();
    while body.len() >= 12 {
        let (total, headers_len) = (be32(body), be32(&body[4..]));
        let (mut headers, payload) = body[12..total - 4].split_at(headers_len);
        let mut event_type = String::new();
        while !headers.is_empty() {
            let name_len = headers[0] as usize;
            let name = std::str::from_utf8(&headers[1..1 + name_len]).unwrap();
            assert_eq!(headers[1 + name_len], 7, "a string header");
            let value_len =
                u16::from_be_bytes([headers[2 + name_len], headers[3 + name_len]]) as usize;
            let value = &headers[4 + name_len..4 + name_len + value_len];
            if name == ":event-type" {
                event_type = String::from_utf8(value.to_vec()).unwrap();
            }
            headers = &headers[4 + name_len + value_len..];
        }
        messages.push((event_type, serde_json::from_slice(payload).unwrap()));
        body = &body[total..];
    }
    messages
}

fn expected_bedrock(body: &[u8]) -> Expected {
    let mut text = String::new();
    let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    let mut stop = String::new();
    let mut usage = [0; 5];
    for (event, data) in event_stream_messages(body) {
        let index = u(&data["contentBlockIndex"]);
        match event.as_str() {
            "contentBlockStart" => {
                let tool = &data["start"]["toolUse"];
                calls.insert(
                    index,
                    (
                        tool["toolUseId"].as_str().unwrap().to_owned(),
                        tool["name"].as_str().unwrap().to_owned(),
                        String::new(),
                    ),
                );
            }
            "contentBlockDelta" => {
                let delta = &data["delta"];
                text.push_str(delta["text"].as_str().unwrap_or(""));
                if let Some(input) = delta["toolUse"]["input"].as_str() {
                    calls.get_mut(&index).unwrap().2.push_str(input);
                }
            }
            "messageStop" => stop = data["stopReason"].as_str().unwrap().to_owned(),
            "metadata" => {
                let report = &data["usage"];
                usage = [
                    u(&report["inputTokens"]),
                    u(&report["outputTokens"]),
                    u(&report["cacheReadInputTokens"]),
                    u(&report["cacheWriteInputTokens"]),
                    0,
                ];
            }
            _ => {}
        }
    }
    let cut_off = stop == "max_tokens";
    let tool_calls: Vec<_> = calls
        .into_values()
        .map(|(id, name, input)| {
            let (arguments, error) = finished_arguments(&input, cut_off);
            (id, name, arguments, error)
        })
        .collect();
    let outcome = Outcome::Done(match stop.as_str() {
        "end_turn" if !tool_calls.is_empty() => StopReason::ToolUse,
        "end_turn" => StopReason::Stop,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" => StopReason::Length,
        other => panic!("unexpected recorded stop reason {other}"),
    });
    Expected {
        text,
        thinking: vec![],
        tool_calls,
        outcome,
        usage,
    }
}

fn expected_responses(body: &str) -> Expected {
    let mut text = String::new();
    let mut refusal = String::new();
    let mut thinking = Vec::new();
    let mut summaries: BTreeMap<u64, String> = BTreeMap::new();
    let mut tool_calls = Vec::new();
    let mut outcome = None;
    let mut usage = [0; 5];
    for (_, event) in recorded_events(body) {
        let index = u(&event["output_index"]);
        match event["type"].as_str().unwrap() {
            "response.output_text.delta" => text.push_str(event["delta"].as_str().unwrap()),
            "response.refusal.delta" => refusal.push_str(event["delta"].as_str().unwrap()),
            "response.reasoning_summary_text.delta" => summaries
                .entry(index)
                .or_default()
                .push_str(event["delta"].as_str().unwrap()),
            "response.output_item.done" => {
                let item = &event["item"];
                match item["type"].as_str().unwrap() {
                    "reasoning" => thinking.push((
                        summaries.remove(&index).unwrap_or_default(),
                        Some(item.to_string()),
                        false,
                    )),
                    "function_call" => {
                        let arguments = item["arguments"].as_str().unwrap();
                        let (arguments, error) = finished_arguments(arguments, false);
                        tool_calls.push((
                            item["call_id"].as_str().unwrap().to_owned(),
                            item["name"].as_str().unwrap().to_owned(),
                            arguments,
                            error,
                        ));
                    }
                    _ => {}
                }
            }
            kind @ ("response.completed" | "response.incomplete") => {
                let report = &event["response"]["usage"];
                let cached = u(&report["input_tokens_details"]["cached_tokens"]);
                usage = [
                    u(&report["input_tokens"]) - cached,
                    u(&report["output_tokens"]),
                    cached,
                    0,
                    u(&report["output_tokens_details"]["reasoning_tokens"]),
                ];
                outcome = Some(if !refusal.is_empty() {
                    Outcome::Refused(refusal.clone())
                } else if kind == "response.incomplete" {
                    Outcome::Done(StopReason::Length)
                } else if tool_calls.is_empty() {
                    Outcome::Done(StopReason::Stop)
                } else {
                    Outcome::Done(StopReason::ToolUse)
                });
            }
            _ => {}
        }
    }
    Expected {
        text: text + &refusal,
        thinking,
        tool_calls,
        outcome: outcome.expect("a recorded response ends"),
        usage,
    }
}

fn expected_gemini(body: &str) -> Expected {
    let mut text = String::new();
    let mut thinking: Vec<(String, Option<String>, bool)> = Vec::new();
    let mut tool_calls = Vec::new();
    let mut finish = String::new();
    let mut usage = [0; 5];
    // Whether the last part was thought text (thinking parts in a row make one block).
    let mut in_thought = false;
    for (_, chunk) in recorded_events(body) {
        if let Some(report) = chunk.get("usageMetadata") {
            let cached = u(&report["cachedContentTokenCount"]);
            let thoughts = u(&report["thoughtsTokenCount"]);
            usage = [
                u(&report["promptTokenCount"]) + u(&report["toolUsePromptTokenCount"]) - cached,
                u(&report["candidatesTokenCount"]) + thoughts,
                cached,
                0,
                thoughts,
            ];
        }
        let candidate = &chunk["candidates"][0];
        for part in candidate["content"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(call) = part.get("functionCall") {
                let id = call["id"].as_str().unwrap_or("generated").to_owned();
                let name = call["name"].as_str().unwrap().to_owned();
                tool_calls.push((id, name, call["args"].clone(), None));
                in_thought = false;
            } else if let Some(piece) = part["text"].as_str() {
                if part["thought"] == true {
                    if !in_thought {
                        thinking.push((String::new(), None, false));
                    }
                    let block = thinking.last_mut().unwrap();
                    block.0.push_str(piece);
                    if let Some(signature) = part["thoughtSignature"].as_str() {
                        block.1 = Some(signature.to_owned());
                    }
                    in_thought = true;
                } else {
                    text.push_str(piece);
                    in_thought = in_thought && piece.is_empty();
                }
            }
        }
        if let Some(reason) = candidate["finishReason"].as_str() {
            finish = reason.to_owned();
        }
    }
    let outcome = Outcome::Done(match finish.as_str() {
        "STOP" if !tool_calls.is_empty() => StopReason::ToolUse,
        "STOP" => StopReason::Stop,
        "MAX_TOKENS" => StopReason::Length,
        other => panic!("unexpected recorded finish reason {other}"),
    });
    Expected {
        text,
        thinking,
        tool_calls,
        outcome,
        usage,
    }
}

fn expected_anthropic(body: &str) -> Expected {
    let mut text = String::new();
    let mut thinking: BTreeMap<u64, (String, Option<String>, bool)> = BTreeMap::new();
    let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    let mut stop = String::new();
    let mut usage = [0; 5];
    let mut apply_usage = |report: &Value| {
        let fields = [
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ];
        for (slot, field) in usage.iter_mut().zip(fields) {
            if let Some(value) = report[field].as_u64() {
                *slot = value;
            }
        }
        if let Some(value) = report["output_tokens_details"]["thinking_tokens"].as_u64() {
            usage[4] = value;
        }
    };
    for (_, event) in recorded_events(body) {
        let index = u(&event["index"]);
        match event["type"].as_str().unwrap() {
            "message_start" => apply_usage(&event["message"]["usage"]),
            "content_block_start" => {
                let block = &event["content_block"];
                match block["type"].as_str().unwrap() {
                    "thinking" => {
                        thinking.insert(index, (String::new(), None, false));
                    }
                    "redacted_thinking" => {
                        let data = block["data"].as_str().map(str::to_owned);
                        thinking.insert(index, (String::new(), data, true));
                    }
                    "tool_use" => {
                        let id = block["id"].as_str().unwrap().to_owned();
                        let name = block["name"].as_str().unwrap().to_owned();
                        calls.insert(index, (id, name, String::new()));
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = &event["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => text.push_str(delta["text"].as_str().unwrap()),
                    "thinking_delta" => thinking
                        .get_mut(&index)
                        .unwrap()
                        .0
                        .push_str(delta["thinking"].as_str().unwrap()),
                    "signature_delta" => {
                        thinking.get_mut(&index).unwrap().1 =
                            Some(delta["signature"].as_str().unwrap().to_owned())
                    }
                    "input_json_delta" => calls
                        .get_mut(&index)
                        .unwrap()
                        .2
                        .push_str(delta["partial_json"].as_str().unwrap()),
                    _ => {}
                }
            }
            "message_delta" => {
                stop = event["delta"]["stop_reason"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                apply_usage(&event["usage"]);
            }
            _ => {}
        }
    }
    let cut_off = stop == "max_tokens";
    let outcome = match stop.as_str() {
        "end_turn" | "stop_sequence" | "pause_turn" => Outcome::Done(StopReason::Stop),
        "tool_use" => Outcome::Done(StopReason::ToolUse),
        "max_tokens" => Outcome::Done(StopReason::Length),
        "refusal" => Outcome::Refused(text.clone()),
        other => panic!("unexpected recorded stop reason {other}"),
    };
    Expected {
        text,
        thinking: thinking.into_values().collect(),
        tool_calls: calls
            .into_values()
            .map(|(id, name, args)| {
                let (arguments, error) = finished_arguments(&args, cut_off);
                (id, name, arguments, error)
            })
            .collect(),
        outcome,
        usage,
    }
}

/// The context and options of a recorded request, with its assistant messages
/// taken, in order, from `decoded` (what this library decoded from the earlier
/// responses of the same conversation).
pub(crate) fn import_request(
    provider: &str,
    body: &Value,
    decoded: &[AssistantMessage],
) -> (Context, StreamOptions) {
    let mut context = Context::new();
    let mut assistants = decoded.iter();
    let mut call_names: BTreeMap<String, String> = BTreeMap::new();
    let mut next_assistant = |context: &mut Context, call_names: &mut BTreeMap<String, String>| {
        let message = assistants
            .next()
            .expect("an assistant message for each one recorded");
        for call in message.tool_calls() {
            call_names.insert(call.id.clone(), call.name.clone());
        }
        context.messages.push(message.clone().into());
    };
    if provider == "gemini" {
        return import_gemini_request(body, decoded);
    }
    if provider == "openai-responses" {
        return import_responses_request(body, decoded);
    }
    if provider == "bedrock" {
        return import_bedrock_request(body, decoded);
    }
    if provider == "anthropic" {
        context.system_prompt = body.get("system").map(joined_text);
        for turn in body["messages"].as_array().unwrap() {
            if turn["role"] == "assistant" {
                next_assistant(&mut context, &mut call_names);
                continue;
            }
            let mut user = Vec::new();
            for block in blocks(&turn["content"]) {
                match block["type"].as_str().unwrap() {
                    "tool_result" => context.messages.push(Message::from(ToolResultMessage {
                        tool_call_id: block["tool_use_id"].as_str().unwrap().to_owned(),
                        tool_name: call_names[block["tool_use_id"].as_str().unwrap()].clone(),
                        content: blocks(&block["content"]).iter().map(content).collect(),
                        details: Value::Null,
                        is_error: block["is_error"].as_bool().unwrap_or(false),
                        timestamp: 0,
                        state: Default::default(),
                    })),
                    _ => user.push(content(&block)),
                }
            }
            if !user.is_empty() {
                context.messages.push(Message::User(UserMessage {
                    content: user,
                    timestamp: 0,
                }));
            }
        }
        for tool in body["tools"].as_array().into_iter().flatten() {
            context.tools.push(Tool::new(
                tool["name"].as_str().unwrap(),
                tool["description"].as_str().unwrap_or(""),
                tool["input_schema"].clone(),
            ));
        }
    } else {
        for message in body["messages"].as_array().unwrap() {
            match message["role"].as_str().unwrap() {
                "system" | "developer" => {
                    context.system_prompt = Some(joined_text(&message["content"]))
                }
                "assistant" => next_assistant(&mut context, &mut call_names),
                "tool" => {
                    let id = message["tool_call_id"].as_str().unwrap();
                    context.messages.push(Message::from(ToolResultMessage {
                        tool_call_id: id.to_owned(),
                        tool_name: call_names[id].clone(),
                        content: vec![Content::text(joined_text(&message["content"]))],
                        details: Value::Null,
                        is_error: false,
                        timestamp: 0,
                        state: Default::default(),
                    }));
                }
                _ => context.messages.push(Message::User(UserMessage {
                    content: blocks(&message["content"]).iter().map(content).collect(),
                    timestamp: 0,
                })),
            }
        }
        for tool in body["tools"].as_array().into_iter().flatten() {
            let function = &tool["function"];
            context.tools.push(Tool::new(
                function["name"].as_str().unwrap(),
                function["description"].as_str().unwrap_or(""),
                function["parameters"].clone(),
            ));
        }
    }
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        max_tokens: body["max_tokens"].as_u64().map(|n| n as u32),
        tool_choice: body.get("tool_choice").map(tool_choice),
        output_schema: body
            .get("response_format")
            .map(|format| serde_json::from_value(format["json_schema"].clone()).unwrap()),
        ..StreamOptions::default()
    };
    (context, options)
}

/// [`import_request`] for the Responses API: the items an answer gave (reasoning,
/// assistant messages, function calls) in a row stand for one decoded message.
fn import_responses_request(
    body: &Value,
    decoded: &[AssistantMessage],
) -> (Context, StreamOptions) {
    let mut context = Context::new();
    context.system_prompt = body["instructions"].as_str().map(str::to_owned);
    let mut assistants = decoded.iter();
    let mut call_names: BTreeMap<String, String> = BTreeMap::new();
    let mut in_answer = false;
    for item in body["input"].as_array().unwrap() {
        let kind = item["type"].as_str().unwrap_or("message");
        let answers = kind == "reasoning"
            || kind == "function_call"
            || (kind == "message" && item["role"] == "assistant");
        if answers {
            if !in_answer {
                let message = assistants
                    .next()
                    .expect("an assistant message for each one recorded");
                for call in message.tool_calls() {
                    call_names.insert(call.id.clone(), call.name.clone());
                }
                context.messages.push(message.clone().into());
            }
            in_answer = true;
            continue;
        }
        in_answer = false;
        match kind {
            "function_call_output" => {
                let id = item["call_id"].as_str().unwrap();
                context.messages.push(Message::from(ToolResultMessage {
                    tool_call_id: id.to_owned(),
                    tool_name: call_names[id].clone(),
                    content: vec![Content::text(item["output"].as_str().unwrap())],
                    details: Value::Null,
                    is_error: false,
                    timestamp: 0,
                    state: Default::default(),
                }));
            }
            "message" => {
                let content = match &item["content"] {
                    Value::String(text) => vec![Content::text(text)],
                    parts => parts
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|part| Content::text(part["text"].as_str().unwrap()))
                        .collect(),
                };
                context.messages.push(Message::User(UserMessage {
                    content,
                    timestamp: 0,
                }));
            }
            other => panic!("unexpected input item {other}"),
        }
    }
    for tool in body["tools"].as_array().into_iter().flatten() {
        context.tools.push(Tool::new(
            tool["name"].as_str().unwrap(),
            tool["description"].as_str().unwrap_or(""),
            tool["parameters"].clone(),
        ));
    }
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        max_tokens: body["max_output_tokens"].as_u64().map(|n| n as u32),
        temperature: body["temperature"].as_f64().map(|t| t as f32),
        tool_choice: body.get("tool_choice").map(tool_choice),
        ..StreamOptions::default()
    };
    (context, options)
}

/// [`import_request`] for Bedrock's Converse API.
fn import_bedrock_request(body: &Value, decoded: &[AssistantMessage]) -> (Context, StreamOptions) {
    let mut context = Context::new();
    context.system_prompt = body["system"].as_array().map(|blocks| {
        blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    });
    let mut assistants = decoded.iter();
    let mut call_names: BTreeMap<String, String> = BTreeMap::new();
    for message in body["messages"].as_array().unwrap() {
        if message["role"] == "assistant" {
            let message = assistants
                .next()
                .expect("an assistant message for each one recorded");
            for call in message.tool_calls() {
                call_names.insert(call.id.clone(), call.name.clone());
            }
            context.messages.push(message.clone().into());
            continue;
        }
        let mut user = Vec::new();
        for block in message["content"].as_array().unwrap() {
            if let Some(result) = block.get("toolResult") {
                let id = result["toolUseId"].as_str().unwrap();
                context.messages.push(Message::from(ToolResultMessage {
                    tool_call_id: id.to_owned(),
                    tool_name: call_names[id].clone(),
                    content: vec![Content::text(
                        result["content"][0]["text"].as_str().unwrap(),
                    )],
                    details: Value::Null,
                    is_error: result["status"] == "error",
                    timestamp: 0,
                    state: Default::default(),
                }));
            } else {
                user.push(Content::text(block["text"].as_str().unwrap()));
            }
        }
        if !user.is_empty() {
            context.messages.push(Message::User(UserMessage {
                content: user,
                timestamp: 0,
            }));
        }
    }
    let config = &body["toolConfig"];
    for tool in config["tools"].as_array().into_iter().flatten() {
        let spec = &tool["toolSpec"];
        context.tools.push(Tool::new(
            spec["name"].as_str().unwrap(),
            spec["description"].as_str().unwrap_or(""),
            spec["inputSchema"]["json"].clone(),
        ));
    }
    let choice = &config["toolChoice"];
    let tool_choice = if choice.get("any").is_some() {
        Some(ToolChoice::Required)
    } else if choice.get("auto").is_some() {
        Some(ToolChoice::Auto)
    } else {
        choice["tool"]["name"]
            .as_str()
            .map(|name| ToolChoice::Tool(name.to_owned()))
    };
    let inference = &body["inferenceConfig"];
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        max_tokens: inference["maxTokens"].as_u64().map(|n| n as u32),
        temperature: inference["temperature"].as_f64().map(|t| t as f32),
        tool_choice,
        ..StreamOptions::default()
    };
    (context, options)
}

/// A model turn of a recorded request as the assistant message it stands for.
fn gemini_history_turn(turn: &Value) -> AssistantMessage {
    let mut message = AssistantMessage::empty(&Model::speaking(Api::GoogleGenerativeAi, "", ""));
    for part in turn["parts"].as_array().unwrap() {
        let signature = part["thoughtSignature"].as_str().map(str::to_owned);
        message
            .content
            .push(if let Some(call) = part.get("functionCall") {
                AssistantContent::ToolCall(Box::new(ToolCall {
                    id: call["id"]
                        .as_str()
                        .map_or_else(tiller_ai::new_id, str::to_owned),
                    name: call["name"].as_str().unwrap().to_owned(),
                    arguments: call["args"].clone(),
                    arguments_error: None,
                    signature,
                }))
            } else if part["thought"] == true {
                AssistantContent::Thinking(ThinkingContent {
                    thinking: part["text"].as_str().unwrap().to_owned(),
                    signature,
                    redacted: false,
                })
            } else {
                AssistantContent::Text(TextContent {
                    text: part["text"].as_str().unwrap().to_owned(),
                    signature,
                })
            });
    }
    message
}

/// [`import_request`] for Gemini: a function response answers the first call of
/// the model turn before it with its name that no response answered yet.
fn import_gemini_request(body: &Value, decoded: &[AssistantMessage]) -> (Context, StreamOptions) {
    let mut context = Context::new();
    context.system_prompt = body["systemInstruction"]["parts"].as_array().map(|parts| {
        parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    });
    let mut assistants = decoded.iter();
    let mut open_calls: Vec<(String, String)> = Vec::new();
    for turn in body["contents"].as_array().unwrap() {
        if turn["role"] == "model" {
            // A turn the recording's client wrote itself (history it was given) is
            // taken from the recording.
            let message = assistants
                .next()
                .cloned()
                .unwrap_or_else(|| gemini_history_turn(turn));
            open_calls = message
                .tool_calls()
                .map(|call| (call.id.clone(), call.name.clone()))
                .collect();
            context.messages.push(message.clone().into());
            continue;
        }
        let mut user = Vec::new();
        for part in turn["parts"].as_array().unwrap() {
            if let Some(response) = part.get("functionResponse") {
                let name = response["name"].as_str().unwrap();
                let at = open_calls.iter().position(|(_, n)| n == name).unwrap();
                let (id, name) = open_calls.remove(at);
                context.messages.push(Message::from(ToolResultMessage {
                    tool_call_id: id,
                    tool_name: name,
                    content: vec![Content::text(response["response"].to_string())],
                    details: Value::Null,
                    is_error: false,
                    timestamp: 0,
                    state: Default::default(),
                }));
            } else if let Some(text) = part["text"].as_str() {
                user.push(Content::text(text));
            } else {
                panic!("unexpected user part {part}");
            }
        }
        if !user.is_empty() {
            context.messages.push(Message::User(UserMessage {
                content: user,
                timestamp: 0,
            }));
        }
    }
    for tools in body["tools"].as_array().into_iter().flatten() {
        for declaration in tools["functionDeclarations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            context.tools.push(Tool::new(
                declaration["name"].as_str().unwrap(),
                declaration["description"].as_str().unwrap_or(""),
                declaration["parameters"].clone(),
            ));
        }
    }
    let calling = &body["toolConfig"]["functionCallingConfig"];
    let tool_choice = calling["mode"].as_str().map(|mode| match mode {
        "AUTO" => ToolChoice::Auto,
        "NONE" => ToolChoice::None,
        "ANY" => match calling["allowedFunctionNames"].as_array() {
            Some(names) if names.len() == 1 => {
                ToolChoice::Tool(names[0].as_str().unwrap().to_owned())
            }
            _ => ToolChoice::Required,
        },
        other => panic!("unexpected function calling mode {other}"),
    });
    let generation = &body["generationConfig"];
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        max_tokens: generation["maxOutputTokens"].as_u64().map(|n| n as u32),
        temperature: generation["temperature"].as_f64().map(|t| t as f32),
        tool_choice,
        ..StreamOptions::default()
    };
    (context, options)
}

/// A recorded `tool_choice` of either dialect.
fn tool_choice(wire: &Value) -> ToolChoice {
    let kind = wire["type"].as_str().or(wire.as_str()).unwrap();
    match kind {
        "auto" => ToolChoice::Auto,
        "none" => ToolChoice::None,
        "required" | "any" => ToolChoice::Required,
        "tool" => ToolChoice::Tool(wire["name"].as_str().unwrap().to_owned()),
        "function" => ToolChoice::Tool(wire["function"]["name"].as_str().unwrap().to_owned()),
        other => panic!("unexpected tool_choice {other}"),
    }
}

/// Content given as a string or as a list of blocks, as a list of blocks.
fn blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        Value::Array(items) => items.clone(),
        Value::Null => vec![],
        other => panic!("unexpected content {other}"),
    }
}

fn joined_text(content: &Value) -> String {
    blocks(content)
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn content(block: &Value) -> Content {
    match block["type"].as_str().unwrap() {
        "text" => Content::Text(TextContent::new(block["text"].as_str().unwrap())),
        "image" => Content::Image(ImageContent {
            data: block["source"]["data"].as_str().unwrap().to_owned(),
            mime_type: block["source"]["media_type"].as_str().unwrap().to_owned(),
        }),
        "image_url" => {
            let url = block["image_url"]["url"].as_str().unwrap();
            let (head, data) = url.split_once(";base64,").unwrap();
            Content::Image(ImageContent {
                data: data.to_owned(),
                mime_type: head.trim_start_matches("data:").to_owned(),
            })
        }
        other => panic!("unexpected content block {other}"),
    }
}

/// What of a request body must match the recording: the model, roles, text,
/// images, tool declarations, tool calls and results tied by id, and thinking
/// carried back with its signature, and the tool choice. Transport details (stream
/// options, caching marks, token limits) are left out.
pub(crate) fn project(provider: &str, body: &Value) -> Value {
    if provider == "gemini" {
        return project_gemini(body);
    }
    if provider == "openai-responses" {
        return project_responses(body);
    }
    if provider == "bedrock" {
        return json!({
            "messages": body["messages"],
            "system": body["system"],
            "toolConfig": body["toolConfig"],
            "temperature": body["inferenceConfig"]["temperature"],
        });
    }
    if provider == "anthropic" {
        let project_blocks = |content: &Value| -> Vec<Value> {
            blocks(content)
                .iter()
                .map(|block| match block["type"].as_str().unwrap() {
                    "text" => json!({"text": block["text"]}),
                    "image" => json!({"image": block["source"]}),
                    "thinking" => json!({"thinking": block["thinking"], "signature": block["signature"]}),
                    "redacted_thinking" => json!({"redacted_thinking": block["data"]}),
                    "tool_use" => json!({"tool_use": block["id"], "name": block["name"], "input": block["input"]}),
                    "tool_result" => json!({
                        "tool_result": block["tool_use_id"],
                        "content": blocks(&block["content"]).iter().map(|b| b["text"].clone()).collect::<Vec<_>>(),
                        "is_error": block["is_error"].as_bool().unwrap_or(false),
                    }),
                    other => panic!("unexpected block {other}"),
                })
                .collect()
        };
        json!({
            "model": body["model"],
            "system": body.get("system").map(joined_text),
            "messages": body["messages"].as_array().unwrap().iter().map(|m| json!({
                "role": m["role"],
                "content": project_blocks(&m["content"]),
            })).collect::<Vec<_>>(),
            "tools": body["tools"].as_array().into_iter().flatten().map(|t| json!({
                "name": t["name"], "description": t["description"], "input_schema": t["input_schema"],
            })).collect::<Vec<_>>(),
            "tool_choice": body["tool_choice"],
            "stream": body["stream"],
        })
    } else {
        let messages: Vec<Value> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| match m["role"].as_str().unwrap() {
                "system" | "developer" => json!({"role": "system", "text": joined_text(&m["content"])}),
                "assistant" => json!({
                    "role": "assistant",
                    "text": Some(joined_text(&m["content"])).filter(|t| !t.is_empty()),
                    "tool_calls": m["tool_calls"].as_array().into_iter().flatten().map(|c| json!({
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "arguments": serde_json::from_str::<Value>(c["function"]["arguments"].as_str().unwrap()).unwrap(),
                    })).collect::<Vec<_>>(),
                }),
                "tool" => json!({"role": "tool", "tool_call_id": m["tool_call_id"], "text": joined_text(&m["content"])}),
                role => json!({"role": role, "content": blocks(&m["content"])}),
            })
            .collect();
        json!({
            "model": body["model"],
            "messages": messages,
            "tools": body["tools"].as_array().into_iter().flatten().map(|t| json!({
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "parameters": t["function"]["parameters"],
            })).collect::<Vec<_>>(),
            "tool_choice": body["tool_choice"],
            "response_format": body["response_format"],
            "stream": body["stream"],
        })
    }
}

/// [`project`] for Gemini: roles and parts (text and thought text with their
/// signatures, function calls with their arguments and signatures, function
/// responses by name, in order), the system instruction, the declarations and the
/// tool config.
fn project_gemini(body: &Value) -> Value {
    let part = |part: &Value| -> Value {
        let signature = &part["thoughtSignature"];
        if let Some(call) = part.get("functionCall") {
            json!({"call": call["name"], "args": call["args"], "signature": signature})
        } else if let Some(response) = part.get("functionResponse") {
            json!({"response": response["name"]})
        } else if part["thought"] == true {
            json!({"thought": part["text"], "signature": signature})
        } else {
            json!({"text": part["text"], "signature": signature})
        }
    };
    // Turns of one role in a row say what one merged turn says.
    let mut contents: Vec<(Value, Vec<Value>)> = Vec::new();
    for turn in body["contents"].as_array().unwrap() {
        let parts = turn["parts"].as_array().unwrap().iter().map(part);
        match contents.last_mut() {
            Some((role, merged)) if *role == turn["role"] => merged.extend(parts),
            _ => contents.push((turn["role"].clone(), parts.collect())),
        }
    }
    json!({
        "system": body["systemInstruction"]["parts"].as_array().map(|parts| {
            parts.iter().map(|p| p["text"].clone()).collect::<Vec<_>>()
        }),
        "contents": contents.into_iter()
            .map(|(role, parts)| json!({"role": role, "parts": parts}))
            .collect::<Vec<_>>(),
        "tools": body["tools"].as_array().into_iter().flatten()
            .flat_map(|tools| tools["functionDeclarations"].as_array().into_iter().flatten())
            .cloned()
            .collect::<Vec<_>>(),
        "toolConfig": body["toolConfig"],
    })
}

/// [`project`] for the Responses API: the instructions, and each input item: a
/// user message's parts, an assistant message's text and id, a reasoning item's id,
/// summary and encrypted content, a call with its ids, name and arguments, an
/// output tied by `call_id`; the tools and the tool choice.
fn project_responses(body: &Value) -> Value {
    let item = |item: &Value| -> Value {
        match item["type"].as_str().unwrap_or("message") {
            "message" if item["role"] == "assistant" => json!({
                "assistant": item["content"].as_array().unwrap().iter()
                    .map(|part| part["text"].clone()).collect::<Vec<_>>(),
                "id": item["id"],
            }),
            "message" => json!({"role": item["role"], "content": item["content"]}),
            "reasoning" => json!({
                "reasoning": item["id"],
                "summary": item["summary"],
                "encrypted_content": item["encrypted_content"],
            }),
            "function_call" => json!({
                "call": item["call_id"],
                "id": item["id"],
                "name": item["name"],
                "arguments": serde_json::from_str::<Value>(item["arguments"].as_str().unwrap()).unwrap(),
            }),
            "function_call_output" => json!({"output": item["call_id"], "text": item["output"]}),
            other => panic!("unexpected input item {other}"),
        }
    };
    json!({
        "model": body["model"],
        "instructions": body["instructions"],
        "input": body["input"].as_array().unwrap().iter().map(item).collect::<Vec<_>>(),
        "tools": body["tools"],
        "tool_choice": body["tool_choice"],
        "stream": body["stream"],
    })
}

/// Sets `name` in this test process's environment: only for a file whose one
/// test calls it before any thread that reads the environment starts.
#[allow(unsafe_code)]
pub(crate) fn set_env_alone(name: &str, value: impl AsRef<std::ffi::OsStr>) {
    // SAFETY: the caller is its file's only test (a process of its own, whose
    // only other threads, a test server's, read no environment).
    unsafe { std::env::set_var(name, value) }
}

/// Whether the environment asks for `reqwest` (as `.ci/run`'s second pass of
/// this suite does), where a test reads the direct path's own behaviour.
pub(crate) fn reqwest_asked() -> bool {
    std::env::var("TILLER_HTTP_CLIENT").is_ok_and(|client| client == "reqwest")
}

/// Streams `model`'s answer to "Say hello" on `runtime`; it must be "Hello".
pub(crate) fn says_hello_on(runtime: &tokio::runtime::Runtime, model: &Model) {
    use futures::StreamExt;
    let context = tiller_ai::Context::new().with_message(tiller_ai::Message::user("Say hello"));
    let events: Vec<_> = runtime.block_on(async {
        tiller_ai::stream(model, &context, &options())
            .collect()
            .await
    });
    match events.last() {
        Some(tiller_ai::AssistantEvent::Done { message, .. }) => {
            assert_eq!(message.text(), "Hello")
        }
        other => panic!("not done: {other:?}"),
    }
}
