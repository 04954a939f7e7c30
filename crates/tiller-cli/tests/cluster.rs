//! Chaos, with real components: a three-node NATS cluster with JetStream
//! (`scripts/nats.sh`), a PostgreSQL server (`scripts/postgres.sh`) and three
//! `tiller serve --cluster` processes of the real binary (a fourth joins one
//! scenario). The scripted model streams slowly, answers every user message of
//! the conversation it has not answered yet, and counts its requests. Clients
//! are plain HTTP and server-sent events.
//!
//! - A killed owner's agent is taken over within the lease TTL + 5 s; streams on
//!   the other hosts read on (no reconnect) through `owner_changed`,
//!   `turn_restarted` and the end; a client resuming anywhere sees every event
//!   once; the store holds one answer; a steer sent in the gap lands once.
//! - A paused owner is replaced, and once it wakes its writes are refused and it
//!   fences itself.
//! - Losing the NATS node that leads the lease bucket costs no lease, no fence,
//!   and no gap in the events.
//! - A drain, with a fourth host added, moves every agent between two turns in
//!   under a second each, without running a turn twice.
//! - Fifty concurrent follow-ups to an agent no host holds: one owner, each
//!   applied once.
//!
//! After each scenario, an invariant checker reads what the cluster published
//! and what the hosts logged: an agent's epochs only rise, and once a new owner
//! has claimed it, nothing of an older epoch is accepted. Scenarios run one at a
//! time, each with its own NATS cluster.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Scratch, exit_of, lines, python_tool, read_until, tiller};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_cluster::{EventSubject, PublishedBatch};
use tiller_test_support::nats::NatsCluster;
use tiller_test_support::postgres::postgres_url;
use tiller_test_support::{CapturedRequest, MockResponse, MockServer, sse};
use tokio::process::Child;
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;

/// The lease TTL of every scenario (the default): above a NATS leader election.
const TTL: Duration = Duration::from_secs(15);

/// One scenario at a time: each runs three NATS nodes and three or four hosts.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The agent's file: one tool, `note` (a second and a half), which the model
/// calls for a user message that starts with `note:`.
const AGENT: &str = "type: object\n\
                     description: You help.\n\
                     json_schema_extra:\n  kind: agent\n  name: helper\n  max_turns: 10\n  tools:\n    - name: note\n      description: Takes a note\n      command: [python3, tools/note.py]\n";

/// The user texts a request carries after the model's last answer.
fn unanswered(request: &CapturedRequest) -> Vec<String> {
    let messages = request.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let after = messages
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .map_or(0, |last| last + 1);
    messages[after..]
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(text) => text.clone(),
            Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
            _ => String::new(),
        })
        .collect()
}

/// The scripted model: a call of `note` for a `note:` message not yet noted,
/// else "Answer to: …" naming every user message not yet answered, streamed in
/// twenty pieces `pace` apart.
fn scripted(request: &CapturedRequest, pace: Duration) -> MockResponse {
    let asked = unanswered(request);
    let noted = request.body["messages"]
        .as_array()
        .is_some_and(|messages| messages.last().is_some_and(|m| m["role"] == "tool"));
    if !noted && asked.iter().any(|text| text.starts_with("note:")) {
        return MockResponse::sse(sse::openai_tool_call(
            &format!(
                "call-{}",
                request.body["messages"].as_array().map_or(0, Vec::len)
            ),
            "note",
            &json!({}),
        ));
    }
    let answer = format!("Answer to: {}.", asked.join(" / "));
    let words: Vec<String> = answer.split_inclusive(' ').map(str::to_owned).collect();
    let per_piece = words.len().div_ceil(20).max(1);
    let pieces: Vec<String> = words
        .chunks(per_piece)
        .map(|chunk| chunk.concat())
        .collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let body = sse::openai_text(&pieces);
    let events: Vec<String> = body.split_inclusive("\n\n").map(str::to_owned).collect();
    MockResponse::sse(body).chunks(events).chunk_delay(pace)
}

/// One `tiller serve --cluster` process.
struct Host {
    id: String,
    base: String,
    child: Child,
    /// What it wrote on stderr (its tracing log among it).
    log: Arc<Mutex<Vec<String>>>,
    said: Arc<Notify>,
}

