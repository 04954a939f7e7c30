//! `tiller serve` as an outside client meets it: each finding of the security
//! review, tried over real HTTP against a server on loopback, as the client that
//! found it tried it. Each of these failed before its fix. Elsewhere, beside the
//! code they test: the cross-site cases driven from a page in a real browser
//! (items 2, 21, 22) in `dashboard.rs`; the MCP client's environment, stderr,
//! timeout and output cap (items 11, 12, 14, 15) in `tiller-mcp`; a sub-agent
//! refused another tenant's session (item 5) in `tiller`'s delegation tests;
//! retention and `tiller sessions prune` (item 10) in the CLI's; SQLite (item 20)
//! in `tiller-store`'s suite; forgotten replay buffers (item 23) in this crate's
//! unit tests.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller::agents::agent_file::AgentFile;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentTool, Definitions, FnTool, Supervisor, ToolOutput,
    agents::{AskAgentConfig, ToolRegistry},
};
use tiller_server::ServerConfig;
use tiller_test_support::MockServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::{Running, closed_for};

/// The problem kind of a problem+json body.
fn kind(problem: &Value) -> &str {
    problem["type"]
        .as_str()
        .and_then(|kind| kind.strip_prefix("urn:tiller:problem:"))
        .unwrap_or_default()
}

/// An inline agent file whose `json_schema_extra` holds `extra` besides its
/// kind and name.
fn inline(extra: Value) -> Value {
    let mut settings = json!({"kind": "agent", "name": "mine"});
    for (key, value) in extra.as_object().unwrap() {
        settings[key] = value.clone();
    }
    json!({"inline": {"type": "object", "description": "You help.", "json_schema_extra": settings}})
}

