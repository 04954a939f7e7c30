//! The cluster on loopback: a three-node NATS cluster with JetStream, a
//! PostgreSQL server, three hosts (`tiller serve --cluster`'s server, each a
//! process of its own: this executable started again) and a model server in a
//! process of its own that streams as a model does. The clients are this
//! process. CPU is read per process from `/proc` (hosts and NATS nodes apart),
//! over each measured stretch alone.
//!
//! 1. **Forwarding**: prompts to 300 idle agents of one host, each sent once to
//!    its owner and once to another host, one at a time: the added latency (p50,
//!    p99; targets 1 ms and 5 ms) and the added CPU per prompt, hosts and NATS
//!    (target 200 µs).
//! 2. **Streaming**: 1,000 agents spread over the hosts, each followed by an SSE
//!    client on another host than its owner; each answers one prompt, 32 tokens
//!    30 ms apart, each token the time it left the model: the time from a token
//!    to its client (p99 target 20 ms), every stream checked complete and in
//!    order, and the CPU per event delivered.
//! 3. **Failover**: 1,000 agents running on one host, which is killed: the time
//!    until the others hold every one of them again (target TTL + 10 s).
//! 4. **Lease renewal**: 100,000 agents owned by one host (spawned hibernated):
//!    the CPU and the NATS messages per second their leases cost while held,
//!    beside what renewing each lease on its own would cost (one round of
//!    100,000 compare-and-set writes, timed).
//!
//! ```text
//! cargo bench -p tiller-cluster --bench cluster [-- --only forward|stream|failover|renewal] [--agents N] [--owned N]
//! ```
//!
//! `TILLER_BENCH_DURABLE_WINDOW_MS`, `TILLER_BENCH_LIVE_INTERVAL_MS` and
//! `TILLER_BENCH_DELIVERY_WINDOW_MS` set the hosts' `ClusterConfig::durable_window`,
//! `live_interval` and `delivery_window`, to compare them.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use tiller::agents::agent_file::AgentFile;
use tiller::{Definitions, Supervisor, SupervisorConfig};
use tiller_cluster::{ClusterConfig, NatsSecurity};
use tiller_server::{Quotas, Server, ServerConfig};
use tiller_test_support::nats::{NatsCluster, NatsUser};
use tiller_test_support::paced::{self, PacedProcess, STAMPED_TOKENS};
use tiller_test_support::postgres::postgres_url;
use tiller_test_support::workload::{CpuTicks, monotonic_ns, runtimes};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Set in a host's environment: `ID NATS_URLS STORE MODEL_PORT HIBERNATE`.
const HOST: &str = "TILLER_BENCH_CLUSTER_HOST";
/// The time between two tokens of a streamed reply, in µs.
const SPACING_US: u64 = 30_000;
/// The lease TTL (the default).
const TTL: Duration = Duration::from_secs(15);

/// The agent files: one per model behaviour of the paced server.
fn definitions(model_port: u16) -> Definitions {
    let mut definitions = Definitions::new();
    for (name, model) in [
        ("fast", "whole".to_owned()),
        ("stamped", format!("stamped-{SPACING_US}")),
        ("slow", "spaced-400000".to_owned()),
    ] {
        let file = format!(
            "type: object\ndescription: You answer.\njson_schema_extra:\n  kind: agent\n  name: {name}\n  model: {{provider: openai, id: \"{model}\", base_url: \"http://127.0.0.1:{model_port}/v1\"}}\n"
        );
        definitions
            .insert(AgentFile::parse(format!("{name}.yaml"), &file).unwrap())
            .unwrap();
    }
    definitions
}

