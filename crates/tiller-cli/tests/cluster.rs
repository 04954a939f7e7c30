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

use common::{
    Scratch, exit_of, lines, missing_tool, python_tool, read_until, readme_block, tiller,
};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_cluster::{ClusterConfig, EventSubject, NatsSecurity, PublishedBatch};
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

/// The address a host said it serves on.
fn address_in(said: &[String]) -> String {
    said.iter()
        .find_map(|line| line.split("http://").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned()
}

/// An agent a trigger starts: one session per event's `key`, events 50 ms
/// apart becoming one prompt.
const LISTENER: &str = "type: object\n\
                        description: You listen.\n\
                        json_schema_extra:\n  kind: agent\n  name: listener\n  triggers:\n    - {on: ping, session: \"{key}\", debounce_ms: 50}\n";

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
    /// The token file every host serves, if any (its requests then carry the
    /// first token).
    tokens: Option<std::path::PathBuf>,
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
        Chaos::start_with(hosts, pace, None).await
    }

    /// [`Chaos::start`] with a token file (`tokens:` first entry's token is
    /// the one requests carry).
    async fn start_with(
        hosts: usize,
        pace: Duration,
        tokens: Option<(&str, &str)>,
    ) -> Option<Chaos> {
        let one_at_a_time = ONE_AT_A_TIME.lock().await;
        let store = postgres_url()?;
        let nats = NatsCluster::start(3)?;
        let model = MockServer::start().await;
        model.respond_with(move |request| scripted(request, pace));
        let scratch = Scratch::new();
        std::fs::create_dir_all(scratch.path().join("agents/tools")).unwrap();
        scratch.write("agents/helper.yaml", AGENT);
        scratch.write("agents/listener.yaml", LISTENER);
        // Long enough for a drain to be asked while it runs.
        scratch.write(
            "agents/tools/note.py",
            &python_tool("time.sleep(1.5)\nprint('noted')"),
        );
        let mut http = reqwest::Client::builder();
        let tokens = tokens.map(|(file, token)| {
            scratch.write("tokens.yaml", file);
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
            http = std::mem::take(&mut http).default_headers(headers);
            scratch.path().join("tokens.yaml")
        });
        let mut chaos = Chaos {
            tokens,
            nats,
            store,
            model,
            scratch,
            hosts: Vec::new(),
            http: http.build().unwrap(),
            _one_at_a_time: one_at_a_time,
        };
        for n in 1..=hosts {
            chaos.add(&format!("h{n}")).await;
        }
        Some(chaos)
    }

    /// How the invariant checker reads the stream: as a host would.
    fn auditor(&self) -> ClusterConfig {
        let user = self.nats.user("tiller");
        let mut config =
            ClusterConfig::new(user.urls.into_iter().map(Into::into).collect(), "audit");
        config.security = NatsSecurity::mutual_tls(user.ca, user.cert, user.key);
        config
    }

    /// Starts host `id`, its bus's URLs and secrets in its environment.
    async fn add(&mut self, id: &str) {
        let agents = self.scratch.path().join("agents");
        let mut args = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--agents",
            agents.to_str().unwrap(),
            "--store",
            &self.store,
            "--host-id",
            id,
        ];
        if let Some(tokens) = &self.tokens {
            args.extend(["--tokens", tokens.to_str().unwrap()]);
        }
        let mut child = tiller(&args)
            .envs(self.nats.env("tiller"))
            .env("TILLER_PROVIDER", "openai")
            .env("TILLER_BASE_URL", self.model.base_url())
            .env("TILLER_MODEL", "scripted")
            .env("TILLER_LOG", "warn,tiller_cluster=info")
            .env("NO_COLOR", "1")
            .spawn()
            .unwrap();
        let mut stderr = lines(child.stderr.take().unwrap());
        let said = read_until(&mut stderr, |line| line.contains("joined the cluster")).await;
        let address = address_in(&said);
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
            let batches = tiller_cluster::published(&self.auditor(), subject)
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
        assert_eq!(tiller::run::check_transcript(&messages), Ok(()));
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

