//! A proxy named by the environment: requests go through it (sent by
//! `reqwest`, which honours `HTTP_PROXY`), not straight to the model's host.
//! (A file of its own: the test sets the process's environment before any
//! other thread starts.)

#![allow(clippy::unwrap_used)]

mod common;

use tiller_ai::Model;
use tiller_test_support::paced::PacedServer;
use tiller_test_support::sse;

#[test]
fn a_proxy_in_the_environment_carries_the_requests() {
    // The proxy answers as the model would; the model's own host does not exist.
    let proxy = PacedServer::start(sse::openai_text_events(&["Hel", "lo"]));
    let address = proxy.base_url().trim_end_matches("/v1").to_owned();
    common::set_env_alone("HTTP_PROXY", &address);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let model = Model::openai_compatible("http://model-host.invalid/v1", "whole");
    common::says_hello_on(&runtime, &model);
    assert_eq!(proxy.connections(), 1);
}