/// A host's process: serves until killed, its base URL on stdout.
fn host(given: &str) {
    let parts: Vec<&str> = given.split(' ').collect();
    let [id, nats_dir, store, model_port, hibernate] = parts[..] else {
        panic!("{given}");
    };
    let runtime = two_workers();
    runtime.block_on(async {
        let store = tiller::store::open(store).await.unwrap();
        let config = SupervisorConfig {
            hibernate_after: (hibernate == "1").then_some(Duration::ZERO),
            ..SupervisorConfig::default()
        };
        let supervisor = Supervisor::with_store(config, store).await.unwrap();
        let open = 1_000_000;
        // One open tenant holds every agent and stream here: no quotas.
        let config = ServerConfig {
            tenant_quotas: Quotas::default(),
            user_quotas: Quotas::default(),
            max_streams_per_caller: open,
            max_connections: open,
            max_connections_per_address: open,
            ..ServerConfig::default()
        };
        let user = NatsUser::read(std::path::Path::new(nats_dir), "tiller");
        let mut cluster = ClusterConfig::new(user.urls.into_iter().map(Into::into).collect(), id);
        cluster.security = NatsSecurity::mutual_tls(user.ca, user.cert, user.key);
        // To compare settings: `TILLER_BENCH_DURABLE_WINDOW_MS`,
        // `TILLER_BENCH_LIVE_INTERVAL_MS`, `TILLER_BENCH_DELIVERY_WINDOW_MS`.
        let millis = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis)
        };
        if let Some(window) = millis("TILLER_BENCH_DURABLE_WINDOW_MS") {
            cluster.durable_window = window;
        }
        if let Some(interval) = millis("TILLER_BENCH_LIVE_INTERVAL_MS") {
            cluster.live_interval = interval;
        }
        if let Some(window) = millis("TILLER_BENCH_DELIVERY_WINDOW_MS") {
            cluster.delivery_window = window;
        }
        let server = Server::clustered(
            supervisor,
            definitions(model_port.parse().unwrap()),
            config,
            cluster,
        )
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("http://{}", listener.local_addr().unwrap());
        server
            .serve(listener, std::future::pending())
            .await
            .unwrap();
    });
}

/// CPU time of process `pid` so far (user and system), from `/proc`.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's name: state (the 3rd field), … utime (14th), stime (15th).
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((field(14) + field(15)) * 10)
}

/// The CPU of a set of processes, read before and after a stretch.
struct Clock {
    pids: Vec<u32>,
    start: Vec<Duration>,
}