/// The answer's text as the last update of `read` leaves it, rebuilt from the
/// lean events by [`tiller::wire::Rebuild`].
fn rebuilt(read: &[Read]) -> String {
    let mut rebuild = tiller::wire::Rebuild::default();
    let mut last = None;
    for event in read {
        let envelope = rebuild.envelope(event.data.to_string().as_bytes()).unwrap();
        if let tiller::Delivered::Event(tiller::AgentEvent::MessageUpdate { message, .. }) =
            envelope.event
        {
            last = Some(message);
        }
    }
    last.expect("an update").get().text()
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

/// A client following an agent on a host that does not hold it gets each
/// update as its piece, so a 100,000-character answer costs its length a few
/// times over; one that joins in the middle of the answer gets one snapshot
/// (the owner's message as it stood, the stream read on from there) and
/// rebuilds the answer exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_elsewhere_gets_pieces_and_one_joining_mid_answer_a_snapshot() {
    let Some(chaos) = Chaos::start(2, Duration::from_millis(100)).await else {
        return;
    };
    let agent = chaos.create("h1").await;
    let on_h2 = chaos.follow("h2", &agent, None).await;
    let long: String = "the sky \"is\" blue "
        .chars()
        .cycle()
        .take(100_000)
        .collect();
    chaos.prompt("h2", &agent, &long, Some("p1")).await;
    let before = on_h2.until(|read| deltas(read) >= 3).await;
    let joined = chaos.follow("h2", &agent, None).await;
    // A client back after the second piece, holding what it read by then.
    let seen = before
        .iter()
        .filter(|event| event.kind == "message_update")
        .nth(1)
        .unwrap()
        .id;
    let back = chaos.follow("h2", &agent, seen).await;
    let ended = |read: &[Read]| read.iter().any(|event| event.kind == "agent_end");
    let all = on_h2.until(ended).await;
    let late = joined.until(ended).await;
    let resumed = back.until(ended).await;

    let answer = all
        .iter()
        .rfind(|event| event.kind == "message_end")
        .map(|event| event.data["event"]["message"]["content"][0]["text"].clone())
        .unwrap();
    assert!(answer.as_str().unwrap().len() > 100_000);
    let mut bytes = 0;
    for event in &all {
        let data = event.data.to_string();
        bytes += data.len();
        if event.kind == "message_update" {
            let piece = &event.data["event"]["assistant_message_event"];
            let escaped = piece
                .get("delta")
                .map_or(0, |delta| delta.to_string().len());
            assert!(data.len() <= 200 + escaped, "{data}");
        }
    }
    // The prompt and the answer each three times whole, the answer once in
    // pieces.
    assert!(bytes < 8 * long.len(), "{bytes} bytes");

    let first_update = late
        .iter()
        .position(|event| event.kind == "message_update")
        .unwrap();
    assert_eq!(
        late[first_update].data["event"]["message"]["role"], "assistant",
        "the first update a late follower gets is whole"
    );
    assert!(late[first_update + 1..].iter().all(|event| {
        event.kind != "message_update" || event.data["event"].get("message").is_none()
    }));
    assert_eq!(json!(rebuilt(&late[first_update..])), answer);

    // Back with Last-Event-ID: each event once from there, and the answer
    // rebuilt exactly from what it held and what came.
    let held: Vec<&Read> = all.iter().take_while(|event| event.id <= seen).collect();
    assert_eq!(
        resumed.iter().map(|event| event.id).collect::<Vec<_>>(),
        all[held.len()..]
            .iter()
            .map(|event| event.id)
            .collect::<Vec<_>>()
    );
    let held: Vec<Read> = held.into_iter().cloned().chain(resumed).collect();
    assert_eq!(json!(rebuilt(&held)), answer);
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

/// What a NATS client was told by the server: its `-ERR`s, as the client's
/// event callback saw them.
fn server_errors() -> (
    async_nats::ConnectOptions,
    Arc<Mutex<Vec<String>>>,
    Arc<Notify>,
) {
    let said = Arc::new(Mutex::new(Vec::new()));
    let told = Arc::new(Notify::new());
    let options = {
        let (said, told) = (said.clone(), told.clone());
        async_nats::ConnectOptions::new().event_callback(move |event| {
            let (said, told) = (said.clone(), told.clone());
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    said.lock().unwrap().push(error.to_string());
                    told.notify_waiters();
                }
            }
        })
    };
    (options, said, told)
}