/// Items 1, 3 and 6: an inline file carries no command, `base_url`, key variable,
/// tool `env` or MCP server, and names no model the server does not serve; the
/// answers tell nothing of the server's programs or environment, and nothing is
/// sent anywhere.
#[tokio::test]
async fn an_inline_file_chooses_only_among_what_the_operator_configured() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, ServerConfig::default()).await;
    let elsewhere = MockServer::start().await;
    let command_tool = json!({"name": "id", "description": "Who am I", "parameters": {"type": "object"}, "command": ["id"]});
    for (extra, field) in [
        (json!({"tools": [command_tool]}), "tools[0].command"),
        (
            json!({"tools": [{"name": "id", "env": ["OPENAI_API_KEY"]}]}),
            "tools[0].env",
        ),
        (json!({"api_key_env": "OPENAI_API_KEY"}), "api_key_env"),
        (
            json!({"model": {"provider": "openai", "id": "gpt-4o", "base_url": elsewhere.base_url()}}),
            "model.base_url",
        ),
        (
            json!({"mcp_servers": [{"name": "fs", "command": ["npx", "server-filesystem"]}]}),
            "mcp_servers",
        ),
        (json!({"model": "openai/gpt-4o-mini"}), "model"),
    ] {
        let (status, problem) = server.post("/agents", inline(extra.clone())).await;
        assert_eq!(
            (status, kind(&problem), problem["field"].as_str()),
            (
                403,
                "operator-only",
                Some(format!("inline.json_schema_extra.{field}").as_str())
            ),
            "{extra}: {problem}"
        );
    }
    // The same written as arrays, which a struct is read from as well: refused.
    let array_tool =
        json!(["id", "d", {"type": "object"}, ["sh", "-c", "id"], 1000, ["OPENAI_API_KEY"], null]);
    for (body, field) in [
        (
            json!({"inline": ["object", "You help.", {}, [], null, {"kind": "agent", "name": "x"}]}),
            "inline",
        ),
        (
            json!({"inline": {"type": "object", "description": "You help.", "json_schema_extra": ["agent", "x"]}}),
            "inline.json_schema_extra",
        ),
        (
            inline(json!({"tools": [array_tool], "tool_choice": {"tool": "id"}})),
            "inline.json_schema_extra.tools[0]",
        ),
    ] {
        let (status, problem) = server.post("/agents", body).await;
        assert_eq!(
            (status, kind(&problem), problem["field"].as_str()),
            (422, "invalid", Some(field)),
            "{problem}"
        );
    }
    let (status, problem) = server
        .post(
            "/agents",
            inline(json!({"model": ["openai", "gpt-4o", elsewhere.base_url()]})),
        )
        .await;
    assert_eq!(
        (status, kind(&problem)),
        (403, "operator-only"),
        "{problem}"
    );

    // Whether a variable exists is not told.
    let (_, set) = server
        .post("/agents", inline(json!({"api_key_env": "PATH"})))
        .await;
    let (_, unset) = server
        .post(
            "/agents",
            inline(json!({"api_key_env": "NO_SUCH_VARIABLE"})),
        )
        .await;
    assert_eq!(set, unset);
    assert!(elsewhere.requests().is_empty(), "nothing went elsewhere");
    assert_eq!(server.get("/agents").await.1, json!([]));

    // What a client may choose: instructions, options, tools by name.
    let (status, agent) = server
        .post(
            "/agents",
            inline(json!({"temperature": 0.2, "max_turns": 3, "thinking": "off"})),
        )
        .await;
    assert_eq!(status, 201, "{agent}");

    // Resuming a session with an inline file follows the same rules.
    let id = agent["id"].as_str().unwrap();
    let (status, _) = server
        .send(reqwest::Method::DELETE, &format!("/agents/{id}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, problem) = server
        .post(
            &format!("/sessions/{id}/resume"),
            inline(json!({"tools": [command_tool]})),
        )
        .await;
    assert_eq!(
        (status, kind(&problem)),
        (403, "operator-only"),
        "{problem}"
    );
    server.stop().await;

    // The operator's opt-in lets a trusted client declare a command tool.
    let trusted = Running::start(
        &faux,
        ServerConfig {
            trust_inline_definitions: true,
            ..ServerConfig::default()
        },
    )
    .await;
    let python = json!({"name": "hello", "description": "Says hello", "parameters": {"type": "object"}, "command": ["python3", "-c", "print('hello')"]});
    let (status, agent) = trusted
        .post("/agents", inline(json!({"tools": [python]})))
        .await;
    assert_eq!(status, 201, "{agent}");
    trusted.stop().await;
}

/// Items 2, 21 and 22 as a plain client sees them (`dashboard.rs` drives the
/// same from a page in a browser): an open server answers loopback names and
/// pages only, reads JSON only when it is said to be JSON, refuses cross-origin
/// WebSocket upgrades, and no page may frame it.
#[tokio::test]
async fn the_open_server_answers_only_this_machine_and_the_origins_it_was_given() {
    let faux = FauxProvider::new();
    let server = Running::start(
        &faux,
        ServerConfig {
            allowed_origins: vec!["https://app.example".to_owned()],
            ..ServerConfig::default()
        },
    )
    .await;
    let create = json!({"definition": "helper"}).to_string();
    let post = |headers: &[(&str, &str)]| {
        let mut request = server
            .http
            .post(format!("{}/agents", server.base))
            .body(create.clone());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send()
    };
    let json = ("content-type", "application/json");
    let answered = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        (status, kind(&body).to_owned())
    };
    for (headers, expected) in [
        (vec![json, ("host", "evil.test")], (403, "host-not-allowed")),
        (
            vec![json, ("origin", "http://evil.test")],
            (403, "cross-origin"),
        ),
        (vec![json, ("origin", "null")], (403, "cross-origin")),
        (
            vec![("content-type", "text/plain")],
            (415, "unsupported-media-type"),
        ),
        (
            vec![("content-type", "application/x-www-form-urlencoded")],
            (415, "unsupported-media-type"),
        ),
    ] {
        let response = post(&headers).await.unwrap();
        let (status, got) = answered(response).await;
        assert_eq!((status, got.as_str()), expected, "{headers:?}");
    }
    assert_eq!(server.get("/agents").await.1, json!([]), "nothing was made");
    // A page's request without `Origin` (an image, a script) says its site.
    let (status, problem) = {
        let response = server
            .http
            .get(format!("{}/events", server.base))
            .header("sec-fetch-site", "cross-site")
            .send()
            .await
            .unwrap();
        answered(response).await
    };
    assert_eq!((status, problem.as_str()), (403, "cross-origin"));
    for origin in [
        "http://127.0.0.1:9",
        "http://localhost:3000",
        "https://app.example",
    ] {
        let response = post(&[json, ("origin", origin)]).await.unwrap();
        assert_eq!(response.status(), 201, "{origin}");
    }

    // A WebSocket upgrade from another origin is refused before it is one.
    let id = server.create_helper().await;
    let ws = format!("{}/agents/{id}/ws", server.base.replace("http://", "ws://"));
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(ws.as_str())
            .unwrap();
    request
        .headers_mut()
        .insert("origin", "http://evil.test".parse().unwrap());
    let Err(tokio_tungstenite::tungstenite::Error::Http(refused)) =
        tokio_tungstenite::connect_async(request).await
    else {
        panic!("a cross-origin upgrade was accepted");
    };
    assert_eq!(refused.status(), 403);

    // No page may frame any answer, the dashboard above all.
    for path in ["/", "/agents", "/nowhere"] {
        let response = server
            .http
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        let headers = response.headers();
        assert_eq!(
            (
                headers["content-security-policy"].to_str().unwrap(),
                headers["x-frame-options"].to_str().unwrap()
            ),
            ("frame-ancestors 'none'", "DENY"),
            "{path}"
        );
    }
    server.stop().await;
}

