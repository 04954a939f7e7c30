//! The loop's figures, with the scripted `faux` provider (no HTTP):
//!
//! 1. CPU per run of 3 model calls and 2 tool rounds, minus the CPU the provider
//!    spends streaming the same three responses on its own (target: at most 50 µs);
//! 2. events per second from the loop to a consumer (target: at least 1 million).
//!
//! ```text
//! cargo bench -p tiller-core --bench agent_loop
//! ```

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_ai::{Context, Message, StreamOptions, ToolCall, ToolResultMessage};
use tiller_core::{AgentMessage, LoopConfig, LoopContext, ToolSet, agent_loop};
use tiller_test_support::workload::{add_tool, cpu_time, two_tool_rounds};

const ROUNDS: usize = 15;
const RUNS_PER_ROUND: u32 = 2_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        overhead().await;
        throughput().await;
    });
}

async fn overhead() {
    let tools = add_tool();
    let contexts = provider_contexts(&tools);
    for _ in 0..2_000 {
        loop_run(&tools).await;
        provider_run(&contexts).await;
    }
    // Interleaved batches, so drift of the machine hits both sides alike.
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        let started = cpu_time();
        for _ in 0..RUNS_PER_ROUND {
            loop_run(&tools).await;
        }
        let with_loop = (cpu_time() - started) / RUNS_PER_ROUND;
        let started = cpu_time();
        for _ in 0..RUNS_PER_ROUND {
            provider_run(&contexts).await;
        }
        let provider = (cpu_time() - started) / RUNS_PER_ROUND;
        rounds.push((with_loop.saturating_sub(provider), with_loop, provider));
    }
    rounds.sort();
    let (overhead, with_loop, provider) = rounds[rounds.len() / 2];
    println!(
        "run of 3 model calls and 2 tool rounds (median of {ROUNDS} rounds): {:.1} µs CPU, of which the provider {:.1} µs: loop overhead {:.1} µs (rounds ranged {:.1} to {:.1})  (target <= 50 µs)",
        micros(with_loop),
        micros(provider),
        micros(overhead),
        micros(rounds[0].0),
        micros(rounds[rounds.len() - 1].0),
    );
}

/// One run through the loop.
async fn loop_run(tools: &ToolSet) {
    let faux = two_tool_rounds();
    let context = LoopContext {
        system_prompt: Some("Use the tools.".into()),
        messages: Vec::new(),
        tools: tools.clone(),
        ..LoopContext::default()
    };
    let prompt = AgentMessage::user("What is (2 + 3) + 8?");
    let messages = agent_loop(
        vec![prompt],
        context,
        LoopConfig::new(faux.model()),
        Default::default(),
    )
    .result()
    .await;
    assert_eq!(messages.len(), 6);
}

/// The same three responses, streamed by the provider alone.
async fn provider_run(contexts: &[Context]) {
    let faux = two_tool_rounds();
    let model = faux.model();
    for context in contexts {
        tiller_ai::stream(&model, context, &StreamOptions::default())
            .result()
            .await;
    }
}

/// What the provider is sent on each of the run's three calls.
fn provider_contexts(tools: &ToolSet) -> Vec<Context> {
    let mut context = Context::new()
        .with_system_prompt("Use the tools.")
        .with_message(Message::user("What is (2 + 3) + 8?"));
    context.tools = tools.definitions().to_vec();
    let mut contexts = vec![context.clone()];
    for (id, a, b, sum) in [("faux_call_1", 2, 3, "5"), ("faux_call_2", 5, 8, "13")] {
        let faux = FauxProvider::new();
        faux.push(FauxTurn::new().with_tool_call_id(id, "add", json!({"a": a, "b": b})));
        let reply = futures::executor::block_on(
            tiller_ai::stream(&faux.model(), &context, &StreamOptions::default()).result(),
        );
        let call = ToolCall {
            id: id.into(),
            name: "add".into(),
            arguments: json!({"a": a, "b": b}),
            arguments_error: None,
            signature: None,
        };
        context = context
            .with_message(reply)
            .with_message(ToolResultMessage::text(&call, sum, false));
        contexts.push(context.clone());
    }
    contexts
}

async fn throughput() {
    const DELTAS: usize = 500_000;
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("x".repeat(DELTAS)).chunk_size(1));
    let context = LoopContext::default();
    let started = Instant::now();
    let mut run = agent_loop(
        vec![AgentMessage::user("go")],
        context,
        LoopConfig::new(faux.model()),
        Default::default(),
    );
    let mut events = 0u64;
    while let Some(event) = run.next().await {
        std::hint::black_box(&event);
        events += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "events through the loop to a consumer: {:.2} million/s ({events} events in {:.0} ms)  (target >= 1 million/s)",
        events as f64 / elapsed / 1e6,
        elapsed * 1e3
    );
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
