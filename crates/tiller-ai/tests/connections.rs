//! Keep-alive: a stream that has ended leaves its connection to the next request,
//! although servers write the body's end after the last event, in a write of its
//! own and sometimes a while later (and a stream that reports `Done` does not wait
//! for it).

#![allow(clippy::unwrap_used)]

mod common;

use common::options;
use futures::StreamExt;
use tiller_ai::{AssistantEvent, Context, Message, Model};
use tiller_test_support::paced::PacedServer;
use tiller_test_support::sse;

async fn say_hello(model: &Model) {
    let context = Context::new().with_message(Message::user("Say hello"));
    let events: Vec<_> = tiller_ai::stream(model, &context, &options())
        .collect()
        .await;
    match events.last() {
        Some(AssistantEvent::Done { message, .. }) => assert_eq!(message.text(), "Hello"),
        other => panic!("not done: {other:?}"),
    }
}

#[tokio::test]
async fn a_body_that_ends_after_its_last_event_keeps_its_connection() {
    let server = PacedServer::start(sse::openai_text_events(&["Hel", "lo"]));
    // The events at once; the body's end 200 ms later, unless the client has
    // closed the connection by then.
    let model = Model::openai_compatible(server.base_url(), "late-end-200");
    say_hello(&model).await;
    let server = tokio::task::spawn_blocking(move || {
        server.wait_for_responses(1);
        server
    })
    .await
    .unwrap();
    assert_eq!(server.closed_before_end(), 0, "the connection was closed");
    assert_eq!(server.connections(), 1);
}

/// The tasks alive on this runtime once `model`'s reply has begun to stream.
async fn tasks_while_streaming(model: &Model, options: &tiller_ai::StreamOptions) -> usize {
    let context = Context::new().with_message(Message::user("Say hello"));
    let mut stream = tiller_ai::stream(model, &context, options);
    while let Some(event) = stream.next().await {
        if matches!(event, AssistantEvent::TextDelta { .. }) {
            break;
        }
    }
    let alive = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    while stream.next().await.is_some() {}
    alive
}

#[tokio::test]
async fn the_stream_is_read_in_the_task_that_polls_it() {
    let server = PacedServer::start(sse::openai_text_events(&["Hel", "lo"]));
    let model = Model::openai_compatible(server.base_url(), "spaced-1000");
    // No connection task: the socket is read by whoever polls the stream.
    assert_eq!(tasks_while_streaming(&model, &options()).await, 0);
    // A client of the caller's own is reqwest's, which reads in a task of its own.
    let mut own_client = options();
    own_client.transport.http_client = Some(reqwest::Client::new());
    assert_ne!(tasks_while_streaming(&model, &own_client).await, 0);
}
