//! The faults real providers throw, injected by a loopback server: every one ends
//! the stream with a typed error event that keeps what arrived, retries happen only
//! before the first byte, and aborts end the stream at once.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{anthropic, openai, options};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::{
    ApiKey, AssistantEvent, AssistantMessage, Context, Message, Model, RetryPolicy, StopReason,
    StreamError, StreamOptions,
};
use tiller_test_support::{MockResponse, MockServer, closed_port_url, sse};

fn context() -> Context {
    Context::new().with_message(Message::user("Say hello"))
}

/// Streams to the end; returns the events and the terminal error, if any.
async fn run(model: &Model, options: &StreamOptions) -> (Vec<AssistantEvent>, Option<StreamError>) {
    let events: Vec<_> = tiller_ai::stream(model, &context(), options)
        .collect()
        .await;
    let error = match events.last() {
        Some(AssistantEvent::Error { error, .. }) => Some(error.clone()),
        _ => None,
    };
    (events, error)
}

fn last_message(events: &[AssistantEvent]) -> &AssistantMessage {
    match events.last().unwrap() {
        AssistantEvent::Done { message, .. } | AssistantEvent::Error { message, .. } => message,
        other => panic!("not terminal: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_the_wait_the_server_asks_for() {
    let server = MockServer::start().await;
    server.push(MockResponse::status(429, "slow down").header("retry-after", "2"));
    server.push(MockResponse::sse(sse::openai_text(&["Hel", "lo"])));
    let options = StreamOptions {
        retry: RetryPolicy {
            initial_backoff: Duration::from_secs(20),
            ..RetryPolicy::default()
        },
        ..options()
    };
    let started = tokio::time::Instant::now();
    let (events, error) = run(&openai(&server), &options).await;
    let waited = started.elapsed();
    assert_eq!(error, None);
    assert_eq!(last_message(&events).text(), "Hello");
    assert_eq!(server.requests().len(), 2);
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(10),
        "waited {waited:?} (virtual time) instead of the 2 s asked for"
    );
}

#[tokio::test(start_paused = true)]
async fn a_5xx_and_an_overloaded_529_are_retried_with_backoff() {
    let server = MockServer::start().await;
    server.push(MockResponse::status(500, "boom"));
    server.push(MockResponse::status(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ));
    server.push(MockResponse::sse(sse::anthropic_text(&["fine ", "now"])));
    let (events, error) = run(&anthropic(&server), &options()).await;
    assert_eq!(error, None);
    assert_eq!(last_message(&events).text(), "fine now");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_after_the_policy_allows() {
    let server = MockServer::start().await;
    server.always(MockResponse::status(503, "unavailable"));
    let (events, error) = run(&openai(&server), &options()).await;
    assert_eq!(server.requests().len(), 4, "one attempt and three retries");
    let Some(StreamError::Http {
        status: 503,
        message,
        ..
    }) = error
    else {
        panic!("expected HTTP 503: {error:?}");
    };
    assert_eq!(message, "unavailable");
    assert_eq!(last_message(&events).stop_reason, StopReason::Error);
}

#[tokio::test]
async fn a_wait_longer_than_the_cap_fails_at_once() {
    let server = MockServer::start().await;
    server.push(MockResponse::status(429, "come back later").header("retry-after", "120"));
    let (events, error) = run(&openai(&server), &options()).await;
    assert_eq!(server.requests().len(), 1);
    assert_eq!(
        error,
        Some(StreamError::RetryAfterTooLong {
            provider: "openai".into(),
            status: 429,
            retry_after_ms: 120_000,
            max_retry_after_ms: 60_000,
            body: "come back later".into(),
        })
    );
    assert_eq!(
        last_message(&events).error_message.as_deref(),
        Some(
            "HTTP 429 from openai: the server asked to retry after 120s, more than the 60s the retry policy allows"
        )
    );
}

#[tokio::test]
async fn client_errors_surface_the_providers_message_and_are_not_retried() {
    let server = MockServer::start().await;
    let body = json!({"error": {"message": "Incorrect API key provided: sk-wr***ng", "type": "invalid_request_error", "code": "invalid_api_key"}});
    server.push(MockResponse::json(401, &body));
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("sk-secret-never-shown")),
        ..options()
    };
    let (events, error) = run(&openai(&server), &options).await;
    assert_eq!(server.requests().len(), 1);
    assert_eq!(
        last_message(&events).error_message.as_deref(),
        Some(
            "HTTP 401 from openai: Incorrect API key provided: sk-wr***ng (invalid_request_error)"
        )
    );
    assert!(matches!(error, Some(StreamError::Http { status: 401, .. })));
    let everything = format!(
        "{events:?} {options:?} {}",
        serde_json::to_string(&events).unwrap()
    );
    assert!(
        !everything.contains("sk-secret-never-shown"),
        "the key leaked"
    );
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some("Bearer sk-secret-never-shown")
    );
}

