//! `tiller serve` at scale: 10,000 agents created over HTTP, 1,000 SSE clients
//! attached (one to every tenth agent), and every agent answering one prompt from
//! a loopback model server in a process of its own that streams 32 tokens 30 ms
//! apart, as a model does, each token the time it was written. The prompts go out
//! at a steady rate (500 a second), so about 500 replies stream at once.
//!
//! Three processes: the model server, the server measured here (a tokio
//! multi-thread runtime with two workers, this machine's cores, and the
//! supervisor's default shards: one per core), and the clients (this executable
//! started again). The CPU clock read here is the server's alone, from the moment
//! the SSE clients are attached until every run has ended. It prints the server's
//! CPU per event of every agent (target <= 10 µs) and per event delivered to an
//! SSE client, and the time from a token leaving the model server to an SSE client
//! reading it (target p99 <= 2 ms), with every stream checked complete and in
//! order.
//!
//! First, the floor: bare tokio `TcpStream`s on a current-thread runtime, as many
//! at once as replies stream at once in the run, reading the same stream from the
//! same model server (no HTTP parsing, nothing handed on): its CPU per SSE event
//! read is printed beside the server's figures.
//!
//! Then the same again with the followed agents prompted through each protocol
//! route instead, each streamed, the agent named as that protocol names a
//! session: the OpenAI API's chat completions (`POST /v1/chat/completions`,
//! `X-Tiller-Session`) and responses (`POST /v1/responses`, `conversation`),
//! the AI SDK's UI message stream (`POST /ai-sdk/bench`, the chat's `id`) and
//! AG-UI (`POST /ag-ui/bench`, the `threadId`). Each followed agent's reply is
//! read in that protocol, and the server's CPU per event is printed beside that
//! of Tiller's own SSE route.
//!
//! ```text
//! cargo bench -p tiller-server --bench serve [-- --agents N --clients M --rate R]
//! ```

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use tiller::agents::agent_file::AgentFile;
use tiller::{Definitions, Supervisor};
use tiller_server::{Quotas, Server, ServerConfig};
use tiller_test_support::paced::{self, PacedProcess, STAMPED_TOKENS};
use tiller_test_support::workload::{cpu_time, monotonic_ns, on_current_thread, runtimes};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Set in the environment of the clients' process: the server's base URL.
const CLIENT: &str = "TILLER_BENCH_SERVE_CLIENT";
/// Set in the environment of the clients' process: the route the followed
/// agents' replies are read from ([`Route::name`]).
const ROUTE: &str = "TILLER_BENCH_SERVE_ROUTE";
/// The time between two tokens of a reply, in µs.
const SPACING_US: u64 = 30_000;
/// The SSE events of a stamped reply as the floor reads it: the role, the
/// tokens, the finish, the usage and `[DONE]`.
const STAMPED_EVENTS: usize = STAMPED_TOKENS + 4;

const AGENT: &str = "
type: object
description: You answer.
json_schema_extra: {kind: agent, name: bench}
";

/// How many agents, SSE clients and prompts per second.
#[derive(Debug, Clone, Copy)]
struct Scale {
    agents: usize,
    clients: usize,
    rate: u32,
}

impl Scale {
    /// From `--agents N --clients M --rate R` among the arguments.
    fn from_args() -> Self {
        let args: Vec<String> = std::env::args().collect();
        let value = |name: &str, default: usize| {
            args.iter()
                .position(|arg| arg == name)
                .and_then(|at| args.get(at + 1))
                .map_or(default, |value| value.parse().unwrap())
        };
        let scale = Scale {
            agents: value("--agents", 10_000),
            clients: value("--clients", 1_000),
            rate: value("--rate", 500) as u32,
        };
        assert!(
            scale.clients >= 1 && scale.clients <= scale.agents,
            "{scale:?}"
        );
        scale
    }
}

/// The route the followed agents' replies are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Tiller's own: `GET /agents/{id}/events`, attached before the prompts.
    Events,
    Chat,
    Responses,
    AiSdk,
    AgUi,
}

impl Route {
    const ALL: [Route; 5] = [
        Route::Events,
        Route::Chat,
        Route::Responses,
        Route::AiSdk,
        Route::AgUi,
    ];

