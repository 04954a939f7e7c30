//! The crash loop: the real `tiller` binary, sessions on SQLite, a command tool that
//! appends its call id (`TILLER_CALL_ID`) to a file, steering and follow-ups sent
//! mid-run — and each run killed with SIGKILL at a random point chosen by event
//! type, then resumed. After each resume:
//!
//! - the stored transcript passes `check_transcript`;
//! - no call id appears twice in the tool's file;
//! - every steering or follow-up message `tiller chat` acknowledged is in the
//!   transcript or still queued.
//!
//! The scripted model is a function of the conversation it is sent, as a real one
//! would be asked again: it calls the tool for the first user message it has not
//! answered, with an id made from that message. A call lost by a crash after its
//! tool ran would be made again with the same id, and the file would show it twice.
//! In some runs a busy disk is played by another process holding SQLite's write
//! lock for a while from the middle of a response, so that commits wait as they do
//! on a loaded machine. `TILLER_CRASH_SEED` replays a run's choices;
//! `TILLER_CRASH_RUNS` sets how many.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::time::Duration;

use common::{Scratch, agent_yaml, finish, lines, python_tool, tiller};
use serde_json::{Value, json};
use tiller::store;
use tiller_test_support::{CapturedRequest, MockResponse, MockServer, sse};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Where a run is killed: at the `nth` event line of this kind (`event_kind`).
const KILL_POINTS: [&str; 9] = [
    "turn_start",
    "message_end:user",
    "message_update",
    "message_end:assistant",
    "tool_execution_start",
    "tool_execution_end",
    "message_end:tool_result",
    "turn_end",
    "agent_end",
];

/// When a steering message or a follow-up is sent, if at all.
const SEND_POINTS: [&str; 3] = ["message_update", "tool_execution_start", "never"];

/// When another process takes SQLite's write lock, if at all, and for how long.
const LOCK_POINTS: [&str; 3] = ["message_start:assistant", "message_update", "never"];
const LOCK_HOLDS: [&str; 3] = ["0.05", "0.15", "0.3"];

/// Holds the write lock of the SQLite file `argv[1]` for `argv[2]` seconds from
/// when a line arrives on its standard input.
const LOCKER: &str = "import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
sys.stdin.readline()
db.execute('BEGIN IMMEDIATE')
time.sleep(float(sys.argv[2]))
db.execute('COMMIT')
";

/// A small deterministic generator (xorshift64*), seeded once per test.
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

/// The text of an OpenAI request message.
fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// The scripted model: a call of `note` for the first user message after its last
/// answer, with an id made from that message's text; once the calls are
/// answered, a short text. Events are paced as a model streams them.
fn model(request: &CapturedRequest) -> MockResponse {
    let messages = request.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let after = messages
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .map_or(0, |last| last + 1);
    let body = match messages[after..].iter().find(|m| m["role"] == "user") {
        Some(user) => {
            let text = text_of(user);
            let mut hasher = DefaultHasher::new();
            text.hash(&mut hasher);
            let id = format!("call-{:016x}", hasher.finish());
            sse::openai_tool_call(&id, "note", &json!({"about": text}))
        }
        None => sse::openai_text(&["Noted", " it", " all", "."]),
    };
    let events: Vec<String> = body.split_inclusive("\n\n").map(str::to_owned).collect();
    MockResponse::sse(body)
        .chunks(events)
        .chunk_delay(Duration::from_millis(2))
}

/// The kind of a JSONL event line: `message_end:assistant`, `tool_execution_start`.
fn kind_of(line: &str) -> String {
    let value: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    let kind = value["event"]["type"].as_str().unwrap_or("").to_owned();
    match kind.as_str() {
        "message_start" | "message_end" => {
            let role = value["event"]["message"]["role"].as_str().unwrap_or("");
            format!("{kind}:{role}")
        }
        _ => kind,
    }
}

async fn next_line(lines: &mut mpsc::UnboundedReceiver<String>) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(30), lines.recv())
        .await
        .expect("tiller chat said nothing for 30 s")
}

