//! Gemini's dialect over real HTTP: what is sent (contents, declarations, tool
//! config, thinking, structured output, signatures carried back) and how its odd
//! streams end (two finish reasons, none, a blocked prompt, an error chunk).

#![allow(clippy::unwrap_used)]

mod common;

use common::{gemini, model_for, options, run_to_end};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::{
    AssistantContent, AssistantMessage, Context, Message, Model, OutputSchema, StopReason,
    StreamError, StreamOptions, ThinkingLevel, Tool, ToolChoice, ToolResultMessage,
};
use tiller_test_support::{Cassette, MockResponse, MockServer, sse};

/// The response to the recording `name`'s first request, as decoded from a replay.
async fn replayed(name: &str) -> (AssistantMessage, Option<StreamError>) {
    let cassette = Cassette::load("gemini", name);
    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    let model = model_for(
        &cassette,
        &cassette.exchanges[0].request.body,
        &server.base_url(),
    );
    run_to_end(
        &model,
        &Context::new().with_message(Message::user("Hi")),
        &options(),
    )
    .await
}

fn hi() -> Context {
    Context::new().with_message(Message::user("Hi"))
}

#[tokio::test]
async fn text_after_the_first_finish_reason_is_kept() {
    let (message, error) = replayed(
        "stream_terminal_matrix__two_terminal_stream_keeps_the_text_after_the_first_finish",
    )
    .await;
    assert_eq!(error, None);
    assert_eq!(message.stop_reason, StopReason::Stop);
    // The recording finishes once after its code runs, then goes on to answer.
    assert!(
        message.text().starts_with("The first number is 12193263"),
        "{}",
        message.text()
    );
}

#[tokio::test]
async fn the_token_limit_ends_in_length() {
    let (message, error) =
        replayed("stream_terminal_matrix__max_tokens_truncated_stream_still_reports_length").await;
    assert_eq!((error, message.stop_reason), (None, StopReason::Length));
}

#[tokio::test]
async fn signatures_and_call_ids_are_kept_and_sent_back_exactly() {
    let cassette = Cassette::load("gemini", "streaming_grammar__thinking_then_tool_call");
    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    server.push(MockResponse::sse(
        sse::gemini_text_events(&["done"]).concat(),
    ));
    let model = model_for(
        &cassette,
        &cassette.exchanges[0].request.body,
        &server.base_url(),
    );
    let tool = Tool::new("lookup_harbor_label", "", json!({"type": "object"}));
    let context = hi().with_tool(tool);
    let (message, error) = run_to_end(&model, &context, &options()).await;
    assert_eq!(error, None);
    assert_eq!(message.stop_reason, StopReason::ToolUse);
    let call = message.tool_calls().next().unwrap().clone();
    assert_eq!(
        (call.id.as_str(), call.signature.as_deref()),
        ("call_966934", Some("signature_REDACTED_1"))
    );
    assert!(matches!(&message.content[0], AssistantContent::Thinking(_)));

    let result = ToolResultMessage::text(&call, "crimson-harbor", false);
    let context = context.with_message(message).with_message(result);
    let (answer, error) = run_to_end(&model, &context, &options()).await;
    assert_eq!((error, answer.text()), (None, "done".to_owned()));

    let sent = &server.requests()[1].body;
    let model_turn = &sent["contents"][1];
    assert_eq!(model_turn["role"], "model");
    let parts = model_turn["parts"].as_array().unwrap();
    assert_eq!(parts[0]["thought"], true);
    assert_eq!(
        parts[1],
        json!({
            "functionCall": {"id": "call_966934", "name": "lookup_harbor_label", "args": {}},
            "thoughtSignature": "signature_REDACTED_1",
        })
    );
    assert_eq!(
        sent["contents"][2],
        json!({"role": "user", "parts": [{"functionResponse": {
            "id": "call_966934", "name": "lookup_harbor_label", "response": {"output": "crimson-harbor"},
        }}]})
    );
}

#[tokio::test]
async fn a_text_signature_on_a_last_empty_part_belongs_to_the_text() {
    let (message, error) = replayed("streaming__streaming_smoke").await;
    assert_eq!(error, None);
    let texts: Vec<_> = message
        .content
        .iter()
        .filter_map(|block| match block {
            AssistantContent::Text(text) => Some(text.signature.as_deref()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, [Some("signature_REDACTED_1")]);
}

#[tokio::test]
async fn the_request_says_what_the_options_say() {
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::gemini_text_events(&["ok"]).concat()));
    let mut model = gemini(&server).with_reasoning(true);
    model.id = "gemini-2.5-flash".to_owned();
    let schema = json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {"q": {"type": ["string", "null"]}},
    });
    let context = Context::new()
        .with_system_prompt("Be brief.")
        .with_message(Message::user("Hi"))
        .with_tool(Tool::new("search", "Searches.", schema));
    let options = StreamOptions {
        temperature: Some(0.5),
        max_tokens: Some(100),
        tool_choice: Some(ToolChoice::Tool("search".to_owned())),
        thinking: ThinkingLevel::Low,
        ..options()
    };
    let (_, error) = run_to_end(&model, &context, &options).await;
    assert_eq!(error, None);
    let sent = &server.requests()[0];
    assert_eq!(
        sent.path,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    );
    assert_eq!(sent.header("x-goog-api-key"), Some("test-key"));
    let low = StreamOptions::default().thinking_budgets.low;
    assert_eq!(
        sent.body,
        json!({
            "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "tools": [{"functionDeclarations": [{
                "name": "search",
                "description": "Searches.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string", "nullable": true}}},
            }]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["search"]}},
            "generationConfig": {
                "temperature": 0.5,
                "maxOutputTokens": 100,
                "thinkingConfig": {"includeThoughts": true, "thinkingBudget": low},
            },
        })
    );
}

