//! Hostile responses are handled in a small, fixed amount of memory, measured by a
//! counting allocator around the whole process (server included). One test in this
//! binary, so no other test's allocations are counted.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use tiller_ai::{
    ApiKey, AssistantEvent, Context, Message, Model, StreamError, StreamLimits, StreamOptions,
};
use tiller_test_support::{MockResponse, MockServer, heap, hostile};

#[global_allocator]
static ALLOCATOR: heap::Counting = heap::Counting;

/// The most any one hostile response may add to the heap at its peak.
const BOUND: usize = 8 * 1024 * 1024;

/// Streams `response` to its end; answers the terminal error and the heap's peak
/// growth over the live size at the start.
async fn peak_of(
    response: MockResponse,
    model: impl Fn(&MockServer) -> Model,
) -> (StreamError, usize) {
    let server = MockServer::start().await;
    server.push(response);
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("test-key")),
        idle_timeout: Some(Duration::from_secs(10)),
        limits: StreamLimits {
            max_event_bytes: 1024 * 1024,
            max_body_bytes: 2 * 1024 * 1024,
            ..StreamLimits::default()
        },
        ..StreamOptions::default()
    };
    let context = Context::new().with_message(Message::user("Hi"));
    let model = model(&server);
    let start = heap::live();
    heap::reset_peak();
    let last = tiller_ai::stream(&model, &context, &options)
        .fold(None, |_, event| async move { Some(event) })
        .await;
    let peak = heap::peak() - start;
    match last {
        Some(AssistantEvent::Error { error, .. }) => (error, peak),
        other => panic!("not an error: {other:?}"),
    }
}

#[tokio::test]
async fn every_hostile_response_fails_in_bounded_memory() {
    let openai = |server: &MockServer| Model::openai_compatible(server.base_url(), "m");
    let anthropic = |server: &MockServer| {
        Model::anthropic_compatible(server.base_url(), "m").with_provider("anthropic")
    };
    let cases = [
        (
            "a block index of 2^40",
            peak_of(hostile::anthropic_huge_index(), anthropic).await,
        ),
        (
            "retry-after: 1e20",
            peak_of(hostile::retry_after("1e20"), openai).await,
        ),
        (
            "retry-after-ms: 1e300",
            peak_of(hostile::retry_after_ms("1e300"), openai).await,
        ),
        (
            "an endless line",
            peak_of(hostile::endless_line(), openai).await,
        ),
        (
            "an endless event",
            peak_of(hostile::endless_event(), openai).await,
        ),
        (
            "an endless body",
            peak_of(hostile::endless_text(Duration::ZERO), openai).await,
        ),
        (
            "5,000 tool calls",
            peak_of(hostile::many_tool_calls(5000), openai).await,
        ),
    ];
    for (case, (error, peak)) in cases {
        println!("{case}: {error} (peak heap growth {peak} bytes)");
        assert!(
            matches!(
                error,
                StreamError::LimitExceeded { .. } | StreamError::RetryAfterTooLong { .. }
            ),
            "{case}: {error:?}"
        );
        assert!(peak < BOUND, "{case}: the heap grew by {peak} bytes");
    }
}
