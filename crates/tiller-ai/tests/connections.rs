//! Keep-alive: a stream that has ended leaves its connection to the next request,
//! although servers write the body's end after the last event, in a write of its
//! own and sometimes a while later (and a stream that reports `Done` does not wait
//! for it).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    // No connection task: the socket is read by whoever polls the stream
    // (unless the environment asks for reqwest, as `.ci/run`'s second pass does).
    let tasks = tasks_while_streaming(&model, &options()).await;
    if common::reqwest_asked() {
        assert_ne!(tasks, 0);
    } else {
        assert_eq!(tasks, 0);
    }
    // A client of the caller's own is reqwest's, which reads in a task of its own.
    let mut own_client = options();
    own_client.transport.http_client = Some(reqwest::Client::new());
    assert_ne!(tasks_while_streaming(&model, &own_client).await, 0);
}

#[tokio::test]
async fn a_urls_user_and_password_go_as_basic_credentials() {
    let server = tiller_test_support::MockServer::start().await;
    server.push(tiller_test_support::MockResponse::sse(sse::openai_text(&[
        "Hel", "lo",
    ])));
    let base_url = server
        .base_url()
        .replacen("http://", "http://gate%40way:s%3Acret@", 1);
    let model = Model::openai_compatible(base_url, "gpt");
    let context = Context::new().with_message(Message::user("Say hello"));
    // No key of its own: a key's `Authorization` would go instead, as with reqwest.
    let options = tiller_ai::StreamOptions::default();
    let events: Vec<_> = tiller_ai::stream(&model, &context, &options)
        .collect()
        .await;
    assert!(
        matches!(events.last(), Some(AssistantEvent::Done { .. })),
        "{events:?}"
    );
    let requests = server.requests();
    // "gate@way:s:cret", as reqwest sends it.
    assert_eq!(
        requests[0].header("authorization"),
        Some("Basic Z2F0ZUB3YXk6czpjcmV0")
    );
}

/// Answers each connection's first request, then closes it (without saying
/// so in a `Connection: close`); counts the connections.
fn one_answer_per_connection(reply: String) -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            let mut connection = connection.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            let mut reader = BufReader::new(connection.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                assert!(reader.read_line(&mut line).unwrap() > 0, "the client left");
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            reader.read_exact(&mut vec![0; length]).unwrap();
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let body = format!("{:x}\r\n{reply}\r\n0\r\n\r\n", reply.len());
            connection.write_all(head.as_bytes()).unwrap();
            connection.write_all(body.as_bytes()).unwrap();
        }
    });
    (base_url, accepted)
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_is_not_used_again() {
    let (base_url, accepted) = one_answer_per_connection(sse::openai_text(&["Hel", "lo"]));
    let model = Model::openai_compatible(base_url, "gpt");
    say_hello(&model).await;
    say_hello(&model).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
