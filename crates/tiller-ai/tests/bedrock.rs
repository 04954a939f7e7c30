//! Amazon Bedrock's Converse API over real HTTP: what is sent (messages, tool
//! config, reasoning carried back with its signature) and how its binary event
//! streams end (exceptions, broken or oversized frames, a body cut mid-frame).
//! The signature itself is checked end to end by the `tiller` command's tests,
//! which own their environment.

#![allow(clippy::unwrap_used)]

mod common;

use common::{options, run_to_end};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::{
    Api, AssistantContent, Context, Limit, Message, Model, StopReason, StreamError, StreamLimits,
    StreamOptions, ThinkingLevel, Tool, ToolChoice, ToolResultMessage,
};
use tiller_test_support::{MockServer, eventstream};

fn model(server: &MockServer) -> Model {
    Model::speaking(
        Api::BedrockConverseStream,
        server.origin(),
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
    )
    .with_provider("bedrock")
}

fn hi() -> Context {
    Context::new().with_message(Message::user("Hi"))
}

fn text(pieces: &[&str], stop: &str) -> Vec<Vec<u8>> {
    let mut messages = vec![eventstream::event(
        "messageStart",
        &json!({"role": "assistant"}),
    )];
    for piece in pieces {
        messages.push(eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"text": piece}}),
        ));
    }
    messages.push(eventstream::event(
        "contentBlockStop",
        &json!({"contentBlockIndex": 0}),
    ));
    messages.push(eventstream::event(
        "messageStop",
        &json!({"stopReason": stop}),
    ));
    messages.push(eventstream::event(
        "metadata",
        &json!({"usage": {"inputTokens": 7, "outputTokens": 2, "totalTokens": 9, "cacheReadInputTokens": 3}}),
    ));
    messages
}

#[tokio::test]
async fn reasoning_keeps_its_signature_and_goes_back_with_it() {
    let server = MockServer::start().await;
    server.push(eventstream::response([
        eventstream::event("messageStart", &json!({"role": "assistant"})),
        eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "Think"}}}),
        ),
        eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "sig-1"}}}),
        ),
        eventstream::event("contentBlockStop", &json!({"contentBlockIndex": 0})),
        eventstream::event(
            "contentBlockStart",
            &json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "search"}}}),
        ),
        eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"q\":"}}}),
        ),
        eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "\"rust\"}"}}}),
        ),
        eventstream::event("contentBlockStop", &json!({"contentBlockIndex": 1})),
        eventstream::event("messageStop", &json!({"stopReason": "tool_use"})),
        eventstream::event("metadata", &json!({"usage": {"inputTokens": 10, "outputTokens": 5}})),
    ]));
    server.push(eventstream::response(text(&["Done."], "end_turn")));
    let model = model(&server).with_reasoning(true);
    let options = StreamOptions {
        thinking: ThinkingLevel::Low,
        temperature: Some(0.3),
        tool_choice: Some(ToolChoice::Auto),
        ..options()
    };
    let context = hi().with_tool(Tool::new("search", "Searches.", json!({"type": "object"})));
    let (message, error) = run_to_end(&model, &context, &options).await;
    assert_eq!((error, message.stop_reason), (None, StopReason::ToolUse));
    let AssistantContent::Thinking(thinking) = &message.content[0] else {
        panic!("{:?}", message.content);
    };
    assert_eq!(
        (thinking.thinking.as_str(), thinking.signature.as_deref()),
        ("Think", Some("sig-1"))
    );
    let call = message.tool_calls().next().unwrap().clone();
    assert_eq!(call.arguments, json!({"q": "rust"}));

    let context = context
        .with_message(message)
        .with_message(ToolResultMessage::text(&call, "no index", true));
    let (answer, error) = run_to_end(&model, &context, &options).await;
    assert_eq!((error, answer.text()), (None, "Done.".to_owned()));
    assert_eq!(
        (answer.usage.input, answer.usage.cache_read),
        (7, 3),
        "cached tokens are apart from the input"
    );

    let sent = &server.requests()[1];
    assert_eq!(
        sent.path,
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse-stream"
    );
    assert_eq!(sent.header("authorization"), Some("Bearer test-key"));
    assert_eq!(
        sent.header("accept"),
        Some("application/vnd.amazon.eventstream")
    );
    let low = StreamOptions::default().thinking_budgets.low;
    assert_eq!(
        sent.body,
        json!({
            "messages": [
                {"role": "user", "content": [{"text": "Hi"}]},
                {"role": "assistant", "content": [
                    {"reasoningContent": {"reasoningText": {"text": "Think", "signature": "sig-1"}}},
                    {"toolUse": {"toolUseId": "tooluse_1", "name": "search", "input": {"q": "rust"}}},
                ]},
                {"role": "user", "content": [
                    {"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "no index"}], "status": "error"}},
                ]},
            ],
            // Thinking within the output limit, and no temperature while thinking.
            "inferenceConfig": {"maxTokens": model.max_tokens},
            "toolConfig": {
                "tools": [{"toolSpec": {"name": "search", "description": "Searches.", "inputSchema": {"json": {"type": "object"}}}}],
                "toolChoice": {"auto": {}},
            },
            "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": low}},
        })
    );

    // A forced tool turns thinking off, as Claude requires; the temperature stays.
    server.push(eventstream::response(text(&["ok"], "end_turn")));
    let forced = StreamOptions {
        tool_choice: Some(ToolChoice::Required),
        ..options
    };
    run_to_end(&model, &context, &forced).await;
    let sent = &server.requests()[2].body;
    assert_eq!(sent["inferenceConfig"], json!({"temperature": 0.3}));
    assert_eq!(sent.get("additionalModelRequestFields"), None);
}

