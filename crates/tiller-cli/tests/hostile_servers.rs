//! The real `tiller` binary against servers and tools that misbehave: each fault ends
//! the run with a clear error on stderr and exit status 1 (or, for a chatty tool, a
//! cut result), a valid transcript, no secret where it does not belong, and a peak
//! resident size under a fixed bound, checked from the kernel's own accounting.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Dialect, Finished, Scratch, agent_yaml, envelopes, finish, python_tool, tiller};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_test_support::{MockResponse, MockServer, hostile, sse};

/// The most a `tiller` process may ever hold resident in these tests.
const RSS_BOUND_KIB: i64 = 128 * 1024;

/// The largest peak resident size of any child this test process has waited for.
#[allow(unsafe_code)]
fn peak_child_rss_kib() -> i64 {
    // SAFETY: getrusage only fills the struct it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage), 0);
        usage.ru_maxrss
    }
}

/// Runs `tiller run --events jsonl` against `server` in `dialect`, and checks the
/// bound and the transcript of the run's `agent_end`.
async fn run_against(server: &MockServer, dialect: Dialect) -> Finished {
    let finished = finish(dialect.tiller(server, "run", &["--events", "jsonl", "Hi"])).await;
    checked(finished)
}

fn checked(finished: Finished) -> Finished {
    let peak = peak_child_rss_kib();
    assert!(peak < RSS_BOUND_KIB, "tiller peaked at {peak} KiB resident");
    // `envelopes` checks the transcript of the run's `agent_end`.
    let lines = envelopes(&finished.stdout);
    let end = lines.last().unwrap();
    assert_eq!(end["event"]["type"], "agent_end", "{}", finished.stderr);
    finished
}

fn assert_failed_with(finished: &Finished, text: &str) {
    assert_eq!(finished.code(), Some(1), "{}", finished.stderr);
    assert!(finished.stderr.contains(text), "{}", finished.stderr);
}

#[tokio::test]
async fn a_block_index_of_two_to_the_forty_is_a_clear_error() {
    let server = MockServer::start().await;
    server.push(hostile::anthropic_huge_index());
    let finished = run_against(&server, Dialect::Anthropic).await;
    assert_failed_with(
        &finished,
        "the response went past a limit: more than 1024 content blocks in one response",
    );
}

#[tokio::test]
async fn absurd_retry_after_values_fail_at_once() {
    for response in [
        hostile::retry_after("1e20"),
        hostile::retry_after_ms("1e300"),
    ] {
        let server = MockServer::start().await;
        server.push(response);
        let finished = run_against(&server, Dialect::OpenAi).await;
        assert_failed_with(
            &finished,
            "HTTP 429 from openai-compatible: the server asked to retry after",
        );
        assert_eq!(server.requests().len(), 1);
    }
}

#[tokio::test]
async fn endless_lines_events_and_tool_calls_stop_at_their_limits() {
    for (response, says) in [
        (
            hostile::endless_line(),
            "bytes in one event-stream line or event",
        ),
        (
            hostile::endless_event(),
            "bytes in one event-stream line or event",
        ),
        (
            hostile::many_tool_calls(5000),
            "content blocks in one response",
        ),
    ] {
        let server = MockServer::start().await;
        server.push(response);
        let finished = run_against(&server, Dialect::OpenAi).await;
        assert_failed_with(&finished, says);
    }
}

/// An agent whose one tool runs `body` (Python), against `server`.
fn tool_agent(scratch: &Scratch, body: &str, extra: &str) -> String {
    scratch.write("tools/tool.py", &python_tool(body));
    let tools = format!(
        "    - name: tool\n      description: A tool\n      command: [python3, tools/tool.py]\n{extra}"
    );
    scratch
        .write("agent.yaml", &agent_yaml(&tools))
        .display()
        .to_string()
}

/// A server whose model calls `tool`, then answers "done".
async fn tool_then_answer() -> MockServer {
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::openai_tool_call(
        "call_1",
        "tool",
        &json!({}),
    )));
    server.push(MockResponse::sse(sse::openai_text(&["done"])));
    server
}

