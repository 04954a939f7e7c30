//! `tiller chat` driven through a pipe: prompts, a steering line while a slow tool
//! runs, commands, and the end of input.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Dialect, Scratch, event_type, exit_of, finish_with_input, lines, read_until};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_test_support::MockServer;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn a_line_typed_while_a_tool_runs_steers_the_agent() {
    let scratch = Scratch::new();
    // The tool finishes only once the test says so, after the steering line is in.
    let agent = common::waiting_agent(&scratch);
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "wait", json!({})));
    server.push(dialect.text(&["Stopping as asked."]));

    let mut child = dialect.chat(
        &server,
        &["--agent", agent.to_str().unwrap(), "--events", "jsonl"],
    );
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = lines(child.stdout.take().unwrap());
    let mut stderr = lines(child.stderr.take().unwrap());

    stdin.write_all(b"start the job\n").await.unwrap();
    read_until(&mut stdout, |line| {
        line.contains("\"tool_execution_start\"")
    })
    .await;
    stdin.write_all(b"never mind, stop\n").await.unwrap();
    read_until(&mut stderr, |line| line == "[steering queued]").await;
    std::fs::write(scratch.path().join("tools/go"), "").unwrap();
    drop(stdin);

    let status = exit_of(&mut child).await;
    assert_eq!(status.code(), Some(0));
    let mut events: Vec<Value> = Vec::new();
    while let Some(line) = stdout.recv().await {
        events.push(serde_json::from_str(&line).unwrap());
    }
    assert_eq!(event_type(events.last().unwrap()), "agent_end");

    let requests = server.requests();
    assert_eq!(
        requests.len(),
        2,
        "one run: the tool call, then the steered answer"
    );
    let roles: Vec<&str> = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(dialect.last_user_text(&requests[1]), "never mind, stop");
    assert_eq!(
        dialect.tool_results(&requests[1]),
        [json!({"id": "call_1", "text": "waited"})]
    );
}

