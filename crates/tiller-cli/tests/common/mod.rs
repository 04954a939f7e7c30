//! Helpers for running the built `tiller` binary against loopback servers.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tiller_test_support::{CapturedRequest, MockResponse, MockServer, sse};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// A folder of its own for one test, removed afterwards.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new() -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "tiller-cli-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(path.join("tools")).unwrap();
        Scratch(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to `name` under the folder and answers its path.
    pub(crate) fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `tiller` binary with a clean environment: no keys, no `TILLER_*`.
pub(crate) fn tiller(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tiller"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// What a finished command printed.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Finished {
    pub(crate) fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Runs `command` to the end (at most a minute), its standard input empty.
pub(crate) async fn finish(command: Command) -> Finished {
    finish_with_input(command, b"").await
}

/// Runs `command` with `input` on its standard input, then to the end.
pub(crate) async fn finish_with_input(mut command: Command, input: &[u8]) -> Finished {
    use tokio::io::AsyncWriteExt;
    command.stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("tiller did not finish within a minute")
        .unwrap();
    Finished {
        status: output.status,
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// The lines a running child writes on one of its streams.
pub(crate) fn lines(
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> mpsc::UnboundedReceiver<String> {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// Reads `lines` until one satisfies `found`, answering every line read.
pub(crate) async fn read_until(
    lines: &mut mpsc::UnboundedReceiver<String>,
    found: impl Fn(&str) -> bool,
) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut read = Vec::new();
        loop {
            let line = lines.recv().await.expect("the stream ended first");
            let done = found(&line);
            read.push(line);
            if done {
                return read;
            }
        }
    })
    .await
    .expect("the awaited line never came")
}

/// Waits for a spawned child to exit.
pub(crate) async fn exit_of(child: &mut Child) -> ExitStatus {
    tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("tiller did not exit")
        .unwrap()
}

/// The processes whose parent is `parent`.
pub(crate) fn children_of(parent: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // `pid (comm) state ppid …`; the name may hold spaces and parentheses.
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// The event type of a JSONL line.
pub(crate) fn event_type(line: &Value) -> &str {
    line["event"]["type"].as_str().unwrap()
}

/// The JSON lines of `tiller --events jsonl`, checked to be envelopes of one agent
/// numbered from 0 without gaps, each run's messages (in its `agent_end`) keeping the
/// transcript rule.
pub(crate) fn envelopes(stdout: &str) -> Vec<Value> {
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    for (seq, line) in lines.iter().enumerate() {
        assert_eq!(line["agent_id"], lines[0]["agent_id"]);
        assert_eq!(
            line["seq"], seq,
            "envelopes are numbered from 0 without gaps"
        );
        if line["event"]["type"] == "agent_end" {
            let messages: Vec<tiller::AgentMessage> =
                serde_json::from_value(line["event"]["messages"].clone()).unwrap();
            if let Err(error) = tiller::run::check_transcript(&messages) {
                panic!("invalid transcript: {error}\n{messages:#?}");
            }
        }
    }
    lines
}

/// The event type of a JSON line, with the block event of a `message_update` and
/// the role of a `message_start` or `message_end`: `message_update:text_delta`.
pub(crate) fn event_kind(line: &Value) -> String {
    match event_type(line) {
        "message_update" => format!(
            "message_update:{}",
            line["event"]["assistant_message_event"]["type"]
                .as_str()
                .unwrap()
        ),
        kind @ ("message_start" | "message_end") => format!(
            "{kind}:{}",
            line["event"]["message"]["role"].as_str().unwrap()
        ),
        kind => kind.to_owned(),
    }
}

/// A provider's wire dialect, as the tests script and read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    OpenAi,
    Anthropic,
}

impl Dialect {
    pub(crate) const BOTH: [Dialect; 2] = [Dialect::OpenAi, Dialect::Anthropic];

    /// The options that point `tiller` at `server` in this dialect.
    pub(crate) fn options(self, server: &MockServer) -> Vec<String> {
        let mut options = vec!["--base-url".to_owned(), server.base_url()];
        match self {
            Dialect::OpenAi => options.extend(["--model".to_owned(), "local-model".to_owned()]),
            Dialect::Anthropic => options.extend([
                "--provider".to_owned(),
                "anthropic".to_owned(),
                "--model".to_owned(),
                "claude-test".to_owned(),
            ]),
        }
        options
    }

    /// A command for `tiller` against `server` in this dialect, with `args` after.
    pub(crate) fn tiller(self, server: &MockServer, subcommand: &str, args: &[&str]) -> Command {
        let mut all = vec![subcommand.to_owned()];
        all.extend(self.options(server));
        all.extend(args.iter().map(|a| (*a).to_owned()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let mut command = tiller(&all);
        if self == Dialect::Anthropic {
            command.env("ANTHROPIC_API_KEY", "test-key");
        }
        command
    }

    /// `tiller chat` against `server` in this dialect, with `args` after, started
    /// with its standard input a pipe to type into.
    pub(crate) fn chat(self, server: &MockServer, args: &[&str]) -> Child {
        let mut command = self.tiller(server, "chat", args);
        command.stdin(std::process::Stdio::piped());
        command.spawn().unwrap()
    }

    /// A streamed text reply.
    pub(crate) fn text(self, pieces: &[&str]) -> MockResponse {
        MockResponse::sse(match self {
            Dialect::OpenAi => sse::openai_text(pieces),
            Dialect::Anthropic => sse::anthropic_text(pieces),
        })
    }

    /// A streamed call of one tool.
    pub(crate) fn tool_call(self, id: &str, name: &str, arguments: Value) -> MockResponse {
        MockResponse::sse(match self {
            Dialect::OpenAi => sse::openai_tool_call(id, name, &arguments),
            Dialect::Anthropic => sse::anthropic_tool_call(id, name, &arguments),
        })
    }

    /// The tool results a request carries: call id, text, and (Anthropic only) the
    /// error flag.
    pub(crate) fn tool_results(self, request: &CapturedRequest) -> Vec<Value> {
        let messages = request.body["messages"].as_array().unwrap();
        match self {
            Dialect::OpenAi => messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| json!({"id": m["tool_call_id"], "text": m["content"]}))
                .collect(),
            Dialect::Anthropic => messages
                .iter()
                .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
                .filter(|block| block["type"] == "tool_result")
                .map(|block| {
                    let text: String = block["content"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(|c| c["text"].as_str())
                        .collect();
                    json!({"id": block["tool_use_id"], "text": text, "is_error": block.get("is_error").cloned().unwrap_or(json!(false))})
                })
                .collect(),
        }
    }

    /// The text of the last user message of a request.
    pub(crate) fn last_user_text(self, request: &CapturedRequest) -> String {
        let messages = request.body["messages"].as_array().unwrap();
        let last = messages.iter().rev().find(|m| m["role"] == "user").unwrap();
        match &last["content"] {
            Value::String(text) => text.clone(),
            Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
            other => panic!("unexpected user content {other}"),
        }
    }
}

/// An agent file whose tools are the given YAML list items (already indented).
pub(crate) fn agent_yaml(tools: &str) -> String {
    format!(
        "type: object\n\
         description: You are a careful assistant.\n\
         properties:\n  answer: {{type: string}}\n\
         required: [answer]\n\
         json_schema_extra:\n  kind: agent\n  name: helper\n  version: \"1.0.0\"\n  thinking: off\n  max_turns: 10\n  tools:\n{tools}"
    )
}

/// A Python tool script that reads its arguments from stdin.
pub(crate) fn python_tool(body: &str) -> String {
    format!(
        "import json, os, sys, time\nargs = json.load(sys.stdin)\nhere = os.path.dirname(os.path.abspath(__file__))\n{body}\n"
    )
}

/// An agent file in `scratch` with one tool, `wait`, that runs until the file
/// `tools/go` exists (the test writes it to let the tool finish); answers its path.
pub(crate) fn waiting_agent(scratch: &Scratch) -> PathBuf {
    scratch.write(
        "tools/wait.py",
        &python_tool(
            "go = os.path.join(here, 'go')\n\
             while not os.path.exists(go):\n    time.sleep(0.01)\n\
             print('waited')",
        ),
    );
    scratch.write(
        "agent.yaml",
        &agent_yaml(
            "    - name: wait\n      description: Waits\n      command: [python3, tools/wait.py]\n",
        ),
    )
}

/// Waits (at most ten seconds) until process `pid` has ended: it no longer exists,
/// or is a zombie nobody has reaped yet.
pub(crate) async fn gone(pid: i32) {
    gone_within(pid, Duration::from_secs(10)).await;
}

/// Waits at most `within` until process `pid` has ended (see [`gone`]).
pub(crate) async fn gone_within(pid: i32, within: Duration) {
    let ended = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    };
    tokio::time::timeout(within, async {
        while !ended() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("process {pid} outlived its call by {within:?}"));
}

/// An agent file of the `helper` agent, answered by whatever model is set.
pub(crate) const HELPER: &str = "type: object\n\
                      description: You help.\n\
                      json_schema_extra: {kind: agent, name: helper}\n";

#[allow(unsafe_code)]
/// Sends SIGTERM to `pid`.
pub(crate) fn terminate(pid: u32) {
    // SAFETY: kill only sends a signal to the child we started.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
}

/// A running `tiller serve` of a folder holding the `helper` agent file.
pub(crate) struct Serving {
    pub(crate) child: Child,
    pub(crate) base: String,
    pub(crate) stderr: mpsc::UnboundedReceiver<String>,
    _scratch: Scratch,
}

impl Serving {
    pub(crate) async fn start() -> Serving {
        Serving::start_with(Scratch::new(), &[], &[]).await
    }

    /// Serves the folder `agents` of `scratch`, written here, with `more` options
    /// and the environment variables `vars`.
    pub(crate) async fn start_with(
        scratch: Scratch,
        more: &[&str],
        vars: &[(&str, &str)],
    ) -> Serving {
        std::fs::create_dir_all(scratch.path().join("agents")).unwrap();
        scratch.write("agents/helper.yaml", HELPER);
        let agents = scratch.path().join("agents");
        let mut args = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--agents",
            agents.to_str().unwrap(),
        ];
        args.extend(more);
        let mut child = tiller(&args).envs(vars.iter().copied()).spawn().unwrap();
        let mut stderr = lines(child.stderr.take().unwrap());
        let said = read_until(&mut stderr, |line| line.contains("http://")).await;
        let line = said.last().unwrap();
        assert!(
            line.contains("agent definition(s)") && line.contains("helper"),
            "{line}"
        );
        let address = line
            .split("http://")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        Serving {
            child,
            base: format!("http://{address}"),
            stderr,
            _scratch: scratch,
        }
    }

    /// Stops it with SIGTERM; it must exit 0 saying so.
    pub(crate) async fn stop(mut self) {
        terminate(self.child.id().unwrap());
        let status = exit_of(&mut self.child).await;
        assert_eq!(status.code(), Some(0));
        read_until(&mut self.stderr, |line| line == "tiller: stopped").await;
    }
}

#[allow(unsafe_code)]
/// Sends SIGKILL to `pid`.
pub(crate) fn kill_hard(pid: u32) {
    // SAFETY: kill only sends a signal to the child we started.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

/// A JSON request to a serving `tiller`: its status and body.
pub(crate) async fn request(
    method: reqwest::Method,
    url: String,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let request = reqwest::Client::new().request(method, url);
    let request = match token {
        Some(token) => request.bearer_auth(token),
        None => request,
    };
    let request = match body {
        Some(body) => request
            .header("content-type", "application/json")
            .body(body.to_string()),
        None => request,
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The first block fenced as `fence` (```` ```sh ````, ```` ```text ````, …)
/// after the README's heading `heading`, as written.
pub(crate) fn readme_block(heading: &str, fence: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = readme.split(heading).nth(1).unwrap();
    section
        .split(&format!("```{fence}\n"))
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap()
        .to_owned()
}

/// The first of `tools` this machine's `PATH` lacks, for a test that runs
/// them: with `TILLER_LIVE=required` none may be missing.
pub(crate) fn missing_tool<'a>(tools: &[&'a str], for_what: &str) -> Option<&'a str> {
    let missing = tools.iter().copied().find(|tool| {
        !std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })?;
    assert!(
        !tiller_test_support::live::live_required(),
        "{missing} is needed by {for_what}"
    );
    eprintln!("skipping {for_what}: no {missing} here");
    Some(missing)
}