/// A `remove` tool whose calls wait for approval, and what it removed.
fn remover() -> (Definitions, Arc<Mutex<Vec<String>>>) {
    let removed = Arc::new(Mutex::new(Vec::new()));
    let tool: Arc<dyn AgentTool> = {
        let removed = removed.clone();
        Arc::new(FnTool::new(
            "remove",
            "Removes a file",
            json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            move |args, _| {
                let removed = removed.clone();
                async move {
                    let path = args["path"].as_str().unwrap_or_default().to_owned();
                    removed.lock().unwrap().push(path.clone());
                    Ok(ToolOutput::text(format!("removed {path}")))
                }
            },
        ))
    };
    let mut definitions = Definitions::new().with_tools(ToolRegistry::new().with(tool));
    definitions
        .insert(
            AgentFile::parse(
                "cleaner.yaml",
                "type: object\ndescription: You clean.\njson_schema_extra: {kind: agent, name: cleaner, tools: [{name: remove}], approvals: {remove: ask}}\n",
            )
            .unwrap(),
        )
        .unwrap();
    (definitions, removed)
}

/// Item 4: two calls wait for approval at once; each reply names the request it
/// answers, and resolves that one only. Denying B and approving A runs A, never B.
#[tokio::test]
async fn parallel_approvals_are_each_resolved_by_the_reply_that_names_them() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("a", "remove", json!({"path": "/tmp/a"}))
            .with_tool_call_id("b", "remove", json!({"path": "/home/b"})),
    );
    faux.push(FauxTurn::text("Removed one, kept the other."));
    let (definitions, removed) = remover();
    let server = Running::serve(
        definitions.with_default_model(faux.model()),
        ServerConfig::default(),
    )
    .await;
    let (_, agent) = server
        .post("/agents", json!({"definition": "cleaner"}))
        .await;
    let id = agent["id"].as_str().unwrap();
    let (_, outcome) = server
        .post(
            &format!("/agents/{id}/prompt?wait=true"),
            json!({"text": "clean up"}),
        )
        .await;
    assert_eq!(outcome["end"], "parked");
    let waiting = |state: &Value| -> Vec<String> {
        state["waiting"]
            .as_array()
            .unwrap()
            .iter()
            .map(|request| request["tool_call_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        waiting(&server.get(&format!("/agents/{id}")).await.1),
        ["a", "b"]
    );

    let reply = format!("/agents/{id}/reply?wait=true");
    // A reply that names no request, or one that is not open, changes nothing.
    let (status, problem) = server.post(&reply, json!({"type": "approve"})).await;
    assert_eq!(
        (status, kind(&problem), problem["field"].as_str()),
        (422, "invalid", Some("request_id"))
    );
    let (status, problem) = server
        .post(&reply, json!({"type": "approve", "request_id": "zzz"}))
        .await;
    assert_eq!(
        (status, kind(&problem)),
        (409, "no-such-request"),
        "{problem}"
    );

    let (_, outcome) = server
        .post(
            &reply,
            json!({"type": "deny", "request_id": "b", "reason": "keep my home"}),
        )
        .await;
    assert_eq!(outcome["end"], "parked", "A still waits");
    assert!(removed.lock().unwrap().is_empty());
    assert_eq!(
        waiting(&server.get(&format!("/agents/{id}")).await.1),
        ["a"]
    );

    let (_, outcome) = server
        .post(&reply, json!({"type": "approve", "request_id": "a"}))
        .await;
    assert_eq!(outcome["end"], "completed", "{outcome}");
    assert_eq!(*removed.lock().unwrap(), ["/tmp/a"]);
    let state = server.get(&format!("/agents/{id}")).await.1;
    let results: Vec<(&str, &str)> = state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "tool_result")
        .map(|message| {
            (
                message["tool_call_id"].as_str().unwrap(),
                message["content"][0]["text"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            ("b", "The user denied this call: keep my home"),
            ("a", "removed /tmp/a")
        ]
    );
    server.stop().await;
}

/// A client's file naming a registry tool cannot lift the approval the operator's
/// definitions ask for it: the call still waits for the user.
#[tokio::test]
async fn an_inline_file_cannot_lift_the_operators_approvals() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("a", "remove", json!({"path": "/home"})));
    let (definitions, removed) = remover();
    let server = Running::serve(
        definitions.with_default_model(faux.model()),
        ServerConfig::default(),
    )
    .await;
    let (status, agent) = server
        .post(
            "/agents",
            inline(json!({"tools": [{"name": "remove"}], "approvals": {"remove": "always"}})),
        )
        .await;
    assert_eq!(status, 201, "{agent}");
    let id = agent["id"].as_str().unwrap();
    let (_, outcome) = server
        .post(
            &format!("/agents/{id}/prompt?wait=true"),
            json!({"text": "remove my home"}),
        )
        .await;
    assert_eq!(outcome["end"], "parked", "{outcome}");
    assert!(removed.lock().unwrap().is_empty());
    server.stop().await;
}

