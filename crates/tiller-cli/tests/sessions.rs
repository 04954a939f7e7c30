//! `--session` across invocations: a `tiller chat` killed with SIGKILL while a tool
//! runs is resumed with every finished message, its queued follow-up and a valid
//! transcript, against SQLite and PostgreSQL; `tiller sessions` lists, shows,
//! forks, removes and prunes what is kept.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Dialect, Scratch, finish, lines, read_until, tiller};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_test_support::MockServer;
use tokio::io::AsyncWriteExt;

/// The stored session, as `tiller sessions show NAME --json` prints it.
async fn stored(store: &str, name: &str) -> Value {
    let shown = finish(tiller(&[
        "sessions", "show", name, "--json", "--store", store,
    ]))
    .await;
    assert_eq!(shown.code(), Some(0), "{}", shown.stderr);
    serde_json::from_str(&shown.stdout).unwrap()
}

fn roles(session: &Value) -> Vec<String> {
    session["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["role"].as_str().unwrap().to_owned())
        .collect()
}

async fn killed_while_a_tool_runs_then_resumed(store: &str, name: &str) {
    let scratch = Scratch::new();
    let agent = common::waiting_agent(&scratch);
    let agent = agent.to_str().unwrap();
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "wait", json!({})));

    let session = [
        "--agent",
        agent,
        "--events",
        "jsonl",
        "--session",
        name,
        "--store",
        store,
    ];
    let mut child = dialect.chat(&server, &session);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = lines(child.stdout.take().unwrap());
    let mut stderr = lines(child.stderr.take().unwrap());
    stdin.write_all(b"start the job\n").await.unwrap();
    read_until(&mut stdout, |line| {
        line.contains("\"tool_execution_start\"")
    })
    .await;
    stdin.write_all(b"/follow and report back\n").await.unwrap();
    read_until(&mut stderr, |line| line == "[follow-up queued]").await;
    child.start_kill().unwrap();
    let status = child.wait().await.unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    std::fs::write(scratch.path().join("tools/go"), "").unwrap();

    // What was finished is stored; the follow-up still waits.
    let left = stored(store, name).await;
    assert_eq!(roles(&left), ["user", "assistant"]);
    assert_eq!(
        left["follow_up"][0]["content"][0]["text"],
        "and report back"
    );

    // Resumed: the open call is answered, the prompt runs, then the follow-up.
    server.push(dialect.text(&["It was interrupted."]));
    server.push(dialect.text(&["Reporting back."]));
    let mut args = session.to_vec();
    args.push("what happened?");
    let resumed = finish(dialect.tiller(&server, "run", &args)).await;
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        dialect.tool_results(&requests[1]),
        [
            json!({"id": "call_1", "text": "Tool call \"wait\" was interrupted: the agent stopped before it finished and was brought back from its session."})
        ]
    );
    assert_eq!(dialect.last_user_text(&requests[1]), "what happened?");
    assert_eq!(dialect.last_user_text(&requests[2]), "and report back");

    let after = stored(store, name).await;
    let messages: Vec<tiller::AgentMessage> =
        serde_json::from_value(after["messages"].clone()).unwrap();
    tiller::run::check_transcript(&messages).unwrap();
    assert_eq!(
        roles(&after),
        [
            "user",
            "assistant",
            "tool_result",
            "user",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert_eq!(after["follow_up"], json!([]));

    let removed = finish(tiller(&["sessions", "rm", name, "--store", store])).await;
    assert_eq!(removed.code(), Some(0), "{}", removed.stderr);
    let gone = finish(tiller(&["sessions", "show", name, "--store", store])).await;
    assert_eq!(gone.code(), Some(1));
    assert_eq!(gone.stderr, format!("tiller: no session named `{name}`\n"));
}

#[tokio::test]
async fn a_chat_killed_mid_tool_resumes_from_sqlite() {
    let scratch = Scratch::new();
    let store = format!("sqlite://{}", scratch.path().join("sessions.db").display());
    killed_while_a_tool_runs_then_resumed(&store, "killed").await;
}

#[tokio::test]
async fn a_chat_killed_mid_tool_resumes_from_postgres() {
    let Some(url) = tiller_test_support::postgres::postgres_url() else {
        return;
    };
    let name = format!("killed-{}-{}", std::process::id(), tiller::ai::now_ms());
    killed_while_a_tool_runs_then_resumed(&url, &name).await;
}

#[tokio::test]
async fn sessions_are_listed_shown_and_continued_by_name() {
    let scratch = Scratch::new();
    let store = format!("sqlite://{}", scratch.path().join("sessions.db").display());
    for prompt in ["first question", "second question"] {
        let run = finish(tiller(&[
            "run",
            "--session",
            "notes",
            "--store",
            &store,
            prompt,
        ]))
        .await;
        assert_eq!(run.code(), Some(0), "{}", run.stderr);
    }
    let listed = finish(tiller(&["sessions", "list", "--store", &store])).await;
    let columns: Vec<&str> = listed.stdout.trim_end().split('\t').collect();
    assert_eq!(columns[..3], ["notes", "4 messages", "active"]);
    let shown = finish(tiller(&["sessions", "show", "notes", "--store", &store])).await;
    let lines: Vec<&str> = shown.stdout.lines().collect();
    assert!(
        lines[0].starts_with("session notes · active · created "),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1], "user: first question");
    assert!(lines[2].starts_with("assistant: You said: \"first question\"."));
    assert_eq!(lines[3], "user: second question");
    assert_eq!(lines.len(), 5);

    // A branch from before the second question, carried on by name.
    let forked = finish(tiller(&[
        "sessions", "fork", "notes", "--at", "2", "--id", "notes-b", "--store", &store,
    ]))
    .await;
    assert_eq!(
        (forked.code(), forked.stdout.as_str()),
        (Some(0), "notes-b\n")
    );
    let run = finish(tiller(&[
        "run",
        "--session",
        "notes-b",
        "--store",
        &store,
        "another question",
    ]))
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let shown = finish(tiller(&["sessions", "show", "notes-b", "--store", &store])).await;
    let lines: Vec<&str> = shown.stdout.lines().skip(1).collect();
    assert_eq!(lines[0], "user: first question");
    assert_eq!(lines[2], "user: another question");
    assert_eq!(lines.len(), 4);
    let branches = finish(tiller(&[
        "sessions", "branches", "notes", "--store", &store,
    ]))
    .await;
    let columns: Vec<&str> = branches.stdout.trim_end().split('\t').collect();
    assert_eq!(
        (columns[..3].to_vec(), columns[4]),
        (
            vec!["notes-b", "4 messages", "active"],
            "branch of notes at 2"
        )
    );
    let past = finish(tiller(&[
        "sessions", "fork", "notes", "--at", "9", "--store", &store,
    ]))
    .await;
    assert_eq!(
        (past.code(), past.stderr.as_str()),
        (
            Some(1),
            "tiller: session `notes` holds 4 messages: it cannot be forked at 9\n"
        )
    );
    let removed = finish(tiller(&["sessions", "rm", "notes-b", "--store", &store])).await;
    assert_eq!(removed.code(), Some(0), "{}", removed.stderr);

    // The default store lives under the data directory.
    let data = scratch.path().join("data");
    let mut run = tiller(&["run", "--session", "elsewhere", "hi"]);
    run.env("XDG_DATA_HOME", &data);
    assert_eq!(finish(run).await.code(), Some(0));
    assert!(data.join("tiller/sessions.db").exists());

    // A closed session past the retention is pruned; an active one never is.
    {
        use tiller::store::{Change, SessionFilter, SessionStatus, SessionWrite, StoreWriter};
        let kept = tiller::store::open(&store).await.unwrap();
        let epoch = kept.list(&SessionFilter::default()).await.unwrap()[0]
            .record
            .epoch;
        StoreWriter::for_store(kept)
            .write(vec![
                SessionWrite::new("notes", Change::SetStatus(SessionStatus::Closed))
                    .at_epoch(epoch),
            ])
            .await
            .unwrap();
    }
    let kept = finish(tiller(&[
        "sessions",
        "prune",
        "--older-than-days",
        "1",
        "--store",
        &store,
    ]))
    .await;
    assert_eq!(
        kept.stdout, "0 closed session(s) deleted\n",
        "{}",
        kept.stderr
    );
    let pruned = finish(tiller(&[
        "sessions",
        "prune",
        "--older-than-days",
        "0",
        "--store",
        &store,
    ]))
    .await;
    assert_eq!(
        pruned.stdout, "1 closed session(s) deleted\n",
        "{}",
        pruned.stderr
    );
    let listed = finish(tiller(&["sessions", "list", "--store", &store])).await;
    assert!(listed.stdout.is_empty(), "{}", listed.stdout);

    let bad = finish(tiller(&["sessions", "list", "--store", "mysql://x"])).await;
    assert_eq!(bad.code(), Some(1));
    assert_eq!(
        bad.stderr,
        "tiller: unsupported store `mysql://x`: expected memory:, sqlite://PATH or postgres://…\n"
    );
}