impl Host {
    fn pid(&self) -> i32 {
        self.child.id().map_or(0, |pid| pid as i32)
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (at most `within`) until its log holds a line with `text`.
    async fn said(&self, text: &str, within: Duration) {
        tokio::time::timeout(within, async {
            loop {
                let notified = self.said.notified();
                if self.log().iter().any(|line| line.contains(text)) {
                    return;
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("host {} never said `{text}`", self.id));
    }
}

/// Sends `signal` to process `pid`.
#[allow(unsafe_code)]
fn signal(pid: i32, signal: libc::c_int) {
    // SAFETY: kill only sends a signal to a child this test started.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// A scenario's cluster.
struct Chaos {
    nats: NatsCluster,
    store: String,
    model: MockServer,
    scratch: Scratch,
    hosts: Vec<Host>,
    http: reqwest::Client,
    _one_at_a_time: tokio::sync::MutexGuard<'static, ()>,
}

/// An event as a client read it.
#[derive(Debug, Clone)]
struct Read {
    id: Option<u64>,
    kind: String,
    data: Value,
}

impl Chaos {
    /// NATS, PostgreSQL, the model streaming `pace` apart, and `hosts` hosts
    /// `h1`…; `None` when the components are not installed here.
    async fn start(hosts: usize, pace: Duration) -> Option<Chaos> {
        let one_at_a_time = ONE_AT_A_TIME.lock().await;
        let store = postgres_url()?;
        let nats = NatsCluster::start(3)?;
        let model = MockServer::start().await;
        model.respond_with(move |request| scripted(request, pace));
        let scratch = Scratch::new();
        std::fs::create_dir_all(scratch.path().join("agents/tools")).unwrap();
        scratch.write("agents/helper.yaml", AGENT);
        // Long enough for a drain to be asked while it runs.
        scratch.write(
            "agents/tools/note.py",
            &python_tool("time.sleep(1.5)\nprint('noted')"),
        );
        let mut chaos = Chaos {
            nats,
            store,
            model,
            scratch,
            hosts: Vec::new(),
            http: reqwest::Client::new(),
            _one_at_a_time: one_at_a_time,
        };
        for n in 1..=hosts {
            chaos.add(&format!("h{n}")).await;
        }
        Some(chaos)
    }

    /// Starts host `id`.
    async fn add(&mut self, id: &str) {
        let agents = self.scratch.path().join("agents");
        let urls = self.nats.url_list();
        let mut child = tiller(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--agents",
            agents.to_str().unwrap(),
            "--store",
            &self.store,
            "--cluster",
            &urls,
            "--host-id",
            id,
        ])
        .env("TILLER_PROVIDER", "openai")
        .env("TILLER_BASE_URL", self.model.base_url())
        .env("TILLER_MODEL", "scripted")
        .env("TILLER_LOG", "warn,tiller_cluster=info")
        .env("NO_COLOR", "1")
        .spawn()
        .unwrap();
        let mut stderr = lines(child.stderr.take().unwrap());
        let said = read_until(&mut stderr, |line| line.contains("joined the cluster")).await;
        let address = said
            .iter()
            .find_map(|line| line.split("http://").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap()
            .to_owned();
        let log = Arc::new(Mutex::new(said));
        let notify = Arc::new(Notify::new());
        {
            let (log, notify) = (log.clone(), notify.clone());
            tokio::spawn(async move {
                while let Some(line) = stderr.recv().await {
                    log.lock().unwrap().push(line);
                    notify.notify_waiters();
                }
            });
        }
        self.hosts.push(Host {
            id: id.to_owned(),
            base: format!("http://{address}"),
            child,
            log,
            said: notify,
        });
    }

    fn host(&self, id: &str) -> &Host {
        self.hosts.iter().find(|host| host.id == id).unwrap()
    }

    /// Prompts `agent` through host `on` (with `key` as its idempotency key):
    /// accepted (202).
    async fn prompt(&self, on: &str, agent: &str, text: &str, key: Option<&str>) {
        let path = format!("/agents/{agent}/prompt");
        let (status, body) = self.post(on, &path, json!({ "text": text }), key).await;
        assert_eq!(status, 202, "{body}");
    }

    /// `POST path` on host `on` with `body`, and an idempotency key if given.
    async fn post(&self, on: &str, path: &str, body: Value, key: Option<&str>) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.host(on).base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `POST path` with key `key` until it succeeds: only `503 unavailable` (the
    /// agent's owner being replaced) is retried, with the same key.
    async fn post_until_done(&self, on: &str, path: &str, body: Value, key: &str) -> u16 {
        let deadline = Instant::now() + TTL * 4;
        loop {
            let (status, problem) = self.post(on, path, body.clone(), Some(key)).await;
            if status < 300 {
                return status;
            }
            assert_eq!(
                (status, problem["type"].as_str()),
                (503, Some("urn:tiller:problem:unavailable")),
                "{problem}"
            );
            assert!(Instant::now() < deadline, "{path} never went through");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn get(&self, on: &str, path: &str) -> Value {
        let response = self
            .http
            .get(format!("{}{path}", self.host(on).base))
            .send()
            .await
            .unwrap();
        serde_json::from_str(&response.text().await.unwrap()).unwrap_or(Value::Null)
    }

    /// Host `on`'s figures from `/metrics`.
    async fn metrics(&self, on: &str) -> HashMap<String, f64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.host(on).base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// A new agent made on host `on`.
    async fn create(&self, on: &str) -> String {
        let (status, agent) = self
            .post(on, "/agents", json!({"definition": "helper"}), None)
            .await;
        assert_eq!(status, 201, "{agent}");
        agent["id"].as_str().unwrap().to_owned()
    }

    /// The stored transcript of `agent`, read through host `on`.
    async fn transcript(&self, on: &str, agent: &str) -> Vec<Value> {
        let page = self
            .get(on, &format!("/sessions/{agent}/messages?limit=1000"))
            .await;
        page["messages"].as_array().cloned().unwrap_or_default()
    }

    /// The texts of the transcript's assistant answers.
    async fn answers(&self, on: &str, agent: &str) -> Vec<String> {
        self.transcript(on, agent)
            .await
            .iter()
            .filter(|m| m["role"] == "assistant")
            .map(|m| {
                m["content"]
                    .as_array()
                    .map(|parts| parts.iter().filter_map(|p| p["text"].as_str()).collect())
                    .unwrap_or_default()
            })
            .filter(|text: &String| !text.is_empty())
            .collect()
    }

    /// Follows `agent`'s events on host `on`, after `after` when given.
    async fn follow(&self, on: &str, agent: &str, after: Option<u64>) -> Follower {
        let mut request = self
            .http
            .get(format!("{}/agents/{agent}/events", self.host(on).base));
        if let Some(after) = after {
            request = request.header("last-event-id", after.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        let events = Arc::new(Mutex::new(Vec::new()));
        let changed = Arc::new(Notify::new());
        let task = {
            let (events, changed) = (events.clone(), changed.clone());
            tokio::spawn(async move {
                let mut body = response.bytes_stream();
                let mut buffer = String::new();
                while let Some(Ok(chunk)) = body.next().await {
                    buffer.push_str(&String::from_utf8_lossy(&chunk));
                    while let Some(end) = buffer.find("\n\n") {
                        let block: String = buffer.drain(..end + 2).collect();
                        let mut read = Read {
                            id: None,
                            kind: String::new(),
                            data: Value::Null,
                        };
                        for line in block.lines() {
                            if let Some(id) = line.strip_prefix("id: ") {
                                read.id = id.parse().ok();
                            } else if let Some(kind) = line.strip_prefix("event: ") {
                                read.kind = kind.to_owned();
                            } else if let Some(data) = line.strip_prefix("data: ") {
                                read.data = serde_json::from_str(data).unwrap_or(Value::Null);
                            }
                        }
                        if !read.kind.is_empty() {
                            events.lock().unwrap().push(read);
                            changed.notify_waiters();
                        }
                    }
                }
            })
        };
        Follower {
            events,
            changed,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// What the stream keeps of `subject` once its newest event is a `last`:
    /// the durable path may lag the live one a moment (an election, longer).
    async fn published_until(&self, subject: &EventSubject, last: &str) -> Vec<PublishedBatch> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let batches = tiller_cluster::published(&self.nats.urls, subject)
                .await
                .unwrap();
            let newest = batches.last().and_then(|batch| batch.events.last());
            if newest.is_some_and(|event| event["event"]["type"] == last) {
                return batches;
            }
            if Instant::now() >= deadline {
                let logs: Vec<(String, Vec<String>)> = self
                    .hosts
                    .iter()
                    .map(|host| (host.id.clone(), host.log()))
                    .collect();
                panic!(
                    "the stream does not end with `{last}`: {batches:?}; the hosts said {logs:#?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The invariant checker, over what the cluster published of `agent` and
    /// what the hosts logged: its epochs only rise; every batch after an owner's
    /// claim is that owner's (none of an older epoch is accepted after); events
    /// are numbered without a repeat, and without a gap but where a new owner
    /// begins; the store holds the session at the last claim's epoch; the stored
    /// transcript is valid. `via` is a live host; `last` is the type of the
    /// last event the stream must hold (waited for, as the durable path may
    /// lag the live one).
    async fn check(&self, agent: &str, via: &str, last: &str) {
        let subject = EventSubject {
            agent: agent.to_owned(),
            tenant: None,
            user: None,
        };
        let batches = self.published_until(&subject, last).await;
        let (mut epoch, mut claimed, mut next) = (0, 0, None);
        for batch in &batches {
            assert!(batch.epoch >= epoch, "epoch {} after {epoch}", batch.epoch);
            assert!(
                batch.epoch >= claimed,
                "a batch of epoch {} after the claim of {claimed}",
                batch.epoch
            );
            epoch = batch.epoch;
            for (n, event) in batch.events.iter().enumerate() {
                let seq = event["seq"].as_u64().unwrap();
                assert_eq!(seq, batch.first + n as u64);
                if let Some(next) = next {
                    if event["event"]["type"] == "owner_changed" {
                        assert!(seq >= next, "a repeat in the numbers");
                    } else {
                        assert_eq!(seq, next, "a gap or a repeat in the numbers");
                    }
                }
                next = Some(seq + 1);
                if event["event"]["type"] == "owner_changed" {
                    let owner_epoch = event["event"]["epoch"].as_u64().unwrap();
                    assert!(
                        owner_epoch > claimed,
                        "claims: {claimed} then {owner_epoch}"
                    );
                    assert_eq!(owner_epoch, batch.epoch);
                    claimed = owner_epoch;
                }
            }
        }
        // Each host's claims of the agent, in time order, rise.
        let mut claims: Vec<(String, u64)> = self
            .hosts
            .iter()
            .flat_map(Host::log)
            .filter(|line| line.contains("agent held here") && line.contains(agent))
            .filter_map(|line| {
                let at = line.split_whitespace().next()?.to_owned();
                let epoch = line
                    .split_whitespace()
                    .find_map(|word| word.strip_prefix("epoch="))?
                    .parse()
                    .ok()?;
                Some((at, epoch))
            })
            .collect();
        claims.sort();
        assert!(!claims.is_empty());
        for pair in claims.windows(2) {
            assert!(pair[1].1 > pair[0].1, "claims out of order: {claims:?}");
        }
        let last_claim = claims.last().unwrap().1;
        assert!(last_claim >= claimed);
        let session = self.get(via, &format!("/sessions/{agent}")).await;
        assert_eq!(session["epoch"].as_u64(), Some(last_claim), "{session}");
        let messages: Vec<tiller::AgentMessage> =
            serde_json::from_value(Value::Array(self.transcript(via, agent).await)).unwrap();
        assert_eq!(tiller::check_transcript(&messages), Ok(()));
    }
}

/// A client following an agent's events, on one connection it never remakes.
struct Follower {
    events: Arc<Mutex<Vec<Read>>>,
    changed: Arc<Notify>,
    _task: AbortOnDropHandle<()>,
}

impl Follower {
    fn read(&self) -> Vec<Read> {
        self.events.lock().unwrap().clone()
    }

    /// Waits (at most a minute) until what was read satisfies `found`.
    async fn until(&self, found: impl Fn(&[Read]) -> bool) -> Vec<Read> {
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let notified = self.changed.notified();
                let read = self.read();
                if found(&read) {
                    return read;
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the awaited events never came: {:?}", kinds(&self.read())))
    }
}

fn kinds(read: &[Read]) -> Vec<&str> {
    read.iter().map(|event| event.kind.as_str()).collect()
}

/// Whether an `agent_end` of a finished run (not a pause) comes after the
/// first `owner_changed`.
fn finished_after_owner_change(read: &[Read]) -> bool {
    read.iter()
        .skip_while(|event| event.kind != "owner_changed")
        .any(|event| event.kind == "agent_end" && event.data["event"]["reason"] != "paused")
}

/// The assistant's streamed text deltas read so far.
fn deltas(read: &[Read]) -> usize {
    read.iter()
        .filter(|event| event.data["event"]["assistant_message_event"]["type"] == "text_delta")
        .count()
}

/// Numbers rise by one from event to event, but where a new owner begins (its
/// `owner_changed` numbered past what the previous one may have published live).
fn consecutive(read: &[Read]) {
    for pair in read.windows(2) {
        if pair[1].kind == "owner_changed" {
            assert!(pair[1].id > pair[0].id, "{:?}", kinds(read));
        } else {
            assert_eq!(pair[1].id, pair[0].id.map(|id| id + 1), "{:?}", kinds(read));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owners_agent_is_taken_over_and_its_turn_run_again() {
    let Some(chaos) = Chaos::start(3, Duration::from_millis(150)).await else {
        return;
    };
    let agent = chaos.create("h1").await;
    let on_h2 = chaos.follow("h2", &agent, None).await;
    let on_h3 = chaos.follow("h3", &agent, None).await;
    let prompt = "why is the sky blue";
    chaos.prompt("h2", &agent, prompt, Some("p1")).await;
    let before = on_h2.until(|read| deltas(read) >= 3).await;
    let resume_after = before[4].id.unwrap();
    signal(chaos.host("h1").pid(), libc::SIGKILL);
    let killed = Instant::now();

    // A steer in the gap: applied once, or refused as retryable and sent again.
    let steered = chaos
        .post_until_done(
            "h3",
            &format!("/agents/{agent}/steer"),
            json!({"text": "and why red at dusk"}),
            "s1",
        )
        .await;
    assert_eq!(steered, 204);
    on_h2
        .until(|read| read.iter().any(|event| event.kind == "owner_changed"))
        .await;
    let took_over = killed.elapsed();
    assert!(
        took_over <= TTL + Duration::from_secs(5),
        "took over after {took_over:?}"
    );

    for follower in [&on_h2, &on_h3] {
        let read = follower.until(finished_after_owner_change).await;
        let changed = read
            .iter()
            .position(|event| event.kind == "owner_changed")
            .unwrap();
        assert_eq!(
            kinds(&read[changed..changed + 3]),
            ["owner_changed", "turn_restarted", "agent_start"]
        );
        assert!(!kinds(&read[..changed]).contains(&"agent_end"));
        consecutive(&read);
    }
    let live = on_h2.read();

    // Resuming anywhere: every event the stream kept after the one seen, once,
    // in order (the live path's last moments of the cut turn, superseded by
    // `turn_restarted`, are not kept).
    let subject = EventSubject {
        agent: agent.clone(),
        tenant: None,
        user: None,
    };
    let kept: Vec<Option<u64>> = chaos
        .published_until(&subject, "agent_end")
        .await
        .iter()
        .flat_map(|batch| &batch.events)
        .map(|event| event["seq"].as_u64())
        .filter(|id| id.is_some_and(|id| id > resume_after))
        .collect();
    for host in ["h2", "h3"] {
        let resumed = chaos.follow(host, &agent, Some(resume_after)).await;
        let read = resumed.until(finished_after_owner_change).await;
        consecutive(&read);
        let ids: Vec<Option<u64>> = read.iter().map(|event| event.id).collect();
        assert_eq!(ids, kept[..ids.len()]);
        assert!(!kinds(&read).contains(&"lagged"));
    }
    let live_ids: Vec<Option<u64>> = live.iter().map(|event| event.id).collect();
    assert!(
        kept.iter().all(|id| live_ids.contains(id)),
        "the live clients saw every kept event"
    );

    // One finished answer to the prompt in the store; the steer once.
    let answers = chaos.answers("h2", &agent).await;
    assert_eq!(
        answers.iter().filter(|text| text.contains(prompt)).count(),
        1,
        "{answers:?}"
    );
    let transcript = chaos.transcript("h2", &agent).await;
    let steers = transcript
        .iter()
        .filter(|m| m["role"] == "user" && m.to_string().contains("red at dusk"))
        .count();
    let state = chaos.get("h3", &format!("/agents/{agent}")).await;
    let queued = state["steering_queue"].as_array().map_or(0, Vec::len);
    assert_eq!(steers + queued, 1, "{transcript:?}");
    eprintln!(
        "killed owner: taken over after {took_over:?}; the model was asked {} times",
        chaos.model.requests().len()
    );
    chaos.check(&agent, "h2", "agent_end").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_is_replaced_and_fences_itself_when_it_wakes() {
    let Some(chaos) = Chaos::start(3, Duration::from_millis(150)).await else {
        return;
    };
    let agent = chaos.create("h1").await;
    let on_h2 = chaos.follow("h2", &agent, None).await;
    let prompt = "tell me about tides";
    chaos.prompt("h2", &agent, prompt, Some("p1")).await;
    on_h2.until(|read| deltas(read) >= 3).await;
    let h1 = chaos.host("h1");
    signal(h1.pid(), libc::SIGSTOP);
    let paused = Instant::now();
    on_h2.until(finished_after_owner_change).await;
    let took_over = paused.elapsed();
    assert!(
        took_over <= TTL + Duration::from_secs(5) + Duration::from_secs(10),
        "{took_over:?}"
    );
    signal(h1.pid(), libc::SIGCONT);
    h1.said("host fenced itself", Duration::from_secs(30)).await;
    let figures = chaos.metrics("h1").await;
    assert!(
        figures["tiller_cluster_self_fences_total"] >= 1.0,
        "{figures:?}"
    );
    assert_eq!(figures["tiller_cluster_leases_held"], 0.0);

    // No interleaving: one answer, the new owner's.
    let answers = chaos.answers("h2", &agent).await;
    assert_eq!(
        answers.iter().filter(|text| text.contains(prompt)).count(),
        1,
        "{answers:?}"
    );
    consecutive(&on_h2.read());
    chaos.check(&agent, "h2", "agent_end").await;
}

/// The NATS node whose JetStream leads the stream `stream`, as its monitoring
/// page says.
async fn leader_of(chaos: &Chaos, stream: &str) -> String {
    let port = chaos.nats.monitor_port("n1").unwrap();
    let page: Value = reqwest::get(format!(
        "http://127.0.0.1:{port}/jsz?accounts=true&streams=true"
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    page["account_details"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|account| {
            account["stream_detail"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find(|detail| detail["name"] == stream)
        .and_then(|detail| detail["cluster"]["leader"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no leader of {stream} in {page}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_nats_node_that_leads_the_leases_costs_nothing() {
    let Some(chaos) = Chaos::start(3, Duration::from_millis(400)).await else {
        return;
    };
    let agent = chaos.create("h1").await;
    let on_h2 = chaos.follow("h2", &agent, None).await;
    chaos.prompt("h2", &agent, "a long story", Some("p1")).await;
    on_h2.until(|read| deltas(read) >= 1).await;
    let leader = leader_of(&chaos, "KV_tiller_leases").await;
    chaos.nats.kill(&leader);
    let read = on_h2
        .until(|read| read.iter().any(|event| event.kind == "agent_end"))
        .await;
    consecutive(&read);
    assert!(!kinds(&read).contains(&"lagged"));
    assert!(!kinds(&read).contains(&"owner_changed"));
    for host in ["h1", "h2", "h3"] {
        let figures = chaos.metrics(host).await;
        assert_eq!(
            figures["tiller_cluster_self_fences_total"], 0.0,
            "{host}: {figures:?}"
        );
    }
    assert_eq!(chaos.metrics("h1").await["tiller_cluster_leases_held"], 1.0);
    chaos.check(&agent, "h2", "agent_end").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_every_agent_between_two_turns_to_the_other_hosts() {
    let Some(mut chaos) = Chaos::start(3, Duration::from_millis(100)).await else {
        return;
    };
    let mut agents = Vec::new();
    for _ in 0..4 {
        agents.push(chaos.create("h1").await);
    }
    chaos.add("h4").await;
    let mut followers = Vec::new();
    for agent in &agents[..2] {
        let follower = chaos.follow("h2", agent, None).await;
        chaos
            .prompt("h2", agent, "note: this, then answer", None)
            .await;
        followers.push(follower);
    }
    for follower in &followers {
        follower
            .until(|read| {
                read.iter()
                    .any(|event| event.kind == "tool_execution_start")
            })
            .await;
    }
    let (status, drained) = chaos.post("h1", "/admin/drain", json!({}), None).await;
    assert_eq!(status, 200, "{drained}");
    let mut moved: Vec<String> = serde_json::from_value(drained["moved"].clone()).unwrap();
    moved.sort();
    let mut expected = agents.clone();
    expected.sort();
    assert_eq!(moved, expected);
    let took: Vec<f64> = serde_json::from_value(drained["took_ms"].clone()).unwrap();
    assert!(took.iter().all(|ms| *ms < 1_000.0), "{took:?}");
    for follower in &followers {
        let read = follower.until(finished_after_owner_change).await;
        assert!(
            !kinds(&read).contains(&"turn_restarted"),
            "{:?}",
            kinds(&read)
        );
        consecutive(&read);
    }
    assert_eq!(chaos.metrics("h1").await["tiller_cluster_leases_held"], 0.0);
    let mut held = 0.0;
    for host in ["h2", "h3", "h4"] {
        held += chaos.metrics(host).await["tiller_cluster_leases_held"];
    }
    assert_eq!(held, 4.0);
    eprintln!("drain: moves took {took:?} ms");
    for (n, agent) in agents.iter().enumerate() {
        // The first two ran; the others only moved.
        let last = if n < 2 { "agent_end" } else { "owner_changed" };
        chaos.check(agent, "h2", last).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_follow_ups_to_an_agent_no_host_holds_apply_once() {
    let Some(mut chaos) = Chaos::start(3, Duration::from_millis(1)).await else {
        return;
    };
    let agent = chaos.create("h1").await;
    // h1 stops without a drain: its idle agent is held by no host.
    let h1 = chaos.hosts.remove(0);
    let mut h1_child = h1.child;
    signal(h1_child.id().unwrap() as i32, libc::SIGTERM);
    assert_eq!(exit_of(&mut h1_child).await.code(), Some(0));
    let sends = (0..50).map(|n| {
        let chaos = &chaos;
        let agent = &agent;
        async move {
            let on = if n % 2 == 0 { "h2" } else { "h3" };
            chaos
                .post_until_done(
                    on,
                    &format!("/agents/{agent}/follow_up"),
                    json!({"text": format!("f{n}")}),
                    &format!("k{n}"),
                )
                .await
        }
    });
    let statuses = futures::future::join_all(sends).await;
    assert!(statuses.iter().all(|status| *status == 204), "{statuses:?}");
    let state = chaos.get("h2", &format!("/agents/{agent}")).await;
    let mut queued: Vec<String> = state["follow_up_queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    queued.sort();
    let mut expected: Vec<String> = (0..50).map(|n| format!("f{n}")).collect();
    expected.sort();
    assert_eq!(queued, expected);
    let mut activations = 0.0;
    for host in ["h2", "h3"] {
        activations += chaos.metrics(host).await["tiller_cluster_activations_total"];
    }
    assert_eq!(activations, 1.0, "one owner");
    chaos.hosts.insert(
        0,
        Host {
            child: h1_child,
            ..h1
        },
    );
    chaos.check(&agent, "h2", "owner_changed").await;
}