/// Item 7: within a tenant, a user's token reaches only that user's agents, as
/// it sees only that user's sessions; a token of the tenant with no user sees
/// them all.
#[tokio::test]
async fn a_users_token_reaches_only_that_users_agents() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hi Ann."));
    let server = Running::start(
        &faux,
        closed_for(&[
            ("t-ann", "acme", Some("ann")),
            ("t-bob", "acme", Some("bob")),
            ("t-acme", "acme", None),
        ]),
    )
    .await;
    let id = server.create_helper_as("t-ann").await;
    let path = format!("/agents/{id}");
    for (method, path, body) in [
        (reqwest::Method::GET, path.clone(), None),
        (
            reqwest::Method::POST,
            format!("{path}/prompt"),
            Some(json!({"text": "who am I?"})),
        ),
        (
            reqwest::Method::POST,
            format!("{path}/follow_up"),
            Some(json!({"text": "and?"})),
        ),
        (reqwest::Method::GET, format!("{path}/events"), None),
        (reqwest::Method::DELETE, path.clone(), None),
    ] {
        let (status, problem) = server.send_as(method, &path, Some("t-bob"), body).await;
        assert_eq!((status, kind(&problem)), (404, "unknown-agent"), "{path}");
    }
    let (_, listed) = server
        .send_as(reqwest::Method::GET, "/agents", Some("t-bob"), None)
        .await;
    assert_eq!(listed, json!([]));
    for token in ["t-ann", "t-acme"] {
        let (status, _) = server
            .send_as(reqwest::Method::GET, &path, Some(token), None)
            .await;
        assert_eq!(status, 200, "{token}");
    }
    server.stop().await;
}

/// Item 9: the follow-up and steering queues are bounded in bytes (and count);
/// past the bound a message is refused with 429 and the queue is as it was.
#[tokio::test]
async fn queues_are_bounded_and_past_the_bound_a_message_is_refused() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, ServerConfig::default()).await;
    let id = server.create_helper().await;
    let text = "x".repeat(600 << 10);
    let (status, _) = server
        .post(&format!("/agents/{id}/follow_up"), json!({"text": text}))
        .await;
    assert_eq!(status, 204);
    let (status, problem) = server
        .post(&format!("/agents/{id}/follow_up"), json!({"text": text}))
        .await;
    assert_eq!((status, kind(&problem)), (429, "queue-full"), "{problem}");
    let state = server.get(&format!("/agents/{id}")).await.1;
    assert_eq!(state["follow_up_queue"].as_array().unwrap().len(), 1);

    // And in count: 256 steering messages, not one more.
    for n in 0..256 {
        let (status, _) = server
            .post(
                &format!("/agents/{id}/steer"),
                json!({"text": format!("s{n}")}),
            )
            .await;
        assert_eq!(status, 204, "steer {n}");
    }
    let (status, problem) = server
        .post(&format!("/agents/{id}/steer"), json!({"text": "one more"}))
        .await;
    assert_eq!((status, kind(&problem)), (429, "queue-full"), "{problem}");
    let state = server.get(&format!("/agents/{id}")).await.1;
    assert_eq!(state["steering_queue"].as_array().unwrap().len(), 256);
    server.stop().await;
}

