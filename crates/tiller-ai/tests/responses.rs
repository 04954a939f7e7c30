//! OpenAI's Responses API over real HTTP: what is sent (instructions, items,
//! reasoning carried back encrypted, calls tied by `call_id`, tool choice,
//! structured output) and how its streams end (completed, incomplete, failed).

#![allow(clippy::unwrap_used)]

mod common;

use common::{model_for, options, run_to_end};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_ai::{
    Api, AssistantContent, AssistantMessage, Context, Message, Model, OutputSchema, StopReason,
    StreamError, StreamOptions, ThinkingLevel, Tool, ToolChoice, ToolResultMessage,
};
use tiller_test_support::{Cassette, MockResponse, MockServer, sse};

fn model(server: &MockServer, id: &str) -> Model {
    Model::speaking(Api::OpenAiResponses, server.base_url(), id).with_provider("openai-responses")
}

fn hi() -> Context {
    Context::new().with_message(Message::user("Hi"))
}

/// A stream of typed events, as the Responses API writes them.
fn events(events: &[Value]) -> MockResponse {
    MockResponse::sse(events.iter().map(sse::data).collect::<String>())
}

fn text_reply(text: &str) -> Vec<Value> {
    vec![
        json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
        json!({"type": "response.content_part.added", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": ""}}),
        json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": text}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": text}]}}),
        json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed",
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3,
                      "output_tokens_details": {"reasoning_tokens": 1}}}}),
    ]
}

#[tokio::test]
async fn reasoning_goes_back_encrypted_with_the_answer_and_its_ids() {
    let cassette = Cassette::load("openai-responses", "reasoning_roundtrip__streaming");
    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    let body = &cassette.exchanges[0].request.body;
    let model = model_for(&cassette, body, &server.base_url()).with_reasoning(true);
    let options = StreamOptions {
        thinking: ThinkingLevel::Medium,
        ..options()
    };
    let context = hi();
    let (first, error) = run_to_end(&model, &context, &options).await;
    assert_eq!(error, None);
    let AssistantContent::Thinking(thinking) = &first.content[0] else {
        panic!("{:?}", first.content);
    };
    let item: Value = serde_json::from_str(thinking.signature.as_deref().unwrap()).unwrap();
    // The item as it was when done, not as the completed response repeats it.
    assert_eq!(item["encrypted_content"], "encrypted_content_REDACTED_2");
    let AssistantContent::Text(text) = &first.content[1] else {
        panic!("{:?}", first.content);
    };
    assert_eq!(text.signature.as_deref(), Some("msg_REDACTED_1"));

    let context = context
        .with_message(first)
        .with_message(Message::user("And then?"));
    let (_, error) = run_to_end(&model, &context, &options).await;
    assert_eq!(error, None);
    let sent = &server.requests()[1].body;
    assert_eq!(
        sent["input"][1],
        json!({"type": "reasoning", "id": "rs_REDACTED_1", "summary": [], "encrypted_content": "encrypted_content_REDACTED_2"})
    );
    assert_eq!(sent["input"][2]["id"], "msg_REDACTED_1");
    assert_eq!(sent["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(
        sent["reasoning"],
        json!({"effort": "medium", "summary": "auto"})
    );
    assert_eq!(sent["store"], false);
}

#[tokio::test]
async fn calls_keep_their_item_ids_and_outputs_answer_them_by_call_id() {
    let cassette = Cassette::load(
        "openai-responses",
        "responses_sessions__parallel_tool_calls_single_turn_streaming",
    );
    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    let body = &cassette.exchanges[0].request.body;
    let model = model_for(&cassette, body, &server.base_url());
    let tools = ["lookup_harbor_label", "lookup_orchard_label"];
    let mut context = hi();
    for tool in tools {
        context = context.with_tool(Tool::new(tool, "", json!({"type": "object"})));
    }
    let (message, error) = run_to_end(&model, &context, &options()).await;
    assert_eq!((error, message.stop_reason), (None, StopReason::ToolUse));
    let calls: Vec<_> = message.tool_calls().cloned().collect();
    assert_eq!(
        calls
            .iter()
            .map(|c| (c.id.as_str(), c.signature.as_deref()))
            .collect::<Vec<_>>(),
        [
            ("call_REDACTED_1", Some("fc_REDACTED_1")),
            ("call_REDACTED_2", Some("fc_REDACTED_2"))
        ]
    );
    context = context.with_message(message);
    for (call, output) in calls.iter().zip(["crimson-harbor", "silver-orchard"]) {
        context = context.with_message(ToolResultMessage::text(call, output, false));
    }
    let (answer, error) = run_to_end(&model, &context, &options()).await;
    assert_eq!(error, None);
    assert!(
        answer.text().contains("silver-orchard"),
        "{}",
        answer.text()
    );
    let input = &server.requests()[1].body["input"];
    assert_eq!(
        input[1],
        json!({"type": "function_call", "id": "fc_REDACTED_1", "call_id": "call_REDACTED_1",
               "name": "lookup_harbor_label", "arguments": "{}", "status": "completed"})
    );
    assert_eq!(
        input[3],
        json!({"type": "function_call_output", "call_id": "call_REDACTED_1", "output": "crimson-harbor"})
    );
}

#[tokio::test]
async fn the_request_says_what_the_options_say() {
    let server = MockServer::start().await;
    server.push(events(&text_reply("{\"n\":1}")));
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false});
    let context = Context::new()
        .with_system_prompt("Be brief.")
        .with_message(Message::user("Hi"))
        .with_tool(Tool::new("search", "Searches.", json!({"type": "object"})));
    let options = StreamOptions {
        temperature: Some(0.5),
        max_tokens: Some(100),
        tool_choice: Some(ToolChoice::Tool("search".to_owned())),
        output_schema: Some(OutputSchema::new("answer", schema.clone()).strict()),
        session_id: Some("s1".to_owned()),
        ..options()
    };
    let (message, error) = run_to_end(&model(&server, "gpt-4.1"), &context, &options).await;
    assert_eq!((error, message.text()), (None, "{\"n\":1}".to_owned()));
    assert_eq!(
        (
            message.usage.input,
            message.usage.cache_read,
            message.usage.output,
            message.usage.reasoning
        ),
        (6, 4, 3, 1)
    );
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/responses");
    assert_eq!(sent.header("authorization"), Some("Bearer test-key"));
    assert_eq!(
        sent.body,
        json!({
            "model": "gpt-4.1",
            "instructions": "Be brief.",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            "tools": [{"type": "function", "name": "search", "description": "Searches.", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "search"},
            "max_output_tokens": 100,
            "temperature": 0.5,
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}},
            "prompt_cache_key": "s1",
            "store": false,
            "stream": true,
        })
    );
}

