//! What pi's proxy costs: `POST /api/stream` requests from a client in another
//! process, answered through a server in this one from a loopback model server in
//! a third (a recorded OpenAI reply of 115 SSE events, one write). The CPU clock
//! read here is the server's alone (user and system time of this process); next
//! to it, the same model call made directly in this process (rounds of each in
//! turn, the least of each kept). Their difference is the proxy's overhead per
//! request (target <= 200 µs), printed for a multi-thread and a current-thread
//! runtime.
//!
//! ```text
//! cargo bench -p tiller-server --bench proxy
//! ```

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::json;
use tiller::ai::Context;
use tiller::{
    Definitions, Supervisor,
    ai::{Message, StreamOptions},
};
use tiller_server::{Server, ServerConfig};
use tiller_test_support::paced::{self, PacedProcess};
use tiller_test_support::workload::{cpu_time, runtimes};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Set in the environment of the client process: the server's base URL.
const CLIENT: &str = "TILLER_BENCH_PROXY_CLIENT";
/// Requests per round.
const REQUESTS: usize = 200;
/// Measured rounds.
const ROUNDS: usize = 5;

fn main() {
    let reply = paced::recorded_reply();
    if paced::serve_if_asked(&reply) {
        return;
    }
    if let Ok(base) = std::env::var(CLIENT) {
        client(&base);
        return;
    }
    let upstream = PacedProcess::start();
    let model = upstream.model("whole");
    for (flavour, mut builder) in runtimes() {
        let runtime = builder.build().unwrap();
        runtime.block_on(measure(flavour, &model));
    }
}

/// Prints the figures on the runtime it runs on, named `flavour`: in each of
/// [`ROUNDS`] rounds, [`REQUESTS`] direct calls, then as many proxied ones; the
/// least of each per request.
async fn measure(flavour: &str, model: &tiller::Model) {
    let context = Context::new().with_message(Message::user("Hello"));
    let options = StreamOptions::default();
    let direct_calls = || async {
        for _ in 0..REQUESTS {
            let answer = tiller::ai::stream(model, &context, &options).result().await;
            assert!(answer.error_message.is_none(), "{answer:?}");
        }
    };

    let supervisor = Supervisor::start().await.unwrap();
    let server = Server::new(
        supervisor,
        Definitions::new().with_default_model(model.clone()),
        ServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(server.serve(listener, std::future::pending()));
    let mut client = tokio::process::Command::new(std::env::current_exe().unwrap())
        .env(CLIENT, &base)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut go = client.stdin.take().unwrap();
    let mut said = BufReader::new(client.stdout.take().unwrap()).lines();

    // A round to warm up, unmeasured.
    direct_calls().await;
    go.write_all(b"go\n").await.unwrap();
    assert_eq!(said.next_line().await.unwrap().as_deref(), Some("done"));
    let (mut direct, mut proxied) = (Duration::MAX, Duration::MAX);
    for _ in 0..ROUNDS {
        let before = cpu_time();
        direct_calls().await;
        direct = direct.min((cpu_time() - before) / REQUESTS as u32);

        let before = cpu_time();
        go.write_all(b"go\n").await.unwrap();
        assert_eq!(said.next_line().await.unwrap().as_deref(), Some("done"));
        proxied = proxied.min((cpu_time() - before) / REQUESTS as u32);
    }
    drop(go);
    client.wait().await.unwrap();
    println!(
        "{flavour}: pi proxy: {:.0} µs server CPU per /api/stream request, {:.0} µs for the same model call made directly: {:.0} µs overhead per request (target <= 200 µs)",
        micros(proxied),
        micros(direct),
        micros(proxied.saturating_sub(direct))
    );
}

/// The client process: for each `go` line on stdin, [`REQUESTS`] requests one
/// after another, each read to its `done`, then says `done`.
fn client(base: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let http = reqwest::Client::new();
        let body = json!({
            "model": {"id": "whole", "provider": "openai-compatible", "api": "openai-completions"},
            "context": {"messages": [{"role": "user", "content": "Hello", "timestamp": 0}]},
            "options": {}
        })
        .to_string();
        let mut rounds = BufReader::new(tokio::io::stdin()).lines();
        while let Some(_go) = rounds.next_line().await.unwrap() {
            for _ in 0..REQUESTS {
                let text = http
                    .post(format!("{base}/api/stream"))
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                assert!(text.contains(r#""type":"done""#), "{text}");
            }
            println!("done");
        }
    });
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