#[tokio::test]
async fn a_connection_cut_mid_stream_keeps_what_arrived_and_is_not_retried() {
    let server = MockServer::start().await;
    let events = sse::openai_text_events(&["Hello", " wor", "ld"]);
    server.push(MockResponse::sse("").chunks(events[..3].to_vec()).cut());
    server.push(MockResponse::sse(sse::openai_text(&["a retry"])));
    let (events, error) = run(&openai(&server), &options()).await;
    assert_eq!(
        server.requests().len(),
        1,
        "never retried after content streamed"
    );
    assert!(
        matches!(error, Some(StreamError::Incomplete { .. })),
        "{error:?}"
    );
    let message = last_message(&events);
    assert_eq!(
        (message.text().as_str(), message.stop_reason),
        ("Hello wor", StopReason::Error)
    );
}

#[tokio::test]
async fn a_malformed_data_line_is_an_error_not_skipped() {
    let server = MockServer::start().await;
    let mut events = sse::openai_text_events(&["Hi"]);
    events.insert(2, "data: {\"choices\": [{\"delta\": \n\n".to_owned());
    server.push(MockResponse::sse(events.concat()));
    let (events, error) = run(&openai(&server), &options()).await;
    let Some(StreamError::Malformed { message }) = error else {
        panic!("expected malformed: {error:?}");
    };
    assert!(message.contains("{\"choices\": [{\"delta\":"), "{message}");
    assert_eq!(last_message(&events).text(), "Hi");
}

