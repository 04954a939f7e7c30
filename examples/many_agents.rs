//! Thousands of supervised agents running at once.
//!
//! ```text
//! cargo run --release --example many_agents -- 10000
//! ```
//!
//! Spawns the given number of agents (1,000 by default), each named `worker-N` and
//! given a `lookup` tool, on Tiller's scripted `faux` model. Every agent runs a prompt
//! concurrently: a model call, a tool call, and the answer. The program then finds an
//! agent by name, lists the agents by status, and shuts them all down. The scripted
//! model keeps the demo about the runtime; swap in `tiller::ai::env::from_env()` to
//! run a handful against a real one.

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentSettings, AgentSpec, AgentTool, FnTool, Model, Supervisor, ToolOutput, ToolSet,
    ai::Message,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let count: usize = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|_| format!("not a number of agents: {arg:?}"))?,
        None => 1_000,
    };
    let lookup = FnTool::new(
        "lookup",
        "Look up a record by number.",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        |args, _ctx| async move { Ok(ToolOutput::text(format!("record {}", args["n"]))) },
    );
    // Settings are shared: every agent starts from the same `Arc`.
    let settings = Arc::new(
        AgentSettings::new(scripted_model())
            .with_system_prompt("Look records up with the lookup tool.")
            .with_tools(ToolSet::new([Arc::new(lookup) as Arc<dyn AgentTool>])?),
    );

    let supervisor = Supervisor::start().await?;
    let started = Instant::now();
    let mut agents = Vec::with_capacity(count);
    for n in 0..count {
        let spec = AgentSpec::new(Arc::clone(&settings)).with_name(format!("worker-{n}"));
        agents.push(supervisor.spawn(spec).await?);
    }
    println!("spawned {count} agents in {:.1?}", started.elapsed());

    let started = Instant::now();
    let outcomes = join_all(
        agents
            .iter()
            .enumerate()
            .map(|(n, agent)| agent.run(format!("Fetch record {n}."))),
    )
    .await;
    let failed = outcomes.iter().filter(|outcome| outcome.is_err()).count();
    println!(
        "ran {count} agents concurrently in {:.1?} ({failed} failed)",
        started.elapsed()
    );

    let name = format!("worker-{}", count / 2);
    if let Some(agent) = supervisor.find(&name) {
        let state = agent.state().await?;
        let answer = state.messages.last().and_then(|m| m.as_assistant());
        println!(
            "{name}: {} messages, last answer {:?}",
            state.messages.len(),
            answer.map(|a| a.text()).unwrap_or_default()
        );
    }

    let mut by_status = BTreeMap::new();
    for info in supervisor.list() {
        *by_status.entry(format!("{:?}", info.status)).or_insert(0) += 1;
    }
    println!("agents by status: {by_status:?}");

    let started = Instant::now();
    supervisor.shutdown().await;
    println!("shut down in {:.1?}", started.elapsed());
    Ok(())
}

/// A scripted model: it looks up the number in the prompt, then reports the record.
fn scripted_model() -> Model {
    let faux = FauxProvider::new();
    faux.respond_with(|request| match request.context.messages.last() {
        Some(Message::ToolResult(result)) => {
            FauxTurn::text(format!("Found {}.", result.text_content()))
        }
        _ => {
            let prompt = request.last_user_text().unwrap_or_default();
            let n: u64 = prompt
                .trim_end_matches('.')
                .rsplit(' ')
                .next()
                .and_then(|word| word.parse().ok())
                .unwrap_or_default();
            FauxTurn::tool_call("lookup", json!({"n": n}))
        }
    });
    faux.model()
}
