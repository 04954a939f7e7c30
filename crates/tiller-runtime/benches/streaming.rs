//! The event path's figures, through the public API against a loopback HTTP/1.1
//! server that streams a recorded OpenAI reply (115 SSE events) as a model does —
//! one event per write, spaced in time, on keep-alive connections. The server runs
//! in a process of its own (this binary, started again), so the CPU clock read
//! here is the client's alone: user and system time of this process, start-up
//! excluded.
//!
//! First the floor: a bare tokio `TcpStream` on a current-thread runtime reading
//! the same spaced stream (no HTTP parsing, nothing handed on), and 1,000 of them
//! reading the 1,000 agents' stream at once. Every per-event figure is printed
//! beside its floor, as a multiple of it. Then three passes:
//!
//! - `default`: a tokio multi-thread host runtime (two workers) and
//!   `SupervisorConfig::default()`, whose agents live on one shard per core;
//!   subscribers read beside their agent (`AgentHandle::spawn_beside`), and once
//!   more on the host runtime (`spaced-host`);
//! - `current-thread`: everything on one current-thread runtime (no shards);
//! - `unsharded`: the multi-thread host runtime with `shards: Count(0)`, the
//!   agents on its workers (the default before shards).
//!
//! The figures:
//!
//! 1. `spaced`: one agent, one subscriber, replies streamed 300 µs per event: CPU
//!    per event (target <= 1.5x the floor) and per reply; `spaced-host` the same
//!    with the subscriber on the host runtime, woken once per batch of events;
//! 2. `floor`: this pass's own runtime reading the stream bare, and `reqwest`
//!    reading it and handing each chunk to one other task;
//! 3. `whole`: the same reply arriving in one write: CPU per reply;
//! 4. `agents`: 1,000 agents streaming at once, 30 events/s each, one subscriber
//!    each: CPU per event (target <= 2x the floor), every subscriber checked for a
//!    complete, ordered stream;
//! 5. `tools`: one prompt of three model calls and two tool rounds: CPU per prompt
//!    (target <= 500 µs);
//! 6. `tools-10`: ten agents given that prompt at once by the host, again and
//!    again: CPU per prompt (target: the default configuration at most the
//!    current-thread figure), beside the floor of the host's two round trips
//!    to the agent's thread a prompt makes there (`run`, then `reset`): as many
//!    bare tasks run on an agent's shard and awaited by the host.
//!
//! ```text
//! cargo bench -p tiller-runtime --bench streaming
//! cargo bench -p tiller-runtime --bench streaming -- spaced default   # only these
//! ```
//!
//! Words after `--` keep only the figures and passes they name.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use tiller_ai::faux::FauxProvider;
use tiller_ai::{AssistantEvent, Model};
use tiller_core::AgentEvent;
use tiller_runtime::{
    AgentHandle, AgentSettings, AgentSpec, Delivered, Notice, Shards, Supervisor, SupervisorConfig,
};
use tiller_test_support::paced::{self, PacedProcess};
use tiller_test_support::workload::{add_tool, cpu_time, on_current_thread, runtimes};

fn main() {
    let reply = paced::recorded_reply();
    if paced::serve_if_asked(&reply) {
        return;
    }
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let figures = [
        "spaced",
        "spaced-host",
        "floor",
        "whole",
        "agents",
        "tools",
        "tools-10",
    ];
    let passes = ["default", "current-thread", "unsharded"];
    let chosen = |name: &str, all: &[&str]| {
        !words.iter().any(|word| all.contains(&word.as_str())) || words.iter().any(|w| w == name)
    };
    let server = PacedProcess::start();
    let text = reply_text(&reply);
    let events = reply.len() as f64;

    let floor = micros(on_current_thread(paced::bare_replies(
        server.port,
        "spaced-300",
        1,
        40,
    ))) / events;
    println!(
        "floor: a bare TcpStream on a current-thread runtime reading a reply of {events} SSE events 300 µs apart: {floor:.1} µs CPU per event"
    );
    // The floor of the 1,000 agents: as many bare readers of the same stream at once.
    let many_floor = chosen("agents", &figures).then(|| {
        let cpu = on_current_thread(paced::bare_replies(server.port, "spaced-33333", 1_000, 1));
        let floor = micros(cpu) / events;
        println!(
            "floor: 1,000 bare TcpStreams on a current-thread runtime reading the same reply at once, 30 events/s each: {floor:.1} µs CPU per event"
        );
        floor
    });
    let against = |per_event: f64, floor: f64, target: f64| {
        format!(
            "{per_event:.1} µs CPU per event, {:.2}x the floor (target <= {target}x)",
            per_event / floor
        )
    };

    let [(_, multi), (_, current)] = runtimes();
    let [(_, unsharded), _] = runtimes();
    // Pass, host runtime, shards.
    let configured = [
        ("default", multi, Shards::Auto),
        ("current-thread", current, Shards::Auto),
        ("unsharded", unsharded, Shards::Count(0)),
    ];
    for (pass, mut builder, shards) in configured {
        if !chosen(pass, &passes) {
            continue;
        }
        builder.build().unwrap().block_on(async {
            let config = SupervisorConfig {
                shards,
                ..SupervisorConfig::default()
            };
            let supervisor = Supervisor::with_config(config).await.unwrap();
            let spaced = server.model("spaced-300");

            if chosen("spaced", &figures) {
                let cpu = replies(&supervisor, &spaced, &text, 20, Reader::Beside).await;
                println!(
                    "{pass} ({} shards): one agent, a reply of {events} SSE events 300 µs apart: {}, {:.2} ms per reply",
                    supervisor.shard_count(),
                    against(micros(cpu) / events, floor, 1.5),
                    micros(cpu) / 1e3,
                );
            }
            if chosen("spaced-host", &figures) {
                let cpu = replies(&supervisor, &spaced, &text, 20, Reader::Host).await;
                println!(
                    "{pass}: the same, its subscriber on the host runtime: {}",
                    against(micros(cpu) / events, floor, 1.5),
                );
            }
            if chosen("floor", &figures) {
                let bare = tokio::spawn(paced::bare_replies(server.port, "spaced-300", 1, 20))
                    .await
                    .unwrap();
                let handed = tokio::spawn(reqwest_handing_on(spaced.clone(), 20))
                    .await
                    .unwrap();
                println!(
                    "{pass}: this runtime reading the same stream: {:.1} µs CPU per event for a bare TcpStream, {:.1} µs for reqwest handing each chunk to another task",
                    micros(bare) / events,
                    micros(handed) / events
                );
            }
            if chosen("whole", &figures) {
                let cpu = replies(&supervisor, &server.model("whole"), &text, 200, Reader::Beside).await;
                println!(
                    "{pass}: one agent, the same reply in one write: {:.2} ms CPU per reply",
                    micros(cpu) / 1e3
                );
            }
            if chosen("agents", &figures) {
                let model = server.model("spaced-33333");
                let cpu = many_agents(&supervisor, &model, &text, 1_000).await;
                println!(
                    "{pass}: 1,000 agents streaming at once, 30 events/s each, every stream complete and in order: {}",
                    against(micros(cpu) / events, many_floor.unwrap_or(floor), 2.0)
                );
            }
            if chosen("tools", &figures) {
                let cpu = tool_prompts(&supervisor, &server.model("tools"), 200).await;
                println!(
                    "{pass}: one prompt, 3 model calls and 2 tool rounds: {:.0} µs CPU (target <= 500 µs)",
                    micros(cpu)
                );
            }
            if chosen("tools-10", &figures) {
                let cpu = tools_at_once(&supervisor, &server.model("tools"), 10, 50).await;
                let trips = host_round_trips(&supervisor, 10, 500).await;
                println!(
                    "{pass}: ten agents given that prompt at once by the host: {:.0} µs CPU per prompt; two bare round trips from the host to an agent's thread: {:.0} µs",
                    micros(cpu),
                    2.0 * micros(trips)
                );
            }
            supervisor.shutdown().await;
        });
    }
}