    fn name(self) -> &'static str {
        match self {
            Route::Events => "events",
            Route::Chat => "chat",
            Route::Responses => "responses",
            Route::AiSdk => "ai-sdk",
            Route::AgUi => "ag-ui",
        }
    }

    /// What the printed figures call it.
    fn said(self) -> &'static str {
        match self {
            Route::Events => "default",
            Route::Chat => "POST /v1/chat/completions",
            Route::Responses => "POST /v1/responses",
            Route::AiSdk => "POST /ai-sdk/{definition}",
            Route::AgUi => "POST /ag-ui/{definition}",
        }
    }

    /// The streamed request that prompts the agent `id` with "Hi".
    fn prompt(self, http: &reqwest::Client, base: &str, id: &str) -> reqwest::RequestBuilder {
        let (path, body) = match self {
            Route::Events => unreachable!("Tiller's own route is followed, not posted"),
            Route::Chat => {
                let body = json!({"model": "bench", "stream": true,
                                  "messages": [{"role": "user", "content": "Hi"}]});
                return http
                    .post(format!("{base}/v1/chat/completions"))
                    .header("x-tiller-session", id)
                    .json(&body);
            }
            Route::Responses => (
                "/v1/responses".to_owned(),
                json!({"model": "bench", "stream": true, "input": "Hi", "conversation": id}),
            ),
            Route::AiSdk => (
                "/ai-sdk/bench".to_owned(),
                json!({"id": id, "messages": [{"id": "m", "role": "user",
                                                "parts": [{"type": "text", "text": "Hi"}]}]}),
            ),
            Route::AgUi => (
                "/ag-ui/bench".to_owned(),
                json!({"threadId": id, "runId": "r",
                       "messages": [{"id": "m", "role": "user", "content": "Hi"}]}),
            ),
        };
        http.post(format!("{base}{path}")).json(&body)
    }

    /// The text piece `data` (one event's JSON) carries, and whether it is
    /// the stream's last event.
    fn read(self, data: &str) -> (Option<String>, bool) {
        if data == "[DONE]" {
            return (None, true);
        }
        let data: Value = serde_json::from_str(data).unwrap();
        let kind = data["type"].as_str().unwrap_or_default();
        let (piece, last) = match self {
            Route::Events => unreachable!("read by `read`"),
            Route::Chat => (&data["choices"][0]["delta"]["content"], false),
            Route::Responses => (
                if kind == "response.output_text.delta" {
                    &data["delta"]
                } else {
                    &Value::Null
                },
                matches!(
                    kind,
                    "response.completed" | "response.incomplete" | "response.failed"
                ),
            ),
            Route::AiSdk => (
                if kind == "text-delta" {
                    &data["delta"]
                } else {
                    &Value::Null
                },
                false,
            ),
            Route::AgUi => (
                if kind == "TEXT_MESSAGE_CONTENT" {
                    &data["delta"]
                } else {
                    &Value::Null
                },
                matches!(kind, "RUN_FINISHED" | "RUN_ERROR"),
            ),
        };
        (piece.as_str().map(str::to_owned), last)
    }
}

/// What the clients saw.
#[derive(Debug, Default)]
struct Seen {
    /// Events delivered to the SSE clients.
    delivered: u64,
    /// Events of one run, as one client saw them.
    per_run: u64,
    /// Streams with an event missing, repeated or out of order, or a `lagged` notice.
    broken: u64,
    /// Token latencies, in ns.
    latencies: Vec<u64>,
}

