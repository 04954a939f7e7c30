//! Request options on the wire of each dialect — `tool_choice`, thinking levels and
//! budgets, provider-specific extra keys — and the shape of a tool-call turn sent
//! back to OpenAI-compatible servers, asserted on the requests a loopback server got.

#![allow(clippy::unwrap_used)]

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_ai::{
    ApiKey, AssistantContent, AssistantMessage, Context, Message, Model, StreamOptions,
    ThinkingBudgets, ThinkingLevel, Tool, ToolCall, ToolChoice, ToolResultMessage,
};
use tiller_test_support::{MockResponse, MockServer, sse};

fn add_tool() -> Tool {
    Tool::new(
        "add",
        "Adds two numbers",
        json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}),
    )
}

/// The body of the one request `stream` sends for `context` with `choice`.
async fn sent_body(
    model: fn(String) -> Model,
    context: &Context,
    choice: Option<ToolChoice>,
) -> Value {
    let options = StreamOptions {
        tool_choice: choice,
        ..StreamOptions::default()
    };
    sent_body_with(model, context, options).await
}

/// The body of the one request `stream` sends for `context` with `options`.
async fn sent_body_with(
    model: impl FnOnce(String) -> Model,
    context: &Context,
    options: StreamOptions,
) -> Value {
    let server = MockServer::start().await;
    let model = model(server.base_url());
    server.push(MockResponse::sse(if model.provider == "anthropic" {
        sse::anthropic_text(&["ok"])
    } else {
        sse::openai_text(&["ok"])
    }));
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        ..options
    };
    tiller_ai::stream(&model, context, &options).result().await;
    server.requests().remove(0).body
}

fn openai(base_url: String) -> Model {
    Model::openai_compatible(base_url, "gpt-test").with_provider("openai")
}

fn anthropic(base_url: String) -> Model {
    Model::anthropic_compatible(base_url, "claude-test").with_provider("anthropic")
}

#[tokio::test]
async fn each_choice_maps_to_each_dialect() {
    let context = Context::new()
        .with_message(Message::user("What is 2 plus 3?"))
        .with_tool(add_tool());
    let cases = [
        (None, Value::Null, Value::Null),
        (
            Some(ToolChoice::Auto),
            json!("auto"),
            json!({"type": "auto"}),
        ),
        (
            Some(ToolChoice::None),
            json!("none"),
            json!({"type": "none"}),
        ),
        (
            Some(ToolChoice::Required),
            json!("required"),
            json!({"type": "any"}),
        ),
        (
            Some(ToolChoice::Tool("add".into())),
            json!({"type": "function", "function": {"name": "add"}}),
            json!({"type": "tool", "name": "add"}),
        ),
    ];
    for (choice, openai_wire, anthropic_wire) in cases {
        let sent = sent_body(openai, &context, choice.clone()).await;
        assert_eq!(sent["tool_choice"], openai_wire, "openai, {choice:?}");
        let sent = sent_body(anthropic, &context, choice.clone()).await;
        assert_eq!(sent["tool_choice"], anthropic_wire, "anthropic, {choice:?}");
    }
}

#[tokio::test]
async fn no_choice_is_sent_without_tools() {
    let context = Context::new().with_message(Message::user("Hello"));
    for model in [openai, anthropic] {
        let sent = sent_body(model, &context, Some(ToolChoice::Required)).await;
        assert_eq!(sent.get("tool_choice"), None, "{sent}");
        assert_eq!(sent.get("tools"), None, "{sent}");
    }
}

/// llama-cpp-python's server answers HTTP 500 to a tool result unless the assistant
/// turn that called the tool says `content: ""`; OpenAI accepts it too.
#[tokio::test]
async fn a_turn_of_tool_calls_alone_says_empty_content() {
    let call = ToolCall {
        id: "call_1".into(),
        name: "add".into(),
        arguments: json!({"a": 2, "b": 3}),
        arguments_error: None,
        signature: None,
    };
    let mut assistant = AssistantMessage::empty(&openai(String::new()));
    assistant.content = vec![AssistantContent::ToolCall(Box::new(call.clone()))];
    let context = Context::new()
        .with_message(Message::user("What is 2 plus 3?"))
        .with_message(assistant)
        .with_message(ToolResultMessage::text(&call, "5", false))
        .with_tool(add_tool());
    let sent = sent_body(openai, &context, Some(ToolChoice::None)).await;
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "user", "content": "What is 2 plus 3?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        ])
    );
    assert_eq!(sent["tool_choice"], json!("none"));
}