/// Item 13: a client resuming after an event number no stream reaches (2^64−1)
/// is told of nothing missed, and gets the live events.
#[tokio::test]
async fn resuming_after_the_largest_event_number_gets_the_live_events() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Still here."));
    let server = Running::start(&faux, ServerConfig::default()).await;
    let id = server.create_helper().await;
    let mut events = server.events(&id, Some(u64::MAX)).await;
    let (status, _) = server
        .post(&format!("/agents/{id}/prompt"), json!({"text": "hi"}))
        .await;
    assert_eq!(status, 202);
    let first = events.next().await;
    assert_eq!(first.kind, "agent_start");

    // The same over a WebSocket's `?after=`.
    faux.push(FauxTurn::text("Still here."));
    let url = format!(
        "{}/agents/{id}/ws?after={}",
        server.base.replace("http://", "ws://"),
        u64::MAX
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    use futures::{SinkExt, StreamExt};
    socket
        .send(tokio_tungstenite::tungstenite::Message::Text(
            json!({"type": "prompt", "text": "again"})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    let first = loop {
        if let tokio_tungstenite::tungstenite::Message::Text(text) =
            socket.next().await.unwrap().unwrap()
        {
            break serde_json::from_str::<Value>(text.as_str()).unwrap();
        }
    };
    assert_eq!(first["event"]["type"], "agent_start", "{first}");
    server.stop().await;
}

/// Item 18: every refusal is problem+json, the router's own and the MCP
/// library's included.
#[tokio::test]
async fn every_refusal_is_problem_details() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, closed_for(&[("t", "acme", None)])).await;
    let id = server.create_helper_as("t").await;
    let request = |method: reqwest::Method, path: &str| {
        server
            .http
            .request(method, format!("{}{path}", server.base))
            .bearer_auth("t")
    };
    let mcp_hello = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    for (request, expected) in [
        (request(reqwest::Method::GET, "/nowhere"), (404, "no-route")),
        (
            request(reqwest::Method::GET, "/agents/%FF"),
            (400, "invalid"),
        ),
        (
            request(reqwest::Method::DELETE, "/agents"),
            (405, "method-not-allowed"),
        ),
        (
            request(reqwest::Method::GET, &format!("/agents/{id}/ws")),
            (400, "not-a-websocket"),
        ),
        (
            request(reqwest::Method::POST, "/mcp")
                .header("host", "evil.example")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(mcp_hello),
            (403, "host-not-allowed"),
        ),
        (
            request(reqwest::Method::POST, "/mcp")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(format!(
                    r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
                    "x".repeat(2 << 20)
                )),
            (413, "body"),
        ),
    ] {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let problem: Value = response.json().await.unwrap();
        assert_eq!(
            (status, kind(&problem), content_type.as_str()),
            (expected.0, expected.1, "application/problem+json"),
            "{problem}"
        );
    }
    server.stop().await;
}

/// Item 19: an agent id (or name) that is empty, holds control characters or is
/// longer than 256 bytes is refused, naming the field.
#[tokio::test]
async fn ids_that_are_no_ids_are_refused() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, ServerConfig::default()).await;
    for (field, value) in [
        ("id", String::new()),
        ("id", "a\u{7}b".to_owned()),
        ("id", "x".repeat(900_000)),
        ("name", "line\nbreak".to_owned()),
        ("id", "someone/writer".to_owned()),
    ] {
        let (status, problem) = server
            .post("/agents", json!({"definition": "helper", field: value}))
            .await;
        assert_eq!(
            (status, kind(&problem), problem["field"].as_str()),
            (422, "invalid", Some(field)),
            "{problem}"
        );
    }
    assert_eq!(server.get("/agents").await.1, json!([]));
    server.stop().await;
}

/// Reads from `tcp` until the server closes it; what it sent.
async fn read_to_close(tcp: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut answer))
        .await
        .expect("the server closed the connection")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Item 8: a client that sends half a request, or keeps a connection open
/// without using it, is disconnected; past the connection cap a client is
/// answered 503 at once.
#[tokio::test]
async fn slow_and_idle_clients_are_disconnected_and_connections_are_capped() {
    let faux = FauxProvider::new();
    let server = Running::start(
        &faux,
        ServerConfig {
            header_timeout: Duration::from_millis(300),
            ..ServerConfig::default()
        },
    )
    .await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut half = TcpStream::connect(&address).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    assert_eq!(read_to_close(&mut half).await, "");
    let mut idle = TcpStream::connect(&address).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let answered = read_to_close(&mut idle).await;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(
        answered.ends_with("ok"),
        "answered, then closed: {answered}"
    );
    server.stop().await;

    let capped = Running::start(
        &faux,
        ServerConfig {
            max_connections: 2,
            ..ServerConfig::default()
        },
    )
    .await;
    let address = capped.base.trim_start_matches("http://").to_owned();
    let _held = [
        TcpStream::connect(&address).await.unwrap(),
        TcpStream::connect(&address).await.unwrap(),
    ];
    let mut third = TcpStream::connect(&address).await.unwrap();
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let refused = read_to_close(&mut third).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("urn:tiller:problem:too-many-connections"),
        "{refused}"
    );
    drop(_held);
    capped.stop().await;
}