/// `kill -9` of `tiller` takes its command tool's program and its stdio MCP server
/// down within a second: they die with it (the parent-death signal), rather than
/// live on as orphans. The tool here would otherwise wait forever.
#[tokio::test]
async fn a_kill_9_of_tiller_takes_its_tools_and_mcp_servers_down() {
    let scratch = Scratch::new();
    // The tool's pid on this machine (in a PID namespace of its own it is 2).
    scratch.write(
        "tools/wait.py",
        &common::python_tool(
            "open(os.path.join(here, 'pid'), 'w').write(os.readlink('/proc/self') + '\\n')\n\
             while True:\n    time.sleep(0.01)",
        ),
    );
    let mcp =
        tiller_test_support::live::installed("mcp.sh", "bin", "the MCP part of the kill test")
            .map(|bin| {
                format!(
                    "\x20 mcp_servers:\n\x20   - name: docs\n\x20     command: [\"{}\", \"{}\"]\n",
                    bin.join("mcp-server-filesystem").display(),
                    scratch.path().display()
                )
            })
            .unwrap_or_default();
    let agent = scratch.write(
        "agent.yaml",
        &format!(
            "{}{mcp}",
            common::agent_yaml(
                "    - name: wait\n      description: Waits\n      command: [python3, tools/wait.py]\n"
            )
        ),
    );
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "wait", json!({})));
    let mut child = dialect.chat(
        &server,
        &["--agent", agent.to_str().unwrap(), "--events", "jsonl"],
    );
    let tiller_pid = child.id().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = lines(child.stdout.take().unwrap());
    stdin.write_all(b"wait for it\n").await.unwrap();
    read_until(&mut stdout, |line| {
        line.contains("\"tool_execution_start\"")
    })
    .await;
    let pid_file = scratch.path().join("tools/pid");
    let tool = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            if let Ok(text) = std::fs::read_to_string(&pid_file)
                && let Ok(pid) = text.trim().parse::<i32>()
            {
                return pid;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the tool never started");
    let children = common::children_of(tiller_pid);
    // The tool runs below tiller: its child, or, in a PID namespace of its own,
    // below the keeper that is.
    let mut below = children.clone();
    let mut at = 0;
    while at < below.len() {
        below.extend(common::children_of(below[at] as u32));
        at += 1;
    }
    assert!(below.contains(&tool), "{below:?} holds {tool}");
    assert_eq!(
        children.len(),
        if mcp.is_empty() { 1 } else { 2 },
        "the tool (or its keeper), and the MCP server when there is one: {children:?}"
    );

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    for pid in children {
        common::gone_within(pid, std::time::Duration::from_secs(1)).await;
    }
}