#[tokio::test]
async fn redacted_reasoning_goes_back_as_redacted_content() {
    let server = MockServer::start().await;
    server.push(eventstream::response([
        eventstream::event("messageStart", &json!({"role": "assistant"})),
        eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"reasoningContent": {"redactedContent": "ZW5j"}}}),
        ),
        eventstream::event("contentBlockStop", &json!({"contentBlockIndex": 0})),
        eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 1, "delta": {"text": "Hi."}}),
        ),
        eventstream::event("messageStop", &json!({"stopReason": "end_turn"})),
    ]));
    server.push(eventstream::response(text(&["ok"], "end_turn")));
    let model = model(&server);
    let (message, error) = run_to_end(&model, &hi(), &options()).await;
    assert_eq!(error, None);
    let AssistantContent::Thinking(thinking) = &message.content[0] else {
        panic!("{:?}", message.content);
    };
    assert_eq!(
        (thinking.redacted, thinking.signature.as_deref()),
        (true, Some("ZW5j"))
    );
    let context = hi()
        .with_message(message)
        .with_message(Message::user("Again"));
    run_to_end(&model, &context, &options()).await;
    assert_eq!(
        server.requests()[1].body["messages"][1]["content"],
        json!([{"reasoningContent": {"redactedContent": "ZW5j"}}, {"text": "Hi."}])
    );
}

#[tokio::test]
async fn exceptions_and_broken_streams_end_in_typed_errors() {
    let whole = text(&["Hel", "lo"], "end_turn");
    let arrived = whole.last().unwrap().len() - 10;
    let mut cut = whole.concat();
    cut.truncate(cut.len() - 10);
    let mut corrupt = text(&["Hel"], "end_turn");
    let last = corrupt[1].len() - 1;
    corrupt[1][last] ^= 0xff;
    let cases: Vec<(Vec<Vec<u8>>, StreamError, &str)> = vec![
        (
            vec![
                text(&["Hel"], "end_turn")[..2].concat(),
                eventstream::exception("throttlingException", "Too many requests"),
            ],
            StreamError::Provider {
                provider: "bedrock".to_owned(),
                code: Some("throttlingException".to_owned()),
                message: "Too many requests".to_owned(),
            },
            "Hel",
        ),
        (
            vec![cut],
            StreamError::Incomplete {
                message: format!(
                    "the body ended inside an event-stream frame ({arrived} bytes of it arrived)"
                ),
            },
            "Hello",
        ),
        (
            text(&["Hel"], "end_turn")[..2].to_vec(),
            StreamError::Incomplete {
                message: "the stream ended without a stop reason".to_owned(),
            },
            "Hel",
        ),
        (
            text(&["Hel"], "guardrail_intervened"),
            StreamError::ContentFiltered,
            "Hel",
        ),
    ];
    for (messages, expected, kept) in cases {
        let server = MockServer::start().await;
        server.push(eventstream::response(messages));
        let (message, error) = run_to_end(&model(&server), &hi(), &options()).await;
        assert_eq!(error, Some(expected));
        assert_eq!(message.text(), kept);
    }

    let server = MockServer::start().await;
    server.push(eventstream::response(corrupt));
    let (_, error) = run_to_end(&model(&server), &hi(), &options()).await;
    assert!(
        matches!(&error, Some(StreamError::Malformed { message }) if message.starts_with("a broken event-stream frame")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_frame_claiming_more_than_the_limit_fails_before_it_is_buffered() {
    let server = MockServer::start().await;
    let mut huge = eventstream::event("contentBlockDelta", &json!({"contentBlockIndex": 0}));
    huge[..4].copy_from_slice(&(64u32 << 20).to_be_bytes());
    server.push(eventstream::response([huge]));
    let options = StreamOptions {
        limits: StreamLimits {
            max_event_bytes: 1024 * 1024,
            ..StreamLimits::default()
        },
        ..options()
    };
    let (_, error) = run_to_end(&model(&server), &hi(), &options).await;
    assert_eq!(
        error,
        Some(StreamError::LimitExceeded {
            limit: Limit::EventBytes,
            max: 1024 * 1024
        })
    );
}

#[tokio::test]
async fn a_structured_answer_comes_as_a_forced_call_read_as_text() {
    let server = MockServer::start().await;
    server.push(eventstream::response([
        eventstream::event("messageStart", &json!({"role": "assistant"})),
        eventstream::event(
            "contentBlockStart",
            &json!({"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "tooluse_9", "name": "answer"}}}),
        ),
        eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": "{\"n\": 1}"}}}),
        ),
        eventstream::event("contentBlockStop", &json!({"contentBlockIndex": 0})),
        eventstream::event("messageStop", &json!({"stopReason": "tool_use"})),
    ]));
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let options = StreamOptions {
        output_schema: Some(tiller_ai::OutputSchema::new("answer", schema.clone())),
        ..options()
    };
    let (message, error) = run_to_end(&model(&server), &hi(), &options).await;
    assert_eq!(
        (error, message.stop_reason, message.text()),
        (None, StopReason::Stop, "{\"n\": 1}".to_owned())
    );
    assert_eq!(message.tool_calls().count(), 0);
    assert_eq!(
        server.requests()[0].body["toolConfig"],
        json!({
            "tools": [{"toolSpec": {"name": "answer", "description": "Give your final answer by calling this tool: its input is the answer.", "inputSchema": {"json": schema}}}],
            "toolChoice": {"tool": {"name": "answer"}},
        })
    );
}