/// Item 8 with shards: the wait for a request's first bytes, read to find the
/// agent it names, counts against the head's time, so a client trickling its
/// head is disconnected within one `header_timeout` of connecting, unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_head_gets_one_header_timeout_on_a_sharded_server() {
    let faux = FauxProvider::new();
    let server = Running::on_two_shards(
        &faux,
        ServerConfig {
            header_timeout: Duration::from_secs(1),
            ..ServerConfig::default()
        },
    )
    .await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut slow = TcpStream::connect(&address).await.unwrap();
    // The slow client's own pace: its first byte after 0.6 s, the rest 0.6 s
    // later, past the one second the head has.
    tokio::time::sleep(Duration::from_millis(600)).await;
    slow.write_all(b"G").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The server closed the connection already: this write may be refused, and
    // the read end in a reset rather than at the end of the stream.
    let _ = slow
        .write_all(b"ET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), slow.read_to_end(&mut answer))
        .await
        .expect("the server closed the connection");
    assert_eq!(String::from_utf8_lossy(&answer), "");
    server.stop().await;
}

/// Item 8, the body: with tokens, a request without one is refused before its
/// body is read; a body that does not arrive in time is refused; one address
/// holds a bounded share of the connections.
#[tokio::test]
async fn slow_bodies_and_one_address_cannot_hold_the_server() {
    let faux = FauxProvider::new();
    let server = Running::start(
        &faux,
        ServerConfig {
            body_timeout: Duration::from_millis(300),
            max_connections_per_address: 3,
            ..closed_for(&[("t", "acme", None)])
        },
    )
    .await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let started = |token: &str| {
        format!(
            "POST /agents HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n{token}\r\n{{\"definition\""
        )
    };
    let mut anonymous = TcpStream::connect(&address).await.unwrap();
    anonymous.write_all(started("").as_bytes()).await.unwrap();
    let refused = read_to_close(&mut anonymous).await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let mut slow = TcpStream::connect(&address).await.unwrap();
    slow.write_all(started("authorization: Bearer t\r\n").as_bytes())
        .await
        .unwrap();
    let refused = read_to_close(&mut slow).await;
    assert!(refused.starts_with("HTTP/1.1 408"), "{refused}");
    assert!(
        refused.contains("urn:tiller:problem:slow-body"),
        "{refused}"
    );

    let _held: Vec<TcpStream> =
        futures::future::join_all((0..3).map(|_| TcpStream::connect(&address)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    let mut fourth = TcpStream::connect(&address).await.unwrap();
    fourth
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let refused = read_to_close(&mut fourth).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("connections from your address"),
        "{refused}"
    );
    server.stop().await;
}

/// Rule: an open server is this machine's. A connection from another address of
/// it (not loopback) is refused; with tokens it is served.
#[tokio::test]
async fn an_open_server_refuses_connections_from_other_addresses() {
    // An address of this machine other than loopback, if it has one.
    let outside = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|socket| {
            socket.connect("192.0.2.1:9")?;
            socket.local_addr()
        })
        .map(|address| address.ip())
        .ok()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified());
    let Some(outside) = outside else {
        eprintln!("skipping: this machine has no address but loopback");
        return;
    };
    for (config, expected) in [
        (ServerConfig::default(), "HTTP/1.1 403"),
        (closed_for(&[("t", "acme", None)]), "HTTP/1.1 200"),
    ] {
        let server = Supervisor::start().await.unwrap();
        let listener = tokio::net::TcpListener::bind((outside, 0)).await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(
            tiller_server::Server::new(server, Definitions::new(), config).serve(listener, async {
                let _ = stopped.await;
            }),
        );
        let mut tcp = TcpStream::connect(address).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let answered = read_to_close(&mut tcp).await;
        assert!(answered.starts_with(expected), "{answered}");
        let _ = stop.send(());
        served.await.unwrap().unwrap();
    }
}