#[tokio::test]
async fn streams_that_end_badly_end_in_typed_errors() {
    let start = text_reply("Hel")[..4].to_vec();
    let with = |last: Value| {
        let mut events = start.clone();
        events.push(last);
        events
    };
    let cases: Vec<(Vec<Value>, Result<StopReason, StreamError>)> = vec![
        (
            with(
                json!({"type": "response.incomplete", "response": {"incomplete_details": {"reason": "max_output_tokens"}}}),
            ),
            Ok(StopReason::Length),
        ),
        (
            with(
                json!({"type": "response.incomplete", "response": {"incomplete_details": {"reason": "content_filter"}}}),
            ),
            Err(StreamError::ContentFiltered),
        ),
        (
            with(
                json!({"type": "response.failed", "response": {"error": {"code": "server_error", "message": "boom"}}}),
            ),
            Err(StreamError::Provider {
                provider: "openai-responses".to_owned(),
                code: Some("server_error".to_owned()),
                message: "boom".to_owned(),
            }),
        ),
        (
            with(json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow down"})),
            Err(StreamError::Provider {
                provider: "openai-responses".to_owned(),
                code: Some("rate_limit_exceeded".to_owned()),
                message: "slow down".to_owned(),
            }),
        ),
        (
            start.clone(),
            Err(StreamError::Incomplete {
                message: "the stream ended before the response was completed".to_owned(),
            }),
        ),
    ];
    for (stream, expected) in cases {
        let server = MockServer::start().await;
        server.push(events(&stream));
        let (message, error) = run_to_end(&model(&server, "gpt-4.1"), &hi(), &options()).await;
        match expected {
            Ok(reason) => assert_eq!((error, message.stop_reason), (None, reason)),
            Err(expected) => assert_eq!(error, Some(expected)),
        }
        assert_eq!(message.text(), "Hel");
    }
}

#[tokio::test]
async fn a_call_cut_off_by_the_token_limit_is_marked_truncated() {
    let server = MockServer::start().await;
    server.push(events(&[
        json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "search", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{\"q\": \"ru"}),
        json!({"type": "response.incomplete", "response": {"incomplete_details": {"reason": "max_output_tokens"}}}),
    ]));
    let (message, error) = run_to_end(&model(&server, "gpt-4.1"), &hi(), &options()).await;
    assert_eq!((error, message.stop_reason), (None, StopReason::Length));
    let call = message.tool_calls().next().unwrap();
    assert_eq!(
        call.arguments_error,
        Some(tiller_ai::ArgumentsError::Truncated {
            received: "{\"q\": \"ru".to_owned()
        })
    );
}

#[tokio::test]
async fn items_whose_reasoning_cannot_go_back_go_without_their_ids() {
    let server = MockServer::start().await;
    server.push(events(&text_reply("ok")));
    let mut earlier = AssistantMessage::empty(&model(&server, "o4-mini"));
    earlier.content = vec![
        AssistantContent::Thinking(tiller_ai::ThinkingContent {
            thinking: String::new(),
            // Not asked for its encrypted content: nothing to send back.
            signature: Some(json!({"type": "reasoning", "id": "rs_1", "summary": []}).to_string()),
            redacted: false,
        }),
        AssistantContent::Text(tiller_ai::TextContent {
            text: "Hello.".to_owned(),
            signature: Some("msg_1".to_owned()),
        }),
    ];
    let context = hi()
        .with_message(earlier)
        .with_message(Message::user("Again"));
    let (_, error) = run_to_end(&model(&server, "o4-mini"), &context, &options()).await;
    assert_eq!(error, None);
    assert_eq!(
        server.requests()[0].body["input"][1],
        json!({"type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "Hello."}]})
    );
}
