//! An `https` endpoint: the stream is read over TLS in HTTP/1.1, and its
//! connection is kept for the next request. (A file of its own: the test sets
//! the process's `SSL_CERT_FILE` before any other thread starts.)

#![allow(clippy::unwrap_used)]

mod common;

use tiller_ai::Model;
use tiller_test_support::paced::PacedServer;
use tiller_test_support::sse;

#[test]
fn a_tls_endpoint_streams_and_keeps_its_connection() {
    let (server, certificate) = PacedServer::start_tls(sse::openai_text_events(&["Hel", "lo"]));
    let trusted = std::env::temp_dir().join(format!("tiller-tls-{}.pem", std::process::id()));
    std::fs::write(&trusted, certificate).unwrap();
    common::set_env_alone("SSL_CERT_FILE", &trusted);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let model = Model::openai_compatible(server.base_url(), "whole");
    for _ in 0..2 {
        common::says_hello_on(&runtime, &model);
    }
    server.wait_for_responses(2);
    // reqwest (`.ci/run`'s second pass) finishes reading a body in a task of its
    // own, which runs only inside the next `block_on`: its count says nothing.
    if !common::reqwest_asked() {
        assert_eq!(server.connections(), 1, "the TLS connection was not kept");
    }
    let _ = std::fs::remove_file(trusted);
}
