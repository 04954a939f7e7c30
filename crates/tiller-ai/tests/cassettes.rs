//! Every recorded provider exchange, decoded and replayed.
//!
//! The recordings are ground truth: a test that disagrees with one has found a bug
//! here, and the recording is never edited to make it pass.

#![allow(clippy::unwrap_used)]

mod common;

use common::{
    Expected, Outcome, assert_well_formed, comparable, decode, dialect, expected, final_message,
    import_request, model_for, project, summarize,
};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;
use tiller_ai::{
    ArgumentsError, AssistantContent, AssistantEvent, AssistantMessage, StopReason, StreamError,
    ThinkingContent, ToolCall,
};
use tiller_test_support::{Cassette, MockServer};

/// Every streamed exchange with a 200 response, with the model it was made to.
fn recorded_streams() -> Vec<(String, tiller_ai::Model, Vec<u8>, Expected)> {
    let mut streams = Vec::new();
    for cassette in Cassette::all() {
        for (i, exchange) in cassette.exchanges.iter().enumerate() {
            if exchange.is_streaming_chat() && exchange.response.status == 200 {
                let model = model_for(&cassette, &exchange.request.body, "http://unused/v1");
                streams.push((
                    format!("{}/{}#{i}", cassette.provider, cassette.name),
                    model,
                    exchange.response.bytes(),
                    expected(dialect(&cassette), exchange),
                ));
            }
        }
    }
    streams
}

fn stream_error(events: &[AssistantEvent]) -> Option<&StreamError> {
    match events.last() {
        Some(AssistantEvent::Error { error, .. }) => Some(error),
        _ => None,
    }
}

#[test]
fn every_recorded_stream_decodes_to_what_it_holds() {
    let streams = recorded_streams();
    assert!(
        streams.len() >= 60,
        "found only {} recorded streams",
        streams.len()
    );
    for (name, model, body, expected) in streams {
        let events = decode(&model, &body, &[usize::MAX]);
        assert_well_formed(&events);
        let decoded = summarize(final_message(&events), stream_error(&events));
        assert_eq!(decoded, expected, "{name}");
    }
}

#[test]
fn any_split_of_a_recorded_body_decodes_to_the_same_events() {
    let chunk_sizes = prop::collection::vec(prop_oneof![1usize..4, 1usize..512], 1..48);
    for (name, model, body, _) in recorded_streams() {
        let whole = comparable(decode(&model, &body, &[usize::MAX]));
        let mut runner = TestRunner::new(Config::with_cases(12));
        runner
            .run(&chunk_sizes, |sizes| {
                let split = comparable(decode(&model, &body, &sizes));
                prop_assert_eq!(&split, &whole, "{} split as {:?}", name, sizes);
                Ok(())
            })
            .unwrap();
    }
}

fn decode_recorded(provider: &str, name: &str, exchange: usize) -> Vec<AssistantEvent> {
    let cassette = Cassette::load(provider, name);
    let exchange = &cassette.exchanges[exchange];
    let model = model_for(&cassette, &exchange.request.body, "http://unused/v1");
    let events = decode(&model, &exchange.response.bytes(), &[usize::MAX]);
    assert_well_formed(&events);
    events
}

fn only_tool_call(message: &AssistantMessage) -> &ToolCall {
    let calls: Vec<_> = message.tool_calls().collect();
    assert_eq!(calls.len(), 1, "{message:#?}");
    calls[0]
}