/// Items 10, 16 and 21: a caller holds a bounded number of event streams (pi's
/// proxy calls among them); MCP sessions are capped, and a session belongs to
/// the token that opened it.
#[tokio::test]
async fn streams_and_mcp_sessions_are_bounded_and_an_mcp_session_is_its_openers() {
    let faux = FauxProvider::new();
    let server = Running::start(
        &faux,
        ServerConfig {
            max_streams_per_caller: 1,
            max_mcp_sessions: 2,
            max_mcp_sessions_per_tenant: 1,
            ..closed_for(&[("t-a", "a", None), ("t-b", "b", None), ("t-c", "c", None)])
        },
    )
    .await;
    let id = server.create_helper_as("t-a").await;
    let open = server
        .http
        .get(format!("{}/agents/{id}/events", server.base))
        .bearer_auth("t-a")
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), 200);
    let (status, problem) = server
        .send_as(reqwest::Method::GET, "/events", Some("t-a"), None)
        .await;
    assert_eq!((status, kind(&problem)), (429, "too-many-streams"));
    let (status, problem) = server
        .send_as(
            reqwest::Method::POST,
            "/api/stream",
            Some("t-a"),
            Some(json!({})),
        )
        .await;
    assert_eq!((status, kind(&problem)), (429, "too-many-streams"));
    // Another tenant's streams are its own.
    let other = server
        .http
        .get(format!("{}/events", server.base))
        .bearer_auth("t-b")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
    drop((open, other));

    let mcp = |token: &'static str, session: Option<&str>, body: &'static str| {
        let mut request = server
            .http
            .post(format!("{}/mcp", server.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}"#;
    const LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let opened = mcp("t-a", None, INITIALIZE).await.unwrap();
    assert_eq!(opened.status(), 200);
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    drop(opened);
    // A tenant's share, then the server's.
    let refused = mcp("t-a", None, INITIALIZE).await.unwrap();
    assert_eq!(refused.status(), 429);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(kind(&problem), "too-many-mcp-sessions");
    let opened = mcp("t-b", None, INITIALIZE).await.unwrap();
    assert_eq!(opened.status(), 200);
    let b_session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    drop(opened);
    // The definitions' instructions are the operator's: no tenant lists them.
    const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    const PROMPTS: &str = r#"{"jsonrpc":"2.0","id":3,"method":"prompts/list"}"#;
    mcp("t-b", Some(&b_session), INITIALIZED).await.unwrap();
    let listed = mcp("t-b", Some(&b_session), PROMPTS)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(listed.contains(r#""prompts":[]"#), "{listed}");
    let refused = mcp("t-c", None, INITIALIZE).await.unwrap();
    assert_eq!(refused.status(), 503);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(kind(&problem), "too-many-mcp-sessions");
    let taken = mcp("t-b", Some(&session), LIST).await.unwrap();
    assert_eq!(taken.status(), 404);
    let problem: Value = taken.json().await.unwrap();
    assert_eq!(kind(&problem), "unknown-mcp-session");
    server.stop().await;
}

/// Item 5: a sub-agent's session goes with its parent's: deleting the session
/// deletes its sub-agents' sessions, so no later conversation of the same id
/// finds them.
#[tokio::test]
async fn deleting_a_session_deletes_its_sub_agents_sessions() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call(
        "ask_agent",
        json!({"agent": "writer", "text": "remember the code 4217"}),
    ));
    faux.push(FauxTurn::text("Remembered."));
    faux.push(FauxTurn::text("Done."));
    let supervisor = Supervisor::start().await.unwrap();
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(
            AgentFile::parse(
                "planner.yaml",
                "type: object\ndescription: You plan.\njson_schema_extra: {kind: agent, name: planner, tools: [{name: ask_agent}]}\n",
            )
            .unwrap(),
        )
        .unwrap();
    definitions
        .insert(
            AgentFile::parse(
                "writer.yaml",
                "type: object\ndescription: You write.\njson_schema_extra: {kind: agent, name: writer}\n",
            )
            .unwrap(),
        )
        .unwrap();
    let definitions = definitions.with_ask_agent(&supervisor, AskAgentConfig::default());
    let server = Running::on(supervisor, definitions, ServerConfig::default()).await;
    let (status, _) = server
        .post("/agents", json!({"definition": "planner", "id": "p"}))
        .await;
    assert_eq!(status, 201);
    let (_, outcome) = server
        .post("/agents/p/prompt?wait=true", json!({"text": "plan"}))
        .await;
    assert_eq!(outcome["end"], "completed", "{outcome}");
    let (status, sub) = server.get("/sessions/p%2Fwriter").await;
    assert_eq!(status, 200, "{sub} {outcome}");

    let (status, _) = server
        .send(reqwest::Method::DELETE, "/sessions/p", None)
        .await;
    assert_eq!(status, 204);
    let (status, _) = server.get("/sessions/p%2Fwriter").await;
    assert_eq!(status, 404);
    let (_, sessions) = server.get("/sessions").await;
    assert_eq!(sessions, json!([]));
    server.stop().await;
}

/// Item 17: with tokens, only the dashboard's page (static, no data) and
/// `/healthz` need none; `/openapi.json` needs one, and `/metrics`, whose figures
/// cover every tenant, an operator's token marked `metrics: true`, which gives
/// no right to act on the server (`POST /admin/drain` needs `admin: true`).
#[tokio::test]
async fn with_tokens_the_metrics_are_the_operators_and_the_api_description_needs_a_token() {
    let faux = FauxProvider::new();
    let mut config = closed_for(&[("t-tenant", "acme", None)]);
    config.tokens = config.tokens.with(
        "t-scraper",
        tiller_server::Owner {
            tenant: "operator".to_owned(),
            user: None,
            metrics: true,
            admin: false,
        },
    );
    config.tokens = config.tokens.with(
        "t-admin",
        tiller_server::Owner {
            tenant: "operator".to_owned(),
            user: None,
            metrics: false,
            admin: true,
        },
    );
    let server = Running::start(&faux, config).await;
    for (path, token, expected) in [
        ("/metrics", None, 401),
        ("/metrics", Some("t-tenant"), 403),
        ("/metrics", Some("t-scraper"), 200),
        ("/openapi.json", None, 401),
        ("/openapi.json", Some("t-tenant"), 200),
        ("/", None, 200),
        ("/healthz", None, 200),
    ] {
        let (status, _) = server
            .send_as(reqwest::Method::GET, path, token, None)
            .await;
        assert_eq!(status, expected, "{path} with {token:?}");
    }
    // Past the right's check, a server of no cluster has nothing to drain.
    for (token, expected) in [("t-tenant", 403), ("t-scraper", 403), ("t-admin", 409)] {
        let (status, problem) = server
            .send_as(reqwest::Method::POST, "/admin/drain", Some(token), None)
            .await;
        assert_eq!(status, expected, "{token}: {problem}");
    }
    server.stop().await;
}

/// A tenant and each of its users hold at most their quotas of live agents
/// and of stored sessions: past one, 429 `quota-exceeded` naming it; a
/// deleted agent frees its live share, not its stored session.
#[tokio::test]
async fn quotas_bound_the_agents_and_sessions_a_tenant_and_a_user_hold() {
    use reqwest::Method;
    use tiller_server::Quotas;
    let faux = FauxProvider::new();
    let mut config = support::closed_for(&[
        ("token-acme", "acme", None),
        ("token-ann", "acme", Some("ann")),
    ]);
    config.tokens = config.tokens.with_quotas(
        "acme",
        Quotas {
            agents: Some(3),
            sessions: Some(4),
            ..Quotas::default()
        },
        Quotas {
            agents: Some(1),
            ..Quotas::default()
        },
    );
    let server = Running::start(&faux, config).await;
    let create = |token: &'static str| {
        let server = &server;
        async move {
            server
                .send_as(
                    Method::POST,
                    "/agents",
                    Some(token),
                    Some(json!({"definition": "helper"})),
                )
                .await
        }
    };
    let refused = |(status, problem): (u16, Value), field: &str| {
        assert_eq!(
            (status, &problem["type"], &problem["field"]),
            (
                429,
                &json!("urn:tiller:problem:quota-exceeded"),
                &json!(field)
            ),
            "{problem}"
        );
    };
    let (status, first) = create("token-ann").await;
    assert_eq!(status, 201);
    refused(create("token-ann").await, "user_quotas.agents");
    let (status, second) = create("token-acme").await;
    assert_eq!(status, 201);
    assert_eq!(create("token-acme").await.0, 201);
    refused(create("token-acme").await, "quotas.agents");
    // A deleted agent frees its share of live agents; its session stays.
    for agent in [&first, &second] {
        let id = agent["id"].as_str().unwrap();
        let (status, _) = server
            .send_as(
                Method::DELETE,
                &format!("/agents/{id}"),
                Some("token-acme"),
                None,
            )
            .await;
        assert_eq!(status, 204);
    }
    assert_eq!(create("token-ann").await.0, 201);
    refused(create("token-acme").await, "quotas.sessions");
    server.stop().await;
}
