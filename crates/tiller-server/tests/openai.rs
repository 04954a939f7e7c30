//! The OpenAI API's chat completions over real HTTP: a stream's chunks in order,
//! the agent's own tools kept out of the answer, a call waiting for approval,
//! sessions started and continued, and refusals as OpenAI error objects.

#![allow(clippy::unwrap_used)]

mod support;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{Running, closed};
use tiller::faux::{FauxProvider, FauxTurn};
use tiller_server::ServerConfig;

/// A user's message.
fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// The `data:` payloads of a stream, in order.
fn data_lines(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_stream_is_the_role_the_pieces_the_finish_the_usage_and_done() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello there, friend.").chunk_size(5));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let (status, body) = server
        .post_raw(
            "/v1/chat/completions",
            &[],
            &json!({"model": "helper", "messages": [user("hi")], "stream": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let lines = data_lines(&body);
    assert_eq!(lines.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = lines[..lines.len() - 1]
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<&str> = chunks
        .iter()
        .map(|chunk| match &chunk["choices"][0] {
            Value::Null => "usage",
            choice if choice["delta"]["role"] == "assistant" => "role",
            choice if choice["finish_reason"] == "stop" => "finish",
            _ => "content",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "role", "content", "content", "content", "content", "finish", "usage"
        ]
    );
    let text: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello there, friend.");
    assert!(chunks.iter().all(|chunk| chunk["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert!(chunks[6]["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    // A session a client names is no sub-agent's.
    let (status, body) = server
        .post_raw(
            "/v1/chat/completions",
            &[("x-tiller-session", "a/helper")],
            &json!({"model": "helper", "messages": [user("hi")]}),
        )
        .await;
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, &error["error"]["param"]),
        (422, &json!("X-Tiller-Session"))
    );
    server.stop().await;
}

#[tokio::test]
async fn the_agents_own_tools_stay_out_of_the_answer_and_a_session_goes_on() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("cat", json!({"x": 1})));
    faux.push(FauxTurn::text("It said x is 1."));
    faux.push(FauxTurn::text("Still 1."));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let response = server
        .http
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "tooled", "messages": [
            {"role": "system", "content": "Ignored."},
            user("Before."),
            {"role": "assistant", "content": "Noted."},
            user("What is x?"),
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let session = response.headers()["x-tiller-session"]
        .to_str()
        .unwrap()
        .to_owned();
    let completion: Value = response.json().await.unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(
        completion["choices"][0],
        json!({"index": 0, "message": {"role": "assistant", "content": "It said x is 1."},
               "finish_reason": "stop"})
    );

    let response = server
        .http
        .post(format!("{}/v1/chat/completions", server.base))
        .header("x-tiller-session", &session)
        .json(&json!({"model": "tooled", "messages": [user("And now?")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-tiller-session"], session.as_str());
    let completion: Value = response.json().await.unwrap();
    assert_eq!(completion["choices"][0]["message"]["content"], "Still 1.");
    let (_, state) = server.get(&format!("/agents/{session}")).await;
    let roles: Vec<&str> = state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "user",
            "assistant"
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn a_call_waiting_for_approval_finishes_parked_and_the_reply_goes_on() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("remove", json!({"path": "a"})));
    faux.push(FauxTurn::text("Removed."));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let response = server
        .http
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "tooled", "messages": [user("Remove a.")]}))
        .send()
        .await
        .unwrap();
    let session = response.headers()["x-tiller-session"]
        .to_str()
        .unwrap()
        .to_owned();
    let completion: Value = response.json().await.unwrap();
    assert_eq!(completion["choices"][0]["finish_reason"], "parked");
    let (_, state) = server.get(&format!("/agents/{session}")).await;
    let request = state["waiting"][0]["tool_call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, outcome) = server
        .post(
            &format!("/agents/{session}/reply?wait=true"),
            json!({"type": "approve", "request_id": request}),
        )
        .await;
    assert_eq!((status, &outcome["end"]), (200, &json!("completed")));
    server.stop().await;
}

#[tokio::test]
async fn refusals_are_openai_error_objects() {
    let faux = FauxProvider::new();
    let server = Running::tooled(
        &faux,
        closed(&[("acme-token", "acme"), ("globex-token", "globex")]),
    )
    .await;
    let ask = |token: Option<&'static str>, session: Option<&'static str>, body: Value| {
        let mut request = server
            .http
            .post(format!("{}/v1/chat/completions", server.base))
            .json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(session) = session {
            request = request.header("x-tiller-session", session);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let kind = response.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_owned();
            (status, kind, response.json::<Value>().await.unwrap())
        }
    };
    let hi = json!({"model": "helper", "messages": [user("hi")]});

    let (status, kind, error) = ask(None, None, hi.clone()).await;
    assert_eq!((status, kind.as_str()), (401, "application/json"));
    assert_eq!(error["error"]["type"], "authentication_error");

    let (status, _, error) = ask(
        Some("acme-token"),
        None,
        json!({"model": "nobody", "messages": [user("hi")]}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        (&error["error"]["type"], &error["error"]["code"]),
        (&json!("not_found_error"), &json!("unknown-model"))
    );

    let (status, _, error) = ask(
        Some("acme-token"),
        None,
        json!({"model": "helper", "messages": [{"role": "tool", "content": "42"}, user("So?")]}),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(
        (&error["error"]["type"], &error["error"]["param"]),
        (&json!("invalid_request_error"), &json!("messages[0].role"))
    );

    // A session another tenant started is none of this one's; on a server of
    // tenants, a client names no new session either.
    faux.push(FauxTurn::text("Hello, acme."));
    let response = server
        .http
        .post(format!("{}/v1/chat/completions", server.base))
        .bearer_auth("acme-token")
        .json(&hi)
        .send()
        .await
        .unwrap();
    let session: &'static str = response.headers()["x-tiller-session"]
        .to_str()
        .unwrap()
        .to_owned()
        .leak();
    let (status, _, error) = ask(Some("globex-token"), Some(session), hi.clone()).await;
    assert_eq!(
        (status, &error["error"]["code"]),
        (404, &json!("unknown-agent"))
    );
    let (status, _, _) = ask(Some("globex-token"), Some("mine"), hi).await;
    assert_eq!(status, 404);
    server.stop().await;
}

/// Under the child-content rule (on in `tiller serve`) the caller's text after
/// a sub-agent's answer is held from the events; a chat completions stream,
/// which does not carry the sub-agent's answer, still says the caller's.
#[tokio::test]
async fn an_answer_held_after_a_sub_agent_still_reaches_a_chat_completions_stream() {
    use tiller::agents::AskAgentConfig;
    use tiller::agents::agent_file::AgentFile;
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call(
        "ask_agent",
        json!({"agent": "writer", "text": "draft it"}),
    ));
    faux.push(FauxTurn::text("The draft is ready.").chunk_size(4));
    faux.push(FauxTurn::text("Here it is: a draft.").chunk_size(4));
    let supervisor = tiller::Supervisor::start().await.unwrap();
    let mut definitions = tiller::Definitions::new().with_default_model(faux.model());
    for file in [
        (
            "planner.yaml",
            "type: object\ndescription: You plan.\njson_schema_extra: {kind: agent, name: planner, tools: [{name: ask_agent}]}\n",
        ),
        (
            "writer.yaml",
            "type: object\ndescription: You write.\njson_schema_extra: {kind: agent, name: writer}\n",
        ),
    ] {
        definitions
            .insert(AgentFile::parse(file.0, file.1).unwrap())
            .unwrap();
    }
    let definitions = definitions.with_ask_agent(&supervisor, AskAgentConfig::default());
    let config = ServerConfig {
        quiet_after_child_content: true,
        ..ServerConfig::default()
    };
    let server = Running::on(supervisor, definitions, config).await;
    let (status, _) = server
        .post("/agents", json!({"definition": "planner", "id": "p"}))
        .await;
    assert_eq!(status, 201);
    let (_, state) = server.get("/agents/p").await;
    assert_eq!(
        state["definition"]["run"]["quiet_after_child_content"],
        true
    );
    let (status, body) = server
        .post_raw(
            "/v1/chat/completions",
            &[("x-tiller-session", "p")],
            &json!({"model": "planner", "messages": [user("write a draft")], "stream": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let text: String = data_lines(&body)
        .iter()
        .filter(|line| *line != "[DONE]")
        .filter_map(|line| {
            let chunk: Value = serde_json::from_str(line).unwrap();
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, "Here it is: a draft.");
    server.stop().await;
}
