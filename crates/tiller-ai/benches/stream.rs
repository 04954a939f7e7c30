//! The wire layer's figures:
//!
//! 1. SSE-to-events (or event-stream-to-events) decoding of every recorded
//!    response body, on one core, per
//!    dialect (target: at least 200 MB/s each);
//! 2. one streamed reply of 110 text deltas from a loopback server in another
//!    process, end to end (request, decode, final message): client CPU per reply
//!    (target: at most 300 µs; pi-ai spends about 10 ms), in the OpenAI chat
//!    dialect, in Gemini's, in OpenAI's Responses API and in Bedrock's binary event
//!    stream, whose CPU per event must stay within 1.5× of the OpenAI chat
//!    decoder's on the same text.
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
use tiller_ai::{Api, ApiKey, Context, Message, Model, ResponseDecoder, StreamOptions};
use tiller_test_support::workload::cpu_time;
use tiller_test_support::{Cassette, MockResponse, MockServer, eventstream, sse};

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
    let mut dialects: Vec<(&str, Model, Vec<Vec<u8>>)> = vec![
        (
            "openai chat",
            Model::openai_compatible("http://unused/v1", "m"),
            Vec::new(),
        ),
        (
            "anthropic",
            Model::anthropic_compatible("http://unused/v1", "m"),
            Vec::new(),
        ),
        (
            "gemini",
            Model::speaking(Api::GoogleGenerativeAi, "http://unused/v1beta", "m"),
            Vec::new(),
        ),
        (
            "openai responses",
            Model::speaking(Api::OpenAiResponses, "http://unused/v1", "m"),
            Vec::new(),
        ),
        (
            "bedrock",
            Model::speaking(Api::BedrockConverseStream, "http://unused", "m"),
            Vec::new(),
        ),
    ];
    for cassette in Cassette::all() {
        for exchange in &cassette.exchanges {
            let dialect = match cassette.provider.as_str() {
                _ if exchange.request.path.ends_with("/responses") => 3,
                "anthropic" => 1,
                "gemini" => 2,
                "bedrock" => 4,
                _ => 0,
            };
            if exchange.is_streaming_chat() && exchange.response.status == 200 {
                dialects[dialect].2.push(exchange.response.bytes());
            }
        }
    }
    for (dialect, model, bodies) in &dialects {
        let bytes: usize = bodies.iter().map(Vec::len).sum();
        println!(
            "decode ({dialect}): {} recorded bodies, {:.1} KiB in all",
            bodies.len(),
            bytes as f64 / 1024.0
        );
        for (label, chunk) in [("whole bodies", usize::MAX), ("1460-byte reads", 1460)] {
            let mut rounds = 0u64;
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(2) {
                for body in bodies {
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
                "decode ({dialect}, {label}): {:.0} MB/s  (target >= 200 MB/s)",
                (bytes as f64 * rounds as f64) / elapsed / 1e6
            );
        }
    }
}

const WORDS: [&str; 11] = [
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

/// The same reply as the Responses API streams it: typed events, each delta with
/// its item, part and sequence number.
fn responses_reply_body() -> String {
    let mut events = vec![
        json!({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_bench", "object": "response", "status": "in_progress", "model": "gpt-4.1-mini"}}),
        json!({"type": "response.output_item.added", "output_index": 0, "sequence_number": 1,
               "item": {"type": "message", "id": "msg_bench", "role": "assistant", "status": "in_progress", "content": []}}),
        json!({"type": "response.content_part.added", "output_index": 0, "content_index": 0, "item_id": "msg_bench",
               "sequence_number": 2, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
    ];
    for i in 0..DELTAS {
        events.push(json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
            "item_id": "msg_bench", "logprobs": [], "obfuscation": "abcdef", "sequence_number": 3 + i,
            "delta": WORDS[i % WORDS.len()]}));
    }
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "sequence_number": 3 + DELTAS,
        "item": {"type": "message", "id": "msg_bench", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "…", "annotations": [], "logprobs": []}]}}));
    events.push(json!({"type": "response.completed", "sequence_number": 4 + DELTAS,
        "response": {"id": "resp_bench", "object": "response", "status": "completed", "model": "gpt-4.1-mini",
                     "usage": {"input_tokens": 24, "input_tokens_details": {"cached_tokens": 0},
                               "output_tokens": DELTAS, "output_tokens_details": {"reasoning_tokens": 0},
                               "total_tokens": 24 + DELTAS}}}));
    events.iter().map(sse::data).collect()
}

/// The same reply as Bedrock streams it: one event-stream message per delta.
fn bedrock_reply_body() -> Vec<u8> {
    let mut messages = vec![eventstream::event(
        "messageStart",
        &json!({"role": "assistant", "p": "abcdefghij"}),
    )];
    for i in 0..DELTAS {
        messages.push(eventstream::event(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"text": WORDS[i % WORDS.len()]}, "p": "abcdefghijklmnopqrstuvwxyz"}),
        ));
    }
    messages.push(eventstream::event(
        "contentBlockStop",
        &json!({"contentBlockIndex": 0, "p": "abcdef"}),
    ));
    messages.push(eventstream::event(
        "messageStop",
        &json!({"stopReason": "end_turn", "p": "abc"}),
    ));
    messages.push(eventstream::event(
        "metadata",
        &json!({"usage": {"inputTokens": 24, "outputTokens": DELTAS, "totalTokens": 24 + DELTAS},
                "metrics": {"latencyMs": 300}, "p": "abcdefghijklmnop"}),
    ));
    messages.concat()
}