/// Anthropic's structured output: the schema as a tool whose call is forced (`any`
/// beside other tools), and that call decoded as the answer's text.
#[tokio::test]
async fn anthropic_structured_output_is_a_forced_tool_read_back_as_text() {
    let schema =
        json!({"type": "object", "properties": {"sum": {"type": "number"}}, "required": ["sum"]});
    let server = MockServer::start().await;
    let model = anthropic(server.base_url());
    server.push(MockResponse::sse(sse::anthropic_tool_call(
        "toolu_1",
        "answer",
        &json!({"sum": 5}),
    )));
    let context = Context::new()
        .with_message(Message::user("What is 2 plus 3?"))
        .with_tool(add_tool());
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        output_schema: Some(tiller_ai::OutputSchema::new("answer", schema.clone())),
        ..StreamOptions::default()
    };
    let message = tiller_ai::stream(&model, &context, &options).result().await;
    let body = server.requests().remove(0).body;
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["add", "answer"]);
    assert_eq!(body["tools"][1]["input_schema"], schema);
    assert_eq!(body["tool_choice"], json!({"type": "any"}));
    assert_eq!(
        (
            message.text(),
            message.tool_calls().count(),
            message.stop_reason
        ),
        (r#"{"sum":5}"#.to_owned(), 0, tiller_ai::StopReason::Stop)
    );
}

/// A thinking level reaches OpenAI as `reasoning_effort` and Anthropic as
/// `thinking.budget_tokens` (the level's budget, the answer's room added to
/// `max_tokens`, no temperature); a model that does not reason gets neither.
#[tokio::test]
async fn a_thinking_level_and_its_budget_reach_the_wire() {
    let context = Context::new().with_message(Message::user("Think about it."));
    let thinking = |level: ThinkingLevel| StreamOptions {
        thinking: level,
        temperature: Some(0.5),
        max_tokens: Some(2_000),
        thinking_budgets: ThinkingBudgets {
            low: 3_000,
            ..ThinkingBudgets::default()
        },
        ..StreamOptions::default()
    };
    let reasoning_openai = |url| openai(url).with_reasoning(true);
    let reasoning_anthropic = |url| anthropic(url).with_reasoning(true).with_max_tokens(64_000);
    for (level, effort) in [
        (ThinkingLevel::Minimal, json!("minimal")),
        (ThinkingLevel::Low, json!("low")),
        (ThinkingLevel::Medium, json!("medium")),
        (ThinkingLevel::High, json!("high")),
        (ThinkingLevel::Xhigh, json!("high")),
        (ThinkingLevel::Off, Value::Null),
    ] {
        let sent = sent_body_with(reasoning_openai, &context, thinking(level)).await;
        assert_eq!(sent["reasoning_effort"], effort, "{level:?}");
    }
    let sent = sent_body_with(openai, &context, thinking(ThinkingLevel::High)).await;
    assert_eq!(sent.get("reasoning_effort"), None);

    let sent = sent_body_with(reasoning_anthropic, &context, thinking(ThinkingLevel::Low)).await;
    assert_eq!(
        (
            &sent["thinking"],
            &sent["max_tokens"],
            sent.get("temperature")
        ),
        (
            &json!({"type": "enabled", "budget_tokens": 3_000}),
            &json!(5_000),
            None
        )
    );
    let sent = sent_body_with(reasoning_anthropic, &context, thinking(ThinkingLevel::High)).await;
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": ThinkingBudgets::default().high})
    );
    let sent = sent_body_with(reasoning_anthropic, &context, thinking(ThinkingLevel::Off)).await;
    assert_eq!(
        (
            sent.get("thinking"),
            &sent["max_tokens"],
            &sent["temperature"]
        ),
        (None, &json!(2_000), &json!(0.5))
    );
    let sent = sent_body_with(anthropic, &context, thinking(ThinkingLevel::High)).await;
    assert_eq!(sent.get("thinking"), None);
}

/// Extra body keys go to the top level of each dialect's body as they are,
/// and never replace a key the request sets itself (its model, its stream, a
/// temperature it sets): an inline `model` cannot send the call elsewhere.
#[tokio::test]
async fn extra_body_keys_pass_through_to_the_request() {
    let context = Context::new().with_message(Message::user("Hi"));
    let extra = json!({"top_k": 40, "temperature": 0.9, "model": "gpt-stolen", "stream": false, "chat_template_kwargs": {"enable_thinking": false}});
    let options = || StreamOptions {
        temperature: Some(0.5),
        extra_body: extra.as_object().unwrap().clone(),
        ..StreamOptions::default()
    };
    for model in [openai as fn(String) -> Model, anthropic] {
        let sent = sent_body_with(model, &context, options()).await;
        assert_eq!(
            (
                &sent["top_k"],
                &sent["temperature"],
                &sent["chat_template_kwargs"]
            ),
            (&json!(40), &json!(0.5), &json!({"enable_thinking": false}))
        );
        assert_eq!(sent["stream"], json!(true));
        assert_ne!(sent["model"], json!("gpt-stolen"));
    }
    // A key the request leaves out is the caller's to add.
    let unset = StreamOptions {
        temperature: None,
        ..options()
    };
    let sent = sent_body_with(openai, &context, unset).await;
    assert_eq!(sent["temperature"], json!(0.9));
    let plain = sent_body_with(openai, &context, StreamOptions::default()).await;
    assert_eq!(plain.get("top_k"), None);
}