impl Clock {
    fn start(pids: &[u32]) -> Clock {
        Clock {
            pids: pids.to_vec(),
            start: pids.iter().map(|pid| cpu_of(*pid)).collect(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.pids
            .iter()
            .zip(&self.start)
            .map(|(pid, start)| cpu_of(*pid).saturating_sub(*start))
            .sum()
    }
}

struct Host {
    id: String,
    base: String,
    child: tokio::process::Child,
}

impl Host {
    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

/// The bench's world.
struct World {
    nats: NatsCluster,
    store: String,
    model: PacedProcess,
    hosts: Vec<Host>,
    http: reqwest::Client,
}

impl World {
    async fn start(hosts: usize, hibernate: bool) -> World {
        let store =
            postgres_url().expect("the bench needs PostgreSQL: scripts/postgres.sh install");
        let nats = NatsCluster::start(3).expect("the bench needs NATS: scripts/nats.sh install");
        let model = PacedProcess::start();
        let mut world = World {
            nats,
            store,
            model,
            hosts: Vec::new(),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(4_096)
                .build()
                .unwrap(),
        };
        for n in 1..=hosts {
            world.add(&format!("h{n}"), hibernate).await;
        }
        world
    }

    async fn add(&mut self, id: &str, hibernate: bool) {
        let given = format!(
            "{id} {} {} {} {}",
            self.nats.dir.display(),
            self.store,
            self.model.port,
            u8::from(hibernate)
        );
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .env(HOST, given)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut said = BufReader::new(child.stdout.take().unwrap()).lines();
        let base = said.next_line().await.unwrap().unwrap();
        self.hosts.push(Host {
            id: id.to_owned(),
            base,
            child,
        });
    }

    fn hosts_pids(&self) -> Vec<u32> {
        self.hosts.iter().map(Host::pid).collect()
    }

    fn nats_pids(&self) -> Vec<u32> {
        (1..=3)
            .filter_map(|n| self.nats.pid(&format!("n{n}")))
            .map(|pid| pid as u32)
            .collect()
    }

    async fn post(&self, host: usize, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.hosts[host].base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `count` agents of `definition` created on `host`, `parallel` at a time.
    async fn create(
        &self,
        host: usize,
        definition: &str,
        count: usize,
        parallel: usize,
    ) -> Vec<String> {
        futures::stream::iter(0..count)
            .map(|_| async move {
                let (status, agent) = self
                    .post(host, "/agents", json!({"definition": definition}))
                    .await;
                assert_eq!(status, 201, "{agent}");
                agent["id"].as_str().unwrap().to_owned()
            })
            .buffer_unordered(parallel)
            .collect()
            .await
    }

    async fn metrics(&self, host: usize) -> HashMap<String, f64> {
        let Ok(response) = self
            .http
            .get(format!("{}/metrics", self.hosts[host].base))
            .send()
            .await
        else {
            return HashMap::new();
        };
        response
            .text()
            .await
            .unwrap_or_default()
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// The counters `names`, each summed over the three hosts' `/metrics`.
    async fn totals<const N: usize>(&self, names: [&str; N]) -> [f64; N] {
        let mut totals = [0.0; N];
        for host in 0..3 {
            let figures = self.metrics(host).await;
            for (total, name) in totals.iter_mut().zip(names) {
                *total += figures.get(name).copied().unwrap_or(0.0);
            }
        }
        totals
    }

    /// Waits until no agent of `host`'s list runs.
    async fn idle(&self, host: usize) {
        loop {
            let listed: Value = self
                .http
                .get(format!("{}/agents", self.hosts[host].base))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if listed
                .as_array()
                .unwrap()
                .iter()
                .all(|agent| agent["status"] != "running")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// 1: a prompt sent to the owner, and to another host.
async fn forwarding() {
    let world = World::start(3, false).await;
    let agents = world.create(0, "fast", 300, 16).await;
    const WARMED: usize = 10;
    // Warm: every host has reached every agent once.
    for agent in agents.iter().take(WARMED) {
        for host in 0..3 {
            world
                .post(
                    host,
                    &format!("/agents/{agent}/prompt?wait=true"),
                    json!({"text": "warm"}),
                )
                .await;
        }
    }
    world.idle(0).await;
    // Rounds alternate between the owner and another host, so that drift in
    // the machine's load falls on both alike.
    let mut figures = vec![(Vec::new(), Duration::ZERO, Duration::ZERO); 2];
    for _round in 0..3 {
        for (kind, host) in [(0, 0), (1, 1)] {
            let hosts = Clock::start(&world.hosts_pids());
            let nats = Clock::start(&world.nats_pids());
            for agent in &agents {
                let started = Instant::now();
                let (status, problem) = world
                    .post(
                        host,
                        &format!("/agents/{agent}/prompt"),
                        json!({"text": "Hi"}),
                    )
                    .await;
                figures[kind].0.push(started.elapsed().as_secs_f64() * 1e3);
                assert_eq!(status, 202, "{problem}");
            }
            world.idle(0).await;
            figures[kind].1 += hosts.elapsed();
            figures[kind].2 += nats.elapsed();
        }
    }
    let prompts = (agents.len() * 3) as f64;
    // The batches and leases were written for the warm prompts too.
    let all_prompts = prompts + (WARMED * 3) as f64;
    let written = world
        .totals([
            "tiller_cluster_live_batches_total",
            "tiller_cluster_stream_batches_total",
            "tiller_cluster_lease_writes_total",
        ])
        .await;
    println!(
        "forward: per prompt: {:.1} live batches, {:.1} stream batches, {:.2} lease writes",
        written[0] / all_prompts,
        written[1] / all_prompts,
        written[2] / all_prompts
    );
    for (name, (latencies, hosts, nats)) in ["owner", "another host"].iter().zip(&mut figures) {
        latencies.sort_by(f64::total_cmp);
        println!(
            "forward: a prompt to {name}: p50 {:.2} ms, p99 {:.2} ms; CPU per prompt (its run included): hosts {:.0} µs, NATS {:.0} µs",
            quantile(latencies, 0.5),
            quantile(latencies, 0.99),
            micros(*hosts) / prompts,
            micros(*nats) / prompts,
        );
    }
    let (floor, floor_cpu) = request_floor(&world, agents.len() * 3).await;
    println!(
        "forward: floor, a bare NATS request and reply of the same size between connections to two nodes: p50 {:.2} ms, p99 {:.2} ms; CPU {:.0} µs each, both ends and NATS",
        quantile(&floor, 0.5),
        quantile(&floor, 0.99),
        micros(floor_cpu) / floor.len() as f64
    );
    let added = |q| quantile(&figures[1].0, q) - quantile(&figures[0].0, q);
    let cpu = |kind: usize| micros(figures[kind].1 + figures[kind].2) / prompts;
    println!(
        "forward: added by another host: latency p50 {:.2} ms (target <= 1 ms), p99 {:.2} ms (target <= 5 ms); CPU {:.0} µs per prompt, hosts and NATS (target <= 200 µs)",
        added(0.5),
        added(0.99),
        cpu(1) - cpu(0),
    );
}

/// The number a stamped token carries, from the JSON around it: the digits
/// after `key`.
fn stamp_after(data: &str, key: &str) -> Option<u64> {
    let at = data.find(key)? + key.len();
    let digits: &str = data[at..].split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// The floor of forwarding: `count` requests, one at a time, from a connection
/// to one NATS node to a responder connected to another, each the size of a
/// forwarded prompt and its answer; their latencies in ms, and the CPU of this
/// process (both ends) and of NATS.
async fn request_floor(world: &World, count: usize) -> (Vec<f64>, Duration) {
    let user = world.nats.user("tiller");
    let asker = user
        .connect(Some(0), async_nats::ConnectOptions::new())
        .await
        .unwrap();
    let answerer = user
        .connect(Some(1), async_nats::ConnectOptions::new())
        .await
        .unwrap();
    let mut asked = answerer.subscribe("tiller.bench.floor").await.unwrap();
    let answering = tokio::spawn(async move {
        while let Some(message) = asked.next().await {
            if let Some(reply) = message.reply {
                answerer
                    .publish(
                        reply,
                        bytes::Bytes::from_static(br#"{"ok":{"type":"done"}}"#),
                    )
                    .await
                    .unwrap();
            }
        }
    });
    let request = bytes::Bytes::from(
        json!({"type": "submit", "op": {"type": "prompt", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}], "timestamp": 0}]}, "key": "01a2140f-5a0e-7c3d-8f5e-2b1c4d5e6f70"})
            .to_string(),
    );
    // The subscription reaches the other node a moment later.
    while asker
        .request("tiller.bench.floor", request.clone())
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut pids = world.nats_pids();
    pids.push(std::process::id());
    let clock = Clock::start(&pids);
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        asker
            .request("tiller.bench.floor", request.clone())
            .await
            .unwrap();
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let cpu = clock.elapsed();
    answering.abort();
    latencies.sort_by(f64::total_cmp);
    (latencies, cpu)
}

/// Reads one SSE stream of an agent to its `agent_end`: events, whether any was
/// missing or out of order, and each token's latency in ms (from its stamp to
/// the read of the chunk holding it). Only what it checks is looked at: the
/// clients share the machine with what they measure.
async fn read(response: reqwest::Response) -> (u64, bool, Vec<f64>) {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let (mut events, mut broken, mut latencies) = (0u64, false, Vec::new());
    let mut expected: Option<u64> = None;
    while let Some(chunk) = body.next().await {
        let read_at = monotonic_ns();
        let Ok(chunk) = chunk else { break };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(str::trim_start)
            };
            let (Some(id), Some(kind), Some(data)) =
                (field("id:"), field("event:"), field("data:"))
            else {
                continue;
            };
            let seq: u64 = id.parse().unwrap();
            // A new owner numbers on from past the live lead.
            broken |= kind != "owner_changed" && expected.is_some_and(|expected| expected != seq);
            expected = Some(seq + 1);
            events += 1;
            match kind {
                "lagged" => broken = true,
                "agent_end" => return (events, broken, latencies),
                "message_update" if data.contains("\"text_delta\"") => {
                    if let Some(stamp) = stamp_after(data, "\"delta\":\"") {
                        latencies.push(read_at.saturating_sub(stamp) as f64 / 1e6);
                    }
                }
                _ => {}
            }
        }
    }
    (events, true, latencies)
}

/// Reads one streamed answer straight from the model server: each token's
/// latency in ms.
async fn read_model(response: reqwest::Response) -> Vec<f64> {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut latencies = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        let read_at = monotonic_ns();
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if let Some(stamp) = stamp_after(&block, "\"content\":\"") {
                latencies.push(read_at.saturating_sub(stamp) as f64 / 1e6);
            }
        }
    }
    latencies
}

/// The floor of the streaming figure: the same answers, started at the same
/// rate, read by the same client code straight from the model server (no
/// Tiller, no NATS): what the machine and the harness cost alone.
async fn stream_floor(world: &World, count: usize) -> (Vec<f64>, Duration) {
    let url = format!("http://127.0.0.1:{}/v1/chat/completions", world.model.port);
    let body = json!({
        "model": format!("stamped-{SPACING_US}"),
        "stream": true,
        "messages": [{"role": "user", "content": "Hi"}],
    })
    .to_string();
    let others = Clock::start(&[std::process::id(), world.model.pid()]);
    let mut ticks = tokio::time::interval(Duration::from_millis(2));
    let mut readers = Vec::new();
    for _ in 0..count {
        ticks.tick().await;
        let request = world
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send();
        readers.push(tokio::spawn(async move {
            read_model(request.await.unwrap()).await
        }));
    }
    let mut latencies = Vec::new();
    for reader in readers {
        latencies.extend(reader.await.unwrap());
    }
    latencies.sort_by(f64::total_cmp);
    (latencies, others.elapsed())
}

/// 2: 1,000 agents streaming, each to a client on another host.
async fn streaming(agents_count: usize) {
    let world = World::start(3, false).await;
    let (floor, floor_cpu) = stream_floor(&world, agents_count).await;
    let mut agents = Vec::new();
    for host in 0..3 {
        let made = world
            .create(
                host,
                "stamped",
                agents_count / 3 + usize::from(host < agents_count % 3),
                32,
            )
            .await;
        agents.extend(made.into_iter().map(|agent| (agent, host)));
    }
    // Warm: each host has made a model call (its HTTP client built, its
    // connections to the model server open), as a host in service has.
    for host in 0..3 {
        let warm = world.create(host, "fast", 1, 1).await;
        world
            .post(
                host,
                &format!("/agents/{}/prompt?wait=true", warm[0]),
                json!({"text": "warm"}),
            )
            .await;
    }
    let mut readers = Vec::new();
    for (agent, owner) in &agents {
        let follower = (owner + 1) % 3;
        let response = world
            .http
            .get(format!(
                "{}/agents/{agent}/events",
                world.hosts[follower].base
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        readers.push(tokio::spawn(read(response)));
    }
    let hosts = Clock::start(&world.hosts_pids());
    let nats = Clock::start(&world.nats_pids());
    let others = Clock::start(&[std::process::id(), world.model.pid()]);
    let machine = CpuTicks::now();
    let started = Instant::now();
    // 500 prompts a second, each to the agent's owner.
    let mut ticks = tokio::time::interval(Duration::from_millis(2));
    let mut prompts = Vec::new();
    for (agent, owner) in &agents {
        ticks.tick().await;
        let request = world
            .http
            .post(format!(
                "{}/agents/{agent}/prompt",
                world.hosts[*owner].base
            ))
            .header("content-type", "application/json")
            .body(json!({"text": "Hi"}).to_string())
            .send();
        prompts.push(tokio::spawn(async move {
            assert_eq!(request.await.unwrap().status(), 202);
        }));
    }
    for prompt in prompts {
        prompt.await.unwrap();
    }
    let (mut delivered, mut broken, mut latencies) = (0u64, 0u64, Vec::new());
    for reader in readers {
        let (events, bad, seen) = reader.await.unwrap();
        delivered += events;
        broken += u64::from(bad);
        latencies.extend(seen);
    }
    let wall = started.elapsed();
    let (hosts, nats, others) = (hosts.elapsed(), nats.elapsed(), others.elapsed());
    let written = world
        .totals([
            "tiller_cluster_live_batches_total",
            "tiller_cluster_stream_batches_total",
        ])
        .await;
    let busy = CpuTicks::now().busy_since(machine);
    latencies.sort_by(f64::total_cmp);
    println!(
        "stream: {} agents, {STAMPED_TOKENS} tokens {} ms apart each, a client each on another host than the owner: {:.1} s; {delivered} events delivered, {broken} streams broken",
        agents.len(),
        SPACING_US / 1_000,
        wall.as_secs_f64()
    );
    println!(
        "stream: a token from the model to its client: p50 {:.2} ms, p99 {:.2} ms (target <= 20 ms), max {:.2} ms",
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.99),
        quantile(&latencies, 1.0)
    );
    println!(
        "stream: floor, the same streams read straight from the model server: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; the clients and the model server {:.1} µs per token",
        quantile(&floor, 0.5),
        quantile(&floor, 0.99),
        quantile(&floor, 1.0),
        micros(floor_cpu) / floor.len() as f64
    );
    println!(
        "stream: NATS messages per event delivered: {:.2} on the hosts' buses, {:.3} batches to the stream",
        written[0] / delivered as f64,
        written[1] / delivered as f64,
    );
    println!(
        "stream: CPU per event delivered (the owner's run, its batches to JetStream, the follower's consumer and SSE): hosts {:.1} µs, NATS {:.1} µs; the clients and the model server {:.1} µs; the machine was {busy:.0}% busy",
        micros(hosts) / delivered as f64,
        micros(nats) / delivered as f64,
        micros(others) / delivered as f64,
    );
}

/// 3: 1,000 running agents whose host is killed.
async fn failover(agents_count: usize) {
    let mut world = World::start(3, false).await;
    let agents = world.create(2, "slow", agents_count, 32).await;
    futures::stream::iter(&agents)
        .map(|agent| {
            let world = &world;
            async move {
                let (status, problem) = world
                    .post(
                        2,
                        &format!("/agents/{agent}/prompt"),
                        json!({"text": "a long answer"}),
                    )
                    .await;
                assert_eq!(status, 202, "{problem}");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    let mut killed = world.hosts.remove(2);
    killed.child.start_kill().unwrap();
    let at = Instant::now();
    let _ = killed.child.wait().await;
    loop {
        let mut failovers = 0.0;
        for host in 0..2 {
            failovers += world
                .metrics(host)
                .await
                .get("tiller_cluster_failovers_total")
                .copied()
                .unwrap_or(0.0);
        }
        if failovers as usize >= agents.len() {
            break;
        }
        assert!(
            at.elapsed() < Duration::from_secs(120),
            "{failovers} taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "failover: {} running agents of a killed host held again by the others after {:.1} s (target <= TTL + 10 s = {} s)",
        agents.len(),
        at.elapsed().as_secs_f64(),
        (TTL + Duration::from_secs(10)).as_secs()
    );
    let _ = killed.id;
}

/// 4: what holding 100,000 leases costs, and what renewing each would.
async fn renewal(owned: usize) {
    let world = World::start(1, true).await;
    let made = Instant::now();
    let agents = world.create(0, "fast", owned, 128).await;
    println!(
        "renewal: {} agents spawned (hibernated) on one host in {:.1} s",
        agents.len(),
        made.elapsed().as_secs_f64()
    );
    let messages = |world: &World| {
        let http = world.http.clone();
        let ports: Vec<u16> = (1..=3)
            .filter_map(|n| world.nats.monitor_port(&format!("n{n}")))
            .collect();
        async move {
            let mut total = 0.0;
            for port in ports {
                let varz: Value = http
                    .get(format!("http://127.0.0.1:{port}/varz"))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                total += varz["in_msgs"].as_f64().unwrap_or(0.0);
            }
            total
        }
    };
    let hold = Duration::from_secs(30);
    let hosts = Clock::start(&world.hosts_pids());
    let nats = Clock::start(&world.nats_pids());
    let before = messages(&world).await;
    tokio::time::sleep(hold).await;
    let sent = messages(&world).await - before;
    let (hosts, nats) = (hosts.elapsed(), nats.elapsed());
    println!(
        "renewal: holding {} leases for {} s (renewed per host): host CPU {:.1} ms/s, NATS CPU {:.1} ms/s, {:.1} NATS messages/s (all nodes, heartbeats and their replication)",
        agents.len(),
        hold.as_secs(),
        hosts.as_secs_f64() * 1e3 / hold.as_secs_f64(),
        nats.as_secs_f64() * 1e3 / hold.as_secs_f64(),
        sent / hold.as_secs_f64()
    );
    // What renewing each lease on its own would take: one round of CAS writes.
    let client = world
        .nats
        .user("tiller")
        .connect(None, async_nats::ConnectOptions::new())
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let bucket = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "bench_per_agent".to_owned(),
            history: 1,
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    let keys: Vec<String> = (0..owned).map(|n| format!("a{n}")).collect();
    let revisions: Vec<u64> = futures::stream::iter(&keys)
        .map(|key| {
            let bucket = bucket.clone();
            async move { bucket.create(key, "h1".into()).await.unwrap() }
        })
        .buffered(256)
        .collect()
        .await;
    let nats = Clock::start(&world.nats_pids());
    let started = Instant::now();
    futures::stream::iter(keys.iter().zip(revisions))
        .map(|(key, revision)| {
            let bucket = bucket.clone();
            async move { bucket.update(key, "h1".into(), revision).await.unwrap() }
        })
        .buffer_unordered(256)
        .collect::<Vec<u64>>()
        .await;
    let round = started.elapsed();
    let nats = nats.elapsed();
    let every = (TTL - Duration::from_secs(3)) / 3;
    println!(
        "renewal: renewing each of {owned} leases instead: one round took {:.1} s and {:.1} s of NATS CPU; renewing every {:?} (three tries before fencing) needs {:.0} writes/s, {:.0}% of this machine's two cores in NATS alone",
        round.as_secs_f64(),
        nats.as_secs_f64(),
        every,
        owned as f64 / every.as_secs_f64(),
        nats.as_secs_f64() / every.as_secs_f64() / 2.0 * 100.0
    );
}

/// The benches' multi-thread runtime: two workers, this machine's cores.
fn two_workers() -> tokio::runtime::Runtime {
    let [(_, mut multi), _] = runtimes();
    multi.build().unwrap()
}

fn main() {
    let reply = paced::recorded_reply();
    if paced::serve_if_asked(&reply) {
        return;
    }
    if let Ok(given) = std::env::var(HOST) {
        host(&given);
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|arg| arg == name)
            .and_then(|at| args.get(at + 1))
            .cloned()
    };
    let only = value("--only");
    let agents: usize = value("--agents").map_or(1_000, |n| n.parse().unwrap());
    let owned: usize = value("--owned").map_or(100_000, |n| n.parse().unwrap());
    let runtime = two_workers();
    runtime.block_on(async {
        let run = |name: &str| only.as_deref().is_none_or(|only| only == name);
        if run("forward") {
            forwarding().await;
        }
        if run("stream") {
            streaming(agents).await;
        }
        if run("failover") {
            failover(agents).await;
        }
        if run("renewal") {
            renewal(owned).await;
        }
    });
}