#[test]
fn nested_and_unicode_arguments_arrive_whole() {
    let events = decode_recorded(
        "openai",
        "chat_tool_lifecycle_matrix__streaming_gpt41_nested_model",
        0,
    );
    let call = only_tool_call(final_message(&events));
    assert_eq!(call.name, "record_payload");
    assert_eq!(
        call.arguments,
        json!({"label": "café 東京", "values": [3, 5, 8], "meta": {"active": true}})
    );

    let events = decode_recorded(
        "anthropic",
        "messages_tool_args__unicode_arguments_streaming",
        0,
    );
    let call = only_tool_call(final_message(&events));
    assert_eq!(
        call.arguments,
        json!({"message": "Grüße aus 東京, from the \"naïve café\"!"})
    );

    let events = decode_recorded(
        "anthropic",
        "messages_tool_args__nested_arguments_streaming",
        0,
    );
    let message = final_message(&events);
    assert_eq!(
        message.text(),
        "I'll book this trip right away with exactly the values you specified!"
    );
    assert_eq!(
        only_tool_call(message).arguments,
        json!({"itinerary": {"city": "Kyoto", "days": 3, "activities": ["temples", "tea ceremony"], "lodging": {"name": "Sakura Inn", "rooms": 2}}})
    );
}

#[test]
fn a_zero_argument_call_has_empty_object_arguments() {
    for (provider, name) in [
        (
            "openai",
            "completions_api__completions_api_raw_stream_emits_required_zero_arg_tool_call",
        ),
        (
            "anthropic",
            "messages_tool_args__zero_argument_tool_use_streaming",
        ),
        (
            "llamacpp",
            "streaming_tools__raw_stream_emits_required_zero_arg_tool_call",
        ),
    ] {
        let events = decode_recorded(provider, name, 0);
        let message = final_message(&events);
        let call = only_tool_call(message);
        assert_eq!(
            (call.name.as_str(), &call.arguments, &call.arguments_error),
            ("ping", &json!({}), &None),
            "{name}"
        );
        assert_eq!(message.stop_reason, StopReason::ToolUse, "{name}");
    }
}

#[test]
fn the_exact_events_of_a_zero_argument_call() {
    let events = comparable(decode_recorded(
        "anthropic",
        "messages_tool_args__zero_argument_tool_use_streaming",
        0,
    ));
    let call = ToolCall {
        id: "toolu_REDACTED_1".into(),
        name: "ping".into(),
        arguments: json!({}),
        arguments_error: None,
        signature: None,
    };
    let mut message = final_message(&events).clone();
    assert_eq!(
        message.content,
        vec![AssistantContent::ToolCall(Box::new(call.clone()))]
    );
    assert_eq!((message.usage.input, message.usage.output), (575, 35));
    let done = AssistantEvent::Done {
        reason: StopReason::ToolUse,
        message: Box::new(message.clone()),
    };
    message.content.clear();
    message.stop_reason = StopReason::Stop;
    message.usage = Default::default();
    assert_eq!(
        events,
        vec![
            AssistantEvent::Start {
                message: Box::new(message)
            },
            AssistantEvent::ToolCallStart {
                content_index: 0,
                id: call.id.clone(),
                name: call.name.clone()
            },
            AssistantEvent::ToolCallEnd {
                content_index: 0,
                tool_call: Box::new(call)
            },
            done,
        ]
    );
}

#[test]
fn arguments_cut_by_the_token_limit_are_marked_truncated_not_guessed() {
    let events = decode_recorded(
        "openai",
        "chat_terminal_metadata_matrix__streaming_gpt_4o_mini_tiny_tool",
        0,
    );
    let message = final_message(&events);
    assert_eq!(message.stop_reason, StopReason::Length);
    let call = only_tool_call(message);
    assert_eq!(call.arguments, json!({}));
    assert_eq!(
        call.arguments_error,
        Some(ArgumentsError::Truncated {
            received: "{\"x\":17,\"y\":25".into()
        })
    );

    let events = decode_recorded(
        "openai",
        "chat_tool_truncation_matrix__streaming_gpt4o_low_model",
        0,
    );
    let call = only_tool_call(final_message(&events));
    assert_eq!(
        call.arguments_error,
        Some(ArgumentsError::Truncated {
            received: "{\"summary\":\"The cache warmer raced".into()
        })
    );

    let events = decode_recorded(
        "openai",
        "chat_terminal_metadata_matrix__streaming_gpt_4o_mini_roomy_tool",
        0,
    );
    let call = only_tool_call(final_message(&events));
    assert_eq!(
        (&call.arguments, &call.arguments_error),
        (&json!({"x": 17, "y": 25}), &None)
    );
}