#[tokio::test]
async fn an_error_event_inside_the_stream_ends_it() {
    let server = MockServer::start().await;
    let mut openai_events = sse::openai_text_events(&["partial"]);
    openai_events.truncate(2);
    openai_events.push(sse::data(
        &json!({"error": {"message": "The server had an error", "type": "server_error"}}),
    ));
    server.push(MockResponse::sse(openai_events.concat()));
    let (events, error) = run(&openai(&server), &options()).await;
    assert_eq!(
        error,
        Some(StreamError::Provider {
            provider: "openai".into(),
            code: Some("server_error".into()),
            message: "The server had an error".into(),
        })
    );
    assert_eq!(last_message(&events).text(), "partial");

    let mut anthropic_events = sse::anthropic_text_events(&["half"]);
    anthropic_events.truncate(3);
    anthropic_events.push(sse::named(
        "error",
        &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    server.push(MockResponse::sse(anthropic_events.concat()));
    let (events, error) = run(&anthropic(&server), &options()).await;
    assert_eq!(
        last_message(&events).error_message.as_deref(),
        Some("anthropic reported an error: Overloaded")
    );
    assert!(
        matches!(error, Some(StreamError::Provider { code: Some(code), .. }) if code == "overloaded_error")
    );
    assert_eq!(last_message(&events).text(), "half");
}

#[tokio::test]
async fn a_stalled_stream_ends_with_a_stalled_error() {
    let server = MockServer::start().await;
    let events = sse::openai_text_events(&["Hello", " there"]);
    server.push(MockResponse::sse("").chunks(events[..2].to_vec()).stall());
    let options = StreamOptions {
        idle_timeout: Some(Duration::from_millis(500)),
        ..options()
    };
    let (events, error) = run(&openai(&server), &options).await;
    assert_eq!(
        error,
        Some(StreamError::Stalled {
            idle_timeout_ms: 500
        })
    );
    assert_eq!(last_message(&events).text(), "Hello");
    assert_eq!(
        last_message(&events).error_message.as_deref(),
        Some("the stream stalled: nothing arrived for 0.5s")
    );
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_stall_too() {
    let server = MockServer::start().await;
    server.push(
        MockResponse::sse(sse::openai_text(&["late"])).header_delay(Duration::from_secs(3600)),
    );
    let options = StreamOptions {
        idle_timeout: Some(Duration::from_millis(300)),
        ..options()
    };
    let (_, error) = run(&openai(&server), &options).await;
    assert_eq!(
        error,
        Some(StreamError::Stalled {
            idle_timeout_ms: 300
        })
    );
}

#[tokio::test]
async fn abort_mid_stream_keeps_the_partial_message() {
    let server = MockServer::start().await;
    let events = sse::openai_text_events(&["Once upon", " a time"]);
    server.push(MockResponse::sse("").chunks(events[..2].to_vec()).stall());
    let options = options();
    let mut stream = tiller_ai::stream(&openai(&server), &context(), &options);
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        if matches!(event, AssistantEvent::TextDelta { .. }) {
            options.transport.cancel.cancel();
        }
        seen.push(event);
    }
    let AssistantEvent::Error {
        reason,
        error,
        message,
    } = seen.last().unwrap()
    else {
        panic!("expected an abort: {seen:?}");
    };
    assert_eq!(
        (*reason, error),
        (StopReason::Aborted, &StreamError::Aborted)
    );
    assert_eq!(message.stop_reason, StopReason::Aborted);
    assert_eq!(message.text(), "Once upon");
    assert_eq!(
        message.error_message.as_deref(),
        Some("the request was aborted")
    );
    assert_eq!(stream.partial(), &**message);
}

#[tokio::test(start_paused = true)]
async fn abort_during_a_backoff_wait_ends_at_once() {
    let server = MockServer::start().await;
    server.push(MockResponse::status(429, "wait").header("retry-after", "30"));
    server.push(MockResponse::sse(sse::openai_text(&["too late"])));
    let options = options();
    let stream = tiller_ai::stream(&openai(&server), &context(), &options);
    let started = tokio::time::Instant::now();
    let consumer = tokio::spawn(stream.collect::<Vec<_>>());
    server.wait_for_requests(1).await;
    options.transport.cancel.cancel();
    let events = consumer.await.unwrap();
    assert!(
        matches!(
            events.last(),
            Some(AssistantEvent::Error {
                error: StreamError::Aborted,
                ..
            })
        ),
        "{events:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the backoff wait was not interrupted"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn an_already_cancelled_token_aborts_before_any_request() {
    let server = MockServer::start().await;
    let options = options();
    options.transport.cancel.cancel();
    let (events, error) = run(&openai(&server), &options).await;
    assert_eq!(error, Some(StreamError::Aborted));
    assert_eq!(events.len(), 2, "start and the abort: {events:?}");
    assert_eq!(server.requests().len(), 0);
}

#[tokio::test]
async fn a_missing_api_key_is_an_error_event_and_no_request() {
    assert!(
        std::env::var("MISTRAL_API_KEY").is_err(),
        "this test needs MISTRAL_API_KEY unset"
    );
    let model = tiller_ai::catalog::provider("mistral")
        .unwrap()
        .model("mistral-small-latest");
    let (events, error) = run(&model, &StreamOptions::default()).await;
    assert_eq!(
        error,
        Some(StreamError::MissingApiKey {
            provider: "mistral".into(),
            env_var: "MISTRAL_API_KEY".into()
        })
    );
    assert_eq!(
        last_message(&events).error_message.as_deref(),
        Some(
            "no API key for provider `mistral`: set MISTRAL_API_KEY or pass an API key in the stream options"
        )
    );
}

/// A model of a provider at another address than the provider's own gets no key
/// from the environment. With the variable unset there is none to withhold, so the
/// request goes out without one (with it set, the stream ends with
/// `StreamError::KeyWithheld`: the `tiller` command's tests set it in a child's
/// environment, `crates/tiller-cli/tests/run.rs`).
#[tokio::test]
async fn a_provider_at_another_address_is_sent_no_key_from_the_environment() {
    assert!(
        std::env::var("MISTRAL_API_KEY").is_err(),
        "this test needs MISTRAL_API_KEY unset"
    );
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::openai_text(&["ok"])));
    let model =
        Model::openai_compatible(server.base_url(), "mistral-small").with_provider("mistral");
    let (events, error) = run(&model, &StreamOptions::default()).await;
    assert_eq!(error, None);
    assert_eq!(last_message(&events).text(), "ok");
    assert_eq!(server.requests()[0].header("authorization"), None);
}

#[tokio::test]
async fn a_local_server_needs_no_key() {
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::openai_text(&["ok"])));
    let model = Model::openai_compatible(server.base_url(), "smollm2").with_provider("llamacpp");
    let (events, error) = run(&model, &StreamOptions::default()).await;
    assert_eq!(error, None);
    assert_eq!(last_message(&events).text(), "ok");
    assert_eq!(server.requests()[0].header("authorization"), None);
}