/// The text of the tool result the model was sent in the second request.
fn result_sent(server: &MockServer) -> String {
    let requests = server.requests();
    let results = Dialect::OpenAi.tool_results(&requests[1]);
    results[0]["text"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_chatty_tool_is_cut_and_its_output_never_fills_memory() {
    let scratch = Scratch::new();
    let agent = tool_agent(
        &scratch,
        "chunk = 'x' * 65536\nfor _ in range(50 * 16):\n    sys.stdout.write(chunk)\nsys.stdout.flush()",
        "",
    );
    let server = tool_then_answer().await;
    let finished = checked(
        finish(Dialect::OpenAi.tiller(
            &server,
            "run",
            &["--agent", &agent, "--events", "jsonl", "Go"],
        ))
        .await,
    );
    assert_eq!(finished.code(), Some(0), "{}", finished.stderr);
    let sent = result_sent(&server);
    let note = "[… 52297728 more bytes cut: the output exceeded the limit of 131072 bytes]";
    assert!(sent.starts_with(&"x".repeat(131_072)), "{}", &sent[..100]);
    assert!(sent.ends_with(note), "{}", &sent[131_000..]);
    assert!(sent.len() <= 131_072 + note.len() + 2, "{}", sent.len());
}

#[tokio::test]
async fn a_tool_sees_no_key_unless_its_file_names_it() {
    let scratch = Scratch::new();
    let tools = "    - name: tool\n      description: Prints its environment\n      command: [env]\n      env: [GREETING]\n";
    let agent = scratch
        .write("agent.yaml", &agent_yaml(tools))
        .display()
        .to_string();
    let server = tool_then_answer().await;
    let mut command = Dialect::OpenAi.tiller(
        &server,
        "run",
        &["--agent", &agent, "--events", "jsonl", "Go"],
    );
    command
        .env("OPENAI_API_KEY", "sk-secret-value")
        .env("HOME", "/home/someone")
        .env("GREETING", "hello");
    let finished = checked(finish(command).await);
    assert_eq!(finished.code(), Some(0), "{}", finished.stderr);
    let sent = result_sent(&server);
    let mut seen: Vec<&str> = sent.lines().filter(|l| !l.starts_with("PATH=")).collect();
    seen.sort_unstable();
    // The call's id, its idempotency key, besides what the file names.
    assert_eq!(
        seen,
        [
            "GREETING=hello",
            "HOME=/home/someone",
            "TILLER_CALL_ID=call_1"
        ]
    );
    assert!(!finished.stdout.contains("sk-secret-value"));
}

/// An agent file whose model is `provider` at `server`, with `extra` settings.
fn file_model_agent(scratch: &Scratch, server: &MockServer, extra: &str) -> String {
    let yaml = format!(
        "type: object\ndescription: Be brief.\njson_schema_extra:\n  kind: agent\n  name: remote\n  model: {{provider: openai, id: gpt-test, base_url: \"{}\"}}\n{extra}",
        server.base_url()
    );
    scratch.write("remote.yaml", &yaml).display().to_string()
}

#[tokio::test]
async fn a_providers_key_goes_to_an_agent_files_server_only_when_the_file_says_so() {
    let scratch = Scratch::new();
    let server = MockServer::start().await;
    let agent = file_model_agent(&scratch, &server, "");
    let mut command = tiller(&["run", "--agent", &agent, "--events", "jsonl", "Hi"]);
    command.env("OPENAI_API_KEY", "sk-secret-value");
    let finished = checked(finish(command).await);
    assert_failed_with(
        &finished,
        "OPENAI_API_KEY is sent only to openai's own API, not to 127.0.0.1: pass the key explicitly to use it there",
    );
    assert!(server.requests().is_empty());

    let agent = file_model_agent(&scratch, &server, "  api_key_env: REMOTE_KEY\n");
    server.push(MockResponse::sse(sse::openai_text(&["hello"])));
    let mut command = tiller(&["run", "--agent", &agent, "Hi"]);
    command
        .env("OPENAI_API_KEY", "sk-secret-value")
        .env("REMOTE_KEY", "remote-key");
    let finished = finish(command).await;
    assert_eq!(finished.code(), Some(0), "{}", finished.stderr);
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some("Bearer remote-key")
    );

    // With no key anywhere there is none to withhold: a local server speaking
    // OpenAI's API needs none.
    let agent = file_model_agent(&scratch, &server, "");
    server.push(MockResponse::sse(sse::openai_text(&["hello"])));
    let finished = finish(tiller(&["run", "--agent", &agent, "Hi"])).await;
    assert_eq!(finished.code(), Some(0), "{}", finished.stderr);
    assert_eq!(finished.stdout, "hello\n");
    assert_eq!(server.requests()[1].header("authorization"), None);
}

#[tokio::test]
async fn a_closed_stderr_does_not_crash_tiller() {
    let server = MockServer::start().await;
    server.push(hostile::retry_after("1e20"));
    let mut child = Dialect::OpenAi
        .tiller(&server, "run", &["Hi"])
        .spawn()
        .unwrap();
    // Whatever tiller writes to stderr now fails with a broken pipe.
    drop(child.stderr.take());
    let output = child.wait_with_output().await.unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "no panic, the run's own status"
    );
}