/// Where a subscriber reads its agent's events.
#[derive(Clone, Copy)]
enum Reader {
    /// On the agent's shard ([`AgentHandle::spawn_beside`]).
    Beside,
    /// On the runtime the bench runs on.
    Host,
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
    reader: Reader,
) -> (AgentHandle, tokio::task::JoinHandle<()>) {
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::new(model.clone())))
        .await
        .unwrap();
    let mut events = agent.subscribe_with_buffer(4_096);
    let text = text.to_owned();
    let checking = async move {
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
                    ..
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
    };
    let checker = match reader {
        Reader::Beside => agent.spawn_beside(checking),
        Reader::Host => tokio::spawn(checking),
    };
    (agent, checker)
}

/// CPU per reply: `count` replies one after another (after two to warm up), the
/// transcript reset after each.
async fn replies(
    supervisor: &Supervisor,
    model: &Model,
    text: &str,
    count: usize,
    reader: Reader,
) -> Duration {
    const WARM_UP: usize = 2;
    let (agent, checker) =
        agent_with_checked_stream(supervisor, model, text, WARM_UP + count, reader).await;
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
        let (agent, checker) =
            agent_with_checked_stream(supervisor, model, text, 2, Reader::Beside).await;
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
    let reader = agent.spawn_beside(async move { while events.next().await.is_some() {} });
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

/// CPU per prompt: `agents` agents given the 3-call prompt at once from a task
/// of the host's runtime, `rounds` times (after a round to warm up).
async fn tools_at_once(
    supervisor: &Supervisor,
    model: &Model,
    agents: usize,
    rounds: usize,
) -> Duration {
    let settings = std::sync::Arc::new(AgentSettings::new(model.clone()).with_tools(add_tool()));
    let spawns = (0..agents).map(|_| supervisor.spawn(AgentSpec::new(settings.clone())));
    let handles: Vec<AgentHandle> = futures::future::try_join_all(spawns).await.unwrap();
    let mut cpu = Duration::ZERO;
    for round in 0..=rounds {
        let started = cpu_time();
        let outcomes = futures::future::join_all(
            handles
                .iter()
                .map(|agent| agent.run("What is (2 + 3) + 8?")),
        )
        .await;
        if round > 0 {
            cpu += cpu_time() - started;
        }
        for outcome in outcomes {
            assert_eq!(outcome.unwrap().messages.len(), 6);
        }
        futures::future::try_join_all(handles.iter().map(AgentHandle::reset))
            .await
            .unwrap();
    }
    for agent in &handles {
        supervisor.stop(agent.id().as_str()).await;
    }
    cpu / (agents * rounds) as u32
}

/// CPU per round trip from the host to an agent's thread and back, `agents`
/// agents' at once: an empty task run beside each agent and awaited.
async fn host_round_trips(supervisor: &Supervisor, agents: usize, rounds: usize) -> Duration {
    let settings = std::sync::Arc::new(AgentSettings::new(FauxProvider::new().model()));
    let spawns = (0..agents).map(|_| supervisor.spawn(AgentSpec::new(settings.clone())));
    let handles: Vec<AgentHandle> = futures::future::try_join_all(spawns).await.unwrap();
    let started = cpu_time();
    for _ in 0..rounds {
        futures::future::join_all(handles.iter().map(|agent| agent.spawn_beside(async {}))).await;
    }
    let cpu = cpu_time() - started;
    for agent in &handles {
        supervisor.stop(agent.id().as_str()).await;
    }
    cpu / (agents * rounds) as u32
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