#[tokio::test]
async fn gemini_3_thinks_by_level_and_a_structured_answer_by_schema() {
    let server = MockServer::start().await;
    server.push(MockResponse::sse(
        sse::gemini_text_events(&["{\"n\":", "1}"]).concat(),
    ));
    let mut model = gemini(&server).with_reasoning(true);
    model.id = "gemini-3-flash-preview".to_owned();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let options = StreamOptions {
        thinking: ThinkingLevel::Medium,
        output_schema: Some(OutputSchema::new("answer", schema.clone())),
        ..options()
    };
    let (message, error) = run_to_end(&model, &hi(), &options).await;
    assert_eq!((error, message.text()), (None, "{\"n\":1}".to_owned()));
    assert_eq!(
        server.requests()[0].body["generationConfig"],
        json!({
            "thinkingConfig": {"includeThoughts": true, "thinkingLevel": "medium"},
            "responseMimeType": "application/json",
            "responseJsonSchema": schema,
        })
    );
}

#[tokio::test]
async fn a_failed_call_answers_with_an_error_and_foreign_thinking_stays_home() {
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::gemini_text_events(&["ok"]).concat()));
    let model = gemini(&server);
    let mut earlier = AssistantMessage::empty(&Model::anthropic_compatible("http://x", "c"));
    earlier.content = vec![
        AssistantContent::Thinking(tiller_ai::ThinkingContent {
            thinking: "private".to_owned(),
            signature: Some("anthropic-signature".to_owned()),
            redacted: false,
        }),
        AssistantContent::ToolCall(Box::new(tiller_ai::ToolCall {
            id: "toolu_1".to_owned(),
            name: "search".to_owned(),
            arguments: json!({"q": "x"}),
            arguments_error: None,
            signature: None,
        })),
    ];
    let call = earlier.tool_calls().next().unwrap().clone();
    let context = hi()
        .with_message(earlier)
        .with_message(ToolResultMessage::text(&call, "no index", true));
    let (_, error) = run_to_end(&model, &context, &options()).await;
    assert_eq!(error, None);
    let contents = &server.requests()[0].body["contents"];
    assert_eq!(
        contents[1],
        json!({"role": "model", "parts": [{"functionCall": {"id": "toolu_1", "name": "search", "args": {"q": "x"}}}]})
    );

    // Gemini 3 takes another model's call only with the documented placeholder.
    server.push(MockResponse::sse(sse::gemini_text_events(&["ok"]).concat()));
    let mut gemini_3 = model.clone();
    gemini_3.id = "gemini-3-flash-preview".to_owned();
    run_to_end(&gemini_3, &context, &options()).await;
    assert_eq!(
        server.requests()[1].body["contents"][1]["parts"][0]["thoughtSignature"],
        "skip_thought_signature_validator"
    );
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"]["response"],
        json!({"error": "no index"})
    );
}

#[tokio::test]
async fn streams_that_end_badly_end_in_typed_errors() {
    let cases: Vec<(String, StreamError, &str)> = vec![
        (
            sse::gemini_chunk(json!([{"text": "Hel"}]), None),
            StreamError::Incomplete {
                message: "the stream ended without a finish reason".to_owned(),
            },
            "Hel",
        ),
        (
            String::new(),
            StreamError::EmptyBody {
                provider: "gemini".to_owned(),
                status: 200,
            },
            "",
        ),
        (
            sse::gemini_chunk(json!([{"text": "Hel"}]), None)
                + &sse::data(
                    &json!({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}),
                ),
            StreamError::Provider {
                provider: "gemini".to_owned(),
                code: Some("UNAVAILABLE".to_owned()),
                message: "overloaded".to_owned(),
            },
            "Hel",
        ),
        (
            sse::data(&json!({"promptFeedback": {"blockReason": "SAFETY"}})),
            StreamError::ContentFiltered,
            "",
        ),
        (
            sse::data(&json!({"promptFeedback": {"blockReason": "OTHER"}})),
            StreamError::Refused {
                message: "Gemini blocked the prompt (OTHER)".to_owned(),
            },
            "",
        ),
        (
            sse::gemini_chunk(json!([{"text": "Hel"}]), Some("RECITATION")),
            StreamError::ContentFiltered,
            "Hel",
        ),
    ];
    for (body, expected, text) in cases {
        let server = MockServer::start().await;
        server.push(MockResponse::sse(body.clone()));
        let (message, error) = run_to_end(&gemini(&server), &hi(), &options()).await;
        assert_eq!(error.as_ref(), Some(&expected), "{body}");
        assert_eq!(message.text(), text, "{body}");
    }
}

#[tokio::test]
async fn a_recorded_404_surfaces_its_status_and_message() {
    let (message, error) =
        replayed("error_envelope__nonexistent_model_streaming_error_preserves_status_and_body")
            .await;
    let Some(StreamError::Http {
        status,
        message: said,
        ..
    }) = error
    else {
        panic!("expected an HTTP error: {error:?}");
    };
    assert_eq!(status, 404);
    assert!(
        said.starts_with("models/gemini-nonexistent-rig-test is not found"),
        "{said}"
    );
    assert_eq!(message.stop_reason, StopReason::Error);
}