#[tokio::test]
async fn two_hundred_runs_killed_at_random_points_lose_and_repeat_nothing() {
    let runs: usize = std::env::var("TILLER_CRASH_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(200);
    let seed: u64 = std::env::var("TILLER_CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| tiller::ai::now_ms() | 1);
    let _ = writeln!(
        std::io::stderr(),
        "crash loop: {runs} runs, TILLER_CRASH_SEED={seed}"
    );
    let mut random = Random(seed);

    let scratch = Scratch::new();
    scratch.write(
        "tools/note.py",
        &python_tool(
            "with open(os.path.join(here, 'calls.txt'), 'a') as calls:\n    \
             calls.write(os.environ['TILLER_CALL_ID'] + '\\n')\n\
             time.sleep(0.03)\n\
             print('noted')",
        ),
    );
    let agent = scratch.write(
        "agent.yaml",
        &agent_yaml(
            "    - name: note\n      description: Notes something down\n      command: [python3, tools/note.py]\n",
        ),
    );
    let agent = agent.to_str().unwrap().to_owned();
    let calls_file = scratch.path().join("tools/calls.txt");
    let database = scratch.path().join("sessions.db");
    let store = format!("sqlite://{}", database.display());
    let locker = scratch.write("locker.py", LOCKER);
    let server = MockServer::start().await;
    server.respond_with(model);
    let base_url = server.base_url();
    let options = |session: &str| -> Vec<String> {
        [
            "--store",
            &store,
            "--session",
            session,
            "--agent",
            &agent,
            "--base-url",
            &base_url,
            "--model",
            "scripted",
        ]
        .map(str::to_owned)
        .to_vec()
    };

    let (mut done, mut reached, mut resumes, mut violations) = (0, 0, 0, Vec::new());
    for run in 0..runs {
        done += 1;
        let session = format!("s{}", run % 10);
        let kill_at = random.pick(&KILL_POINTS);
        let nth = 1 + random.below(2);
        let steer_at = random.pick(&SEND_POINTS);
        let follow_at = random.pick(&SEND_POINTS);
        let lock_at = random.pick(&LOCK_POINTS);
        let mut lock = (lock_at != "never").then(|| {
            tokio::process::Command::new("python3")
                .arg(&locker)
                .arg(&database)
                .arg(random.pick(&LOCK_HOLDS))
                .stdin(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        });

        let mut args = vec!["chat".to_owned()];
        args.extend(options(&session));
        args.extend(["--events".to_owned(), "jsonl".to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut command = tiller(&args);
        command.stdin(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = lines(child.stdout.take().unwrap());
        let mut stderr = lines(child.stderr.take().unwrap());
        stdin
            .write_all(format!("task {run}\n").as_bytes())
            .await
            .unwrap();

        let (mut seen, mut steered, mut followed) = (0, false, false);
        while let Some(line) = next_line(&mut stdout).await {
            let kind = kind_of(&line);
            if kind == kill_at {
                seen += 1;
            }
            if seen == nth {
                reached += 1;
                break;
            }
            if kind == "agent_end" {
                break;
            }
            if kind == lock_at
                && let Some(mut stdin) = lock.as_mut().and_then(|locker| locker.stdin.take())
            {
                let _ = stdin.write_all(b"lock\n").await;
            }
            if !steered && kind == steer_at {
                steered = true;
                let _ = stdin.write_all(format!("steer {run}\n").as_bytes()).await;
            }
            if !followed && kind == follow_at {
                followed = true;
                let _ = stdin
                    .write_all(format!("/follow follow {run}\n").as_bytes())
                    .await;
            }
        }
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        if let Some(mut locker) = lock {
            let _ = locker.start_kill();
            let _ = locker.wait().await;
        }
        // Everything it said before it died: the acknowledgements among it.
        let mut acknowledged = Vec::new();
        while let Some(line) = stderr.recv().await {
            match line.as_str() {
                "[steering queued]" => acknowledged.push(format!("steer {run}")),
                "[follow-up queued]" => acknowledged.push(format!("follow {run}")),
                _ => {}
            }
        }

        let mut args = vec!["run".to_owned()];
        args.extend(options(&session));
        args.push(format!("resume {run}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let resumed = finish(tiller(&args)).await;
        if resumed.code() == Some(0) {
            resumes += 1;
        } else {
            violations.push(format!(
                "run {run}: the resume failed: {}",
                resumed.stderr.trim()
            ));
        }

        let opened = store::open(&store).await.unwrap();
        let stored = opened.load(&session).await.unwrap().unwrap();
        drop(opened);
        let messages: Vec<tiller::AgentMessage> =
            stored.messages.iter().map(|m| (**m).clone()).collect();
        if let Err(error) = tiller::run::check_transcript(&messages) {
            violations.push(format!("run {run}: invalid transcript: {error}"));
        }
        let said: HashSet<String> = messages
            .iter()
            .filter_map(|m| m.as_user().map(|user| user.text_content()))
            .chain(
                stored
                    .steering
                    .iter()
                    .chain(&stored.follow_up)
                    .filter_map(|queued| queued.message.as_user().map(|u| u.text_content())),
            )
            .collect();
        for text in &acknowledged {
            if !said.contains(text) {
                violations.push(format!("run {run}: `{text}` was acknowledged, then lost"));
            }
        }
        let ids = std::fs::read_to_string(&calls_file).unwrap_or_default();
        let mut once = HashSet::new();
        for id in ids.lines() {
            if !once.insert(id) {
                violations.push(format!("run {run}: the call {id} ran twice"));
            }
        }
        // A violation found once is reported once.
        if !violations.is_empty() {
            break;
        }
    }
    let calls = std::fs::read_to_string(&calls_file)
        .unwrap_or_default()
        .lines()
        .count();
    // Straight to stderr, past the test harness's capture: CI's log shows it.
    let _ = writeln!(
        std::io::stderr(),
        "crash loop: {done} runs, {reached} kill points reached, {resumes} resumes, {calls} tool calls run, {} violations",
        violations.len()
    );
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
}
