//! A proxy named by the environment: requests go through it (sent by
//! `reqwest`, which honours `HTTP_PROXY`), not straight to the model's host.
//! (A file of its own: the test sets the process's environment before any
//! other thread starts.)

#![allow(clippy::unwrap_used)]

mod common;

use common::options;
use futures::StreamExt;
use tiller_ai::{AssistantEvent, Context, Message, Model};
use tiller_test_support::paced::PacedServer;
use tiller_test_support::sse;

#[test]
fn a_proxy_in_the_environment_carries_the_requests() {
    // The proxy answers as the model would; the model's own host does not exist.
    let proxy = PacedServer::start(sse::openai_text_events(&["Hel", "lo"]));
    let address = proxy.base_url().trim_end_matches("/v1").to_owned();
    // SAFETY: no thread of this process reads the environment yet (the
    // server's threads only accept connections), and this is the file's only test.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("HTTP_PROXY", &address);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let model = Model::openai_compatible("http://model-host.invalid/v1", "whole");
    let context = Context::new().with_message(Message::user("Say hello"));
    let events: Vec<_> = runtime.block_on(async {
        tiller_ai::stream(&model, &context, &options())
            .collect()
            .await
    });
    match events.last() {
        Some(AssistantEvent::Done { message, .. }) => assert_eq!(message.text(), "Hello"),
        other => panic!("not done: {other:?}"),
    }
    assert_eq!(proxy.connections(), 1);
}