/// Waits (30 s at most) until the server has said something containing `text`.
async fn told(said: &Mutex<Vec<String>>, told: &Notify, text: &str) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let notified = told.notified();
            if said
                .lock()
                .unwrap()
                .iter()
                .any(|error| error.contains(text))
            {
                return;
            }
            notified.await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server never said `{text}`: {:?}", said.lock().unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bus_refuses_intruders_and_owners_refuse_what_a_client_could_not_send() {
    let Some(chaos) = Chaos::start(3, Duration::from_millis(1)).await else {
        return;
    };
    let agent = chaos.create("h1").await;
    let (status, _) = chaos
        .post(
            "h2",
            &format!("/agents/{agent}/prompt?wait=true"),
            json!({"text": "hi"}),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let before = chaos.transcript("h3", &agent).await;
    let url = chaos.nats.urls[0].clone();
    let monitor = chaos.nats.user("monitor");
    let plain = url.replace("tls://", "nats://");

    // No credentials at all, over TLS or not: refused as it connects.
    let refused = async_nats::ConnectOptions::new()
        .add_root_certificates(monitor.ca.clone())
        .connect(url.as_str())
        .await;
    assert!(refused.is_err(), "a client without a certificate connected");
    assert!(async_nats::connect(plain.as_str()).await.is_err());
    // A certificate the authority signed, but no password.
    let refused = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(monitor.ca.clone())
        .add_client_certificate(monitor.cert.clone(), monitor.key.clone())
        .connect(url.as_str())
        .await;
    assert_eq!(
        refused.err().map(|error| error.kind()),
        Some(async_nats::ConnectErrorKind::AuthorizationViolation)
    );

    // The monitoring user reads no subject and sends no op.
    let (options, said, told_by) = server_errors();
    let watcher = monitor
        .connect(None, options.custom_inbox_prefix("_INBOX_monitor"))
        .await
        .unwrap();
    let _events = watcher.subscribe("tiller.>").await.unwrap();
    watcher.flush().await.unwrap();
    told(
        &said,
        &told_by,
        "Permissions Violation for Subscription to \"tiller.>\"",
    )
    .await;
    let _inboxes = watcher.subscribe("_INBOX.>").await.unwrap();
    watcher.flush().await.unwrap();
    told(
        &said,
        &told_by,
        "Permissions Violation for Subscription to \"_INBOX.>\"",
    )
    .await;
    let stop = tiller_cluster::Request::Stop;
    watcher
        .publish(
            tiller_cluster::op_subject(&agent),
            serde_json::to_vec(&stop).unwrap().into(),
        )
        .await
        .unwrap();
    watcher.flush().await.unwrap();
    told(&said, &told_by, "Permissions Violation for Publish").await;
    // The account's figures, which it may read, hold no event; a stream's
    // information (which would list its subjects: tenants, users, agents) it
    // may not ask for.
    let info = watcher.request("$JS.API.INFO", "".into()).await.unwrap();
    assert!(String::from_utf8_lossy(&info.payload).contains("\"streams\""));
    watcher
        .publish("$JS.API.STREAM.INFO.TILLER_EVENTS", "".into())
        .await
        .unwrap();
    watcher.flush().await.unwrap();
    told(
        &said,
        &told_by,
        "Permissions Violation for Publish to \"$JS.API.STREAM.INFO",
    )
    .await;

    // A host's own user, sending what no client may: each refused by the owner.
    let host = chaos
        .nats
        .user("tiller")
        .connect(None, async_nats::ConnectOptions::new())
        .await
        .unwrap();
    // (the op, whom it is sent for, what the refusal names)
    let forbidden = [
        (
            json!({"type": "update_settings", "patch": {"base_url": "http://127.0.0.1:9/v1", "model": "evil"}}),
            json!({}),
            "only prompt",
        ),
        (
            json!({"type": "set_messages", "messages": []}),
            json!({}),
            "only prompt",
        ),
        // The model's own answer, as if the client had written it.
        (
            json!({"type": "prompt", "messages": [before[1].clone()]}),
            json!({}),
            "user messages only",
        ),
        // A prompt sent for a tenant the agent does not work for.
        (
            json!({"type": "prompt", "text": "hi"}),
            json!({"tenant": "someone-else"}),
            "tenant",
        ),
    ];
    for (n, (op, on_behalf, named)) in forbidden.iter().enumerate() {
        let request =
            json!({"type": "submit", "op": op, "key": format!("evil-{n}"), "on_behalf": on_behalf});
        let answer = host
            .request(
                tiller_cluster::op_subject(&agent),
                request.to_string().into(),
            )
            .await
            .unwrap();
        let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
        assert!(
            answer["forbidden"]
                .as_str()
                .is_some_and(|reason| reason.contains(named)),
            "{op} was not refused: {answer}"
        );
    }
    let mut refused = 0.0;
    for on in ["h1", "h2", "h3"] {
        refused += chaos.metrics(on).await["tiller_cluster_ops_refused_total"];
    }
    assert_eq!(refused, 4.0);
    // Nothing changed: the transcript and the agent's model are as they were.
    assert_eq!(chaos.transcript("h3", &agent).await, before);
    let state = chaos.get("h2", &format!("/agents/{agent}")).await;
    assert_eq!(state["definition"]["model"]["id"], "scripted");
    assert!(state["owner"]["epoch"].as_u64().unwrap() > 0, "{state}");
    assert_eq!(state["owner"]["host"], "h1");

    // What a client may do, a host may forward: a fork asked of a host that
    // does not own the agent is made by its owner, and the branch runs on.
    let branch = format!("{agent}-again");
    let (status, made) = chaos
        .post(
            "h3",
            &format!("/sessions/{agent}/fork?wait=true"),
            json!({"at": 2, "id": branch, "prompt": "hi again"}),
            None,
        )
        .await;
    assert_eq!(
        (status, &made["branch"]["parent"]),
        (201, &json!(agent)),
        "{made}"
    );
    let forked = chaos.transcript("h2", &branch).await;
    assert_eq!(forked.len(), 4, "{forked:?}");
    assert_eq!(forked[..2], before[..]);
    assert_eq!(forked[2]["content"][0]["text"], "hi again");
    assert_eq!(chaos.transcript("h3", &agent).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_events_on_any_host_reach_their_sessions_once_wherever_they_live() {
    let Some(chaos) = Chaos::start(3, Duration::from_millis(1)).await else {
        return;
    };
    let hosts = ["h1", "h2", "h3"];
    let ping = |key: usize, n: usize| json!({"key": format!("k{key}"), "n": n});
    // Each session starts on the host its first event reaches: three each.
    for key in 0..9 {
        let (status, body) = chaos
            .post(hosts[key % 3], "/triggers/ping", ping(key, key), None)
            .await;
        assert_eq!((status, &body["matched"]), (202, &json!(1)), "{body}");
    }
    let sessions = wait_for_events(&chaos, 9).await;
    // The other 91, spread over every host at once, for keys each host owns.
    let sends = (9..100).map(|n| {
        let chaos = &chaos;
        async move {
            let (status, body) = chaos
                .post(hosts[n % 3], "/triggers/ping", ping(n % 9, n), None)
                .await;
            assert_eq!((status, &body["matched"]), (202, &json!(1)), "{body}");
        }
    });
    futures::future::join_all(sends).await;
    let seen = wait_for_events(&chaos, 100).await;
    let mut owners = std::collections::BTreeSet::new();
    for session in sessions.keys() {
        let state = chaos.get("h1", &format!("/agents/{session}")).await;
        owners.insert(state["owner"]["host"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        owners.len(),
        3,
        "the sessions live on every host: {owners:?}"
    );
    let mut counted: Vec<usize> = seen.values().flatten().copied().collect();
    counted.sort_unstable();
    assert_eq!(counted, (0..100).collect::<Vec<_>>(), "each event once");
}

/// Waits until the listener's sessions hold `count` events in their user
/// messages; each session's event numbers.
async fn wait_for_events(chaos: &Chaos, count: usize) -> HashMap<String, Vec<usize>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = chaos.get("h2", "/sessions?limit=1000").await;
        let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
        for session in listed.as_array().into_iter().flatten() {
            let id = session["id"].as_str().unwrap_or_default();
            if !id.contains("listener") {
                continue;
            }
            let numbers = seen.entry(id.to_owned()).or_default();
            for message in chaos.transcript("h2", id).await {
                if message["role"] != "user" {
                    continue;
                }
                let text: String = message["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|part| part["text"].as_str())
                    .collect();
                numbers.extend(text.split("\"n\":").skip(1).filter_map(|rest| {
                    rest.split(|c: char| !c.is_ascii_digit())
                        .next()?
                        .parse::<usize>()
                        .ok()
                }));
            }
        }
        if seen.values().map(Vec::len).sum::<usize>() >= count {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "only {seen:?} of {count} events arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_budget_is_one_figure_for_every_host() {
    let tokens = "tokens:\n  - {token: t-acme, tenant: acme}\n\
                  tenants:\n  acme: {budget: {model_calls: 5}}\n";
    let Some(chaos) =
        Chaos::start_with(3, Duration::from_millis(1), Some((tokens, "t-acme"))).await
    else {
        return;
    };
    // Three agents of the tenant's on each host, prompted at once through
    // another host than their owner.
    let mut agents = Vec::new();
    for on in ["h1", "h2", "h3"] {
        for _ in 0..3 {
            agents.push(chaos.create(on).await);
        }
    }
    let prompts = agents.iter().enumerate().map(|(n, agent)| {
        let chaos = &chaos;
        async move {
            let on = ["h2", "h3", "h1"][n / 3];
            let path = format!("/agents/{agent}/prompt?wait=true");
            chaos
                .post(on, &path, json!({"text": format!("p{n}")}), None)
                .await
        }
    });
    let answered = futures::future::join_all(prompts).await;
    let calls = chaos.model.requests().len();
    println!(
        "budget: {calls} model calls reached the model under a budget of 5 (9 prompts on 3 hosts)"
    );
    assert_eq!(calls, 5, "{answered:?}");
    let refused = answered
        .iter()
        .filter(|(_, outcome)| outcome["budget_exceeded"]["scope"] == "tenant")
        .count();
    assert_eq!(refused, 4, "{answered:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_agents_on_three_hosts_keep_to_one_accounts_limit() {
    let Some(chaos) = Chaos::start(3, Duration::from_millis(1)).await else {
        return;
    };
    // The account: 20 requests, refilled at 20 a second, as OpenAI's headers
    // state it; past it, 429 with the wait.
    const CAPACITY: f64 = 20.0;
    const PER_SECOND: f64 = 20.0;
    let bucket = Arc::new(Mutex::new((CAPACITY, Instant::now())));
    let throttled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let (bucket, throttled) = (bucket.clone(), throttled.clone());
        chaos.model.respond_with(move |request| {
            let mut bucket = bucket.lock().unwrap();
            let now = Instant::now();
            bucket.0 = (bucket.0 + (now - bucket.1).as_secs_f64() * PER_SECOND).min(CAPACITY);
            bucket.1 = now;
            let allowed = bucket.0 >= 1.0;
            if allowed {
                bucket.0 -= 1.0;
            }
            let remaining = bucket.0.floor();
            let reset_ms = ((CAPACITY - bucket.0) / PER_SECOND * 1_000.0).ceil();
            let response = if allowed {
                scripted(request, Duration::from_millis(1))
            } else {
                throttled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                MockResponse::status(429, r#"{"error": {"message": "rate limited"}}"#).header(
                    "retry-after-ms",
                    &((1.0 - bucket.0) / PER_SECOND * 1_000.0).ceil().to_string(),
                )
            };
            response
                .header("x-ratelimit-limit-requests", &CAPACITY.to_string())
                .header("x-ratelimit-remaining-requests", &remaining.to_string())
                .header("x-ratelimit-reset-requests", &format!("{reset_ms}ms"))
        });
    }
    let hosts = ["h1", "h2", "h3"];
    let mut agents: Vec<String> = Vec::new();
    for n in 0..200 {
        agents.push(chaos.create(hosts[n % 3]).await);
    }
    let started = Instant::now();
    let prompts = agents.iter().enumerate().map(|(n, agent)| {
        let chaos = &chaos;
        async move {
            let path = format!("/agents/{agent}/prompt?wait=true");
            let (status, outcome) = chaos
                .post(
                    hosts[(n + 1) % 3],
                    &path,
                    json!({"text": format!("p{n}")}),
                    None,
                )
                .await;
            assert_eq!(status, 200, "{outcome}");
            assert!(outcome["error"].is_null(), "{outcome}");
        }
    });
    futures::future::join_all(prompts).await;
    let took = started.elapsed();
    let requests = chaos.model.requests().len();
    let throttled = throttled.load(std::sync::atomic::Ordering::Relaxed);
    let share = throttled as f64 / requests as f64;
    println!(
        "rate limits: {requests} requests, {throttled} answered 429 ({:.1}%, target at most 10%), 200 answers in {:.1} s (the account's floor: {:.1} s)",
        share * 100.0,
        took.as_secs_f64(),
        (200.0 - CAPACITY) / PER_SECOND
    );
    assert!(
        share <= 0.10,
        "{throttled} of {requests} requests were throttled"
    );
    // Every host's agents, page by page from any host.
    let mut listed = Vec::new();
    let mut next = Some("/agents?limit=64".to_owned());
    while let Some(path) = next.take() {
        let response = chaos
            .http
            .get(format!("{}{path}", chaos.host("h2").base))
            .send()
            .await
            .unwrap();
        next = response
            .headers()
            .get("link")
            .and_then(|link| link.to_str().ok()?.strip_prefix('<')?.split_once('>'))
            .map(|(path, _)| path.to_owned());
        let page: Vec<Value> = response.json().await.unwrap();
        assert!(page.len() <= 64);
        listed.extend(
            page.into_iter()
                .map(|agent| agent["id"].as_str().unwrap().to_owned()),
        );
    }
    // In id order, each once; other scenarios' agents may share the store.
    assert!(
        listed.windows(2).all(|pair| pair[0] < pair[1]),
        "{listed:?}"
    );
    agents.sort();
    listed.retain(|id| agents.binary_search(id).is_ok());
    assert_eq!(listed, agents);
}

#[tokio::test]
async fn a_secret_on_the_command_line_and_an_open_bus_off_this_machine_are_refused() {
    let store = "postgres://tiller@127.0.0.1:1/db";
    // (the URLs on the command line, or in $TILLER_CLUSTER; what stderr says)
    let cases = [
        (
            Some("tls://tiller:hunter2@127.0.0.1:4222"),
            None,
            "$TILLER_CLUSTER",
        ),
        (Some("nats://10.1.2.3:4222"), None, "--insecure-cluster"),
        // From the environment, the secret is taken (and never shown).
        (None, Some("nats://tiller:hunter2@10.1.2.3:4222"), "TLS"),
    ];
    for (argument, environment, said) in cases {
        let mut args = vec!["serve", "--store", store];
        args.extend(
            argument
                .map(|urls| ["--cluster", urls])
                .into_iter()
                .flatten(),
        );
        let mut command = tiller(&args);
        if let Some(urls) = environment {
            command.env("TILLER_CLUSTER", urls);
        }
        let refused = common::finish(command).await;
        assert_eq!(refused.code(), Some(2), "{refused:?}");
        assert!(refused.stderr.contains(said), "{}", refused.stderr);
        assert!(!refused.stderr.contains("hunter2"), "{}", refused.stderr);
        assert!(
            !refused.stderr.contains("serving"),
            "refused before it listens: {}",
            refused.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_answers_joining_until_it_has_joined() {
    let Some(store) = postgres_url() else {
        return;
    };
    // A "NATS server" that takes the connection and never says a word: the
    // host waits out its connection timeout, joining all the while.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let _held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let mut host = tiller(&["serve", "--listen", "127.0.0.1:0", "--store", &store])
        .env("TILLER_CLUSTER", format!("nats://127.0.0.1:{port}"))
        .spawn()
        .unwrap();
    let mut stderr = lines(host.stderr.take().unwrap());
    let said = read_until(&mut stderr, |line| line.contains("http://")).await;
    let address = address_in(&said);
    for path in ["/healthz", "/agents"] {
        let response = reqwest::get(format!("http://{address}{path}"))
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "urn:tiller:problem:joining");
    }
    // It never joins: it says why and exits.
    read_until(&mut stderr, |line| line.contains("cannot reach NATS")).await;
    assert_eq!(exit_of(&mut host).await.code(), Some(1));
}

/// The README's "A cluster of hosts" block, run by bash as written (the
/// `tiller` on its path this build's), in a folder of its own beside the
/// repository's scripts and examples; then the jobs it left and what its
/// scripts started are stopped the README's way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_cluster_section_runs_as_written() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    if postgres_url().is_none() || !NatsCluster::available() {
        return;
    }
    if missing_tool(&["curl", "jq", "openssl"], "the README's cluster section").is_some() {
        return;
    }
    let block = readme_block("### A cluster of hosts", "sh");
    let scratch = Scratch::new();
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    for linked in ["scripts", "examples"] {
        std::os::unix::fs::symlink(
            root.join(linked).canonicalize().unwrap(),
            scratch.path().join(linked),
        )
        .unwrap();
    }
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_tiller"))
        .parent()
        .unwrap();
    // Not ending on a script: bash would run the last command in its own
    // place, and that script's caller would be the test, not this shell.
    let script = format!(
        "set -e\n{block}\necho\nkill $(jobs -p) 2>/dev/null || true\nwait 2>/dev/null || true\nscripts/nats.sh stop\nscripts/postgres.sh stop\necho stopped\n"
    );
    let mut bash = tokio::process::Command::new("bash");
    bash.args(["-c", &script])
        .current_dir(scratch.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                binary.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env_remove("TILLER_CLUSTER")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = bash.spawn().unwrap();
    // Whatever happens, nothing the block started outlives the test.
    let group = child.id().unwrap() as i32;
    struct Group(i32);
    impl Drop for Group {
        fn drop(&mut self) {
            signal(-self.0, libc::SIGKILL);
        }
    }
    let _group = Group(group);
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the README's cluster section did not finish in two minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("\"end\":\"completed\""),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.trim_end().ends_with("stopped"), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("owner_changed"),
        "the follower on h2 read the takeover: {stdout}"
    );
    let folder = std::fs::read_to_string(scratch.path().join("nats.txt")).unwrap();
    let folder = folder.lines().nth(1).unwrap();
    assert!(
        !std::path::Path::new(folder).exists(),
        "scripts/nats.sh stop stopped its cluster"
    );
}