#[test]
fn two_tool_calls_stream_before_the_text() {
    let events = decode_recorded(
        "llamacpp",
        "streaming_tools__raw_stream_surfaces_two_distinct_tool_calls_before_text",
        0,
    );
    let message = final_message(&events);
    let names: Vec<_> = message
        .tool_calls()
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("call_REDACTED_1", "lookup_harbor_label"),
            ("call_REDACTED_2", "lookup_orchard_label")
        ]
    );
    assert_eq!(message.stop_reason, StopReason::ToolUse);
    assert_eq!((message.usage.input, message.usage.output), (286, 42));
}

#[test]
fn a_null_tool_calls_delta_is_ignored() {
    let events = decode_recorded(
        "openai",
        "completions_api__completions_api_raw_stream_accepts_null_tool_calls_delta",
        0,
    );
    let message = final_message(&events);
    assert_eq!(message.text(), "cassette null tool calls ok");
    assert_eq!(message.tool_calls().count(), 0);
    assert_eq!(message.stop_reason, StopReason::Stop);
}

#[test]
fn a_refusal_ends_in_an_error_that_keeps_the_words_and_the_usage() {
    let events = decode_recorded(
        "openai",
        "refusal_matrix__chat_streaming_terminal_carries_usage",
        0,
    );
    let AssistantEvent::Error {
        reason,
        error,
        message,
    } = events.last().unwrap()
    else {
        panic!("expected an error: {events:#?}");
    };
    let words = "I'm really sorry, but I can't assist with this request.";
    assert_eq!(*reason, StopReason::Error);
    assert_eq!(
        error,
        &StreamError::Refused {
            message: words.into()
        }
    );
    assert_eq!(message.text(), words);
    assert_eq!(
        message.error_message.as_deref(),
        Some(format!("the model refused: {words}").as_str())
    );
    assert_eq!((message.usage.input, message.usage.output), (49, 13));
}

#[test]
fn redacted_thinking_keeps_its_data_as_the_signature() {
    let events = decode_recorded(
        "anthropic",
        "messages_thinking__redacted_thinking_streaming",
        0,
    );
    let message = final_message(&events);
    let redacted = |data: &str| {
        AssistantContent::Thinking(ThinkingContent {
            thinking: String::new(),
            signature: Some(data.into()),
            redacted: true,
        })
    };
    assert_eq!(
        message.content,
        vec![
            redacted("redacted_thinking_REDACTED_1"),
            redacted("redacted_thinking_REDACTED_2"),
            AssistantContent::Text(tiller_ai::TextContent::new("OK")),
        ]
    );
}

#[test]
fn thinking_keeps_its_signature_and_reasoning_content_is_thinking() {
    let events = decode_recorded("anthropic", "reasoning_tool_roundtrip__streaming", 0);
    let AssistantContent::Thinking(thinking) = &final_message(&events).content[0] else {
        panic!("thinking first");
    };
    assert_eq!(thinking.signature.as_deref(), Some("signature_REDACTED_2"));
    assert!(
        thinking
            .thinking
            .starts_with("The user wants to know the current weather in Tokyo")
    );
    assert_eq!(final_message(&events).usage.reasoning, 41);

    let events = decode_recorded(
        "llamacpp",
        "streaming_tools__example_streaming_with_tools",
        0,
    );
    let message = final_message(&events);
    assert!(
        matches!(&message.content[0], AssistantContent::Thinking(t) if t.thinking.starts_with("Okay, the user wants to calculate 2 minus 5."))
    );
    assert_eq!(only_tool_call(message).name, "subtract");
}

