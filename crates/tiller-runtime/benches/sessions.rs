//! The session store's figures, on SQLite (a file under the temp directory):
//!
//! 1. agents spawned with a 10-message transcript each into SQLite, then
//!    hibernated: live heap per hibernated agent (target <= 512 B; counted by the
//!    allocator, so memory the allocator keeps after a stopped actor is not
//!    counted), resident set of the whole process (target <= 1.5 GiB at 1,000,000
//!    agents), spawn rate (target >= 20,000 agents/s);
//! 2. thaw of one hibernated agent (a state request that brings it back from the
//!    store): p50 (target <= 300 µs) and p99 (target <= 2 ms), asked from a task
//!    on the agent's shard as `tiller serve`'s handler asks, and (for comparison)
//!    from a task on the host's runtime and from outside any runtime, each of
//!    which adds hand-offs between threads; timed
//!    once the spawns' writes are checkpointed into the database file and synced.
//!
//! Each phase also prints the share of the machine's CPU time that a hypervisor
//! stole meanwhile (`/proc/stat`). On a virtual machine, the host's own handling
//! of the gigabytes just written can take a third of the CPU time for some seconds
//! after the spawns, and the thaws' p99 follows it: a round of thaws that saw 5%
//! or more stolen is timed again a second later on other agents (at most 20
//! rounds), and the rounds timed again are printed with their share.
//!
//! ```text
//! cargo bench -p tiller-runtime --bench sessions              # 1,000,000 agents
//! cargo bench -p tiller-runtime --bench sessions -- 100000    # fewer
//! ```

#![allow(clippy::unwrap_used)]

#[global_allocator]
static HEAP: tiller_test_support::heap::Counting = tiller_test_support::heap::Counting;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tiller_ai::faux::FauxProvider;
use tiller_runtime::{
    AgentHandle, AgentSettings, AgentSpec, AgentStatus, Supervisor, SupervisorConfig,
};
use tiller_store::SqlStore;
use tiller_test_support::workload::{CpuTicks, rss, transcript};

