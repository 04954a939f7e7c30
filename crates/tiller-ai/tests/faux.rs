//! The scripted provider: exact events, delays, injected failures, recorded requests.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{assert_well_formed, comparable, final_message};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_ai::{
    ArgumentsError, AssistantContent, AssistantEvent, Context, Message, Model, StopReason,
    StreamError, StreamOptions, ThinkingLevel, ToolCall, Usage,
};

fn ask(text: &str) -> Context {
    Context::new()
        .with_system_prompt("Be brief.")
        .with_message(Message::user(text))
}

async fn collect_events(
    model: &Model,
    context: &Context,
    options: &StreamOptions,
) -> Vec<AssistantEvent> {
    let events: Vec<_> = tiller_ai::stream(model, context, options).collect().await;
    assert_well_formed(&events);
    events
}

#[tokio::test]
async fn a_text_turn_streams_in_chunks_with_exact_events() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello world").chunk_size(5));
    let events =
        comparable(collect_events(&faux.model(), &ask("hi"), &StreamOptions::default()).await);
    let mut done = final_message(&events).clone();
    assert_eq!(done.text(), "Hello world");
    assert_eq!(
        (done.usage.input, done.usage.output),
        (3, 3),
        "four characters a token"
    );
    let mut start = done.clone();
    start.content.clear();
    start.usage = Usage::default();
    let delta = |d: &str| AssistantEvent::TextDelta {
        content_index: 0,
        delta: d.into(),
    };
    done.stop_reason = StopReason::Stop;
    assert_eq!(
        events,
        vec![
            AssistantEvent::Start {
                message: Box::new(start)
            },
            AssistantEvent::TextStart { content_index: 0 },
            delta("Hello"),
            delta(" worl"),
            delta("d"),
            AssistantEvent::TextEnd {
                content_index: 0,
                signature: None
            },
            AssistantEvent::Done {
                reason: StopReason::Stop,
                message: Box::new(done)
            },
        ]
    );
}

#[tokio::test]
async fn thinking_and_tool_calls_get_ids_per_provider() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_thinking("The user wants two lookups.")
            .with_tool_call("lookup", json!({"q": "a"}))
            .with_tool_call("lookup", json!({"q": "b"})),
    );
    faux.push(FauxTurn::tool_call("lookup", json!({})));
    let model = faux.model();
    let first = tiller_ai::stream(&model, &ask("go"), &StreamOptions::default())
        .result()
        .await;
    let second = tiller_ai::stream(&model, &ask("again"), &StreamOptions::default())
        .result()
        .await;
    let ids: Vec<_> = first
        .tool_calls()
        .chain(second.tool_calls())
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(ids, ["faux_call_1", "faux_call_2", "faux_call_3"]);
    assert!(
        matches!(&first.content[0], AssistantContent::Thinking(t) if t.thinking == "The user wants two lookups.")
    );
    assert_eq!(first.stop_reason, StopReason::ToolUse);
    assert_eq!(faux.remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn chunk_delays_pace_the_stream() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::text("abcdef")
            .chunk_size(2)
            .delay(Duration::from_millis(100)),
    );
    let started = tokio::time::Instant::now();
    let message = tiller_ai::stream(&faux.model(), &ask("x"), &StreamOptions::default())
        .result()
        .await;
    assert_eq!(message.text(), "abcdef");
    assert_eq!(started.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn abort_ends_a_slow_scripted_stream() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::text("one two three four")
            .chunk_size(4)
            .delay(Duration::from_secs(1)),
    );
    let options = StreamOptions::default();
    let mut stream = tiller_ai::stream(&faux.model(), &ask("x"), &options);
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        if matches!(event, AssistantEvent::TextDelta { .. }) {
            options.transport.cancel.cancel();
        }
        seen.push(event);
    }
    let message = final_message(&seen);
    assert_eq!(
        (message.stop_reason, message.text().as_str()),
        (StopReason::Aborted, "one ")
    );
}

