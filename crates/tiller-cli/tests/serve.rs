//! `tiller serve`: the real binary on a free port, agents made from a folder of
//! agent files and answered by the faux model over HTTP; a clean stop at SIGTERM
//! with an event stream open; bad agent files refused before listening; and
//! clients no one here wrote (installed by `scripts/http-clients.sh`): Python's
//! `httpx` and `httpx-sse` using the API as a user would, the `openai` package
//! through `/v1`, schemathesis fuzzing the OpenAPI document, and pi-agent-core's
//! `Agent` and `streamProxy` through `/api/stream`.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use common::{
    HELPER, Scratch, Serving, exit_of, finish, kill_hard, missing_tool, readme_block, request,
    tiller,
};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_test_support::tools::TOOLED_AGENT_FILE;
use tiller_test_support::{MockResponse, MockServer, sse};

#[tokio::test]
async fn serves_agents_from_a_folder_and_stops_cleanly() {
    let serving = Serving::start().await;
    let base = serving.base.clone();
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };

    let created = post("/agents", json!({"definition": "helper", "id": "h"}))
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let events = http
        .get(format!("{base}/agents/h/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let outcome = post("/agents/h/prompt?wait=true", json!({"text": "hello"}))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let outcome: Value = serde_json::from_str(&outcome).unwrap();
    let answer = outcome["messages"][1]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(answer.starts_with("You said: \"hello\"."), "{answer}");
    // The child-content rule is on for the agents it serves.
    let state: Value = http
        .get(format!("{base}/agents/h"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        state["definition"]["run"]["quiet_after_child_content"],
        json!(true),
        "{state}"
    );

    // SIGTERM with the event stream still open: the stream ends, the process exits 0.
    serving.stop().await;
    let rest = events.text().await.unwrap();
    assert!(rest.contains("event: agent_end"), "{rest}");
}

#[tokio::test]
async fn a_prompts_files_travel_within_the_body_limit_it_is_given() {
    let serving = Serving::start_with(Scratch::new(), &["--max-body-bytes", "4096"], &[]).await;
    let prompt = |bytes: usize| {
        let data = tiller::ai::FileContent::from_bytes("notes.txt", &vec![b'x'; bytes])
            .unwrap()
            .data;
        json!({"text": "Read it", "files": [{"name": "notes.txt", "mime_type": "text/plain", "data": data}]})
    };
    let url = |path: &str| format!("{}{path}", serving.base);
    let (status, _) = request(
        reqwest::Method::POST,
        url("/agents"),
        None,
        Some(json!({"definition": "helper", "id": "h"})),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _) = request(
        reqwest::Method::POST,
        url("/agents/h/prompt"),
        None,
        Some(prompt(4096)),
    )
    .await;
    assert_eq!(status, 413);
    let (status, outcome) = request(
        reqwest::Method::POST,
        url("/agents/h/prompt?wait=true"),
        None,
        Some(prompt(1000)),
    )
    .await;
    assert_eq!(status, 200, "{outcome}");
    let answer = outcome["messages"][1]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        answer
            .starts_with("You said: \"Read it\" and attached notes.txt (text/plain, 1000 bytes)."),
        "{answer}"
    );
    serving.stop().await;
}

#[tokio::test]
async fn with_a_token_file_every_request_needs_a_known_token() {
    let scratch = Scratch::new();
    let tokens = scratch.write(
        "tokens.yaml",
        "tokens:\n  - {token: s3cret, tenant: acme, user: alice}\n",
    );
    let serving = Serving::start_with(scratch, &["--tokens", tokens.to_str().unwrap()], &[]).await;
    let http = reqwest::Client::new();
    let create = |token: Option<&str>| {
        let request = http
            .post(format!("{}/agents", serving.base))
            .header("content-type", "application/json")
            .body(json!({"definition": "helper"}).to_string());
        match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
        .send()
    };
    assert_eq!(create(None).await.unwrap().status(), 401);
    assert_eq!(create(Some("guess")).await.unwrap().status(), 401);
    assert_eq!(create(Some("s3cret")).await.unwrap().status(), 201);
    serving.stop().await;
}

/// Without the `cluster` feature (the default build, as `.ci/run` tests it),
/// `--cluster` is refused before anything starts, saying how to build it in.
#[cfg(not(feature = "cluster"))]
#[tokio::test]
async fn a_tiller_built_without_the_cluster_refuses_cluster_and_says_how_to_get_it() {
    let done = finish(tiller(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--cluster",
        "nats://127.0.0.1:4222",
        "--store",
        "postgres://tiller@127.0.0.1/tiller",
    ]))
    .await;
    assert_eq!(done.code(), Some(2), "{}", done.stderr);
    assert_eq!(
        done.stderr.trim(),
        "tiller: this tiller was built without the cluster: build it with `--features cluster` (cargo install --path crates/tiller-cli --features cluster)"
    );
}

