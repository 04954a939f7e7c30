//! The runtime's figures:
//!
//! 1. memory per idle agent holding a 10-message transcript, all included (target
//!    <= 4 KiB), and spawn rate (target >= 50,000 agents/s), over 100,000 agents;
//! 2. deliveries per second from one agent streaming 100,000 deltas to 100
//!    subscribers (target >= 5 million/s);
//! 3. 10,000 agents running at once against `faux` (3 model calls, 2 tool rounds):
//!    CPU per run beyond the bare loop's (target <= 100 µs);
//! 4. `abort()` to idle while a tool runs (target: p99 < 1 ms).
//!
//! ```text
//! cargo bench -p tiller --bench agents
//! ```

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentEvent, AgentMessage, AgentSettings, AgentSpec, AgentTool, AssistantMessage, Delivered,
    FnTool, Message, Supervisor, ToolSet,
};
use tiller_test_support::workload::{add_tool, cpu_time, two_tool_rounds};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        idle_agents().await;
        fan_out().await;
        concurrent_runs().await;
        abort_latency().await;
    });
}

fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<usize>()
        .unwrap()
        * 4096
}

/// Five questions and five answers, as a model would have written them.
fn transcript(model: &tiller::Model) -> Vec<AgentMessage> {
    (0..5)
        .flat_map(|n| {
            let mut answer = AssistantMessage::empty(model);
            answer
                .content
                .push(tiller::tiller_ai::AssistantContent::Text(
                    tiller::tiller_ai::TextContent::new(format!(
                        "Answer number {n}, short and to the point."
                    )),
                ));
            [
                AgentMessage::user(format!("Question number {n}?")),
                AgentMessage::Llm(Message::from(answer)),
            ]
        })
        .collect()
}

async fn idle_agents() {
    const AGENTS: usize = 100_000;
    let faux = FauxProvider::new();
    let supervisor = Supervisor::start().await.unwrap();
    let settings = Arc::new(
        AgentSettings::new(faux.model()).with_system_prompt("You are a helpful assistant."),
    );
    let template = transcript(&faux.model());
    let before = rss();
    let started = Instant::now();
    for _ in 0..AGENTS {
        supervisor
            .spawn(AgentSpec::new(settings.clone()).with_messages(template.clone()))
            .await
            .unwrap();
    }
    let elapsed = started.elapsed();
    let per_agent = (rss() - before) / AGENTS;
    println!(
        "{AGENTS} idle agents with a 10-message transcript: {per_agent} bytes per agent, all included (target <= 4096); spawned at {:.0} agents/s (target >= 50,000)",
        AGENTS as f64 / elapsed.as_secs_f64()
    );
    supervisor.shutdown().await;
}

async fn fan_out() {
    const DELTAS: usize = 100_000;
    const SUBSCRIBERS: usize = 100;
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("x".repeat(DELTAS)).chunk_size(1));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())))
        .await
        .unwrap();
    let readers: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            let mut events = agent.subscribe_with_buffer(4 * DELTAS);
            tokio::spawn(async move {
                let mut received = 0u64;
                while let Some(envelope) = events.next().await {
                    received += 1;
                    if matches!(
                        envelope.event,
                        Delivered::Event(AgentEvent::AgentEnd { .. })
                    ) {
                        break;
                    }
                }
                received
            })
        })
        .collect();
    let started = Instant::now();
    agent.prompt("go").await.unwrap();
    let mut deliveries = 0;
    for reader in readers {
        deliveries += reader.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "one agent streaming {DELTAS} deltas to {SUBSCRIBERS} subscribers: {:.1} million deliveries/s ({deliveries} in {:.0} ms) (target >= 5 million/s)",
        deliveries as f64 / elapsed / 1e6,
        elapsed * 1e3
    );
    supervisor.shutdown().await;
}

async fn concurrent_runs() {
    const AGENTS: usize = 10_000;
    let tools = add_tool();
    // The bare loop, one run after another: what a run costs without the runtime.
    let bare = {
        for _ in 0..1_000 {
            bare_run(&tools).await;
        }
        let started = cpu_time();
        for _ in 0..AGENTS {
            bare_run(&tools).await;
        }
        (cpu_time() - started) / AGENTS as u32
    };
    let supervisor = Supervisor::start().await.unwrap();
    let mut agents = Vec::with_capacity(AGENTS);
    for _ in 0..AGENTS {
        let settings = AgentSettings::new(two_tool_rounds().model())
            .with_system_prompt("Use the tools.")
            .with_tools(tools.clone());
        agents.push(supervisor.spawn(AgentSpec::new(settings)).await.unwrap());
    }
    let started = cpu_time();
    let wall = Instant::now();
    for agent in &agents {
        agent.prompt("What is (2 + 3) + 8?").await.unwrap();
    }
    for agent in &agents {
        agent.wait_for_idle().await;
    }
    let wall = wall.elapsed();
    let per_run = (cpu_time() - started) / AGENTS as u32;
    let finished = agents
        .iter()
        .filter(|agent| agent.status() == tiller::AgentStatus::Idle)
        .count();
    let complete = futures::future::join_all(agents.iter().map(|a| a.state()))
        .await
        .into_iter()
        .filter(|state| state.as_ref().map(|s| s.messages.len()) == Ok(6))
        .count();
    println!(
        "{AGENTS} agents running at once (3 model calls, 2 tool rounds): {complete} of {finished} finished complete in {:.0} ms; {:.1} µs CPU per run, bare loop {:.1} µs: runtime overhead {:.1} µs (target <= 100 µs)",
        wall.as_secs_f64() * 1e3,
        micros(per_run),
        micros(bare),
        micros(per_run.saturating_sub(bare))
    );
    supervisor.shutdown().await;
}

async fn bare_run(tools: &ToolSet) {
    let faux = two_tool_rounds();
    let context = tiller::tiller_core::AgentContext {
        system_prompt: Some("Use the tools.".into()),
        messages: Vec::new(),
        tools: tools.clone(),
    };
    let config = tiller::tiller_core::LoopConfig::new(faux.model());
    let messages = tiller::tiller_core::agent_loop(
        vec![AgentMessage::user("What is (2 + 3) + 8?")],
        context,
        config,
        Default::default(),
    )
    .result()
    .await;
    assert_eq!(messages.len(), 6);
}

async fn abort_latency() {
    const ROUNDS: usize = 2_000;
    let waits = FnTool::new(
        "wait",
        "Waits to be cancelled",
        json!({"type": "object"}),
        |_, ctx| async move {
            ctx.cancel().cancelled().await;
            Err(tiller::ToolError::new("cancelled"))
        },
    );
    let faux = FauxProvider::new();
    faux.respond_with(|_| FauxTurn::tool_call("wait", json!({})));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::new(faux.model()).with_tools(
            ToolSet::new([Arc::new(waits) as Arc<dyn AgentTool>]).unwrap(),
        )))
        .await
        .unwrap();
    let mut latencies = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let mut events = agent.subscribe();
        agent.prompt("wait").await.unwrap();
        while let Some(envelope) = events.next().await {
            if matches!(
                envelope.event,
                Delivered::Event(AgentEvent::ToolExecutionStart { .. })
            ) {
                break;
            }
        }
        let started = Instant::now();
        agent.abort();
        agent.wait_for_idle().await;
        latencies.push(started.elapsed());
        agent.set_messages(Vec::new()).await.unwrap();
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "abort() to idle while a tool runs, {ROUNDS} rounds: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs (target p99 < 1000 µs)",
        micros(at(0.5)),
        micros(at(0.99)),
        micros(latencies[latencies.len() - 1])
    );
    supervisor.shutdown().await;
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