/// Replays each recorded conversation over HTTP: every request this library sends
/// must match the recorded one (roles, tool declarations, call ids, thinking carried
/// back), with the assistant turns it decoded from the earlier responses.
#[tokio::test]
async fn recorded_conversations_send_the_recorded_requests() {
    let mut replayed = 0;
    for cassette in Cassette::all()
        .into_iter()
        .filter(Cassette::is_streaming_chat)
    {
        let server = MockServer::start().await;
        server.push_cassette(&cassette);
        let model = model_for(
            &cassette,
            &cassette.exchanges[0].request.body,
            &server.base_url(),
        );
        let mut decoded: Vec<AssistantMessage> = Vec::new();
        for (i, exchange) in cassette.exchanges.iter().enumerate() {
            let name = format!("{}/{}#{i}", cassette.provider, cassette.name);
            let (context, options) =
                import_request(dialect(&cassette), &exchange.request.body, &decoded);
            let events: Vec<_> = tiller_ai::stream(&model, &context, &options)
                .collect()
                .await;
            assert_well_formed(&events);

            let sent = &server.requests()[i];
            assert_eq!(sent.path, exchange.request.path, "{name}");
            assert_eq!(
                project(dialect(&cassette), &sent.body),
                project(dialect(&cassette), &exchange.request.body),
                "{name}"
            );
            let decoded_now = summarize(final_message(&events), stream_error(&events));
            assert_eq!(
                decoded_now,
                expected(dialect(&cassette), exchange),
                "{name}"
            );
            decoded.push(final_message(&events).clone());
        }
        replayed += 1;
    }
    assert!(replayed >= 55, "replayed only {replayed} conversations");
}

#[tokio::test]
async fn credentials_and_versions_travel_in_headers() {
    for (provider, name, header, value) in [
        (
            "openai",
            "completions_api__completions_api_raw_stream_accepts_null_tool_calls_delta",
            "authorization",
            "Bearer test-key",
        ),
        (
            "anthropic",
            "messages_tool_args__zero_argument_tool_use_streaming",
            "x-api-key",
            "test-key",
        ),
    ] {
        let cassette = Cassette::load(provider, name);
        let server = MockServer::start().await;
        server.push_cassette(&cassette);
        let body = &cassette.exchanges[0].request.body;
        let (context, options) = import_request(provider, body, &[]);
        let model = model_for(&cassette, body, &server.base_url());
        tiller_ai::stream(&model, &context, &options).result().await;
        let sent = &server.requests()[0];
        assert_eq!(sent.header(header), Some(value));
        assert_eq!(sent.header("content-type"), Some("application/json"));
        if provider == "anthropic" {
            assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
        }
    }
}

#[tokio::test]
async fn a_recorded_404_surfaces_its_status_and_message() {
    let cassette = Cassette::load(
        "anthropic",
        "error_envelope__nonexistent_model_streaming_error_preserves_status_and_body",
    );
    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    let body = &cassette.exchanges[0].request.body;
    let (context, options) = import_request("anthropic", body, &[]);
    let model = model_for(&cassette, body, &server.base_url());
    let events: Vec<_> = tiller_ai::stream(&model, &context, &options)
        .collect()
        .await;
    assert_well_formed(&events);
    let AssistantEvent::Error { error, message, .. } = events.last().unwrap() else {
        panic!("expected an error");
    };
    let StreamError::Http {
        status,
        message: said,
        body: raw,
        ..
    } = error
    else {
        panic!("expected an HTTP error: {error:?}");
    };
    assert_eq!(
        (*status, said.as_str()),
        (404, "model: claude-nonexistent-rig-test (not_found_error)")
    );
    assert_eq!(raw, &cassette.exchanges[0].response.body);
    assert_eq!(
        message.error_message.as_deref(),
        Some("HTTP 404 from anthropic: model: claude-nonexistent-rig-test (not_found_error)")
    );
    assert_eq!(server.requests().len(), 1, "a 404 is not retried");
    assert_eq!(summarize(message, Some(error)).outcome, Outcome::Http(404));
}