#[tokio::test]
async fn an_injected_failure_keeps_the_content() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("partial answer").fail("the model fell over"));
    let events = collect_events(&faux.model(), &ask("x"), &StreamOptions::default()).await;
    let AssistantEvent::Error {
        reason,
        error,
        message,
    } = events.last().unwrap()
    else {
        panic!()
    };
    assert_eq!(*reason, StopReason::Error);
    assert_eq!(
        error,
        &StreamError::Provider {
            provider: "faux".into(),
            code: None,
            message: "the model fell over".into()
        }
    );
    assert_eq!(message.text(), "partial answer");
    assert_eq!(
        message.error_message.as_deref(),
        Some("faux reported an error: the model fell over")
    );
}

#[tokio::test]
async fn a_scripted_length_stop_truncates_unfinished_arguments() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_raw_tool_call("write", "{\"path\": \"a.txt\", \"body\": \"Onc")
            .stop_reason(StopReason::Length),
    );
    let message = tiller_ai::stream(&faux.model(), &ask("x"), &StreamOptions::default())
        .result()
        .await;
    assert_eq!(message.stop_reason, StopReason::Length);
    assert_eq!(
        message.tool_calls().next().unwrap(),
        &ToolCall {
            id: "faux_call_1".into(),
            name: "write".into(),
            arguments: json!({}),
            arguments_error: Some(ArgumentsError::Truncated {
                received: "{\"path\": \"a.txt\", \"body\": \"Onc".into()
            }),
            signature: None,
        }
    );
}

#[tokio::test]
async fn requests_are_recorded_with_their_options() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("one")).push(FauxTurn::text("two"));
    let model = faux.model();
    let options = StreamOptions {
        session_id: Some("session-1".into()),
        thinking: ThinkingLevel::High,
        max_tokens: Some(100),
        ..StreamOptions::default()
    };
    let first = ask("first");
    tiller_ai::stream(&model, &first, &options).result().await;
    let options = StreamOptions {
        session_id: Some("session-2".into()),
        ..options
    };
    tiller_ai::stream(&model, &ask("second"), &options)
        .result()
        .await;
    let requests = faux.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].context, first);
    assert_eq!(requests[1].last_user_text().as_deref(), Some("second"));
    assert_eq!(
        requests
            .iter()
            .map(|r| r.session_id.as_deref())
            .collect::<Vec<_>>(),
        [Some("session-1"), Some("session-2")]
    );
    assert_eq!(
        (requests[0].thinking, requests[0].max_tokens),
        (ThinkingLevel::High, Some(100))
    );
}

#[tokio::test]
async fn a_responder_answers_when_the_script_is_empty() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("scripted"));
    faux.respond_with(|request| {
        FauxTurn::text(format!(
            "echo: {}",
            request.last_user_text().unwrap_or_default()
        ))
    });
    let model = faux.model();
    let first = tiller_ai::stream(&model, &ask("a"), &StreamOptions::default())
        .result()
        .await;
    let second = tiller_ai::stream(&model, &ask("b"), &StreamOptions::default())
        .result()
        .await;
    assert_eq!(
        (first.text().as_str(), second.text().as_str()),
        ("scripted", "echo: b")
    );
}

#[tokio::test]
async fn an_empty_script_and_a_detached_model_are_errors() {
    let faux = FauxProvider::new();
    let events = collect_events(&faux.model(), &ask("x"), &StreamOptions::default()).await;
    assert!(
        matches!(events.last(), Some(AssistantEvent::Error { error: StreamError::Provider { message, .. }, .. }) if message.starts_with("no scripted turn left"))
    );
    assert_eq!(
        faux.requests().len(),
        1,
        "the request is recorded all the same"
    );

    let detached: Model =
        serde_json::from_value(serde_json::to_value(faux.model()).unwrap()).unwrap();
    let events = collect_events(&detached, &ask("x"), &StreamOptions::default()).await;
    assert!(
        matches!(events.last(), Some(AssistantEvent::Error { error: StreamError::Provider { message, .. }, .. }) if message.contains("FauxProvider::model()"))
    );
}