/// The same reply as Gemini streams it: one text part per chunk, with the usage so
/// far and the model's version in each.
fn gemini_reply_body() -> String {
    let chunk = |i: usize, finish: Option<&str>| {
        let mut candidate = json!({
            "content": {"parts": [{"text": WORDS[i % WORDS.len()]}], "role": "model"},
            "index": 0,
        });
        if let Some(reason) = finish {
            candidate["finishReason"] = json!(reason);
        }
        sse::data(&json!({
            "candidates": [candidate],
            "usageMetadata": {"promptTokenCount": 24, "candidatesTokenCount": i + 1,
                              "totalTokenCount": 25 + i, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 24}]},
            "modelVersion": "gemini-2.5-flash",
            "responseId": "bench-response-id",
        }))
    };
    (0..DELTAS)
        .map(|i| chunk(i, (i + 1 == DELTAS).then_some("STOP")))
        .collect()
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
    let mut body = chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        json!(null),
    );
    for i in 0..DELTAS {
        body.push_str(&chunk(
            json!({"content": WORDS[i % WORDS.len()]}),
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

/// The server process: answers every request with the reply in the dialect it
/// was asked in, until killed.
fn serve() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let server = MockServer::start().await;
        let (openai, responses, gemini) =
            (reply_body(), responses_reply_body(), gemini_reply_body());
        let bedrock = bytes::Bytes::from(bedrock_reply_body());
        server.respond_with(move |request| {
            if request.path.ends_with("/converse-stream") {
                return MockResponse::recorded(
                    200,
                    "application/vnd.amazon.eventstream",
                    bedrock.clone(),
                );
            }
            MockResponse::sse(if request.path.ends_with(":streamGenerateContent") {
                gemini.clone()
            } else if request.path.ends_with("/responses") {
                responses.clone()
            } else {
                openai.clone()
            })
        });
        println!("{}", server.origin());
        std::future::pending::<()>().await;
    });
}

/// The server process, killed when dropped (also when a figure's check panics).
struct ServerProcess(std::process::Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn reply_cpu() {
    let mut server = ServerProcess(
        Command::new(std::env::current_exe().unwrap())
            .arg("--serve")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut origin = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut origin)
        .unwrap();
    let origin = origin.trim();
    let dialects = [
        (
            "openai chat",
            Model::openai_compatible(format!("{origin}/v1"), "gpt-4o-mini").with_provider("openai"),
        ),
        (
            "gemini",
            Model::speaking(
                Api::GoogleGenerativeAi,
                format!("{origin}/v1beta"),
                "gemini-2.5-flash",
            )
            .with_provider("gemini"),
        ),
        (
            "openai responses",
            Model::speaking(Api::OpenAiResponses, format!("{origin}/v1"), "gpt-4.1-mini")
                .with_provider("openai-responses"),
        ),
        (
            "bedrock",
            Model::speaking(Api::BedrockConverseStream, origin, "amazon.nova-lite-v1:0")
                .with_provider("bedrock"),
        ),
    ];
    let context = Context::new()
        .with_system_prompt("You are a helpful assistant.")
        .with_message(Message::user("Why is the sky blue?"));
    let options = StreamOptions {
        transport: tiller_ai::Transport::keyed(ApiKey::new("bench")),
        ..StreamOptions::default()
    };
    for runtime_label in ["current-thread runtime", "multi-thread runtime"] {
        let mut per_event = Vec::new();
        for (dialect, model) in &dialects {
            let mut builder = if runtime_label.starts_with("current") {
                tokio::runtime::Builder::new_current_thread()
            } else {
                tokio::runtime::Builder::new_multi_thread()
            };
            let runtime = builder.enable_all().build().unwrap();
            let (cpu, wall, replies) = runtime.block_on(async {
                let reply = || async {
                    let message = tiller_ai::stream(model, &context, &options).result().await;
                    assert_eq!(
                        message.usage.output, DELTAS as u64,
                        "{dialect}: {:?}",
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
            let cpu_per_reply = cpu.as_secs_f64() * 1e6 / replies as f64;
            per_event.push(cpu_per_reply / DELTAS as f64);
            println!(
                "reply of {DELTAS} deltas over loopback ({dialect}, {runtime_label}): {cpu_per_reply:.0} µs client CPU per reply ({:.2} µs per event), {:.0} µs wall  (target <= 300 µs CPU)",
                per_event.last().unwrap(),
                wall.as_secs_f64() * 1e6 / replies as f64,
            );
        }
        for (index, dialect) in [(1, "gemini"), (2, "openai responses"), (3, "bedrock")] {
            println!(
                "{dialect} / openai chat CPU per event ({runtime_label}): {:.2}×  (target <= 1.5×)",
                per_event[index] / per_event[0]
            );
        }
    }
    drop(server);
}