#[tokio::test]
async fn commands_and_prompts_from_a_pipe() {
    let dialect = Dialect::Anthropic;
    let server = MockServer::start().await;
    server.push(dialect.text(&["First answer."]));
    server.push(dialect.text(&["After the reset."]));
    // Commands wait for each run's end (its `agent_end`): a line typed before it
    // would steer or abort the run.
    let mut child = dialect.chat(&server, &["--events", "jsonl"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = lines(child.stdout.take().unwrap());
    let mut stderr = lines(child.stderr.take().unwrap());

    stdin.write_all(b"hello\n").await.unwrap();
    read_until(&mut stdout, |line| line.contains("\"agent_end\"")).await;
    stdin
        .write_all(b"/state\n/frobnicate\n/abort\n/reset\n")
        .await
        .unwrap();
    let said = read_until(&mut stderr, |line| line.starts_with("[reset")).await;
    assert_eq!(
        said,
        [
            "[2 messages · 10 tokens in, 1 out · $0.0000 · idle]",
            "[unknown command /frobnicate: a line is a prompt when the agent is idle, steers it while it works, and answers when a tool asks (y or n to approve a call); /file PATH attaches a file to the next message, /follow TEXT queues a follow-up, /abort stops the run, /reset clears the conversation, /compact [WHAT TO KEEP] replaces its oldest part with a summary, /state summarises it, /quit leaves]",
            "[nothing to abort]",
            "[reset: the conversation is empty]",
        ]
    );
    stdin.write_all(b"again\n").await.unwrap();
    read_until(&mut stdout, |line| line.contains("\"agent_end\"")).await;
    stdin.write_all(b"/quit\n").await.unwrap();
    assert_eq!(exit_of(&mut child).await.code(), Some(0));

    let requests = server.requests();
    assert_eq!(
        requests[1].body["messages"].as_array().unwrap().len(),
        1,
        "the reset emptied the conversation"
    );
    assert_eq!(dialect.last_user_text(&requests[1]), "again");
}

#[tokio::test]
async fn a_chat_on_the_faux_model_ends_with_its_input() {
    let run = finish_with_input(common::tiller(&["chat"]), b"Hello\n").await;
    assert_eq!(run.code(), Some(0));
    assert!(
        run.stdout.starts_with("You said: \"Hello\"."),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains("using the scripted faux model"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn a_file_attached_in_a_chat_goes_with_the_next_message_only() {
    let report = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/files/report.pdf"
    );
    let input = format!("/file {report}\n/file /no/such.pdf\nWhat does it say?\nAnd now?\n");
    let run = finish_with_input(common::tiller(&["chat"]), input.as_bytes()).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let answers: Vec<&str> = run
        .stdout
        .lines()
        .map(|line| line.split(". I am").next().unwrap())
        .collect();
    assert_eq!(
        answers,
        [
            "You said: \"What does it say?\" and attached report.pdf (application/pdf, 650 bytes)",
            "You said: \"And now?\"",
        ]
    );
    assert!(
        run.stderr.contains(
            "[report.pdf attached (application/pdf, 650 bytes): it goes with your next message]\n\
             [could not read /no/such.pdf: No such file or directory (os error 2)]\n"
        ),
        "{}",
        run.stderr
    );
}

/// An agent file in `scratch` whose `remind` tool (a program) asks when, unless
/// told; its calls wait for approval when `approvals` says so.
fn remind_agent(scratch: &Scratch, approvals: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(scratch.path().join("tools")).unwrap();
    scratch.write(
        "tools/remind.py",
        &common::python_tool(
            "if 'due' not in args:\n    print(json.dumps({'field': 'due', 'question': 'When?'}))\n    sys.exit(75)\nprint('set for ' + args['due'])",
        ),
    );
    scratch.write(
        "agent.yaml",
        &format!("type: object\ndescription: You set reminders.\njson_schema_extra:\n  kind: agent\n  name: reminder\n  approvals: {approvals}\n  tools:\n    - name: remind\n      description: Set a reminder\n      parameters: {{type: object, properties: {{what: {{type: string}}, due: {{type: string}}}}, required: [what]}}\n      command: [python3, tools/remind.py]\n"),
    )
}

/// A tool that needs approval and asks for what it lacks, in a conversation: the
/// chat shows the approval and the question, and the next lines answer them: the
/// answer goes into the call, which asks for approval again with it.
#[tokio::test]
async fn the_chat_asks_for_approval_and_for_what_a_tool_lacks() {
    let scratch = Scratch::new();
    let agent = remind_agent(&scratch, "{remind: ask}");
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "remind", json!({"what": "call Juan"})));
    server.push(dialect.text(&["Done: Friday."]));

    let mut child = dialect.chat(&server, &["--agent", agent.to_str().unwrap()]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = lines(child.stdout.take().unwrap());
    let mut stderr = lines(child.stderr.take().unwrap());

    stdin.write_all(b"remind me to call Juan\n").await.unwrap();
    read_until(&mut stderr, |line| {
        line == r#"[run remind {"what":"call Juan"}? y/n]"#
    })
    .await;
    stdin.write_all(b"y\n").await.unwrap();
    read_until(&mut stderr, |line| line == "[remind asks] When?").await;
    stdin.write_all(b"Friday\n").await.unwrap();
    read_until(&mut stderr, |line| {
        line == r#"[run remind {"due":"Friday","what":"call Juan"}? y/n]"#
    })
    .await;
    stdin.write_all(b"yes\n").await.unwrap();
    read_until(&mut stdout, |line| line == "Done: Friday.").await;
    drop(stdin);
    let status = exit_of(&mut child).await;
    assert_eq!(status.code(), Some(0));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        dialect.tool_results(&requests[1]),
        [json!({"id": "call_1", "text": "set for Friday"})]
    );
}

/// A question left waiting when the chat ended is asked again by the next chat of
/// the same session, and the first line answers it.
#[tokio::test]
async fn a_session_left_waiting_asks_again_in_the_next_chat() {
    let scratch = Scratch::new();
    let agent = remind_agent(&scratch, "{}");
    let store = format!("sqlite://{}", scratch.path().join("chats.db").display());
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "remind", json!({"what": "call Juan"})));
    let args = [
        "--agent",
        agent.to_str().unwrap(),
        "--session",
        "juan",
        "--store",
        store.as_str(),
    ];
    let first = finish_with_input(
        dialect.tiller(&server, "chat", &args),
        b"remind me to call Juan\n",
    )
    .await;
    assert!(
        first.stderr.contains("[remind asks] When?"),
        "{}",
        first.stderr
    );
    assert_eq!(
        first.status.code(),
        Some(1),
        "the conversation ended unfinished"
    );

    server.push(dialect.text(&["Done: Friday."]));
    let second = finish_with_input(dialect.tiller(&server, "chat", &args), b"Friday\n").await;
    assert_eq!(second.status.code(), Some(0), "{}", second.stderr);
    assert!(
        second.stderr.starts_with("[remind asks] When?"),
        "{}",
        second.stderr
    );
    assert_eq!(second.stdout.trim(), "Done: Friday.");
    assert_eq!(
        dialect.tool_results(&server.requests()[1]),
        [json!({"id": "call_1", "text": "set for Friday"})]
    );
}