/// A session reloaded with `--compress-chars` shows the model a long answer cut in
/// its middle, its start and end kept around the marker; an agent file's
/// `compression` does the same. The store keeps the answer whole.
#[tokio::test]
async fn a_reloaded_session_cuts_long_answers_as_the_command_or_the_file_says() {
    let scratch = Scratch::new();
    let store = format!("sqlite://{}", scratch.path().join("sessions.db").display());
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    let long = format!("Start of the plan. {}End of the plan.", "step. ".repeat(50));
    server.push(dialect.text(&[&long]));
    server.push(dialect.text(&["Noted."]));
    server.push(dialect.text(&["Noted again."]));
    let agent = scratch.write(
        "agent.yaml",
        "type: object\ndescription: You plan.\njson_schema_extra: {kind: agent, name: planner, compression: {max_chars: 30, keep_end_chars: 16}}\n",
    );
    let session = ["--session", "plan", "--store", &store];
    for args in [
        &["make a plan"][..],
        &["--compress-chars", "40", "go on"],
        &["--agent", agent.to_str().unwrap(), "and then?"],
    ] {
        let run = finish(dialect.tiller(&server, "run", &[&session[..], args].concat())).await;
        assert_eq!(run.code(), Some(0), "{}", run.stderr);
    }
    let cut = |max: usize, end: usize| {
        let length = long.chars().count();
        format!(
            "{}\n[… {} characters cut. The whole message is \"message:1\": call the `lookup` tool with that name to read it.]\n{}",
            long.chars().take(max - end).collect::<String>(),
            length - max,
            long.chars().skip(length - end).collect::<String>()
        )
    };
    let seen: Vec<Value> = server
        .requests()
        .iter()
        .map(|request| {
            request.body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|message| message["role"] == "assistant")
                .map_or(Value::Null, |message| message["content"].clone())
        })
        .collect();
    assert_eq!(seen, [Value::Null, json!(cut(40, 10)), json!(cut(30, 16))]);
    let kept = stored(&store, "plan").await;
    assert_eq!(kept["messages"][1]["content"][0]["text"], long);
}
