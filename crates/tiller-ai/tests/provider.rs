//! Providers of the host's: a gateway in front of a built-in dialect (its own
//! transport and headers), and a provider reporting events of its own, with the
//! same limits, errors and event order as the built-ins.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::assert_well_formed;
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::{
    ApiKey, AssistantContent, AssistantEvent, AssistantStream, Context, ContextRef, Message, Model,
    OpenAiCompletions, Provider, ProviderEvent, StopReason, StreamError, StreamLimits,
    StreamOptions, ToolCall, Usage,
};
use tiller_test_support::{MockResponse, MockServer, sse};

/// Sends every request to another server, with a header of its own: a proxy or
/// gateway in front of the OpenAI dialect.
struct Gateway {
    base_url: String,
}

impl Provider for Gateway {
    fn stream(
        &self,
        model: &Model,
        context: ContextRef<'_>,
        options: &StreamOptions,
    ) -> AssistantStream {
        let mut routed = model.clone();
        routed.base_url = self.base_url.clone();
        let mut options = options.clone();
        options.transport.headers.insert("x-gateway-tenant", "acme");
        OpenAiCompletions.stream(&routed, context, &options)
    }
}

/// Reports the events it was made with.
struct Scripted(Vec<ProviderEvent>);

impl Provider for Scripted {
    fn stream(
        &self,
        model: &Model,
        _context: ContextRef<'_>,
        options: &StreamOptions,
    ) -> AssistantStream {
        AssistantStream::from_events(model, options, futures::stream::iter(self.0.clone()))
    }
}

fn ask() -> Context {
    Context::new().with_message(Message::user("Hello?"))
}

async fn events(model: &Model, options: &StreamOptions) -> Vec<AssistantEvent> {
    let events: Vec<_> = tiller_ai::stream(model, &ask(), options).collect().await;
    assert_well_formed(&events);
    events
}

fn last_message(events: &[AssistantEvent]) -> &tiller_ai::AssistantMessage {
    match events.last().unwrap() {
        AssistantEvent::Done { message, .. } | AssistantEvent::Error { message, .. } => message,
        other => panic!("not a terminal event: {other:?}"),
    }
}

#[tokio::test]
async fn a_gateway_routes_a_built_in_dialect_through_its_own_transport() {
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::openai_text(&["Hi ", "there."])));
    let model = Model::openai_compatible("http://unused.invalid/v1", "gpt-test")
        .with_custom_provider(Arc::new(Gateway {
            base_url: server.base_url(),
        }));
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        ..StreamOptions::default()
    };
    let events = events(&model, &options).await;
    assert_eq!(last_message(&events).text(), "Hi there.");
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("x-gateway-tenant"), Some("acme"));
    assert_eq!(request.body["model"], "gpt-test");
}

#[tokio::test]
async fn reported_events_become_the_usual_stream() {
    let usage = Usage {
        input: 12,
        output: 7,
        ..Usage::default()
    };
    let model = Model::openai_compatible("stub://", "stub")
        .with_provider("stub")
        .with_custom_provider(Arc::new(Scripted(vec![
            ProviderEvent::Thinking("Let me see.".into()),
            ProviderEvent::Text("Calling ".into()),
            ProviderEvent::Text("add.".into()),
            ProviderEvent::ToolCall {
                id: "call_1".into(),
                name: "add".into(),
                arguments: r#"{"a": 2, "b": 3}"#.into(),
            },
            ProviderEvent::Usage(usage),
            ProviderEvent::Done(StopReason::ToolUse),
        ])));
    let events = events(&model, &StreamOptions::default()).await;
    let kinds: Vec<String> = events
        .iter()
        .map(|event| {
            serde_json::to_value(event).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "start",
            "thinking_start",
            "thinking_delta",
            "thinking_end",
            "text_start",
            "text_delta",
            "text_delta",
            "text_end",
            "tool_call_start",
            "tool_call_delta",
            "tool_call_end",
            "done"
        ]
    );
    let message = last_message(&events);
    assert_eq!(message.text(), "Calling add.");
    assert_eq!(
        message.tool_calls().cloned().collect::<Vec<_>>(),
        [ToolCall {
            id: "call_1".into(),
            name: "add".into(),
            arguments: json!({"a": 2, "b": 3}),
            arguments_error: None,
            signature: None,
        }]
    );
    assert_eq!(
        (
            message.stop_reason,
            message.usage.input,
            message.usage.output,
            message.provider.as_str()
        ),
        (StopReason::ToolUse, 12, 7, "stub")
    );
    assert!(matches!(message.content[0], AssistantContent::Thinking(_)));
}

#[tokio::test]
async fn failures_endings_and_limits_are_the_built_ins() {
    let stub = |events: Vec<ProviderEvent>| {
        Model::openai_compatible("stub://", "stub")
            .with_provider("stub")
            .with_custom_provider(Arc::new(Scripted(events)))
    };
    let error = |events: &[AssistantEvent]| match events.last().unwrap() {
        AssistantEvent::Error { error, .. } => error.clone(),
        other => panic!("expected an error, got {other:?}"),
    };

    let failed = events(
        &stub(vec![
            ProviderEvent::Text("partial".into()),
            ProviderEvent::Failed("the upstream closed".into()),
        ]),
        &StreamOptions::default(),
    )
    .await;
    assert_eq!(
        error(&failed),
        StreamError::Provider {
            provider: "stub".into(),
            code: None,
            message: "the upstream closed".into(),
        }
    );
    assert_eq!(last_message(&failed).text(), "partial");

    let unfinished = events(
        &stub(vec![ProviderEvent::Text("and then".into())]),
        &StreamOptions::default(),
    )
    .await;
    assert_eq!(
        error(&unfinished),
        StreamError::Incomplete {
            message: "the stub provider ended without a result".into()
        }
    );

    let limits = StreamLimits {
        max_content_blocks: 2,
        ..StreamLimits::default()
    };
    let options = StreamOptions {
        limits,
        ..StreamOptions::default()
    };
    let crowded = events(
        &stub(vec![
            ProviderEvent::Thinking("one".into()),
            ProviderEvent::Text("two".into()),
            ProviderEvent::Thinking("three".into()),
            ProviderEvent::Done(StopReason::Stop),
        ]),
        &options,
    )
    .await;
    assert_eq!(
        error(&crowded),
        StreamError::LimitExceeded {
            limit: tiller_ai::Limit::ContentBlocks,
            max: 2
        }
    );
}
