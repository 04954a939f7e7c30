//! Hostile and broken servers: every fault ends the stream with a typed error that
//! names the limit, keeps what arrived, and never panics or grows without bound.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{anthropic, bedrock, gemini, openai, options, responses, run_to_end};
use pretty_assertions::assert_eq;
use tiller_ai::{
    AssistantMessage, Context, Limit, Message, Model, StopReason, StreamError, StreamLimits,
    StreamOptions,
};
use tiller_test_support::{MockResponse, MockServer, closed_port_url, hostile, sse};

/// Streams a greeting to the end: the final message and the terminal error, if any.
async fn run(model: &Model, options: &StreamOptions) -> (AssistantMessage, Option<StreamError>) {
    run_to_end(
        model,
        &Context::new().with_message(Message::user("Hi")),
        options,
    )
    .await
}

#[tokio::test]
async fn a_block_index_of_two_to_the_forty_is_past_the_block_limit() {
    let server = MockServer::start().await;
    server.push(hostile::anthropic_huge_index());
    let (message, error) = run(&anthropic(&server), &options()).await;
    assert_eq!(
        error,
        Some(StreamError::LimitExceeded {
            limit: Limit::ContentBlocks,
            max: 1024
        })
    );
    assert_eq!(message.text(), "Hi");
    assert_eq!(
        message.error_message.as_deref(),
        Some("the response went past a limit: more than 1024 content blocks in one response")
    );
}

#[tokio::test(start_paused = true)]
async fn absurd_retry_waits_are_too_long_not_a_panic() {
    for response in [
        hostile::retry_after("1e20"),
        hostile::retry_after_ms("1e300"),
    ] {
        let server = MockServer::start().await;
        server.push(response);
        let (message, error) = run(&openai(&server), &options()).await;
        assert_eq!(
            error,
            Some(StreamError::RetryAfterTooLong {
                provider: "openai".into(),
                status: 429,
                retry_after_ms: u64::MAX,
                max_retry_after_ms: 60_000,
                body: "slow down".into(),
            })
        );
        assert_eq!(
            message.error_message.as_deref(),
            Some(
                "HTTP 429 from openai: the server asked to retry after longer than can be represented, more than the 60s the retry policy allows"
            )
        );
        assert_eq!(message.stop_reason, StopReason::Error);
        assert_eq!(server.requests().len(), 1);
    }
}

#[tokio::test]
async fn timeouts_too_long_to_represent_mean_never() {
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::openai_text(&["Hel", "lo"])));
    let options = StreamOptions {
        idle_timeout: Some(Duration::MAX),
        response_deadline: Some(Duration::MAX),
        ..options()
    };
    let (message, error) = run(&openai(&server), &options).await;
    assert_eq!(error, None);
    assert_eq!(message.text(), "Hello");
}

#[tokio::test(start_paused = true)]
async fn keep_alive_comments_do_not_keep_a_stalled_stream_alive() {
    let server = MockServer::start().await;
    server.push(hostile::keep_alive_forever(Duration::from_secs(1)));
    let options = StreamOptions {
        idle_timeout: Some(Duration::from_secs(5)),
        ..options()
    };
    let (message, error) = run(&openai(&server), &options).await;
    assert_eq!(
        error,
        Some(StreamError::Stalled {
            idle_timeout_ms: 5000
        })
    );
    assert_eq!(message.text(), "Hel");

    // The other dialects' streams stall the same way after their first text.
    for (model, response) in endless_dialects(&server, Duration::ZERO)
        .into_iter()
        .skip(1)
    {
        server.push(response.stall_after_first());
        let (message, error) = run(&model, &options).await;
        assert_eq!(
            error,
            Some(StreamError::Stalled {
                idle_timeout_ms: 5000
            }),
            "{}",
            model.api
        );
        assert_eq!(message.text(), "Hel", "{}", model.api);
    }
}

