//! What pi's proxy costs: `POST /api/stream` requests from a client in another
//! process, answered through a server in this one from a loopback model server in
//! a third (a recorded OpenAI reply of 115 SSE events, one write). The CPU clock
//! read here is the server's alone (user and system time of this process); next
//! to it, the same model call made directly in this process. Their difference is
//! the proxy's overhead per request (target <= 200 µs).
//!
//! ```text
//! cargo bench -p tiller-server --bench proxy
//! ```

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::json;
use tiller::tiller_ai::Context;
use tiller::{Definitions, Message, StreamOptions, Supervisor};
use tiller_server::{Server, ServerConfig};
use tiller_test_support::paced::{self, PacedProcess};
use tiller_test_support::workload::cpu_time;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Set in the environment of the client process: the server's base URL.
const CLIENT: &str = "TILLER_BENCH_PROXY_CLIENT";
/// Requests per figure.
const REQUESTS: usize = 500;

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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Direct: the model call alone, as the server makes it.
        let context = Context::new().with_message(Message::user("Hello"));
        let options = StreamOptions::default();
        for _ in 0..20 {
            tiller::tiller_ai::stream(&model, &context, &options)
                .result()
                .await;
        }
        let before = cpu_time();
        for _ in 0..REQUESTS {
            let answer = tiller::tiller_ai::stream(&model, &context, &options)
                .result()
                .await;
            assert!(answer.error_message.is_none(), "{answer:?}");
        }
        let direct = (cpu_time() - before) / REQUESTS as u32;

        // Proxied: the same call for a client in another process.
        let supervisor = Supervisor::start().await.unwrap();
        let server = Server::new(
            supervisor,
            Definitions::new().with_default_model(model.clone()),
            ServerConfig::default(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(server.serve(listener, std::future::pending()));
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .env(CLIENT, &base)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(said.next_line().await.unwrap().as_deref(), Some("warm"));
        let before = cpu_time();
        assert_eq!(said.next_line().await.unwrap().as_deref(), Some("done"));
        let proxied = (cpu_time() - before) / REQUESTS as u32;
        child.wait().await.unwrap();
        println!(
            "pi proxy: {:.0} µs server CPU per /api/stream request, {:.0} µs for the same model call made directly: {:.0} µs overhead per request (target <= 200 µs)",
            micros(proxied),
            micros(direct),
            micros(proxied.saturating_sub(direct))
        );
    });
}

/// The client process: 20 requests to warm up, says `warm`, then (at once)
/// [`REQUESTS`] requests one after another, each read to its `done`, and says
/// `done`.
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
        let request = || async {
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
        };
        for _ in 0..20 {
            request().await;
        }
        println!("warm");
        for _ in 0..REQUESTS {
            request().await;
        }
        println!("done");
    });
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
