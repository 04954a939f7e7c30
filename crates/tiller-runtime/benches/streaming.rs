//! The event path's figures, through the public API against a loopback HTTP/1.1
//! server that streams a recorded OpenAI reply (115 SSE events) as a model does —
//! one event per write, spaced in time, on keep-alive connections. The server runs
//! in a process of its own (this binary, started again), so the CPU clock read
//! here is the client's alone: user and system time of this process, start-up
//! excluded. Every figure is printed for a tokio multi-thread runtime (two
//! workers) and a current-thread one:
//!
//! 1. one agent, one subscriber, replies streamed 300 µs per event: CPU per event
//!    (target <= 8 µs multi-thread, <= 5 µs current-thread) and per reply — next
//!    to this machine's floor for the same stream: a bare `TcpStream` reading it,
//!    and `reqwest` reading it and handing each chunk to one other task (the least
//!    any runtime does to deliver a streamed event to a subscriber);
//! 2. the same reply arriving in one write: CPU per reply;
//! 3. 1,000 agents streaming at once, 30 events/s each, one subscriber each: CPU
//!    per event (target <= 10 µs), every subscriber checked for a complete, ordered
//!    stream;
//! 4. one prompt of three model calls and two tool rounds: CPU per prompt
//!    (target <= 500 µs).
//!
//! ```text
//! cargo bench -p tiller-runtime --bench streaming
//! cargo bench -p tiller-runtime --bench streaming -- spaced current-thread   # only these
//! ```
//!
//! Words after `--` keep only the figures (`spaced`, `floor`, `whole`, `agents`,
//! `tools`)
//! and runtimes (`multi-thread`, `current-thread`) they name.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use tiller_ai::{AssistantEvent, Model};
use tiller_core::AgentEvent;
use tiller_runtime::{AgentHandle, AgentSettings, AgentSpec, Delivered, Notice, Supervisor};
use tiller_test_support::paced::{self, PacedProcess};
use tiller_test_support::workload::{add_tool, cpu_time, runtimes};

fn main() {
    let reply = paced::recorded_reply();
    if paced::serve_if_asked(&reply) {
        return;
    }
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let figures = ["spaced", "floor", "whole", "agents", "tools"];
    let flavours = ["multi-thread", "current-thread"];
    let chosen = |name: &str, all: &[&str]| {
        !words.iter().any(|word| all.contains(&word.as_str())) || words.iter().any(|w| w == name)
    };
    let server = PacedProcess::start();
    let text = reply_text(&reply);
    for (flavour, mut builder) in runtimes() {
        if !chosen(flavour, &flavours) {
            continue;
        }
        let runtime = builder.build().unwrap();
        let (spaced_target, many_target) = match flavour {
            "multi-thread" => (8.0, 10.0),
            _ => (5.0, 10.0),
        };
        runtime.block_on(async {
            let supervisor = Supervisor::start().await.unwrap();
            let events = reply.len() as f64;

            if chosen("spaced", &figures) {
                let cpu = replies(&supervisor, &server.model("spaced-300"), &text, 20).await;
                println!(
                    "{flavour}: one agent, a reply of {events} SSE events 300 µs apart: {:.1} µs CPU per event (target <= {spaced_target} µs), {:.2} ms per reply",
                    micros(cpu) / events,
                    micros(cpu) / 1e3
                );
            }
            if chosen("floor", &figures) {
                let bare = tokio::spawn(bare_socket(server.port, 20)).await.unwrap();
                let handed = tokio::spawn(reqwest_handing_on(server.model("spaced-300"), 20))
                    .await
                    .unwrap();
                println!(
                    "{flavour}: this machine's floor for the same stream: {:.1} µs CPU per event for a bare TcpStream reading it, {:.1} µs for reqwest reading it and handing each chunk to another task",
                    micros(bare) / events,
                    micros(handed) / events
                );
            }
            if chosen("whole", &figures) {
                let cpu = replies(&supervisor, &server.model("whole"), &text, 200).await;
                println!(
                    "{flavour}: one agent, the same reply in one write: {:.2} ms CPU per reply",
                    micros(cpu) / 1e3
                );
            }
            if chosen("agents", &figures) {
                let model = server.model("spaced-33333");
                let cpu = many_agents(&supervisor, &model, &text, 1_000).await;
                println!(
                    "{flavour}: 1,000 agents streaming at once, 30 events/s each: {:.1} µs CPU per event (target <= {many_target} µs), every stream complete and in order",
                    micros(cpu) / events
                );
            }
            if chosen("tools", &figures) {
                let cpu = tool_prompts(&supervisor, &server.model("tools"), 200).await;
                println!(
                    "{flavour}: one prompt, 3 model calls and 2 tool rounds: {:.0} µs CPU (target <= 500 µs)",
                    micros(cpu)
                );
            }
            supervisor.shutdown().await;
        });
    }
}