fn main() {
    let reply = paced::recorded_reply();
    if paced::serve_if_asked(&reply) {
        return;
    }
    let scale = Scale::from_args();
    if let Ok(base) = std::env::var(CLIENT) {
        let asked = std::env::var(ROUTE).unwrap_or_default();
        let route = Route::ALL
            .into_iter()
            .find(|route| route.name() == asked)
            .unwrap_or(Route::Events);
        clients(&base, scale, route);
        return;
    }
    let upstream = PacedProcess::start();
    let model = upstream.model(&format!("stamped-{SPACING_US}"));
    let [(_, mut builder), _] = runtimes();
    // As many bare readers at once as replies stream at once below.
    let at_once = (scale.rate as usize).min(scale.agents);
    let floor = micros(on_current_thread(paced::bare_replies(
        upstream.port,
        &format!("stamped-{SPACING_US}"),
        at_once,
        1,
    ))) / STAMPED_EVENTS as f64;
    println!(
        "floor: {at_once} bare TcpStreams on a current-thread runtime reading the same stream at once: {floor:.1} µs CPU per SSE event read"
    );
    let runtime = builder.build().unwrap();
    // The server's CPU per event of every agent, by Tiller's own SSE route.
    let mut own_route = None;
    for route in Route::ALL {
        let flavour = route.said();
        let per_event = runtime.block_on(async {
        let mut definitions = Definitions::new().with_default_model(model.clone());
        definitions
            .insert(AgentFile::parse("bench.yaml", AGENT).unwrap())
            .unwrap();
        // Every client is the one caller of an open server: room for all of them.
        // One open tenant holds every agent and stream here: no quotas.
        let config = ServerConfig {
            tenant_quotas: Quotas::default(),
            user_quotas: Quotas::default(),
            max_streams_per_caller: scale.clients,
            max_connections: scale.clients + 1_024,
            max_connections_per_address: scale.clients + 1_024,
            ..ServerConfig::default()
        };
        let server = Server::new(Supervisor::start().await.unwrap(), definitions, config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(server.serve(listener, std::future::pending()));
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(std::env::args().skip(1))
            .env(CLIENT, &base)
            .env(ROUTE, route.name())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(said.next_line().await.unwrap().as_deref(), Some("attached"));
        let (before, started) = (cpu_time(), std::time::Instant::now());
        let done = said.next_line().await.unwrap().unwrap();
        let (cpu, wall) = (cpu_time() - before, started.elapsed());
        child.wait().await.unwrap();
        let seen: Value = serde_json::from_str(done.strip_prefix("done ").unwrap()).unwrap();
        let delivered = seen["delivered"].as_u64().unwrap();
        let all_events = seen["per_run"].as_u64().unwrap() * scale.agents as u64;
        println!(
            "{flavour}: {} agents created over HTTP, {} SSE clients, {} prompts/s, {} tokens {} ms apart per reply: {:.1} s, server CPU {:.2} s",
            scale.agents,
            scale.clients,
            scale.rate,
            STAMPED_TOKENS,
            SPACING_US / 1_000,
            wall.as_secs_f64(),
            cpu.as_secs_f64()
        );
        // The agents' events are the same whatever route their replies are
        // read from: counted on Tiller's own.
        let all_events = own_route.map_or(all_events, |(_, events)| events);
        let per_event = micros(cpu) / all_events as f64;
        match own_route {
            None => println!(
                "{flavour}: server CPU per event of every agent (model bytes to actor, hub, replay buffer and SSE): {per_event:.1} µs (target <= 10 µs), {:.2}x the floor ({all_events} events)",
                per_event / floor
            ),
            Some((own, _)) => println!(
                "{flavour}: server CPU per event of every agent, a tenth of them read in this protocol: {per_event:.1} µs, {:.2}x Tiller's own SSE route's {own:.1} µs (target <= 1.5x)",
                per_event / own
            ),
        }
        println!(
            "{flavour}: server CPU per event delivered to a client: {:.1} µs ({delivered} delivered, {} streams broken)",
            micros(cpu) / delivered as f64,
            seen["broken"]
        );
        println!(
            "{flavour}: a token from the model server to an SSE client: p50 {:.2} ms, p99 {:.2} ms (target <= 2 ms), max {:.2} ms",
            seen["p50_ms"].as_f64().unwrap(),
            seen["p99_ms"].as_f64().unwrap(),
            seen["max_ms"].as_f64().unwrap()
        );
        (per_event, all_events)
    });
        own_route = own_route.or(Some(per_event));
    }
}

/// The clients' process: creates the agents, attaches the SSE clients, says
/// `attached`, prompts every agent at the rate asked, reads every stream to its
/// `agent_end`, waits for every agent to be idle, and says `done` with what it saw.
fn clients(base: &str, scale: Scale, route: Route) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let http = reqwest::Client::new();
        let post = |path: String, body: Value| {
            http.post(format!("{base}{path}"))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
        };
        futures::stream::iter(0..scale.agents)
            .map(|n| {
                post(
                    "/agents".to_owned(),
                    json!({"definition": "bench", "id": format!("a{n}")}),
                )
            })
            .buffer_unordered(64)
            .for_each(|response| async move {
                assert_eq!(response.unwrap().status(), 201);
            })
            .await;

        let every = scale.agents / scale.clients;
        let mut readers = Vec::new();
        for n in (0..scale.clients).filter(|_| route == Route::Events) {
            let response = http
                .get(format!("{base}/agents/a{}/events", n * every))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            readers.push(tokio::spawn(read(response)));
        }
        println!("attached");

        let mut ticks = tokio::time::interval(Duration::from_secs(1) / scale.rate);
        let mut prompts = Vec::with_capacity(scale.agents);
        for n in 0..scale.agents {
            ticks.tick().await;
            if route != Route::Events && n % every == 0 && n / every < scale.clients {
                let streamed = route.prompt(&http, base, &format!("a{n}")).send();
                readers.push(tokio::spawn(async move {
                    let response = streamed.await.unwrap();
                    assert_eq!(response.status(), 200);
                    read_protocol(response, route).await
                }));
                continue;
            }
            let prompt = post(format!("/agents/a{n}/prompt"), json!({"text": "Hi"}));
            prompts.push(tokio::spawn(async move {
                assert_eq!(prompt.await.unwrap().status(), 202);
            }));
        }
        for prompt in prompts {
            prompt.await.unwrap();
        }
        let mut seen = Seen::default();
        for reader in readers {
            let (events, broken, latencies) = reader.await.unwrap();
            seen.delivered += events;
            seen.per_run = seen.per_run.max(events);
            seen.broken += u64::from(broken);
            seen.latencies.extend(latencies);
        }
        // The agents no client follows may still be answering.
        loop {
            let agents = http
                .get(format!("{base}/agents"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let agents: Value = serde_json::from_str(&agents).unwrap();
            let running = agents
                .as_array()
                .unwrap()
                .iter()
                .any(|agent| agent["status"] != "idle");
            if !running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen.latencies.sort_unstable();
        let at = |q: f64| {
            let index = ((seen.latencies.len() as f64 * q) as usize).min(seen.latencies.len() - 1);
            seen.latencies[index] as f64 / 1e6
        };
        println!(
            "done {}",
            json!({
                "delivered": seen.delivered,
                "per_run": seen.per_run,
                "broken": seen.broken,
                "p50_ms": at(0.5),
                "p99_ms": at(0.99),
                "max_ms": at(1.0),
            })
        );
    });
}

/// Reads one agent's event stream to its `agent_end`: how many events came,
/// whether any was missing, repeated or out of order, and each token's latency
/// (from its stamp to the moment the chunk holding it was read).
async fn read(response: reqwest::Response) -> (u64, bool, Vec<u64>) {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let (mut events, mut broken, mut latencies) = (0u64, false, Vec::new());
    let mut expected: Option<u64> = None;
    while let Some(chunk) = body.next().await {
        let read_at = monotonic_ns();
        buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(str::trim_start)
            };
            let (Some(id), Some(data)) = (field("id:"), field("data:")) else {
                continue;
            };
            let seq: u64 = id.parse().unwrap();
            broken |= expected.is_some_and(|expected| expected != seq);
            expected = Some(seq + 1);
            events += 1;
            let data: Value = serde_json::from_str(data).unwrap();
            let event = &data["event"];
            match event["type"].as_str().unwrap() {
                "lagged" => broken = true,
                "agent_end" => return (events, broken, latencies),
                "message_update" => {
                    let update = &event["assistant_message_event"];
                    if update["type"] == "text_delta"
                        && let Ok(stamp) = update["delta"].as_str().unwrap().trim().parse::<u64>()
                    {
                        latencies.push(read_at.saturating_sub(stamp));
                    }
                }
                _ => {}
            }
        }
    }
    (events, true, latencies)
}

/// Reads one reply streamed in the protocol of `route` to its last event: how
/// many events came, whether it ended without its last, and each token's
/// latency.
async fn read_protocol(response: reqwest::Response, route: Route) -> (u64, bool, Vec<u64>) {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let (mut events, mut latencies) = (0u64, Vec::new());
    while let Some(bytes) = body.next().await {
        let read_at = monotonic_ns();
        buffer.push_str(std::str::from_utf8(&bytes.unwrap()).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let Some(data) = block.lines().find_map(|line| line.strip_prefix("data: ")) else {
                continue;
            };
            events += 1;
            let (piece, last) = route.read(data.trim());
            if last {
                return (events, false, latencies);
            }
            if let Some(Ok(stamp)) = piece.map(|text| text.trim().parse::<u64>()) {
                latencies.push(read_at.saturating_sub(stamp));
            }
        }
    }
    (events, true, latencies)
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
