//! The wire layer's figures:
//!
//! 1. SSE-to-events decoding of every recorded response body, on one core (target:
//!    at least 200 MB/s);
//! 2. one streamed reply of 110 text deltas from a loopback server in another
//!    process, end to end (request, decode, final message): client CPU per reply
//!    (target: at most 300 µs; pi-ai spends about 10 ms).
//!
//! ```text
//! cargo bench -p tiller-ai --bench stream
//! ```

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use tiller_ai::{ApiKey, Context, Message, Model, ResponseDecoder, StreamOptions};
use tiller_test_support::workload::cpu_time;
use tiller_test_support::{Cassette, MockResponse, MockServer, sse};

const DELTAS: usize = 110;

fn main() {
    if std::env::args().any(|arg| arg == "--serve") {
        serve();
        return;
    }
    decode_throughput();
    reply_cpu();
}

fn decode_throughput() {
    let mut bodies = Vec::new();
    for cassette in Cassette::all() {
        for exchange in &cassette.exchanges {
            if exchange.is_streaming_chat() && exchange.response.status == 200 {
                let model = match cassette.provider.as_str() {
                    "anthropic" => Model::anthropic_compatible("http://unused/v1", "m"),
                    _ => Model::openai_compatible("http://unused/v1", "m"),
                };
                bodies.push((model, exchange.response.body.clone().into_bytes()));
            }
        }
    }
    let bytes: usize = bodies.iter().map(|(_, body)| body.len()).sum();
    println!(
        "decode: {} recorded bodies, {:.1} KiB in all",
        bodies.len(),
        bytes as f64 / 1024.0
    );
    for (label, chunk) in [("whole bodies", usize::MAX), ("1460-byte reads", 1460)] {
        let mut rounds = 0u64;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            for (model, body) in &bodies {
                let mut decoder = ResponseDecoder::new(model).unwrap();
                for piece in body.chunks(chunk.min(body.len())) {
                    decoder.feed(piece);
                    while let Some(event) = decoder.next_event() {
                        black_box(event);
                    }
                }
                decoder.end();
                while let Some(event) = decoder.next_event() {
                    black_box(event);
                }
            }
            rounds += 1;
        }
        let elapsed = started.elapsed().as_secs_f64();
        println!(
            "decode ({label}): {:.0} MB/s  (target >= 200 MB/s)",
            (bytes as f64 * rounds as f64) / elapsed / 1e6
        );
    }
}

/// A reply as OpenAI streams it: every chunk with the usual envelope.
fn reply_body() -> String {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        sse::data(&json!({
            "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1_763_000_000,
            "model": "gpt-4o-mini-2024-07-18", "service_tier": "default",
            "system_fingerprint": "fp_bench", "obfuscation": "abcdef",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            "usage": null
        }))
    };
    let words = [
        "The",
        " sky",
        " looks",
        " blue",
        " because",
        " air",
        " scatters",
        " short",
        " waves",
        " more",
        ".",
    ];
    let mut body = chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        json!(null),
    );
    for i in 0..DELTAS {
        body.push_str(&chunk(
            json!({"content": words[i % words.len()]}),
            json!(null),
        ));
    }
    body.push_str(&chunk(json!({}), json!("stop")));
    body.push_str(&sse::data(&json!({
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "choices": [],
        "usage": {"prompt_tokens": 24, "completion_tokens": DELTAS, "total_tokens": 24 + DELTAS,
                  "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}
    })));
    body.push_str(sse::OPENAI_DONE);
    body
}

/// The server process: answers every request with the reply, until killed.
fn serve() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let server = MockServer::start().await;
        server.always(MockResponse::sse(reply_body()));
        println!("{}", server.base_url());
        std::future::pending::<()>().await;
    });
}

fn reply_cpu() {
    let mut server = Command::new(std::env::current_exe().unwrap())
        .arg("--serve")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut base_url = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut base_url)
        .unwrap();
    let model = Model::openai_compatible(base_url.trim(), "gpt-4o-mini").with_provider("openai");
    let context = Context::new()
        .with_system_prompt("You are a helpful assistant.")
        .with_message(Message::user("Why is the sky blue?"));
    let options = StreamOptions {
        api_key: Some(ApiKey::new("bench")),
        ..StreamOptions::default()
    };
    for (label, mut builder) in [
        (
            "current-thread runtime",
            tokio::runtime::Builder::new_current_thread(),
        ),
        (
            "multi-thread runtime",
            tokio::runtime::Builder::new_multi_thread(),
        ),
    ] {
        let runtime = builder.enable_all().build().unwrap();
        let (cpu, wall, replies) = runtime.block_on(async {
            let reply = || async {
                let message = tiller_ai::stream(&model, &context, &options).result().await;
                assert_eq!(
                    message.usage.output, DELTAS as u64,
                    "{:?}",
                    message.error_message
                );
            };
            for _ in 0..300 {
                reply().await;
            }
            let replies = 3000;
            let (cpu, wall) = (cpu_time(), Instant::now());
            for _ in 0..replies {
                reply().await;
            }
            (cpu_time() - cpu, wall.elapsed(), replies)
        });
        println!(
            "reply of {DELTAS} deltas over loopback ({label}): {:.0} µs client CPU per reply, {:.0} µs wall  (target <= 300 µs CPU)",
            cpu.as_secs_f64() * 1e6 / replies as f64,
            wall.as_secs_f64() * 1e6 / replies as f64,
        );
    }
    server.kill().unwrap();
    server.wait().unwrap();
}
