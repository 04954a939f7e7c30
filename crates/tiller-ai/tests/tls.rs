//! An `https` endpoint: the stream is read over TLS in HTTP/1.1, and its
//! connection is kept for the next request. (A file of its own: the test sets
//! the process's `SSL_CERT_FILE` before any other thread starts.)

#![allow(clippy::unwrap_used)]

mod common;

use common::options;
use futures::StreamExt;
use tiller_ai::{AssistantEvent, Context, Message, Model};
use tiller_test_support::paced::PacedServer;
use tiller_test_support::sse;

#[test]
fn a_tls_endpoint_streams_and_keeps_its_connection() {
    let (server, certificate) = PacedServer::start_tls(sse::openai_text_events(&["Hel", "lo"]));
    let trusted = std::env::temp_dir().join(format!("tiller-tls-{}.pem", std::process::id()));
    std::fs::write(&trusted, certificate).unwrap();
    // SAFETY: no thread of this process reads the environment yet (the
    // server's threads only accept connections), and this is the file's only test.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("SSL_CERT_FILE", &trusted);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let model = Model::openai_compatible(server.base_url(), "whole");
    let context = Context::new().with_message(Message::user("Say hello"));
    for _ in 0..2 {
        let events: Vec<_> = runtime.block_on(async {
            tiller_ai::stream(&model, &context, &options())
                .collect()
                .await
        });
        match events.last() {
            Some(AssistantEvent::Done { message, .. }) => assert_eq!(message.text(), "Hello"),
            other => panic!("not done: {other:?}"),
        }
    }
    server.wait_for_responses(2);
    // reqwest (`.ci/run`'s second pass) finishes reading a body in a task of its
    // own, which runs only inside the next `block_on`: its count says nothing.
    if !std::env::var("TILLER_HTTP_CLIENT").is_ok_and(|client| client == "reqwest") {
        assert_eq!(server.connections(), 1, "the TLS connection was not kept");
    }
    let _ = std::fs::remove_file(trusted);
}