#[tokio::test]
async fn a_bad_agent_file_is_refused_before_listening() {
    let scratch = Scratch::new();
    std::fs::create_dir(scratch.path().join("agents")).unwrap();
    scratch.write(
        "agents/broken.yaml",
        "type: object\njson_schema_extra: {kind: agent}\n",
    );
    let agents = scratch.path().join("agents");
    let done = finish(tiller(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--agents",
        agents.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(done.code(), Some(2), "{}", done.stderr);
    assert!(done.stderr.contains("broken.yaml"), "{}", done.stderr);
    assert!(!done.stderr.contains("serving"), "{}", done.stderr);

    scratch.write("agents/broken.yaml", HELPER);
    let tokens = scratch.write(
        "tokens.yaml",
        "tokens:\n  - {token: t, tenant: a, colour: red}\n",
    );
    let done = finish(tiller(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--agents",
        agents.to_str().unwrap(),
        "--tokens",
        tokens.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(done.code(), Some(2), "{}", done.stderr);
    assert!(done.stderr.contains("tokens.yaml"), "{}", done.stderr);
    assert!(!done.stderr.contains("serving"), "{}", done.stderr);
}

/// What `scripts/http-clients.sh WHAT` prints (a path), if that client is
/// installed (see [`tiller_test_support::live::installed`]).
fn installed_client(what: &str, test: &str) -> Option<PathBuf> {
    tiller_test_support::live::installed(
        "http-clients.sh",
        what,
        &format!("the {test} client test"),
    )
}

#[tokio::test]
async fn a_python_client_uses_the_api_as_a_user_would() {
    let Some(python) = installed_client("python", "Python") else {
        return;
    };
    let serving = Serving::start().await;
    run_python_client(&python, "serve_client.py", &serving).await;
    serving.stop().await;
}

/// Runs `tests/clients/{script}` with `python` against `serving` (its base URL
/// and the README's path as arguments), which must print `ok`.
async fn run_python_client(python: &std::path::Path, script: &str, serving: &Serving) {
    let said = python_says(python, script, &[&serving.base, &readme()]).await;
    assert_eq!(said, "ok", "{script} said otherwise");
}

/// The `openai` package's client, as its users call it: the model list, a
/// completion that starts a session, a streamed one that continues it, an
/// unknown model's error, and the README's snippets: Python's
/// (`tests/clients/openai_client.py`), the AI SDK's and AG-UI's
/// (`tests/clients/readme_snippets.mjs`).
#[tokio::test]
async fn the_openai_package_talks_to_the_agents_as_to_openai() {
    let Some(python) = installed_client("python", "OpenAI") else {
        return;
    };
    // The README's snippet runs against the examples' calculator, beside the helper.
    let scratch = Scratch::new();
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    for file in ["calculator.yaml", "tools/add.py"] {
        let text = std::fs::read_to_string(examples.join(file)).unwrap();
        std::fs::create_dir_all(scratch.path().join("agents/tools")).unwrap();
        scratch.write(&format!("agents/{file}"), &text);
    }
    let serving = Serving::start_with(scratch, &[], &[]).await;
    run_python_client(&python, "openai_client.py", &serving).await;
    // The README's snippets for the AI SDK and AG-UI, beside it.
    if let Some(modules) = installed_client("node-modules", "npm ai and @ag-ui/client") {
        let readme = readme();
        let ran = node_client("readme_snippets.mjs", &modules, &[&serving.base, &readme]).await;
        // Each printed the answer's text, the AI SDK's as it grew.
        let printed: Vec<Vec<String>> = serde_json::from_value(ran).unwrap();
        assert_eq!(printed.len(), 2);
        for lines in printed {
            let last = lines.last().unwrap();
            assert!(
                last.starts_with("You said: \"What is 2 plus 3?\""),
                "{lines:?}"
            );
        }
    }
    serving.stop().await;
}

/// The npm `openai` package's client, from Node: the model list, a completion
/// that starts a session, a streamed one that continues it
/// (`tests/clients/openai_client.mjs`).
#[tokio::test]
async fn the_npm_openai_package_talks_to_the_agents_from_node() {
    let Some(modules) = installed_client("node-modules", "npm openai") else {
        return;
    };
    let serving = Serving::start().await;
    let said = node_client("openai_client.mjs", &modules, &[&serving.base]).await;
    assert_eq!(said, json!("ok"));
    serving.stop().await;
}

/// `POST /v1/responses` through the `openai` packages, across restarts on one
/// store: Python's streams a response and continues it; the server restarts
/// and Node's continues the last by its id; it restarts again and Python's
/// continues Node's (`tests/clients/openai_responses.py`, `.mjs`).
#[tokio::test]
async fn the_openai_packages_continue_a_response_after_a_restart() {
    let (Some(python), Some(modules)) = (
        installed_client("python", "OpenAI"),
        installed_client("node-modules", "npm openai"),
    ) else {
        return;
    };
    let kept = Scratch::new();
    let store = format!("sqlite://{}", kept.path().join("chats.db").display());
    let options = ["--store", store.as_str()];
    let serving = Serving::start_with(Scratch::new(), &options, &[]).await;
    let id = python_says(&python, "openai_responses.py", &[&serving.base, "start"]).await;
    assert!(id.starts_with("resp_"), "{id}");
    serving.stop().await;
    let serving = Serving::start_with(Scratch::new(), &options, &[]).await;
    let from_node = node_client("openai_responses.mjs", &modules, &[&serving.base, &id]).await;
    let from_node = from_node.as_str().unwrap().to_owned();
    serving.stop().await;
    let serving = Serving::start_with(Scratch::new(), &options, &[]).await;
    let said = python_says(
        &python,
        "openai_responses.py",
        &[&serving.base, "continue", &from_node],
    )
    .await;
    assert_eq!(said, "ok");
    serving.stop().await;
}

/// `tiller serve` of the `tooled` agent, on a scripted model that calls `cat`
/// once and answers, `runs` times.
async fn serving_tooled(upstream: &MockServer, runs: usize) -> Serving {
    for _ in 0..runs {
        upstream.push(MockResponse::sse(sse::openai_tool_call(
            "call_1",
            "cat",
            &json!({"x": 1}),
        )));
        upstream.push(MockResponse::sse(sse::openai_text(&[
            "cat said ",
            "x is 1.",
        ])));
    }
    let scratch = Scratch::new();
    std::fs::create_dir_all(scratch.path().join("agents")).unwrap();
    scratch.write("agents/tooled.yaml", TOOLED_AGENT_FILE);
    let base_url = upstream.base_url();
    let vars = [
        ("TILLER_BASE_URL", base_url.as_str()),
        ("TILLER_MODEL", "local-model"),
    ];
    Serving::start_with(scratch, &[], &vars).await
}

/// The AI SDK's chat transport (`useChat`'s) and `readUIMessageStream`
/// render the agent's tool call, its result and its answer from
/// `POST /ai-sdk/tooled` (`tests/clients/ui_stream_client.mjs`).
#[tokio::test]
async fn the_ai_sdks_chat_transport_renders_the_agents_tool_and_answer() {
    let Some(modules) = installed_client("node-modules", "npm ai") else {
        return;
    };
    let upstream = MockServer::start().await;
    let serving = serving_tooled(&upstream, 1).await;
    let rendered = node_client("ui_stream_client.mjs", &modules, &[&serving.base, "tooled"]).await;
    assert_eq!(
        rendered,
        json!({
            "parts": [
                {"type": "step-start"},
                {"type": "dynamic-tool", "toolName": "cat", "state": "output-available",
                 "input": {"x": 1}, "output": "{\"x\":1}"},
                {"type": "step-start"},
                {"type": "text", "text": "cat said x is 1.", "state": "done"},
            ],
            "metadata": {"session": "chat-1", "end": "completed"},
        })
    );
    serving.stop().await;
}

/// AG-UI's `HttpAgent` runs the agent, its event order checked by the client
/// itself, and keeps the messages the events made; the `ag-ui-protocol`
/// package's models validate every event (`tests/clients/ag_ui_client.mjs`,
/// `ag_ui_events.py`).
#[tokio::test]
async fn ag_ui_clients_read_and_validate_every_event() {
    let (Some(modules), Some(python)) = (
        installed_client("node-modules", "@ag-ui/client"),
        installed_client("python", "ag-ui-protocol"),
    ) else {
        return;
    };
    let upstream = MockServer::start().await;
    let serving = serving_tooled(&upstream, 2).await;
    let kinds = [
        "RUN_STARTED",
        "STATE_SNAPSHOT",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ];
    let run = node_client("ag_ui_client.mjs", &modules, &[&serving.base, "tooled"]).await;
    assert_eq!(run["events"], json!(kinds));
    assert_eq!(
        run["messages"],
        json!([
            {"role": "user", "content": "What does cat say?", "toolCalls": []},
            {"role": "assistant", "toolCalls": ["cat"]},
            {"role": "tool", "content": "{\"x\":1}", "toolCalls": []},
            {"role": "assistant", "content": "cat said x is 1.", "toolCalls": []},
        ])
    );
    let validated = python_says(&python, "ag_ui_events.py", &[&serving.base, "tooled"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&validated).unwrap(),
        json!(kinds)
    );
    serving.stop().await;
}

/// Runs `tests/clients/{script}` with `python` and `args`: what it printed,
/// trimmed.
async fn python_says(python: &std::path::Path, script: &str, args: &[&str]) -> String {
    let client = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let output = tokio::process::Command::new(python)
        .arg(client)
        .args(args)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.trim().to_owned()
}

#[tokio::test]
async fn schemathesis_finds_no_server_error_in_the_documented_api() {
    let Some(python) = installed_client("python", "schemathesis") else {
        return;
    };
    let serving = Serving::start().await;
    // The event streams would never end: left out.
    let output = tokio::process::Command::new(python.with_file_name("schemathesis"))
        .args([
            "run",
            &format!("{}/openapi.json", serving.base),
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "25",
            "--seed",
            "1",
            "--exclude-operation-id",
            "agentEvents",
            "--exclude-operation-id",
            "allEvents",
            "--request-timeout",
            "10",
        ])
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Every operation it selected was tested ("Selected: N/M", "Tested: N").
    let figure = |label: &str| {
        stdout
            .lines()
            .find_map(|line| line.trim().strip_prefix(label))
            .and_then(|rest| rest.split('/').next())
            .map(|count| count.trim().to_owned())
    };
    let (selected, tested) = (figure("Selected:"), figure("Tested:"));
    assert!(
        output.status.success()
            && selected.as_deref().is_some_and(|n| n != "0")
            && selected == tested,
        "schemathesis found problems: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serving.stop().await;
}

/// Runs the Node client `script` (of `tests/clients`: pi-agent-core's, npm
/// `openai`'s) with `modules` and `args`: the one JSON line it prints.
async fn node_client(script: &str, modules: &std::path::Path, args: &[&str]) -> Value {
    let client = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let output = tokio::process::Command::new("node")
        .arg(client)
        .arg(modules)
        .args(args)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

#[tokio::test]
async fn pi_agent_cores_stream_proxy_drives_a_turn_through_the_server() {
    let Some(modules) = installed_client("node-modules", "pi-agent-core") else {
        return;
    };
    let upstream = MockServer::start().await;
    upstream.push(MockResponse::sse(sse::openai_tool_call(
        "call_1",
        "clock",
        &json!({"zone": "UTC"}),
    )));
    upstream.push(MockResponse::sse(sse::openai_text(&[
        "It is noon ",
        "in UTC.",
    ])));
    let scratch = Scratch::new();
    let tokens = scratch.write(
        "tokens.yaml",
        "tokens: [{token: pi-secret, tenant: acme}]\n",
    );
    let base_url = upstream.base_url();
    let serving = Serving::start_with(
        scratch,
        &["--tokens", tokens.to_str().unwrap()],
        &[
            ("TILLER_BASE_URL", base_url.as_str()),
            ("TILLER_MODEL", "local-model"),
        ],
    )
    .await;

    let run = node_client(
        "pi_proxy_client.mjs",
        &modules,
        &[
            &serving.base,
            "pi-secret",
            "openai-compatible",
            "local-model",
        ],
    )
    .await;

    // pi's own agent loop saw a streamed tool call, ran its tool, and streamed the
    // answer, every model call through the proxy.
    let updates = |kinds: &[&str]| {
        kinds
            .iter()
            .map(|kind| format!("message_update:{kind}"))
            .collect::<Vec<_>>()
    };
    let mut expected: Vec<String> = [
        "agent_start",
        "turn_start",
        "message_start",
        "message_end",
        "message_start",
    ]
    .map(str::to_owned)
    .to_vec();
    expected.extend(updates(&[
        "toolcall_start",
        "toolcall_delta",
        "toolcall_delta",
        "toolcall_end",
    ]));
    expected.extend(
        [
            "message_end",
            "tool_execution_start",
            "tool_execution_end",
            "message_start",
            "message_end",
            "turn_end",
            "turn_start",
            "message_start",
        ]
        .map(str::to_owned),
    );
    expected.extend(updates(&[
        "text_start",
        "text_delta",
        "text_delta",
        "text_end",
    ]));
    expected.extend(["message_end", "turn_end", "agent_end"].map(str::to_owned));
    assert_eq!(run["events"], json!(expected));

    let messages = run["messages"].as_array().unwrap();
    let summary: Vec<Value> = messages
        .iter()
        .map(|message| {
            json!([
                message["role"],
                message["content"],
                message.get("stopReason")
            ])
        })
        .collect();
    assert_eq!(
        summary,
        [
            json!(["user", [{"type": "text", "text": "What time is it in UTC?"}], null]),
            json!(["assistant", [{"type": "toolCall", "id": "call_1", "name": "clock", "arguments": {"zone": "UTC"}}], "toolUse"]),
            json!(["toolResult", [{"type": "text", "text": "noon in UTC"}], null]),
            json!(["assistant", [{"type": "text", "text": "It is noon in UTC."}], "stop"]),
        ]
    );

    // The request boundary: the second call carries pi's tool round, in OpenAI's
    // form, to the server's model.
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].body["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What time is it in UTC?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "clock", "arguments": "{\"zone\":\"UTC\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "noon in UTC"}
        ])
    );
    serving.stop().await;
}

#[tokio::test]
async fn a_conversation_outlives_the_server_in_its_sqlite_store_and_idle_agents_hibernate() {
    let kept = Scratch::new();
    let store = format!("sqlite://{}", kept.path().join("chats.db").display());
    let options = ["--store", store.as_str(), "--hibernate-after", "0"];
    let serving = Serving::start_with(Scratch::new(), &options, &[]).await;
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, base: &str, path: &str, body: Option<Value>| {
        let request = http.request(method, format!("{base}{path}"));
        let request = match body {
            Some(body) => request
                .header("content-type", "application/json")
                .body(body.to_string()),
            None => request,
        };
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            )
        }
    };
    use reqwest::Method;
    let base = serving.base.clone();
    let created = call(
        Method::POST,
        &base,
        "/agents",
        Some(json!({"definition": "helper", "id": "c"})),
    )
    .await;
    assert_eq!(created.0, 201);
    let prompted = call(
        Method::POST,
        &base,
        "/agents/c/prompt?wait=true",
        Some(json!({"text": "hello"})),
    )
    .await;
    assert_eq!(prompted.0, 200);
    // Idle, it leaves memory; a request brings it back.
    let mut status = Value::Null;
    for _ in 0..10_000 {
        status = call(Method::GET, &base, "/agents", None).await.1[0]["status"].clone();
        if status == "hibernated" {
            break;
        }
    }
    assert_eq!(status, "hibernated");
    let state = call(Method::GET, &base, "/agents/c", None).await.1;
    assert_eq!(state["messages"].as_array().unwrap().len(), 2);
    serving.stop().await;

    // A new server on the same file: the conversation is there to read and resume.
    let serving = Serving::start_with(Scratch::new(), &options, &[]).await;
    let base = serving.base.clone();
    let (status, sessions) = call(Method::GET, &base, "/sessions", None).await;
    assert_eq!(
        (
            status,
            &sessions[0]["id"],
            &sessions[0]["messages"],
            &sessions[0]["agent"]
        ),
        (200, &json!("c"), &json!(2), &Value::Null)
    );
    let (status, page) = call(Method::GET, &base, "/sessions/c/messages?from=1", None).await;
    assert_eq!(
        (status, &page["total"], &page["next"]),
        (200, &json!(2), &Value::Null)
    );
    let answer = page["messages"][0]["content"][0]["text"].as_str().unwrap();
    assert!(answer.starts_with("You said: \"hello\"."), "{answer}");
    let resumed = call(
        Method::POST,
        &base,
        "/sessions/c/resume",
        Some(json!({"definition": "helper"})),
    )
    .await;
    assert_eq!(resumed.0, 201);
    let again = call(
        Method::POST,
        &base,
        "/agents/c/prompt?wait=true",
        Some(json!({"text": "again"})),
    )
    .await;
    assert_eq!(again.0, 200);
    let state = call(Method::GET, &base, "/agents/c", None).await.1;
    assert_eq!(state["messages"].as_array().unwrap().len(), 4);
    serving.stop().await;
}

/// With `--dormant-after 0`, an agent gives up its actor whenever it is idle and
/// its state stays in memory: each prompt wakes it, and the conversation goes
/// on whole.
#[tokio::test]
async fn idle_agents_go_dormant_and_each_prompt_wakes_them() {
    let serving = Serving::start_with(Scratch::new(), &["--dormant-after", "0"], &[]).await;
    let http = reqwest::Client::new();
    let base = &serving.base;
    let created = http
        .post(format!("{base}/agents"))
        .json(&json!({"definition": "helper", "id": "d"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    for text in ["hello", "again"] {
        let prompted = http
            .post(format!("{base}/agents/d/prompt?wait=true"))
            .json(&json!({ "text": text }))
            .send()
            .await
            .unwrap();
        assert_eq!(prompted.status(), 200);
    }
    let state: Value = http
        .get(format!("{base}/agents/d"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let said: Vec<&str> = state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["role"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["user", "assistant", "user", "assistant"]);
    assert_eq!(state["status"], "idle");
    serving.stop().await;
}

/// The seeds' flow over HTTP, with the server killed while the question waits: the
/// tool (a program) asks "When?", `tiller serve` dies with SIGKILL, a new one on
/// the same SQLite file still waits, and the answer goes into the same call, which
/// runs again with it.
#[tokio::test]
async fn a_question_waiting_over_http_survives_a_killed_server() {
    let upstream = MockServer::start().await;
    upstream.push(MockResponse::sse(sse::openai_tool_call(
        "call_1",
        "remind",
        &json!({"what": "call Juan"}),
    )));
    upstream.push(MockResponse::sse(sse::openai_text(&["Done: Friday."])));
    let base_url = upstream.base_url();
    let vars = [
        ("TILLER_BASE_URL", base_url.as_str()),
        ("TILLER_MODEL", "local-model"),
    ];
    let kept = Scratch::new();
    let store = format!("sqlite://{}", kept.path().join("chats.db").display());
    let options = ["--store", store.as_str()];
    let agents = |scratch: &Scratch| {
        std::fs::create_dir_all(scratch.path().join("agents/tools")).unwrap();
        scratch.write(
            "agents/tools/remind.py",
            &common::python_tool(
                "if 'due' not in args:\n    print(json.dumps({'field': 'due', 'question': 'When?'}))\n    sys.exit(75)\nprint('set for ' + args['due'])",
            ),
        );
        scratch.write(
            "agents/remind.yaml",
            "type: object\ndescription: You set reminders.\njson_schema_extra:\n  kind: agent\n  name: reminder\n  tools:\n    - name: remind\n      description: Set a reminder\n      parameters: {type: object, properties: {what: {type: string}, due: {type: string}}, required: [what]}\n      command: [python3, tools/remind.py]\n",
        );
    };
    let scratch = Scratch::new();
    agents(&scratch);
    let mut serving = Serving::start_with(scratch, &options, &vars).await;
    let http = reqwest::Client::new();
    let post = |base: &str, path: &str, body: Value| {
        let request = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let get = |base: &str, path: &str| {
        let request = http.get(format!("{base}{path}"));
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let base = serving.base.clone();
    let created = post(
        &base,
        "/agents",
        json!({"definition": "reminder", "id": "r"}),
    )
    .await;
    assert_eq!(created.0, 201);
    let (status, outcome) = post(
        &base,
        "/agents/r/prompt?wait=true",
        json!({"text": "remind me to call Juan"}),
    )
    .await;
    assert_eq!((status, &outcome["end"]), (200, &json!("parked")));
    let state = get(&base, "/agents/r").await;
    assert_eq!(state["status"], "waiting_for_input");
    let question = json!([{"type": "input", "tool_call_id": "call_1", "tool_name": "remind", "field": "due", "question": "When?", "current_data": {"what": "call Juan"}}]);
    assert_eq!(state["waiting"], question);
    // A prompt now is refused with what waits.
    let (status, problem) = post(&base, "/agents/r/prompt", json!({"text": "hi"})).await;
    assert_eq!(
        (status, problem["type"].as_str()),
        (409, Some("urn:tiller:problem:waiting-for-reply"))
    );

    kill_hard(serving.child.id().unwrap());
    exit_of(&mut serving.child).await;

    let scratch = Scratch::new();
    agents(&scratch);
    let serving = Serving::start_with(scratch, &options, &vars).await;
    let base = serving.base.clone();
    let resumed = post(
        &base,
        "/sessions/r/resume",
        json!({"definition": "reminder"}),
    )
    .await;
    assert_eq!(resumed.0, 201);
    let state = get(&base, "/agents/r").await;
    assert_eq!(
        (&state["status"], &state["waiting"]),
        (&json!("waiting_for_input"), &question)
    );
    let asking = state["waiting"][0]["tool_call_id"].as_str().unwrap();
    let (status, outcome) = post(
        &base,
        "/agents/r/reply?wait=true",
        json!({"type": "answer", "request_id": asking, "text": "Friday"}),
    )
    .await;
    assert_eq!((status, &outcome["end"]), (200, &json!("completed")));
    let results: Vec<&str> = outcome["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool_result")
        .map(|m| m["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["set for Friday"]);
    assert_eq!(upstream.requests().len(), 2, "no model turn for the answer");
    let (status, problem) = post(
        &base,
        "/agents/r/reply",
        json!({"type": "approve", "request_id": asking}),
    )
    .await;
    assert_eq!(
        (status, problem["type"].as_str()),
        (409, Some("urn:tiller:problem:nothing-to-reply"))
    );
    serving.stop().await;
}

/// Stopped and started again on the same store, a server with tokens (whose
/// clients cannot choose ids) makes new agents under new ids: they do not start
/// again from 1 and collide with the sessions kept.
#[tokio::test]
async fn a_restarted_server_makes_new_agents_on_the_same_store() {
    use reqwest::Method;
    let kept = Scratch::new();
    let store = format!("sqlite://{}", kept.path().join("chats.db").display());
    let tokens = kept.write("tokens.yaml", "tokens:\n  - {token: t, tenant: acme}\n");
    let options = ["--tokens", tokens.to_str().unwrap(), "--store", &store];
    let mut ids = Vec::new();
    for _ in 0..2 {
        let serving = Serving::start_with(Scratch::new(), &options, &[]).await;
        let (status, agent) = request(
            Method::POST,
            format!("{}/agents", serving.base),
            Some("t"),
            Some(json!({"definition": "helper"})),
        )
        .await;
        assert_eq!(status, 201, "{agent}");
        ids.push(agent["id"].as_str().unwrap().to_owned());
        serving.stop().await;
    }
    assert_ne!(ids[0], ids[1]);
    assert!(ids[0] < ids[1], "time-ordered: {ids:?}");

    // A client-chosen id whose session exists is an error naming it, at once.
    let serving = Serving::start_with(Scratch::new(), &["--store", &store], &[]).await;
    let (status, problem) = request(
        Method::POST,
        format!("{}/agents", serving.base),
        None,
        Some(json!({"definition": "helper", "id": ids[0]})),
    )
    .await;
    assert_eq!(
        (status, &problem["type"], &problem["detail"]),
        (
            409,
            &json!("urn:tiller:problem:session-exists"),
            &json!(format!("session `{}` exists already", ids[0]))
        ),
        "{problem}"
    );
    serving.stop().await;
}

/// Two servers on one store: the one that resumes a session takes it over, and
/// the other's agent stops at its next write, saying so, having written nothing.
async fn two_servers_share_a_store_and_never_overwrite_each_other(store: &str) {
    use reqwest::Method;
    let options = ["--store", store];
    let first = Serving::start_with(Scratch::new(), &options, &[]).await;
    let second = Serving::start_with(Scratch::new(), &options, &[]).await;
    let id = format!("shared-{}-{}", std::process::id(), tiller::ai::now_ms());
    let at = |serving: &Serving, path: &str| format!("{}{path}", serving.base);

    let (status, _) = request(
        Method::POST,
        at(&first, "/agents"),
        None,
        Some(json!({"definition": "helper", "id": id})),
    )
    .await;
    assert_eq!(status, 201);
    let prompt = |serving: &Serving, text: &str| {
        request(
            Method::POST,
            at(serving, &format!("/agents/{id}/prompt?wait=true")),
            None,
            Some(json!({"text": text})),
        )
    };
    assert_eq!(prompt(&first, "first").await.0, 200);
    let (status, resumed) = request(
        Method::POST,
        at(&second, &format!("/sessions/{id}/resume")),
        None,
        Some(json!({"definition": "helper"})),
    )
    .await;
    assert_eq!(status, 201, "{resumed}");

    let (status, problem) = prompt(&first, "overwrite?").await;
    assert_eq!(status, 409, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("session `{id}` was taken over by another process")),
        "{detail}"
    );
    let (_, agents) = request(Method::GET, at(&first, "/agents"), None, None).await;
    let listed = agents
        .as_array()
        .unwrap()
        .iter()
        .find(|agent| agent["id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(listed["status"], "stopped", "{listed}");
    assert!(
        listed["reason"]
            .as_str()
            .unwrap()
            .contains("was taken over by another process"),
        "{listed}"
    );

    assert_eq!(prompt(&second, "second").await.0, 200);
    let (status, page) = request(
        Method::GET,
        at(&second, &format!("/sessions/{id}/messages")),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let said: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "user")
        .map(|message| message["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["first", "second"]);
    first.stop().await;
    second.stop().await;
}

#[tokio::test]
async fn two_servers_on_one_sqlite_file_never_overwrite_each_other() {
    let kept = Scratch::new();
    let store = format!("sqlite://{}", kept.path().join("chats.db").display());
    two_servers_share_a_store_and_never_overwrite_each_other(&store).await;
}

#[tokio::test]
async fn two_servers_on_one_postgres_database_never_overwrite_each_other() {
    let Some(url) = tiller_test_support::postgres::postgres_url() else {
        return;
    };
    two_servers_share_a_store_and_never_overwrite_each_other(&url).await;
}

/// `tiller serve` reads its model from the environment as `tiller run` does: a
/// provider pointed at a server of the user's own gets the provider's key when it
/// is set, and no key (no refusal either) when it is not.
#[tokio::test]
async fn serve_reads_the_model_and_key_from_the_environment_as_run_does() {
    use reqwest::Method;
    let upstream = MockServer::start().await;
    upstream.always(MockResponse::sse(sse::openai_text(&[
        "Hi from ",
        "llama.cpp.",
    ])));
    let url = upstream.base_url();
    let model = [
        ("TILLER_PROVIDER", "openai"),
        ("TILLER_BASE_URL", url.as_str()),
        ("TILLER_MODEL", "smollm2"),
    ];
    for key in [None, Some("sk-mine")] {
        let mut vars = model.to_vec();
        vars.extend(key.map(|key| ("OPENAI_API_KEY", key)));
        let serving = Serving::start_with(Scratch::new(), &[], &vars).await;
        let (status, agent) = request(
            Method::POST,
            format!("{}/agents", serving.base),
            None,
            Some(json!({"definition": "helper"})),
        )
        .await;
        assert_eq!(status, 201);
        let id = agent["id"].as_str().unwrap();
        let (status, outcome) = request(
            Method::POST,
            format!("{}/agents/{id}/prompt?wait=true", serving.base),
            None,
            Some(json!({"text": "hello"})),
        )
        .await;
        assert_eq!(status, 200, "{outcome}");
        assert_eq!(
            outcome["messages"][1]["content"][0]["text"], "Hi from llama.cpp.",
            "{outcome}"
        );
        let sent = upstream.requests().pop().unwrap();
        assert_eq!(sent.body["model"], "smollm2");
        assert_eq!(
            sent.header("authorization"),
            key.map(|key| format!("Bearer {key}")).as_deref()
        );
        serving.stop().await;
    }
}

/// pi-agent-core's own `Agent`, fed the server's lean event stream through the
/// README's rebuild rule (in JavaScript, as the README writes it), renders the
/// answer as it streams: the text grows with each event, and the Agent ends
/// with the prompt and the answer.
#[tokio::test]
async fn pi_agent_cores_agent_renders_a_streamed_message_from_the_servers_events() {
    let Some(modules) = installed_client("node-modules", "pi-agent-core") else {
        return;
    };
    let upstream = MockServer::start().await;
    upstream.push(MockResponse::sse(sse::openai_text(&[
        "It is ", "noon ", "in UTC.",
    ])));
    let base_url = upstream.base_url();
    let serving = Serving::start_with(
        Scratch::new(),
        &[],
        &[
            ("TILLER_BASE_URL", base_url.as_str()),
            ("TILLER_MODEL", "local-model"),
        ],
    )
    .await;
    let created = reqwest::Client::new()
        .post(format!("{}/agents", serving.base))
        .header("content-type", "application/json")
        .body(json!({"definition": "helper", "id": "pi"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let readme = readme();
    let seen = node_client(
        "pi_events_client.mjs",
        &modules,
        &[readme.as_str(), &serving.base, "pi", "What time is it?"],
    )
    .await;
    assert_eq!(
        seen,
        json!({
            "rendered": ["", "It is ", "It is noon ", "It is noon in UTC.", "It is noon in UTC."],
            "messages": [["user", "What time is it?"], ["assistant", "It is noon in UTC."]],
        })
    );
    serving.stop().await;
}

/// `--jwt-secret-env` makes the server take JSON Web Tokens signed with that
/// secret beside the token file: a valid one creates an agent of its tenant, an
/// expired one is 401; an unset variable is a usage error.
#[tokio::test]
async fn serve_takes_json_web_tokens_signed_with_the_secret_it_is_given() {
    let scratch = Scratch::new();
    let tokens = scratch.write("tokens.yaml", "tokens: [{token: ops, tenant: ops}]\n");
    let serving = Serving::start_with(
        scratch,
        &[
            "--tokens",
            tokens.to_str().unwrap(),
            "--jwt-secret-env",
            "TILLER_TEST_JWT",
            "--jwt-issuer",
            "auth.example.com",
        ],
        &[("TILLER_TEST_JWT", "the shared secret")],
    )
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = |exp: u64| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &json!({"iss": "auth.example.com", "exp": exp, "tenant_id": "acme", "sub": "ann"}),
            &jsonwebtoken::EncodingKey::from_secret(b"the shared secret"),
        )
        .unwrap()
    };
    let http = reqwest::Client::new();
    let create = |bearer: String| {
        http.post(format!("{}/agents", serving.base))
            .bearer_auth(bearer)
            .header("content-type", "application/json")
            .body(json!({"definition": "helper"}).to_string())
            .send()
    };
    let created = create(token(now + 600)).await.unwrap();
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let state: Value = http
        .get(format!("{}/agents/{id}", serving.base))
        .bearer_auth(token(now + 600))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&state["context"]["tenant_id"], &state["context"]["user_id"]),
        (&json!("acme"), &json!("ann"))
    );
    assert_eq!(create(token(now - 3_600)).await.unwrap().status(), 401);
    assert_eq!(create("ops".to_owned()).await.unwrap().status(), 201);
    serving.stop().await;

    let unset = finish(tiller(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--jwt-secret-env",
        "TILLER_TEST_JWT_UNSET",
    ]))
    .await;
    assert_eq!(
        (unset.code(), unset.stderr.as_str()),
        (
            Some(2),
            "tiller: TILLER_TEST_JWT_UNSET is not set: it should hold the JWT secret\n"
        )
    );
}

/// The README, whose rebuild rule the clients run as written.
fn readme() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../README.md")
        .display()
        .to_string()
}

/// The README's "Sessions that branch" block, run by bash as written (the
/// `tiller` on its path this build's) from the repository's root: it prints
/// what the README says it prints.
#[tokio::test]
async fn the_readmes_branch_section_runs_as_written() {
    if missing_tool(&["curl", "jq"], "the README's branch section").is_some() {
        return;
    }
    let heading = "### Sessions that branch";
    let (script, printed) = (readme_block(heading, "sh"), readme_block(heading, "text"));
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_tiller"));
    let mut bash = tokio::process::Command::new("bash");
    // Whatever happens, the server it starts goes with it.
    let guarded = format!("set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}");
    bash.args(["-c", &guarded])
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .env(
            "PATH",
            format!(
                "{}:{}",
                binary.parent().unwrap().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env_remove("TILLER_STORE")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(std::time::Duration::from_secs(60), bash.output())
        .await
        .expect("the README's branch section did not finish in a minute")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout, printed);
}