fn main() {
    let agents: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(1_000_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(hibernated_agents(agents));
}

async fn hibernated_agents(count: usize) {
    const AT_ONCE: usize = 2_000;
    let dir = std::env::temp_dir().join(format!("tiller-bench-sessions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("sessions.db").display());
    let store = Arc::new(SqlStore::open(&url).await.unwrap());
    let config = SupervisorConfig {
        hibernate_after: Some(Duration::ZERO),
        ..SupervisorConfig::default()
    };
    let supervisor = Supervisor::with_store(config, store.clone()).await.unwrap();
    let faux = FauxProvider::new();
    let settings = Arc::new(
        AgentSettings::new(faux.model()).with_system_prompt("You are a helpful assistant."),
    );
    let template = transcript(&faux.model());

    let before = tiller_test_support::heap::live();
    let ticks = CpuTicks::now();
    let started = Instant::now();
    // Spawns arrive continuously, `AT_ONCE` of them in flight at any time.
    let mut spawns = futures::stream::iter(0..count)
        .map(|n| {
            supervisor.spawn(
                AgentSpec::new(settings.clone())
                    .with_id(format!("agent-{n}"))
                    .with_messages(template.clone()),
            )
        })
        .buffer_unordered(AT_ONCE);
    while let Some(handle) = spawns.next().await {
        handle.unwrap();
    }
    let rate = count as f64 / started.elapsed().as_secs_f64();
    let stolen = CpuTicks::now().stolen_since(ticks);
    // Every agent hibernates as soon as it is idle.
    while supervisor
        .list()
        .iter()
        .any(|info| info.status != AgentStatus::Hibernated)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let per_agent = tiller_test_support::heap::live().saturating_sub(before) / count;
    println!(
        "{count} agents with a 10-message transcript spawned into SQLite and hibernated: {rate:.0} agents/s (target >= 20,000; CPU time stolen by the hypervisor meanwhile: {stolen:.0}%); {per_agent} bytes of live heap per hibernated agent (target <= 512); process RSS {:.2} GiB (target <= 1.5 GiB at 1,000,000)",
        rss() as f64 / (1u64 << 30) as f64
    );

    // The thaws are timed with the spawns' writes settled: copied from the WAL
    // into the database file and on disk, not beside a checkpoint or the
    // kernel's writeback of gigabytes of them.
    store.checkpoint().await.unwrap();
    for file in ["sessions.db", "sessions.db-wal"] {
        if let Ok(file) = std::fs::File::open(dir.join(file)) {
            file.sync_all().unwrap();
        }
    }
    // From a task on the agent's shard, as `tiller serve`'s handler asks (it
    // serves a connection naming an agent there); from a task on the host's
    // runtime, as an embedding program's handler asks, which adds a hand-off to
    // the shard and one back; and from outside any runtime (this thread, in
    // `block_on`), which adds one to a worker thread too. A round whose CPU time
    // a hypervisor stole from is timed again a second later, on other agents.
    const ROUNDS: usize = 20;
    let mut stolen_before = Vec::new();
    for round in 0..ROUNDS {
        let sampled: Vec<String> = (round..count)
            .step_by((count / 1_000).max(1))
            .take(1_000)
            .map(|n| format!("agent-{n}"))
            .collect();
        let third = sampled.len() / 3;
        let (beside, rest) = sampled.split_at(third);
        let (inside, outside) = rest.split_at(third);
        let ticks = CpuTicks::now();
        let mut on_shard = Vec::with_capacity(beside.len());
        for id in beside {
            let agent = supervisor.get(id).unwrap();
            let thawing = agent.clone();
            on_shard.push(
                agent
                    .spawn_beside(async move { thaw(&thawing).await })
                    .await
                    .unwrap(),
            );
        }
        on_shard.sort();
        let on_runtime = {
            let (supervisor, ids) = (supervisor.clone(), inside.to_vec());
            tokio::spawn(async move { thaws(&supervisor, &ids).await })
                .await
                .unwrap()
        };
        let off_runtime = thaws(&supervisor, outside).await;
        let stolen = CpuTicks::now().stolen_since(ticks);
        if stolen >= 5.0 && round + 1 < ROUNDS {
            stolen_before.push(format!("{stolen:.0}%"));
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        println!(
            "thaw of a hibernated agent (state() from the store), {} agents from a task on the agent's shard: p50 {:.0} µs (target <= 300 µs), p99 {:.0} µs (target <= 2000 µs); {} from a task on the host's runtime: p50 {:.0} µs, p99 {:.0} µs; {} from outside the runtime: p50 {:.0} µs, p99 {:.0} µs (CPU time stolen by the hypervisor meanwhile: {stolen:.0}%; rounds timed again before, with the share stolen: [{}])",
            beside.len(),
            quantile(&on_shard, 0.5),
            quantile(&on_shard, 0.99),
            inside.len(),
            quantile(&on_runtime, 0.5),
            quantile(&on_runtime, 0.99),
            outside.len(),
            quantile(&off_runtime, 0.5),
            quantile(&off_runtime, 0.99),
            stolen_before.join(", "),
        );
        break;
    }
    supervisor.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// How long `state()` took for each of `ids`, all hibernated, sorted.
async fn thaws(supervisor: &Supervisor, ids: &[String]) -> Vec<Duration> {
    let mut latencies = Vec::new();
    for id in ids {
        latencies.push(thaw(&supervisor.get(id).unwrap()).await);
    }
    latencies.sort();
    latencies
}

/// How long `state()` took for `agent`, hibernated.
async fn thaw(agent: &AgentHandle) -> Duration {
    let started = Instant::now();
    let state = agent.state().await.unwrap();
    let took = started.elapsed();
    assert_eq!(state.messages.len(), 10);
    took
}

/// The `q` quantile of sorted `latencies`, in microseconds.
fn quantile(latencies: &[Duration], q: f64) -> f64 {
    let at = ((latencies.len() as f64 * q) as usize).min(latencies.len() - 1);
    latencies[at].as_secs_f64() * 1e6
}