/// The text the reply streams.
fn reply_text(reply: &[String]) -> String {
    reply
        .iter()
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<serde_json::Value>(data).ok())
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// Spawns an agent on `model` with one subscriber that checks every run's stream:
/// numbered without a gap, never lagged, the deltas adding up to `text`. The
/// subscriber's task ends after `runs` runs.
async fn agent_with_checked_stream(
    supervisor: &Supervisor,
    model: &Model,
    text: &str,
    runs: usize,
) -> (AgentHandle, tokio::task::JoinHandle<()>) {
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::new(model.clone())))
        .await
        .unwrap();
    let mut events = agent.subscribe_with_buffer(4_096);
    let text = text.to_owned();
    let checker = tokio::spawn(async move {
        let mut last_seq = None;
        let mut streamed = String::new();
        let mut ended = 0;
        while ended < runs {
            let envelope = events.next().await.expect("the stream went on");
            if let Some(last) = last_seq {
                assert_eq!(envelope.seq, last + 1, "no gap, no reordering");
            }
            last_seq = Some(envelope.seq);
            match &envelope.event {
                Delivered::Event(AgentEvent::MessageUpdate {
                    assistant_message_event: AssistantEvent::TextDelta { delta, .. },
                }) => streamed.push_str(delta),
                Delivered::Event(AgentEvent::AgentEnd { .. }) => {
                    assert_eq!(streamed, text, "every delta, in order");
                    streamed.clear();
                    ended += 1;
                }
                Delivered::Notice(Notice::Lagged { missed }) => panic!("lagged by {missed}"),
                _ => {}
            }
        }
    });
    (agent, checker)
}

/// CPU per reply: `count` replies one after another (after two to warm up), the
/// transcript reset after each.
async fn replies(supervisor: &Supervisor, model: &Model, text: &str, count: usize) -> Duration {
    const WARM_UP: usize = 2;
    let (agent, checker) =
        agent_with_checked_stream(supervisor, model, text, WARM_UP + count).await;
    let mut cpu = Duration::ZERO;
    for n in 0..WARM_UP + count {
        let started = cpu_time();
        agent.run("Name one common tree species.").await.unwrap();
        if n >= WARM_UP {
            cpu += cpu_time() - started;
        }
        agent.reset().await.unwrap();
    }
    checker.await.unwrap();
    supervisor.stop(agent.id().as_str()).await;
    cpu / count as u32
}

/// CPU per agent's reply: `count` agents prompted at once, twice (the first round
/// opens the connections and is not counted).
async fn many_agents(supervisor: &Supervisor, model: &Model, text: &str, count: usize) -> Duration {
    let mut agents = Vec::with_capacity(count);
    let mut checkers = Vec::with_capacity(count);
    for _ in 0..count {
        let (agent, checker) = agent_with_checked_stream(supervisor, model, text, 2).await;
        agents.push(agent);
        checkers.push(checker);
    }
    let mut cpu = Duration::ZERO;
    for round in 0..2 {
        let started = cpu_time();
        for agent in &agents {
            agent.prompt("Name one common tree species.").await.unwrap();
        }
        for agent in &agents {
            agent.wait_for_idle().await;
        }
        if round == 1 {
            cpu = cpu_time() - started;
        }
        for agent in &agents {
            agent.reset().await.unwrap();
        }
    }
    for checker in checkers {
        checker.await.unwrap();
    }
    for agent in &agents {
        supervisor.stop(agent.id().as_str()).await;
    }
    cpu / count as u32
}

/// CPU per reply of a bare tokio `TcpStream` reading `count` spaced replies on one
/// connection (after two to warm up): no HTTP parsing, no decoding, nothing handed on.
async fn bare_socket(port: u16, count: usize) -> Duration {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const WARM_UP: usize = 2;
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    socket.set_nodelay(true).unwrap();
    let body = r#"{"model":"spaced-300"}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut buffer = vec![0; 64 * 1024];
    let mut cpu = Duration::ZERO;
    for n in 0..WARM_UP + count {
        let started = cpu_time();
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut tail = Vec::new();
        loop {
            let read = socket.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the server closed the connection");
            tail.extend_from_slice(&buffer[..read]);
            if tail.ends_with(b"\r\n0\r\n\r\n") {
                break;
            }
            let keep = tail.len().saturating_sub(8);
            tail.drain(..keep);
        }
        if n >= WARM_UP {
            cpu += cpu_time() - started;
        }
    }
    cpu / count as u32
}

/// CPU per reply of `reqwest` reading `count` spaced replies (after two to warm up)
/// and handing each chunk to another task.
async fn reqwest_handing_on(model: Model, count: usize) -> Duration {
    const WARM_UP: usize = 2;
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", model.base_url);
    let (chunks, mut received) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move { while received.recv().await.is_some() {} });
    let mut cpu = Duration::ZERO;
    for n in 0..WARM_UP + count {
        let started = cpu_time();
        let response = client
            .post(&url)
            .body(r#"{"model":"spaced-300"}"#)
            .send()
            .await
            .unwrap();
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            chunks.send(chunk.unwrap()).unwrap();
        }
        if n >= WARM_UP {
            cpu += cpu_time() - started;
        }
    }
    drop(chunks);
    reader.await.unwrap();
    cpu / count as u32
}

/// CPU per prompt of three model calls and two tool rounds, one prompt after
/// another (after ten to warm up).
async fn tool_prompts(supervisor: &Supervisor, model: &Model, count: usize) -> Duration {
    const WARM_UP: usize = 10;
    let agent = supervisor
        .spawn(AgentSpec::new(
            AgentSettings::new(model.clone()).with_tools(add_tool()),
        ))
        .await
        .unwrap();
    let mut events = agent.subscribe();
    let reader = tokio::spawn(async move { while events.next().await.is_some() {} });
    let mut cpu = Duration::ZERO;
    for n in 0..WARM_UP + count {
        let started = cpu_time();
        let outcome = agent.run("What is (2 + 3) + 8?").await.unwrap();
        if n >= WARM_UP {
            cpu += cpu_time() - started;
        }
        assert_eq!(
            outcome.messages.len(),
            6,
            "three answers, two results, the prompt"
        );
        agent.reset().await.unwrap();
    }
    supervisor.stop(agent.id().as_str()).await;
    reader.await.unwrap();
    cpu / count as u32
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