#[tokio::test]
async fn connection_refused_is_retried_then_reported() {
    let model = Model::openai_compatible(closed_port_url(), "m");
    let options = StreamOptions {
        retry: RetryPolicy {
            max_retries: 2,
            initial_backoff: Duration::from_millis(1),
            ..RetryPolicy::default()
        },
        ..options()
    };
    let (events, error) = run(&model, &options).await;
    let Some(StreamError::Connection {
        url,
        attempts,
        message,
    }) = error
    else {
        panic!("expected a connection error: {error:?}");
    };
    assert!(url.ends_with("/v1/chat/completions"), "{url}");
    assert_eq!(attempts, 3);
    assert!(
        !message.contains(&url),
        "the address is said once: {message}"
    );
    assert!(message.contains("Connection refused"), "{message}");
    assert_eq!(last_message(&events).stop_reason, StopReason::Error);
}

#[tokio::test]
async fn an_empty_200_body_is_a_clear_error() {
    let server = MockServer::start().await;
    // Ended cleanly, or cut before the first chunk (llama-cpp-python does both).
    let empty_bodies = [MockResponse::sse(""), MockResponse::sse("").cut()];
    for (model, body) in [openai(&server), anthropic(&server)]
        .into_iter()
        .flat_map(|model| empty_bodies.clone().map(|body| (model.clone(), body)))
    {
        server.push(body);
        let (events, error) = run(&model, &options()).await;
        assert_eq!(
            error,
            Some(StreamError::EmptyBody {
                provider: model.provider.clone(),
                status: 200,
            })
        );
        assert_eq!(
            last_message(&events).error_message.as_deref(),
            Some(
                format!(
                    "HTTP 200 from {} with an empty body: the server streamed nothing",
                    model.provider
                )
                .as_str()
            )
        );
    }
}

/// llama-cpp-python's server answers some requests with HTTP 500 and an error whose
/// message is empty (recorded from its server); the body is then the message.
#[tokio::test]
async fn a_500_with_an_empty_error_message_shows_its_body() {
    let server = MockServer::start().await;
    let body =
        r#"{"error":{"message":"","type":"internal_server_error","param":null,"code":null}}"#;
    server.push(MockResponse::status(500, body).header("content-type", "application/json"));
    let options = StreamOptions {
        retry: RetryPolicy::never(),
        ..options()
    };
    let (events, error) = run(&openai(&server), &options).await;
    assert_eq!(
        last_message(&events).error_message.as_deref(),
        Some(format!("HTTP 500 from openai: {body}").as_str())
    );
    assert!(
        matches!(error, Some(StreamError::Http { status: 500, body: sent, .. }) if sent == body)
    );
}

#[tokio::test]
async fn a_json_answer_to_a_stream_request_is_named() {
    let server = MockServer::start().await;
    server.push(MockResponse::json(
        200,
        &json!({"choices": [{"message": {"content": "not streamed"}}]}),
    ));
    let (_, error) = run(&openai(&server), &options()).await;
    let Some(StreamError::Malformed { message }) = error else {
        panic!("expected malformed: {error:?}");
    };
    assert!(
        message.starts_with(
            "expected an event stream, but the server answered with JSON: {\"choices\""
        ),
        "{message}"
    );
}

#[tokio::test]
async fn a_stream_without_its_end_is_incomplete() {
    let server = MockServer::start().await;
    let mut events = sse::anthropic_text_events(&["cut"]);
    events.truncate(4);
    server.push(MockResponse::sse(events.concat()));
    let (events, error) = run(&anthropic(&server), &options()).await;
    assert_eq!(
        error,
        Some(StreamError::Incomplete {
            message: "the stream ended before `message_stop`".into()
        })
    );
    assert_eq!(last_message(&events).text(), "cut");
}