/// The dialects whose endless streams the limits are held to: a model of each on
/// `server`, and its stream of `Hel`, `lo `, `lo `, … one every `every`.
fn endless_dialects(
    server: &MockServer,
    every: Duration,
) -> [(Model, tiller_test_support::MockResponse); 4] {
    [
        (openai(server), hostile::endless_text(every)),
        (gemini(server), hostile::gemini_endless_text(every)),
        (responses(server), hostile::responses_endless_text(every)),
        (bedrock(server), hostile::bedrock_endless_text(every)),
    ]
}

#[tokio::test(start_paused = true)]
async fn a_response_that_never_ends_meets_its_deadline() {
    let options = StreamOptions {
        idle_timeout: Some(Duration::from_secs(5)),
        response_deadline: Some(Duration::from_secs(2)),
        ..options()
    };
    let server = MockServer::start().await;
    for (model, response) in endless_dialects(&server, Duration::from_millis(100)) {
        server.push(response);
        let (message, error) = run(&model, &options).await;
        assert_eq!(
            error,
            Some(StreamError::DeadlineExceeded { deadline_ms: 2000 }),
            "{}",
            model.api
        );
        assert!(
            message.text().starts_with("Hello lo lo "),
            "{}: {}",
            model.api,
            message.text()
        );
    }
}

#[tokio::test]
async fn an_endless_body_stops_at_the_body_limit() {
    let options = StreamOptions {
        limits: StreamLimits {
            max_body_bytes: 256 * 1024,
            ..StreamLimits::default()
        },
        ..options()
    };
    let server = MockServer::start().await;
    for (model, response) in endless_dialects(&server, Duration::ZERO) {
        server.push(response);
        let (message, error) = run(&model, &options).await;
        assert_eq!(
            error,
            Some(StreamError::LimitExceeded {
                limit: Limit::BodyBytes,
                max: 256 * 1024
            }),
            "{}",
            model.api
        );
        assert!(message.text().starts_with("Hello lo "), "{}", model.api);
    }
}

#[tokio::test]
async fn an_endless_line_or_event_stops_at_the_event_limit() {
    for response in [hostile::endless_line(), hostile::endless_event()] {
        let server = MockServer::start().await;
        server.push(response);
        let options = StreamOptions {
            limits: StreamLimits {
                max_event_bytes: 1024 * 1024,
                ..StreamLimits::default()
            },
            ..options()
        };
        let (_, error) = run(&openai(&server), &options).await;
        assert_eq!(
            error,
            Some(StreamError::LimitExceeded {
                limit: Limit::EventBytes,
                max: 1024 * 1024
            })
        );
    }
}

#[tokio::test]
async fn thousands_of_tool_calls_stop_at_the_block_limit() {
    let server = MockServer::start().await;
    for (model, response) in [
        (openai(&server), hostile::many_tool_calls(5000)),
        (gemini(&server), hostile::gemini_many_tool_calls(5000)),
        (responses(&server), hostile::responses_many_tool_calls(5000)),
        (bedrock(&server), hostile::bedrock_many_tool_calls(5000)),
    ] {
        server.push(response);
        let (message, error) = run(&model, &options()).await;
        assert_eq!(
            error,
            Some(StreamError::LimitExceeded {
                limit: Limit::ContentBlocks,
                max: 1024
            }),
            "{}",
            model.api
        );
        assert_eq!(message.tool_calls().count(), 1024, "{}", model.api);
    }
}

#[tokio::test(start_paused = true)]
async fn errors_never_show_a_urls_user_info_or_query() {
    let url = closed_port_url().replace("http://", "http://user:sk-secret@");
    let model = Model::openai_compatible(format!("{url}?key=sk-secret"), "m");
    let (message, error) = run(&model, &options()).await;
    let Some(StreamError::Connection { url: shown, .. }) = error else {
        panic!("{error:?}");
    };
    assert!(
        !shown.contains("sk-secret") && !shown.contains('?'),
        "{shown}"
    );
    assert!(!message.error_message.unwrap().contains("sk-secret"));
}
