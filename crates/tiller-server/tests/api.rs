//! The agents API over real HTTP: a server on loopback, agents on the scripted
//! faux model, requests and event streams through reqwest.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller::agents::agent_file::AgentFile;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::MemoryStore;
use tiller::{Definitions, Supervisor, SupervisorConfig};
use tiller_server::ServerConfig;
use tiller_test_support::{MockResponse, MockServer, sse};

mod support;
use support::*;

#[tokio::test]
async fn an_agent_is_created_prompted_read_and_deleted_over_http() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello there."));
    let server = Running::start(&faux, ServerConfig::default()).await;

    let (status, agent) = server
        .post(
            "/agents",
            json!({"definition": "helper", "id": "a1", "name": "first"}),
        )
        .await;
    assert_eq!(
        (status, agent),
        (201, json!({"id": "a1", "name": "first", "status": "idle"}))
    );

    let (status, outcome) = server
        .post("/agents/a1/prompt?wait=true", json!({"text": "Hi"}))
        .await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(outcome["end"], "completed");
    assert_eq!(outcome["messages"][1]["content"][0]["text"], "Hello there.");

    let (status, state) = server.get("/agents/a1").await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            &state["status"],
            &state["definition"]["system_prompt"],
            &state["definition"]["model"]["id"],
            state["messages"].as_array().unwrap().len(),
            &state["is_streaming"]
        ),
        (
            &json!("idle"),
            &json!("You help."),
            &json!("faux"),
            2,
            &json!(false)
        )
    );

    let (status, list) = server.get("/agents").await;
    assert_eq!(
        (status, list),
        (
            200,
            json!([{"id": "a1", "name": "first", "status": "idle"}])
        )
    );

    let (status, _) = server
        .send(reqwest::Method::DELETE, "/agents/a1", None)
        .await;
    assert_eq!(status, 204);
    let (status, problem) = server.get("/agents/a1").await;
    assert_eq!(
        (status, problem),
        (
            404,
            json!({"type": "urn:tiller:problem:unknown-agent", "title": "Not Found", "status": 404, "detail": "no agent has the id `a1`"})
        )
    );
    server.stop().await;
}

#[tokio::test]
async fn a_prompt_carries_files_and_a_bad_one_is_refused_by_its_place() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("A report."));
    let server = Running::start(&faux, ServerConfig::default()).await;
    server
        .post("/agents", json!({"definition": "helper", "id": "f1"}))
        .await;
    let pdf = json!({"name": "report.pdf", "mime_type": "application/pdf", "data": "JVBERi0xLjQ="});
    let (status, problem) = server
        .post(
            "/agents/f1/prompt",
            json!({"text": "Read these", "files": [pdf, {"name": "x.pdf", "mime_type": "application/pdf", "data": "not base64!"}]}),
        )
        .await;
    assert_eq!(
        (status, &problem["field"], &problem["detail"]),
        (
            422,
            &json!("files[1]"),
            &json!("the data of x.pdf is not base64")
        )
    );
    let (status, outcome) = server
        .post(
            "/agents/f1/prompt?wait=true",
            json!({"text": "Read this", "files": [pdf]}),
        )
        .await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(
        outcome["messages"][0]["content"],
        json!([{"type": "text", "text": "Read this"}, {"type": "file", "data": "JVBERi0xLjQ=", "mime_type": "application/pdf", "name": "report.pdf"}])
    );
    // The model was sent the file; the refused prompt left nothing behind.
    let requests = faux.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].context.messages.len(), 1);
    server.stop().await;
}

/// A file stored with `POST /files` is named by its id in prompts of its
/// tenant, reaches the model whole, and is stored once; another tenant cannot
/// name it, and a deleted one is gone.
#[tokio::test]
async fn a_stored_file_is_named_by_id_in_its_tenants_prompts_only() {
    use reqwest::Method;
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("A report."));
    let config = closed_for(&[
        ("token-acme", "acme", None),
        ("token-globex", "globex", None),
    ]);
    let server = on_store(&faux, &MemoryStore::new(), config).await;
    let call = |method: Method, path: &str, token: &'static str, body: Option<Value>| {
        let path = path.to_owned();
        let server = &server;
        async move { server.send_as(method, &path, Some(token), body).await }
    };
    let upload = json!({"name": "report.pdf", "data": "JVBERi0xLjQ="});
    let (status, stored) = call(Method::POST, "/files", "token-acme", Some(upload.clone())).await;
    let id = tiller::store::file_id(b"%PDF-1.4");
    assert_eq!(
        (
            status,
            &stored["id"],
            &stored["name"],
            &stored["mime_type"],
            &stored["size"]
        ),
        (
            201,
            &json!(id),
            &json!("report.pdf"),
            &json!("application/pdf"),
            &json!(8)
        )
    );
    let (status, again) = call(Method::POST, "/files", "token-acme", Some(upload)).await;
    assert_eq!((status, again), (201, stored.clone()));
    for (body, field, detail) in [
        (
            json!({"name": "x.pdf", "data": "not base64!"}),
            "data",
            "the data of x.pdf is not base64",
        ),
        (
            json!({"name": "x.bin", "data": "AA=="}),
            "data",
            "no media type known for x.bin: Tiller knows .pdf, .txt, .md, .csv, .html, .json, .xml, .doc, .docx, .xls, .xlsx, .wav, .mp3, .flac, .ogg and .m4a",
        ),
        (
            json!({"id": id}),
            "id",
            "a file's id is its content address: send `{name, mime_type, data}`",
        ),
    ] {
        let (status, problem) = call(Method::POST, "/files", "token-acme", Some(body)).await;
        assert_eq!(
            (status, &problem["field"], &problem["detail"]),
            (422, &json!(field), &json!(detail))
        );
    }

    let mut agents = Vec::new();
    for token in ["token-acme", "token-globex"] {
        let (status, created) = call(
            Method::POST,
            "/agents",
            token,
            Some(json!({"definition": "helper"})),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        agents.push(format!(
            "/agents/{}/prompt",
            created["id"].as_str().unwrap()
        ));
    }
    let (acme, globex) = (&agents[0], &agents[1]);
    let named = json!({"text": "Read this", "files": [{"id": id}]});
    let (status, problem) = call(Method::POST, globex, "token-globex", Some(named.clone())).await;
    let unknown = format!("no stored file `{id}` (see POST /files)");
    assert_eq!(
        (status, &problem["field"], &problem["detail"]),
        (422, &json!("files[0]"), &json!(unknown)),
        "another tenant cannot name it"
    );
    let both = json!({"text": "Read this", "files": [{"id": id, "name": "x.pdf"}]});
    let (status, problem) = call(Method::POST, acme, "token-acme", Some(both)).await;
    assert_eq!((status, &problem["field"]), (422, &json!("files[0]")));
    let many = json!({"text": "Read these", "files": vec![json!({"id": id}); 17]});
    let (status, problem) = call(Method::POST, acme, "token-acme", Some(many)).await;
    assert_eq!(
        (status, &problem["field"], &problem["detail"]),
        (
            422,
            &json!("files"),
            &json!("17 files, more than the 16 a message may carry")
        )
    );
    let (status, outcome) = call(
        Method::POST,
        &format!("{acme}?wait=true"),
        "token-acme",
        Some(named.clone()),
    )
    .await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(
        outcome["messages"][0]["content"],
        json!([{"type": "text", "text": "Read this"}, {"type": "file", "data": "JVBERi0xLjQ=", "mime_type": "application/pdf", "name": "report.pdf"}])
    );
    let requests = faux.requests();
    assert_eq!(requests.len(), 1, "the refused prompts reached no model");

    let (status, _) = call(
        Method::DELETE,
        &format!("/files/{id}"),
        "token-globex",
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = call(Method::DELETE, &format!("/files/{id}"), "token-acme", None).await;
    assert_eq!(status, 204);
    let (status, problem) = call(Method::POST, acme, "token-acme", Some(named)).await;
    assert_eq!((status, &problem["detail"]), (422, &json!(unknown)));
    server.stop().await;
}

#[tokio::test]
async fn agents_are_listed_page_by_page_in_id_order() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, ServerConfig::default()).await;
    for id in ["p3", "p1", "p5", "p2", "p4"] {
        let (status, _) = server
            .post("/agents", json!({"definition": "helper", "id": id}))
            .await;
        assert_eq!(status, 201);
    }
    let mut pages = Vec::new();
    let mut next = Some("/agents?limit=2".to_owned());
    while let Some(path) = next.take() {
        let response = server
            .http
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        next = response
            .headers()
            .get("link")
            .map(|link| link.to_str().unwrap().to_owned());
        let page: Vec<Value> = response.json().await.unwrap();
        pages.push(
            page.iter()
                .map(|agent| agent["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>(),
        );
        next = next.map(|link| {
            assert!(link.ends_with(">; rel=\"next\""), "{link}");
            link[1..link.find('>').unwrap()].to_owned()
        });
    }
    assert_eq!(pages, [vec!["p1", "p2"], vec!["p3", "p4"], vec!["p5"]]);
    let (status, problem) = server.get("/agents?limit=0").await;
    assert_eq!(
        (status, &problem["type"]),
        (422, &json!("urn:tiller:problem:invalid"))
    );
    server.stop().await;
}

#[tokio::test]
async fn an_inline_definition_makes_an_agent_and_a_bad_one_names_its_field() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, ServerConfig::default()).await;
    let (status, agent) = server
        .post(
            "/agents",
            json!({"inline": {"type": "object", "description": "You rhyme.", "json_schema_extra": {"kind": "agent", "name": "poet"}}, "id": "p"}),
        )
        .await;
    assert_eq!((status, &agent["id"]), (201, &json!("p")));
    let (_, state) = server.get("/agents/p").await;
    assert_eq!(state["definition"]["system_prompt"], "You rhyme.");

    let (status, problem) = server
        .post(
            "/agents",
            json!({"inline": {"type": "object", "json_schema_extra": {"kind": "agent", "name": "poet", "max_turns": "many"}}}),
        )
        .await;
    assert_eq!(
        (status, &problem["type"], &problem["field"]),
        (
            422,
            &json!("urn:tiller:problem:invalid"),
            &json!("inline.json_schema_extra.max_turns")
        ),
        "{problem}"
    );
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_get_typed_problems_and_change_nothing() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("slow").delay(Duration::from_secs(3_600)));
    let config = ServerConfig {
        max_body_bytes: 1_024,
        ..ServerConfig::default()
    };
    let server = Running::start(&faux, config).await;
    let id = server.create_helper().await;

    // Unknown definition, missing and unknown fields, wrong types.
    let cases = [
        (
            "/agents",
            json!({"definition": "nobody"}),
            Some("definition"),
        ),
        ("/agents", json!({}), Some("definition")),
        (
            "/agents",
            json!({"definition": "helper", "colour": "red"}),
            Some("colour"),
        ),
        (&format!("/agents/{id}/prompt"), json!({}), Some("text")),
        (
            &format!("/agents/{id}/steer"),
            json!({"text": 7}),
            Some("text"),
        ),
    ];
    for (path, body, field) in cases {
        let (status, problem) = server.post(path, body.clone()).await;
        assert_eq!(status, 422, "{path} {body}: {problem}");
        assert_eq!(problem["type"], "urn:tiller:problem:invalid");
        assert_eq!(problem["field"].as_str(), field, "{path} {body}: {problem}");
    }

    // A query that is not a boolean.
    let (status, problem) = server
        .post(
            &format!("/agents/{id}/prompt?wait=maybe"),
            json!({"text": "x"}),
        )
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("wait")),
        "{problem}"
    );

    // A body past the limit.
    let (status, problem) = server
        .post(
            &format!("/agents/{id}/prompt"),
            json!({"text": "x".repeat(2_000)}),
        )
        .await;
    assert_eq!(
        (status, &problem["status"]),
        (413, &json!(413)),
        "{problem}"
    );

    // A second prompt while the first runs: 409 busy.
    let (status, _) = server
        .post(&format!("/agents/{id}/prompt"), json!({"text": "one"}))
        .await;
    assert_eq!(status, 202);
    let (status, problem) = server
        .post(&format!("/agents/{id}/prompt"), json!({"text": "two"}))
        .await;
    assert_eq!(
        (status, &problem["type"]),
        (409, &json!("urn:tiller:problem:busy"))
    );

    // Abort answers once the agent is idle; nothing of "two" was kept.
    let (status, _) = server.post(&format!("/agents/{id}/abort"), json!({})).await;
    assert_eq!(status, 204);
    let (_, state) = server.get(&format!("/agents/{id}")).await;
    assert_eq!(state["status"], "idle");
    let texts: Vec<&Value> = state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| &m["content"][0]["text"])
        .collect();
    assert_eq!(texts, [&json!("one")]);

    // Unknown agents: 404 for every route.
    for path in [
        "/agents/ghost/prompt",
        "/agents/ghost/steer",
        "/agents/ghost/reset",
    ] {
        let (status, problem) = server.post(path, json!({"text": "hi"})).await;
        assert_eq!(
            (status, &problem["type"]),
            (404, &json!("urn:tiller:problem:unknown-agent")),
            "{path}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn events_stream_in_order_and_resume_after_the_last_one_seen() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("one two three").chunk_size(4));
    faux.push(FauxTurn::text("again").chunk_size(5));
    let server = Running::start(&faux, ServerConfig::default()).await;
    let id = server.create_helper().await;

    let mut events = server.events(&id, None).await;
    let (status, _) = server
        .post(&format!("/agents/{id}/prompt"), json!({"text": "count"}))
        .await;
    assert_eq!(status, 202);
    let first = events.until_end().await;
    assert_eq!(
        kinds(&first),
        [
            "agent_start",
            "turn_start",
            "message_start",
            "message_end",
            "message_start",
            "message_update",
            "message_update",
            "message_update",
            "message_update",
            "message_update",
            "message_update",
            "message_end",
            "turn_end",
            "agent_end"
        ]
    );
    // Numbered without a gap; the data is the envelope.
    let ids: Vec<u64> = first.iter().map(|event| event.id).collect();
    assert_eq!(ids, (ids[0]..ids[0] + ids.len() as u64).collect::<Vec<_>>());
    assert_eq!(first[0].data["agent_id"], json!(id));
    assert_eq!(first[0].data["seq"], json!(first[0].id));
    assert_eq!(first[0].data["event"]["type"], "agent_start");

    // Each update carries its piece, not the answer.
    assert!(first[5..first.len() - 3].iter().all(|event| {
        event.kind == "message_update" && event.data["event"].get("message").is_none()
    }));
    // A client that saw up to the assistant's message_start comes back: the rest
    // of the run, then the next run, each event once; the first update whole (a
    // snapshot of the answer so far, which it replaces), the others as they were.
    let seen = first[4].id;
    let mut resumed = server.events(&id, Some(seen)).await;
    let replayed = resumed.until_end().await;
    let (snapshot, message) = unsnapshot(&replayed[0]);
    assert_eq!(message["role"], "assistant");
    assert_eq!(snapshot, first[5]);
    assert_eq!(replayed[1..], first[6..]);
    let (status, _) = server
        .post(&format!("/agents/{id}/prompt"), json!({"text": "again"}))
        .await;
    assert_eq!(status, 202);
    let second = resumed.until_end().await;
    assert_eq!(second[0].id, first.last().unwrap().id + 1);
    assert_eq!(second, events.until_end().await);

    // A bad Last-Event-ID is bad input.
    let response = server
        .http
        .get(format!("{}/agents/{id}/events", server.base))
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);

    // Shutting down ends the open streams rather than waiting on them.
    server.stop().await;
}

/// With shards, a connection whose first request names an agent is served on
/// that agent's shard, moved there when the accept loop chose another; its
/// stream reads as on any connection, from the request's first byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_naming_an_agent_is_served_on_the_agents_shard() {
    let faux = FauxProvider::new();
    let server = Running::on_two_shards(&faux, ServerConfig::default()).await;
    let mut followed = Vec::new();
    for _ in 0..8 {
        let id = server.create_helper().await;
        followed.push((server.events_alone(&id).await, id));
    }
    for (events, id) in &mut followed {
        faux.push(FauxTurn::text(format!("I am {id}.")).chunk_size(64));
        let (status, _) = server
            .post(&format!("/agents/{id}/prompt"), json!({"text": "Who?"}))
            .await;
        assert_eq!(status, 202);
        let run = events.until_end().await;
        assert_eq!(
            kinds(&run),
            [
                "agent_start",
                "turn_start",
                "message_start",
                "message_end",
                "message_start",
                "message_update",
                "message_update",
                "message_update",
                "message_end",
                "turn_end",
                "agent_end"
            ]
        );
        assert_eq!(
            run[8].data["event"]["message"]["content"][0]["text"],
            format!("I am {id}.")
        );
    }
    let response = server
        .http
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    // The eight event streams at least; a prompt sent on a fresh connection of the
    // client's pool names its agent too, and is placed the same way.
    let beside: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("tiller_connections_total{placed=\"beside_agent\"} "))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no beside_agent count: {text}"));
    assert!(beside >= 8, "{text}");
    server.stop().await;
}

#[tokio::test]
async fn a_client_back_after_the_replay_buffer_moved_on_is_told_what_it_missed() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("a long answer streamed in many pieces").chunk_size(2));
    let config = ServerConfig {
        replay_events: 4,
        ..ServerConfig::default()
    };
    let server = Running::start(&faux, config).await;
    let id = server.create_helper().await;
    let mut events = server.events(&id, None).await;
    server
        .post(&format!("/agents/{id}/prompt"), json!({"text": "go"}))
        .await;
    let all = events.until_end().await;
    let last = all.last().unwrap().id;

    let mut resumed = server.events(&id, Some(all[0].id)).await;
    let lagged = resumed.next().await;
    assert_eq!(
        (
            lagged.kind.as_str(),
            lagged.id,
            &lagged.data["event"]["missed"]
        ),
        ("lagged", all[1].id, &json!(last - 3 - all[1].id))
    );
    let rest = resumed.until_end().await;
    // It cannot rebuild the answer from pieces it missed: the first update it
    // gets is whole.
    let (snapshot, message) = unsnapshot(&rest[0]);
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "a long answer streamed in many pieces"}])
    );
    assert_eq!(snapshot, all[all.len() - 4]);
    assert_eq!(rest[1..], all[all.len() - 3..]);
    // What it missed of the conversation, the store has.
    let finished: Vec<&Value> = all
        .iter()
        .filter(|event| event.kind == "message_end")
        .map(|event| &event.data["event"]["message"])
        .collect();
    let (status, page) = server.get(&format!("/sessions/{id}/messages")).await;
    assert_eq!(status, 200);
    assert_eq!(
        page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .collect::<Vec<_>>(),
        finished
    );
    server.stop().await;
}

#[tokio::test]
async fn tenants_see_only_their_own_agents() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello, Acme."));
    let config = closed_for(&[
        ("token-acme", "acme", Some("alice")),
        ("token-globex", "globex", None),
    ]);
    let server = Running::start(&faux, config).await;
    use reqwest::Method;

    // No token, or one the server does not know: 401, whatever the route.
    for token in [None, Some("token-nobody")] {
        let (status, problem) = server.send_as(Method::GET, "/agents", token, None).await;
        assert_eq!(
            (status, &problem["type"]),
            (401, &json!("urn:tiller:problem:unauthorized"))
        );
    }
    let (status, _) = server.send_as(Method::GET, "/healthz", None, None).await;
    assert_eq!(status, 200);

    // Acme's agent works for Acme's user; an id of the client's own is refused.
    let (status, problem) = server
        .send_as(
            Method::POST,
            "/agents",
            Some("token-acme"),
            Some(json!({"definition": "helper", "id": "mine"})),
        )
        .await;
    assert_eq!((status, &problem["field"]), (422, &json!("id")));
    let id = server.create_helper_as("token-acme").await;
    let (status, _) = server
        .send_as(
            Method::POST,
            &format!("/agents/{id}/prompt?wait=true"),
            Some("token-acme"),
            Some(json!({"text": "hi"})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, state) = server
        .send_as(
            Method::GET,
            &format!("/agents/{id}"),
            Some("token-acme"),
            None,
        )
        .await;
    assert_eq!(
        state["context"],
        json!({"tenant_id": "acme", "user_id": "alice", "session_id": id})
    );
    let (_, list) = server
        .send_as(Method::GET, "/agents", Some("token-acme"), None)
        .await;
    assert_eq!(list.as_array().unwrap().len(), 1);

    // Globex finds nothing of it, by any route.
    let (_, list) = server
        .send_as(Method::GET, "/agents", Some("token-globex"), None)
        .await;
    assert_eq!(list, json!([]));
    let attempts = [
        (Method::GET, format!("/agents/{id}"), None),
        (Method::GET, format!("/agents/{id}/events"), None),
        (
            Method::POST,
            format!("/agents/{id}/prompt"),
            Some(json!({"text": "x"})),
        ),
        (
            Method::POST,
            format!("/agents/{id}/steer"),
            Some(json!({"text": "x"})),
        ),
        (
            Method::POST,
            format!("/agents/{id}/follow_up"),
            Some(json!({"text": "x"})),
        ),
        (Method::POST, format!("/agents/{id}/abort"), None),
        (Method::POST, format!("/agents/{id}/reset"), None),
        (Method::DELETE, format!("/agents/{id}"), None),
    ];
    for (method, path, body) in attempts {
        let (status, problem) = server
            .send_as(method.clone(), &path, Some("token-globex"), body)
            .await;
        assert_eq!(
            (status, &problem["type"]),
            (404, &json!("urn:tiller:problem:unknown-agent")),
            "{method} {path}"
        );
    }
    // And Acme's agent is as it was.
    let (_, state) = server
        .send_as(
            Method::GET,
            &format!("/agents/{id}"),
            Some("token-acme"),
            None,
        )
        .await;
    assert_eq!(state["messages"].as_array().unwrap().len(), 2);
    server.stop().await;
}

#[tokio::test]
async fn context_headers_count_only_when_the_server_trusts_them() {
    let faux = FauxProvider::new();
    for trust in [false, true] {
        let config = ServerConfig {
            trust_context_headers: trust,
            ..ServerConfig::default()
        };
        let server = Running::start(&faux, config).await;
        let created = server
            .http
            .post(format!("{}/agents", server.base))
            .header("content-type", "application/json")
            .header("X-User-Id", "mallory")
            .header("X-Client-Id", "web")
            // No LLM configurations: the model named is only the context's.
            .header("X-Model-Name", "gpt-5")
            .body(json!({"definition": "helper", "id": "c"}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
        let (_, state) = server.get("/agents/c").await;
        let expected = if trust {
            json!({"user_id": "mallory", "client_id": "web", "session_id": "c", "default_model": "gpt-5"})
        } else {
            json!({"session_id": "c"})
        };
        assert_eq!(state["context"], expected, "trusted: {trust}");
        server.stop().await;
    }
}

#[tokio::test]
async fn trusted_headers_choose_the_definition_and_one_of_the_operators_models() {
    let upstream = MockServer::start().await;
    upstream.push(MockResponse::sse(sse::openai_text(&[
        "From the local model.",
    ])));
    let local = tiller::runtime::DefinitionPatch {
        base_url: Some(upstream.base_url()),
        model: Some("small-model".to_owned()),
        ..Default::default()
    };
    let faux = FauxProvider::new();
    let definitions = Definitions::new()
        .with_default_model(faux.model())
        .with_llms(tiller::agents::LlmConfigs::new().with("local", local));
    let config = ServerConfig {
        trust_context_headers: true,
        ..ServerConfig::default()
    };
    let server = Running::serve(definitions, config).await;
    let create = |id: &str, model: &str| {
        server
            .http
            .post(format!("{}/agents", server.base))
            .header("content-type", "application/json")
            .header("X-Agent-Schema", "helper")
            .header("X-Model-Name", model)
            .header("X-Anonymous-Id", "visitor-9")
            .body(json!({"id": id}).to_string())
            .send()
    };
    let refused = create("m0", "gpt-5").await.unwrap();
    assert_eq!(refused.status(), 422);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(
        (&problem["field"], &problem["detail"]),
        (
            &json!("X-Model-Name"),
            &json!("no LLM configuration `gpt-5` (known: local)")
        )
    );
    assert_eq!(server.get("/agents/m0").await.0, 404);

    assert_eq!(create("m1", "local").await.unwrap().status(), 201);
    let (status, outcome) = server
        .post("/agents/m1/prompt?wait=true", json!({"text": "Hi"}))
        .await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(
        outcome["messages"][1]["content"][0]["text"],
        "From the local model."
    );
    let (_, state) = server.get("/agents/m1").await;
    assert_eq!(
        (
            &state["definition"]["system_prompt"],
            &state["definition"]["model"]["id"]
        ),
        (&json!("You help."), &json!("small-model"))
    );
    assert_eq!(upstream.requests()[0].body["model"], "small-model");
    assert!(faux.requests().is_empty());
    // An anonymous caller has no user id (none is made up), only the id its
    // client gave.
    assert_eq!(
        state["context"],
        json!({"session_id": "m1", "default_model": "local", "agent_schema_uri": "helper", "anonymous_id": "visitor-9"})
    );
    server.stop().await;
}

/// A request body as pi-agent-core's `streamProxy` sends it: the whole model
/// (pointing elsewhere, which the server ignores), a context after one tool
/// round, and options.
fn pi_request(provider: &str, id: &str) -> Value {
    json!({
        "model": {"id": id, "name": id, "api": "openai-completions", "provider": provider,
                  "baseUrl": "https://elsewhere.invalid/v1", "reasoning": false, "input": ["text"],
                  "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                  "contextWindow": 8192, "maxTokens": 1024, "headers": {"x-steal": "keys"}},
        "context": {
            "systemPrompt": "Be brief.",
            "messages": [
                {"role": "user", "content": "What time is it?", "timestamp": 1},
                {"role": "assistant", "api": "openai-completions", "provider": provider, "model": id,
                 "content": [{"type": "toolCall", "id": "call_1", "name": "clock", "arguments": {"zone": "UTC"}}],
                 "usage": {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 2,
                           "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
                 "stopReason": "toolUse", "timestamp": 2},
                {"role": "toolResult", "toolCallId": "call_1", "toolName": "clock",
                 "content": [{"type": "text", "text": "noon"}], "isError": false, "timestamp": 3}
            ],
            "tools": [{"name": "clock", "description": "Tells the time",
                       "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}]
        },
        "options": {"temperature": 0.25, "maxTokens": 64, "sessionId": "s-1", "transport": "sse"}
    })
}

/// The `data:` of each server-sent event of `body`, as JSON.
fn sse_data(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

#[tokio::test]
async fn pi_proxy_calls_the_servers_model_and_streams_pis_events() {
    let upstream = MockServer::start().await;
    upstream.push(MockResponse::sse(sse::openai_text(&["It is ", "noon."])));
    let model = tiller::Model::openai_compatible(upstream.base_url(), "local-model");
    let provider = model.provider.clone();
    let server = Running::serve(
        Definitions::new().with_default_model(model),
        ServerConfig::default(),
    )
    .await;

    let (status, body) = server
        .post_raw("/api/stream", &[], &pi_request(&provider, "local-model"))
        .await;
    assert_eq!(status, 200, "{body}");
    let usage = json!({"input": 10, "output": 2, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 12,
                       "cost": {"input": 0.0, "output": 0.0, "cacheRead": 0.0, "cacheWrite": 0.0, "total": 0.0}});
    assert_eq!(
        sse_data(&body),
        [
            json!({"type": "start"}),
            json!({"type": "text_start", "contentIndex": 0}),
            json!({"type": "text_delta", "contentIndex": 0, "delta": "It is "}),
            json!({"type": "text_delta", "contentIndex": 0, "delta": "noon."}),
            json!({"type": "text_end", "contentIndex": 0}),
            json!({"type": "done", "reason": "stop", "usage": usage}),
        ]
    );

    // The request boundary: the server's model and address, the client's
    // conversation and options, none of the client's headers.
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(requests[0].header("x-steal"), None);
    let body = &requests[0].body;
    assert_eq!(
        (
            &body["model"],
            &body["temperature"],
            &body["max_tokens"],
            &body["messages"]
        ),
        (
            &json!("local-model"),
            &json!(0.25),
            &json!(64),
            &json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What time is it?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "clock", "arguments": "{\"zone\":\"UTC\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "noon"}
            ])
        )
    );
    let (_, metrics) = server.get("/metrics").await;
    let metrics = metrics.as_str().unwrap();
    for line in [
        "tiller_proxy_calls_total 1",
        "tiller_proxy_first_event_seconds_count 1",
        "tiller_http_responses_total{route=\"/api/stream\",status=\"200\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }
    server.stop().await;
}

/// `/api/stream` holds a client to the operator's token limit and to its
/// tenant's budget: five calls at once against a budget of two model calls,
/// two go out and three are refused (429 `budget-exceeded`); a token budget
/// lowers the call's `max_tokens` to what it leaves.
#[tokio::test]
async fn pi_proxy_caps_max_tokens_and_reserves_against_the_tenants_budget() {
    let upstream = MockServer::start().await;
    upstream.always(MockResponse::sse(sse::openai_text(&["It is noon."])));
    let model = tiller::Model::openai_compatible(upstream.base_url(), "local-model");
    let (provider, limit) = (model.provider.clone(), model.max_tokens);
    let supervisor = Supervisor::start().await.unwrap();
    let calls = tiller::run::Budget {
        model_calls: Some(2),
        ..tiller::run::Budget::default()
    };
    let tokens = tiller::run::Budget {
        total_tokens: Some(1_000),
        ..tiller::run::Budget::default()
    };
    supervisor.set_tenant_budget("acme", calls).await.unwrap();
    supervisor
        .set_tenant_budget("globex", tokens)
        .await
        .unwrap();
    let server = Running::on(
        supervisor,
        Definitions::new().with_default_model(model),
        closed(&[("a", "acme"), ("g", "globex")]),
    )
    .await;
    let mut greedy = pi_request(&provider, "local-model");
    greedy["options"]["maxTokens"] = json!(99_999_999);
    let acme = [("authorization", "Bearer a")];
    let five = (0..5).map(|_| server.post_raw("/api/stream", &acme, &greedy));
    let mut statuses: Vec<u16> = futures::future::join_all(five)
        .await
        .into_iter()
        .map(|(status, body)| {
            if status == 429 {
                let problem: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(problem["type"], "urn:tiller:problem:budget-exceeded");
            }
            status
        })
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    let sent = upstream.requests();
    assert_eq!(sent.len(), 2);
    // The operator's limit, not the client's 99,999,999.
    assert_eq!(sent[0].body["max_tokens"], json!(limit));

    // The request's bytes bound its input; the rest of 1,000 tokens is the
    // most the answer may take.
    let globex = [("authorization", "Bearer g")];
    let (status, _) = server.post_raw("/api/stream", &globex, &greedy).await;
    assert_eq!(status, 200);
    let input = greedy.to_string().len() as u64 / 4;
    assert_eq!(
        upstream.requests()[2].body["max_tokens"],
        json!(1_000 - input)
    );
    server.stop().await;
}

/// The operator's guardrails check what a client brings: an inline agent's
/// prompts (its run ends `guardrail_tripped`) and `/api/stream`'s last user
/// message (403 `guardrail-tripped`, the model never called).
#[tokio::test]
async fn the_operators_guardrails_check_inline_agents_and_the_pi_proxy() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Never sent."));
    let no_secrets = tiller::run::Guardrail::new(
        "no_secrets",
        |input: tiller::run::GuardrailInput| async move {
            Ok(if input.text.contains("password") {
                tiller::run::Verdict::Fail {
                    reason: "it mentions a password".to_owned(),
                }
            } else {
                tiller::run::Verdict::Pass
            })
        },
    );
    let config = ServerConfig {
        guardrails: tiller::run::Guardrails {
            input: vec![no_secrets],
            ..tiller::run::Guardrails::default()
        },
        ..ServerConfig::default()
    };
    let server = Running::start(&faux, config).await;
    let (status, _) = server
        .post(
            "/agents",
            json!({"inline": {"type": "object", "description": "You help.", "json_schema_extra": {"kind": "agent", "name": "mine"}}, "id": "mine"}),
        )
        .await;
    assert_eq!(status, 201);
    let (status, outcome) = server
        .post(
            "/agents/mine/prompt?wait=true",
            json!({"text": "my password is hunter2"}),
        )
        .await;
    assert_eq!(
        (status, &outcome["end"]),
        (200, &json!("guardrail_tripped")),
        "{outcome}"
    );
    let model = faux.model();
    let mut asked = pi_request(&model.provider, &model.id);
    asked["context"]["messages"] =
        json!([{"role": "user", "content": "the password is hunter2", "timestamp": 1}]);
    let (status, body) = server.post_raw("/api/stream", &[], &asked).await;
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, &problem["type"]),
        (403, &json!("urn:tiller:problem:guardrail-tripped")),
        "{problem}"
    );
    assert_eq!(faux.remaining(), 1, "the model was never asked");
    server.stop().await;
}

#[tokio::test]
async fn pi_proxy_refuses_unknown_models_bad_bodies_and_unknown_tokens() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, closed(&[("secret-a", "acme")])).await;
    let model = faux.model();
    let bearer = [("authorization", "Bearer secret-a")];

    let (status, body) = server
        .post_raw("/api/stream", &[], &pi_request(&model.provider, &model.id))
        .await;
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            status,
            &problem["type"],
            problem["error"] == problem["detail"]
        ),
        (401, &json!("urn:tiller:problem:unauthorized"), true),
        "{problem}"
    );

    let (status, body) = server
        .post_raw("/api/stream", &bearer, &pi_request("openai", "gpt-4o"))
        .await;
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, &problem["field"], &problem["error"]),
        (
            422,
            &json!("model"),
            &json!(format!(
                "this server does not serve the model openai/gpt-4o; it serves {}/{}",
                model.provider, model.id
            ))
        ),
        "{problem}"
    );

    let mut bad = pi_request(&model.provider, &model.id);
    bad["context"]["messages"][0]["role"] = json!("robot");
    let (status, body) = server.post_raw("/api/stream", &bearer, &bad).await;
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("context.messages[0].role")),
        "{problem}"
    );
    assert_eq!(faux.remaining(), 0);
    server.stop().await;
}

#[tokio::test]
async fn metrics_count_agents_responses_problems_and_streamed_events() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello there."));
    let server = Running::start(&faux, ServerConfig::default()).await;
    let id = server.create_helper().await;
    let mut events = server.events(&id, None).await;
    let (status, _) = server
        .post(
            &format!("/agents/{id}/prompt?wait=true"),
            json!({"text": "Hi"}),
        )
        .await;
    assert_eq!(status, 200);
    let seen = events.until_end().await;
    let streamed = seen.len();
    // A client resuming after the last event is answered once the server has
    // recorded (and counted) every event so far.
    let _resumed = server.events(&id, Some(seen.last().unwrap().id)).await;
    let (status, _) = server.get("/agents/nobody").await;
    assert_eq!(status, 404);

    let response = server
        .http
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    let text = response.text().await.unwrap();
    // The model's time to its first event varies; the count of such events does not.
    let (text, waited) = {
        let mut waited = None;
        let lines: Vec<&str> = text
            .lines()
            .map(
                |line| match line.strip_prefix("tiller_model_first_event_seconds_sum ") {
                    Some(seconds) => {
                        waited = seconds.parse::<f64>().ok();
                        "tiller_model_first_event_seconds_sum T"
                    }
                    None => line,
                },
            )
            .collect();
        (lines.join("\n") + "\n", waited)
    };
    assert!(waited.is_some_and(f64::is_finite), "{text}");
    assert_eq!(
        text,
        format!(
            "# HELP tiller_agents Agents by status.
# TYPE tiller_agents gauge
tiller_agents{{status=\"idle\"}} 1
tiller_agents{{status=\"running\"}} 0
tiller_agents{{status=\"hibernated\"}} 0
tiller_agents{{status=\"stopped\"}} 0
tiller_agents{{status=\"waiting_for_input\"}} 0
# HELP tiller_runs_started_total Runs started.
# TYPE tiller_runs_started_total counter
tiller_runs_started_total 1
# HELP tiller_runs_ended_total Runs ended, by how.
# TYPE tiller_runs_ended_total counter
tiller_runs_ended_total{{end=\"completed\"}} 1
# HELP tiller_model_first_event_seconds Time from a turn's start to the model's first event.
# TYPE tiller_model_first_event_seconds summary
tiller_model_first_event_seconds_sum T
tiller_model_first_event_seconds_count 1
# HELP tiller_http_responses_total HTTP responses by route and status.
# TYPE tiller_http_responses_total counter
tiller_http_responses_total{{route=\"/agents\",status=\"201\"}} 1
tiller_http_responses_total{{route=\"/agents/{{id}}\",status=\"404\"}} 1
tiller_http_responses_total{{route=\"/agents/{{id}}/events\",status=\"200\"}} 2
tiller_http_responses_total{{route=\"/agents/{{id}}/prompt\",status=\"200\"}} 1
# HELP tiller_problems_total Problem responses by kind.
# TYPE tiller_problems_total counter
tiller_problems_total{{kind=\"unknown-agent\"}} 1
# HELP tiller_connections_total Connections by where they are served: on the shard of the agent their first request names, or on one chosen in turn.
# TYPE tiller_connections_total counter
tiller_connections_total{{placed=\"beside_agent\"}} 0
tiller_connections_total{{placed=\"in_turn\"}} 0
# HELP tiller_events_streamed_total Events written to event-stream clients.
# TYPE tiller_events_streamed_total counter
tiller_events_streamed_total {streamed}
# HELP tiller_proxy_calls_total Model calls through /api/stream.
# TYPE tiller_proxy_calls_total counter
tiller_proxy_calls_total 0
# HELP tiller_proxy_first_event_seconds Time from a proxied call to the model's first event.
# TYPE tiller_proxy_first_event_seconds summary
tiller_proxy_first_event_seconds_sum 0
tiller_proxy_first_event_seconds_count 0
# HELP tiller_store_unavailable 1 while the session store cannot write (writes wait, requests that would write get 503).
# TYPE tiller_store_unavailable gauge
tiller_store_unavailable 0
# HELP tiller_store_write_failures_total Tries of a write the session store failed (each tried again).
# TYPE tiller_store_write_failures_total counter
tiller_store_write_failures_total 0
# HELP tiller_store_outages_total Times the session store became unavailable.
# TYPE tiller_store_outages_total counter
tiller_store_outages_total 0
"
        )
    );
    server.stop().await;
}

#[tokio::test]
async fn a_tiller_agent_calls_its_model_through_a_servers_pi_proxy() {
    let upstream = MockServer::start().await;
    upstream.push(MockResponse::sse(sse::openai_tool_call(
        "call_1",
        "clock",
        &json!({"zone": "UTC"}),
    )));
    upstream.push(MockResponse::sse(sse::openai_text(&["It is ", "noon."])));
    let served = tiller::Model::openai_compatible(upstream.base_url(), "local-model");
    let server = Running::serve(
        Definitions::new().with_default_model(served.clone()),
        closed(&[("proxy-token", "acme")]),
    )
    .await;

    // An agent elsewhere, holding no provider key: its model is the proxy's.
    let clock = tiller::FnTool::new(
        "clock",
        "Tells the time",
        json!({"type": "object", "properties": {"zone": {"type": "string"}}}),
        |args, _| async move {
            Ok(tiller::ToolOutput::text(format!(
                "noon in {}",
                args["zone"].as_str().unwrap()
            )))
        },
    );
    let mut settings = tiller::AgentSettings::new(tiller::Model::pi_proxy(
        &server.base,
        &served.provider,
        "local-model",
    ))
    .with_system_prompt("Be brief.")
    .with_tools(
        tiller::ToolSet::new([std::sync::Arc::new(clock) as std::sync::Arc<dyn tiller::AgentTool>])
            .unwrap(),
    );
    settings.definition.run.stream.transport.api_key = Some(tiller::ai::ApiKey::new("proxy-token"));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(tiller::AgentSpec::new(settings))
        .await
        .unwrap();
    let outcome = agent.run("What time is it?").await.unwrap();
    assert_eq!(outcome.summary().text, "It is noon.");
    let messages: Vec<Value> = outcome
        .messages
        .iter()
        .map(|message| {
            let json = serde_json::to_value(message).unwrap();
            json!([json["role"], json["content"], json.get("stop_reason")])
        })
        .collect();
    assert_eq!(
        messages,
        [
            json!(["user", [{"type": "text", "text": "What time is it?"}], null]),
            json!(["assistant", [{"type": "tool_call", "id": "call_1", "name": "clock", "arguments": {"zone": "UTC"}}], "tool_use"]),
            json!(["tool_result", [{"type": "text", "text": "noon in UTC"}], null]),
            json!(["assistant", [{"type": "text", "text": "It is noon."}], "stop"]),
        ]
    );

    // The request boundary: the proxy's model call carries the agent's tool round.
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        (
            &requests[1].body["tools"][0]["function"]["name"],
            &requests[1].body["messages"]
        ),
        (
            &json!("clock"),
            &json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What time is it?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "clock", "arguments": "{\"zone\":\"UTC\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "noon in UTC"}
            ])
        )
    );
    supervisor.shutdown().await;
    server.stop().await;
}

#[tokio::test]
async fn every_operation_the_openapi_document_lists_is_served() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, ServerConfig::default()).await;
    let (status, spec) = server.get("/openapi.json").await;
    assert_eq!((status, &spec["openapi"]), (200, &json!("3.1.0")));
    let (status, _) = server
        .post("/agents", json!({"definition": "helper", "id": "a1"}))
        .await;
    assert_eq!(status, 201);

    let mut operations: Vec<(String, String)> = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|key| *key != "parameters")
                .map(|method| (method.to_uppercase(), path.replace("{id}", "a1")))
                .collect::<Vec<_>>()
        })
        .collect();
    // Stopping the agent and deleting its session go last.
    operations.sort_by_key(|(method, path)| (method == "DELETE", path.starts_with("/agents")));
    assert_eq!(operations.len(), 40, "{operations:?}");
    for (method, path) in operations {
        let response = server
            .http
            .request(method.parse().unwrap(), format!("{}{path}", server.base))
            .header("content-type", "application/json")
            .body(r#"{"text": "hi"}"#)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let problem = response
            .headers()
            .get("content-type")
            .is_some_and(|kind| kind == "application/problem+json");
        // A route that is not there is a bare 404 or a 405.
        assert!(
            status != 405 && (status != 404 || problem),
            "{method} {path}: {status}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn the_stream_of_every_agent_follows_the_tenants_agents_and_no_others() {
    let faux = FauxProvider::new();
    let server = Running::start(
        &faux,
        closed(&[("acme-token", "acme"), ("globex-token", "globex")]),
    )
    .await;
    const ACME: &[(&str, &str)] = &[("authorization", "Bearer acme-token")];
    const GLOBEX: &[(&str, &str)] = &[("authorization", "Bearer globex-token")];
    let create = |headers: &'static [(&'static str, &'static str)]| {
        let server = &server;
        async move {
            let (status, body) = server
                .post_raw("/agents", headers, &json!({"definition": "helper"}))
                .await;
            assert_eq!(status, 201, "{body}");
            serde_json::from_str::<Value>(&body).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let before = create(ACME).await;
    let mut all = server.stream("/events", ACME).await;
    let after = create(ACME).await;
    let other = create(GLOBEX).await;
    for (id, headers) in [(&other, GLOBEX), (&before, ACME), (&after, ACME)] {
        faux.push(FauxTurn::text("Hello."));
        let (status, body) = server
            .post_raw(
                &format!("/agents/{id}/prompt?wait=true"),
                headers,
                &json!({"text": "Hi"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    let mut by_agent: std::collections::BTreeMap<String, Vec<(u64, String)>> = Default::default();
    let mut ended = 0;
    while ended < 2 {
        let event = all.next().await;
        assert!(!event.numbered, "{event:?}");
        ended += usize::from(event.kind == "agent_end");
        by_agent
            .entry(event.data["agent_id"].as_str().unwrap().to_owned())
            .or_default()
            .push((event.id, event.kind));
    }
    assert_eq!(
        by_agent.keys().collect::<Vec<_>>(),
        {
            let mut ids = vec![&before, &after];
            ids.sort();
            ids
        },
        "only the tenant's agents, the one created after the stream opened included"
    );
    for (id, events) in &by_agent {
        let kinds: Vec<&str> = events.iter().map(|(_, kind)| kind.as_str()).collect();
        assert_eq!(kinds.first(), Some(&"agent_start"), "{id}: {kinds:?}");
        assert_eq!(kinds.last(), Some(&"agent_end"), "{id}: {kinds:?}");
        let seqs: Vec<u64> = events.iter().map(|(seq, _)| *seq).collect();
        let first = seqs[0];
        assert_eq!(
            seqs,
            (first..first + seqs.len() as u64).collect::<Vec<_>>(),
            "{id}: in order, none missing"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_proxied_call_in_flight_ends_with_pis_aborted_event_at_shutdown() {
    let upstream = MockServer::start().await;
    upstream.push(
        MockResponse::sse("")
            .chunks([sse::openai_delta(json!({"content": "It is"}))])
            .stall(),
    );
    let model = tiller::Model::openai_compatible(upstream.base_url(), "local-model");
    let provider = model.provider.clone();
    let server = Running::serve(
        Definitions::new().with_default_model(model),
        ServerConfig::default(),
    )
    .await;
    let response = server
        .http
        .post(format!("{}/api/stream", server.base))
        .header("content-type", "application/json")
        .body(pi_request(&provider, "local-model").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut text = String::new();
    // The answer has begun.
    while !text.contains("text_delta") {
        text.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    let stopping = tokio::spawn(server.stop());
    while let Some(chunk) = body.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    stopping.await.unwrap();
    let events = sse_data(&text);
    let last = events.last().unwrap();
    assert_eq!(
        (&last["type"], &last["reason"]),
        (&json!("error"), &json!("aborted")),
        "{text}"
    );
}

/// A WebSocket to `path` of `server`.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn socket(server: &Running, path: &str) -> Socket {
    let url = format!("{}{path}", server.base.replace("http://", "ws://"));
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

/// The next text frame, as JSON.
async fn frame(socket: &mut Socket) -> Value {
    loop {
        match socket.next().await.unwrap().unwrap() {
            tokio_tungstenite::tungstenite::Message::Text(text) => {
                return serde_json::from_str(text.as_str()).unwrap();
            }
            _ => continue,
        }
    }
}

/// The next problem frame, events before it skipped.
async fn problem(socket: &mut Socket) -> Value {
    loop {
        let frame = frame(socket).await;
        if frame["type"] == "problem" {
            return frame;
        }
    }
}

async fn send(socket: &mut Socket, command: Value) {
    use futures::SinkExt;
    socket
        .send(tokio_tungstenite::tungstenite::Message::Text(
            command.to_string().into(),
        ))
        .await
        .unwrap();
}

/// A file in a WebSocket command is checked as over HTTP: a stored file's id in
/// place of its bytes is refused (it would have named another tenant's), and so
/// are more files than a message may carry; the agent hears of neither.
#[tokio::test]
async fn a_websocket_command_cannot_carry_a_files_id_or_too_many_files() {
    let faux = FauxProvider::new();
    let server = Running::start(&faux, ServerConfig::default()).await;
    let id = server.create_helper().await;
    let mut ws = socket(&server, &format!("/agents/{id}/ws")).await;
    let forged = json!({"type": "file", "data": tiller::store::file_id(b"secret"), "mime_type": "application/pdf", "name": "x.pdf"});
    let message = |files: Vec<Value>| {
        let mut content = vec![json!({"type": "text", "text": "Read"})];
        content.extend(files);
        json!({"type": "prompt", "messages": [{"role": "user", "content": content, "timestamp": 0}]})
    };
    send(&mut ws, message(vec![forged])).await;
    let refused = problem(&mut ws).await;
    assert_eq!(
        (&refused["status"], &refused["field"], &refused["detail"]),
        (
            &json!(422),
            &json!("messages[0].files[0]"),
            &json!("the data of x.pdf is not base64")
        ),
        "{refused}"
    );
    let pdf = json!({"type": "file", "data": "JVBERi0xLjQ=", "mime_type": "application/pdf", "name": "r.pdf"});
    send(&mut ws, message(vec![pdf; 17])).await;
    let refused = problem(&mut ws).await;
    assert_eq!(
        (&refused["status"], &refused["field"]),
        (&json!(422), &json!("messages[0].files[16]")),
        "{refused}"
    );
    assert!(faux.requests().is_empty());
    let (_, state) = server.get(&format!("/agents/{id}")).await;
    assert_eq!(state["messages"], json!([]));
    server.stop().await;
}

#[tokio::test]
async fn a_websocket_streams_events_and_takes_prompt_steer_and_abort() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("never finished").delay(Duration::from_secs(3_600)));
    let server = Running::start(&faux, ServerConfig::default()).await;
    let id = server.create_helper().await;
    let mut ws = socket(&server, &format!("/agents/{id}/ws")).await;

    send(&mut ws, json!({"type": "prompt", "text": "Hi"})).await;
    let mut kinds = Vec::new();
    while kinds.last() != Some(&"message_start".to_owned()) || kinds.len() < 5 {
        kinds.push(
            frame(&mut ws).await["event"]["type"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(
        kinds,
        [
            "agent_start",
            "turn_start",
            "message_start",
            "message_end",
            "message_start"
        ]
    );

    // While it runs: a second prompt is refused, a steer is taken, a bad frame
    // is named.
    send(&mut ws, json!({"type": "prompt", "text": "Again"})).await;
    let busy = problem(&mut ws).await;
    assert_eq!(
        (&busy["type"], &busy["kind"], &busy["status"]),
        (
            &json!("problem"),
            &json!("urn:tiller:problem:busy"),
            &json!(409)
        ),
        "{busy}"
    );
    send(&mut ws, json!({"type": "steer", "text": "Be quick"})).await;
    send(&mut ws, json!({"type": "dance"})).await;
    let bad = problem(&mut ws).await;
    assert_eq!(
        (&bad["type"], &bad["status"]),
        (&json!("problem"), &json!(422)),
        "{bad}"
    );
    let (_, state) = server.get(&format!("/agents/{id}")).await;
    assert_eq!(
        state["steering_queue"][0]["content"][0]["text"],
        json!("Be quick")
    );

    send(&mut ws, json!({"type": "abort"})).await;
    let mut last = Value::Null;
    while last["event"]["type"] != "agent_end" {
        last = frame(&mut ws).await;
    }
    let end_seq = last["seq"].as_u64().unwrap();
    let (_, state) = server.get(&format!("/agents/{id}")).await;
    assert_eq!(state["status"], "idle");

    // A second socket resumes after an event it saw.
    let mut again = socket(&server, &format!("/agents/{id}/ws?after={}", end_seq - 1)).await;
    let resumed = frame(&mut again).await;
    assert_eq!(
        (&resumed["seq"], &resumed["event"]["type"]),
        (&json!(end_seq), &json!("agent_end"))
    );
    server.stop().await;
}

/// A server on `store`, answering with `faux`.
async fn on_store(faux: &FauxProvider, store: &MemoryStore, config: ServerConfig) -> Running {
    let supervisor = Supervisor::with_store(
        SupervisorConfig::default(),
        std::sync::Arc::new(store.clone()),
    )
    .await
    .unwrap();
    let definitions = Definitions::new().with_default_model(faux.model());
    Running::on(supervisor, definitions, config).await
}

#[tokio::test]
async fn a_conversation_is_listed_paged_resumed_after_a_restart_and_deleted() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello there."));
    faux.push(FauxTurn::text("Welcome back."));
    let store = MemoryStore::new();
    let server = on_store(&faux, &store, ServerConfig::default()).await;
    let (status, _) = server
        .post(
            "/agents",
            json!({"definition": "helper", "id": "c1", "name": "chat"}),
        )
        .await;
    assert_eq!(status, 201);
    let (status, _) = server
        .post("/agents/c1/prompt?wait=true", json!({"text": "Hi"}))
        .await;
    assert_eq!(status, 200);

    let (status, sessions) = server.get("/sessions").await;
    assert_eq!(status, 200);
    let session = &sessions[0];
    assert_eq!(
        (
            sessions.as_array().unwrap().len(),
            &session["id"],
            &session["name"],
            &session["status"],
            &session["messages"],
            &session["definition"]["system_prompt"],
            &session["agent"],
        ),
        (
            1,
            &json!("c1"),
            &json!("chat"),
            &json!("active"),
            &json!(2),
            &json!("You help."),
            &json!({"id": "c1", "name": "chat", "status": "idle"}),
        )
    );
    let (status, page) = server.get("/sessions/c1/messages?limit=1").await;
    assert_eq!(
        (status, &page["from"], &page["total"], &page["next"]),
        (200, &json!(0), &json!(2), &json!(1))
    );
    assert_eq!(page["messages"][0]["role"], "user");
    assert_eq!(page["messages"][0]["content"][0]["text"], "Hi");
    let (status, page) = server.get("/sessions/c1/messages?from=1&limit=1").await;
    assert_eq!(
        (status, &page["from"], &page["next"]),
        (200, &json!(1), &Value::Null)
    );
    assert_eq!(page["messages"][0]["content"][0]["text"], "Hello there.");

    // Bad pages and unknown sessions: typed problems.
    let (status, problem) = server.get("/sessions/c1/messages?limit=0").await;
    assert_eq!((status, &problem["field"]), (422, &json!("limit")));
    let (status, problem) = server.get("/sessions?status=sleeping").await;
    assert_eq!((status, &problem["field"]), (422, &json!("query")));
    let (status, problem) = server.get("/sessions/nobody/messages").await;
    assert_eq!(
        (status, &problem["type"]),
        (404, &json!("urn:tiller:problem:unknown-session"))
    );
    server.stop().await;

    // Another server on the same store: no agent holds the session until it is
    // resumed, with its transcript and name, and it goes on from there.
    let server = on_store(&faux, &store, ServerConfig::default()).await;
    assert_eq!(server.get("/agents").await, (200, json!([])));
    let (_, session) = server.get("/sessions/c1").await;
    assert_eq!(
        (&session["messages"], &session["agent"]),
        (&json!(2), &Value::Null)
    );
    let (status, problem) = server.post("/sessions/c1/resume", json!({})).await;
    assert_eq!((status, &problem["field"]), (422, &json!("definition")));
    let (status, agent) = server
        .post("/sessions/c1/resume", json!({"definition": "helper"}))
        .await;
    assert_eq!(
        (status, agent),
        (201, json!({"id": "c1", "name": "chat", "status": "idle"}))
    );
    let (status, again) = server
        .post("/sessions/c1/resume", json!({"definition": "helper"}))
        .await;
    assert_eq!((status, &again["id"]), (200, &json!("c1")));
    let (status, outcome) = server
        .post(
            "/agents/c1/prompt?wait=true",
            json!({"text": "Still there?"}),
        )
        .await;
    assert_eq!(status, 200, "{outcome}");
    let (_, state) = server.get("/agents/c1").await;
    let texts: Vec<&Value> = state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| &message["content"][0]["text"])
        .collect();
    assert_eq!(
        texts,
        [
            &json!("Hi"),
            &json!("Hello there."),
            &json!("Still there?"),
            &json!("Welcome back.")
        ]
    );
    // The model saw the whole conversation.
    assert_eq!(faux.requests().last().unwrap().context.messages.len(), 3);

    let (status, _) = server
        .send(reqwest::Method::DELETE, "/sessions/c1", None)
        .await;
    assert_eq!(status, 204);
    assert_eq!(server.get("/agents/c1").await.0, 404);
    assert_eq!(server.get("/sessions/c1").await.0, 404);
    assert_eq!(server.get("/sessions").await, (200, json!([])));
    server.stop().await;
}

#[tokio::test]
async fn a_tenant_sees_only_its_own_sessions_and_a_users_token_only_its_users() {
    let faux = FauxProvider::new();
    let config = closed_for(&[
        ("token-alice", "acme", Some("alice")),
        ("token-acme", "acme", None),
        ("token-globex", "globex", None),
    ]);
    let store = MemoryStore::new();
    let server = on_store(&faux, &store, config).await;
    let running = &server;
    let call = |method: reqwest::Method, path: &str, token: &'static str| {
        let (path, body) = (path.to_owned(), json!({"definition": "helper"}));
        async move {
            running
                .send_as(method, &path, Some(token), Some(body))
                .await
        }
    };
    use reqwest::Method;
    let (_, alices) = call(Method::POST, "/agents", "token-alice").await;
    let alices = alices["id"].as_str().unwrap().to_owned();
    let (_, acmes) = call(Method::POST, "/agents", "token-acme").await;
    let acmes = acmes["id"].as_str().unwrap().to_owned();
    let (_, globexs) = call(Method::POST, "/agents", "token-globex").await;
    let globexs = globexs["id"].as_str().unwrap().to_owned();

    let ids = |sessions: &Value| {
        let mut ids: Vec<String> = sessions
            .as_array()
            .unwrap()
            .iter()
            .map(|session| session["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    let mut acme_both = vec![alices.clone(), acmes.clone()];
    acme_both.sort();
    assert_eq!(
        ids(&call(Method::GET, "/sessions", "token-acme").await.1),
        acme_both
    );
    assert_eq!(
        ids(&call(Method::GET, "/sessions?user_id=alice", "token-acme")
            .await
            .1),
        std::slice::from_ref(&alices)
    );
    assert_eq!(
        ids(&call(Method::GET, "/sessions", "token-alice").await.1),
        std::slice::from_ref(&alices)
    );
    assert_eq!(
        ids(&call(Method::GET, "/sessions?user_id=bob", "token-alice")
            .await
            .1),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(&call(Method::GET, "/sessions", "token-globex").await.1),
        [globexs]
    );
    // Another tenant's session, or another user's, does not exist for the caller.
    for (token, id) in [("token-globex", &alices), ("token-alice", &acmes)] {
        for (method, path) in [
            (Method::GET, format!("/sessions/{id}")),
            (Method::GET, format!("/sessions/{id}/messages")),
            (Method::POST, format!("/sessions/{id}/resume")),
            (Method::POST, format!("/sessions/{id}/fork")),
            (Method::GET, format!("/sessions/{id}/branches")),
            (Method::DELETE, format!("/sessions/{id}")),
        ] {
            let (status, problem) = call(method, &path, token).await;
            assert_eq!(
                (status, &problem["type"]),
                (404, &json!("urn:tiller:problem:unknown-session")),
                "{token} {path}"
            );
        }
    }
    assert_eq!(
        ids(&call(Method::GET, "/sessions", "token-acme").await.1),
        acme_both
    );
    server.stop().await;
}

/// Each message's processing status, on the agent and on the stored
/// session's pages: a prompt is done once answered, streaming while its run
/// works, a response failed when it ended in an error or was aborted.
#[tokio::test]
async fn each_message_says_where_it_stands() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Fine."));
    faux.push(FauxTurn::text("").fail("the provider is down"));
    faux.push(FauxTurn::text("never finished").delay(Duration::from_secs(3_600)));
    let store = MemoryStore::new();
    let server = on_store(&faux, &store, ServerConfig::default()).await;
    let (status, _) = server
        .post("/agents", json!({"definition": "helper", "id": "s"}))
        .await;
    assert_eq!(status, 201);
    for text in ["one", "two"] {
        let (status, _) = server
            .post("/agents/s/prompt?wait=true", json!({"text": text}))
            .await;
        assert_eq!(status, 200);
    }
    let (_, page) = server.get("/sessions/s/messages").await;
    assert_eq!(page["statuses"], json!(["done", "done", "done", "failed"]));
    // A page that ends on a prompt reads on for its answer.
    let (_, page) = server.get("/sessions/s/messages?limit=1").await;
    assert_eq!(page["statuses"], json!(["done"]));

    let mut events = server.stream("/agents/s/events", &[]).await;
    let (status, _) = server
        .post("/agents/s/prompt", json!({"text": "three"}))
        .await;
    assert_eq!(status, 202);
    // The prompt is in the transcript, its response under way.
    while events.next().await.kind != "message_end" {}
    let (_, state) = server.get("/agents/s").await;
    assert_eq!(
        state["statuses"],
        json!(["done", "done", "done", "failed", "streaming"])
    );
    let (_, page) = server.get("/sessions/s/messages?from=4").await;
    assert_eq!(page["statuses"], json!(["streaming"]));
    let (status, _) = server.post("/agents/s/abort", json!({})).await;
    assert_eq!(status, 204);
    events.until_end().await;
    let (_, page) = server.get("/sessions/s/messages?from=4").await;
    assert_eq!(page["statuses"], json!(["done", "failed"]));
    server.stop().await;
}

/// A conversation's widgets are part of it: listed with their latest data,
/// `update_widget` refused for an id never shown, and the ids shown kept with
/// the session, so an update after a restart is taken.
#[tokio::test]
async fn a_conversations_widgets_are_listed_and_outlive_a_restart() {
    let faux = FauxProvider::new();
    let store = MemoryStore::new();
    let server = on_store(&faux, &store, ServerConfig::default()).await;
    let inline = json!({"type": "object", "description": "You show.", "json_schema_extra": {
        "kind": "agent", "name": "shower",
        "tools": [{"name": "display_widget"}, {"name": "update_widget"}]}});
    let (status, created) = server
        .post("/agents", json!({"inline": inline, "id": "w"}))
        .await;
    assert_eq!(status, 201, "{created}");
    // Two shown in one turn, and one of them changed in the same turn.
    faux.push(
        FauxTurn::tool_call(
            "display_widget",
            json!({"id": "build", "kind": "progress", "data": {"done": 1}}),
        )
        .with_tool_call(
            "display_widget",
            json!({"id": "tests", "kind": "table", "data": {"rows": []}}),
        )
        .with_tool_call(
            "update_widget",
            json!({"id": "tests", "data": {"rows": [1]}}),
        ),
    );
    faux.push(
        FauxTurn::tool_call("update_widget", json!({"id": "build", "data": {"done": 2}}))
            .with_tool_call("update_widget", json!({"id": "ghost", "data": {}})),
    );
    faux.push(FauxTurn::text("Shown."));
    let (status, outcome) = server
        .post(
            "/agents/w/prompt?wait=true",
            json!({"text": "Show progress"}),
        )
        .await;
    assert_eq!(status, 200, "{outcome}");
    let results: Vec<(&Value, &Value)> = outcome["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "tool_result")
        .map(|message| (&message["content"][0]["text"], &message["is_error"]))
        .collect();
    assert_eq!(
        results,
        [
            (&json!("Widget `build` shown."), &json!(false)),
            (&json!("Widget `tests` shown."), &json!(false)),
            (&json!("Widget `tests` updated."), &json!(false)),
            (&json!("Widget `build` updated."), &json!(false)),
            (
                &json!(
                    "no widget `ghost` was shown in this conversation: show it with display_widget first"
                ),
                &json!(true)
            ),
        ]
    );
    let build = |done: u64, updated_at: u64| {
        json!([
            {"id": "build", "kind": "progress", "data": {"done": done}, "shown_at": 2, "updated_at": updated_at},
            {"id": "tests", "kind": "table", "data": {"rows": [1]}, "shown_at": 3, "updated_at": 4}
        ])
    };
    let (status, widgets) = server.get("/sessions/w/widgets").await;
    assert_eq!((status, widgets), (200, build(2, 6)));
    server.stop().await;

    // Another process: the session resumed, its widget still known.
    let server = on_store(&faux, &store, ServerConfig::default()).await;
    let (status, _) = server
        .post("/sessions/w/resume", json!({"inline": inline}))
        .await;
    assert_eq!(status, 201);
    faux.push(FauxTurn::tool_call(
        "update_widget",
        json!({"id": "build", "data": {"done": 3}}),
    ));
    faux.push(FauxTurn::text("Done."));
    let (status, _) = server
        .post("/agents/w/prompt?wait=true", json!({"text": "Finish"}))
        .await;
    assert_eq!(status, 200);
    let (status, widgets) = server.get("/sessions/w/widgets").await;
    assert_eq!((status, widgets), (200, build(3, 11)));
    let (status, problem) = server.get("/sessions/nope/widgets").await;
    assert_eq!(
        (status, &problem["type"]),
        (404, &json!("urn:tiller:problem:unknown-session"))
    );
    server.stop().await;
}

/// An agent with memory keeps what it learns of its user, and the user (or
/// their tenant, naming them) reads and deletes it over HTTP; no one else can.
#[tokio::test]
async fn a_users_memory_is_read_and_deleted_by_them_alone() {
    use reqwest::Method;
    let faux = FauxProvider::new();
    let config = closed_for(&[
        ("token-alice", "acme", Some("alice")),
        ("token-bob", "acme", Some("bob")),
        ("token-acme", "acme", None),
        ("token-globex", "globex", None),
    ]);
    let untrusted = on_store(&faux, &MemoryStore::new(), config.clone()).await;
    let inline = json!({"inline": {"type": "object", "description": "You help.",
        "json_schema_extra": {"kind": "agent", "name": "keeper", "memory": {}}}});
    let (status, problem) = untrusted
        .send_as(Method::POST, "/agents", Some("token-alice"), Some(inline))
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (403, &json!("inline.json_schema_extra.memory")),
        "a client's own file cannot turn memory on"
    );
    untrusted.stop().await;
    let config = ServerConfig {
        trust_inline_definitions: true,
        ..config
    };
    let server = on_store(&faux, &MemoryStore::new(), config).await;
    let call = |method: Method, path: &str, token: &'static str, body: Option<Value>| {
        let path = path.to_owned();
        let server = &server;
        async move { server.send_as(method, &path, Some(token), body).await }
    };
    let inline = json!({"inline": {"type": "object", "description": "You help.",
        "json_schema_extra": {"kind": "agent", "name": "keeper", "memory": {}}}});
    let (status, created) = call(Method::POST, "/agents", "token-alice", Some(inline)).await;
    assert_eq!(status, 201, "{created}");
    let prompt = format!(
        "/agents/{}/prompt?wait=true",
        created["id"].as_str().unwrap()
    );
    faux.push(
        FauxTurn::tool_call("update_working_memory", json!({"document": "Name: Alice"}))
            .with_tool_call("remember", json!({"fact": "Alice likes green tea"})),
    );
    faux.push(FauxTurn::text("Noted."));
    let (status, outcome) = call(
        Method::POST,
        &prompt,
        "token-alice",
        Some(json!({"text": "I'm Alice and I like green tea."})),
    )
    .await;
    assert_eq!((status, &outcome["end"]), (200, &json!("completed")));

    let (status, memory) = call(Method::GET, "/memory", "token-alice", None).await;
    assert_eq!(status, 200, "{memory}");
    let fact = memory["memories"][0].clone();
    assert_eq!(
        (&memory["user_id"], &memory["working_memory"], &fact["text"]),
        (
            &json!("alice"),
            &json!("Name: Alice"),
            &json!("Alice likes green tea")
        )
    );
    assert_eq!(memory["memories"].as_array().unwrap().len(), 1);
    // The tenant names its user; another tenant finds nothing of hers.
    let (_, by_tenant) = call(Method::GET, "/memory?user_id=alice", "token-acme", None).await;
    assert_eq!(by_tenant, memory);
    let (_, elsewhere) = call(Method::GET, "/memory?user_id=alice", "token-globex", None).await;
    assert_eq!(
        elsewhere,
        json!({"user_id": "alice", "working_memory": null, "memories": []})
    );
    let (_, paged) = call(Method::GET, "/memory?offset=1&limit=1", "token-alice", None).await;
    assert_eq!(paged["memories"], json!([]));
    for (method, path, token, expected) in [
        (Method::GET, "/memory", "token-acme", (422, "invalid")),
        (
            Method::GET,
            "/memory?user_id=bob",
            "token-alice",
            (403, "forbidden"),
        ),
        (
            Method::GET,
            "/memory?limit=0",
            "token-alice",
            (422, "invalid"),
        ),
        (
            Method::GET,
            "/memory?colour=red",
            "token-alice",
            (422, "invalid"),
        ),
        (
            Method::DELETE,
            "/memory?user_id=bob",
            "token-alice",
            (403, "forbidden"),
        ),
    ] {
        let (status, problem) = call(method, path, token, None).await;
        assert_eq!(
            (status, problem["type"].as_str().unwrap()),
            (
                expected.0,
                format!("urn:tiller:problem:{}", expected.1).as_str()
            ),
            "{path}"
        );
    }
    // Bob cannot forget Alice's fact by its id; Alice can, once.
    let one = format!("/memory/{}", fact["id"].as_str().unwrap());
    let (status, problem) = call(Method::DELETE, &one, "token-bob", None).await;
    assert_eq!(
        (status, &problem["type"]),
        (404, &json!("urn:tiller:problem:unknown-memory"))
    );
    let (status, _) = call(Method::DELETE, &one, "token-alice", None).await;
    assert_eq!(status, 204);
    let (status, _) = call(Method::DELETE, &one, "token-alice", None).await;
    assert_eq!(status, 404);
    let (status, forgotten) = call(Method::DELETE, "/memory", "token-alice", None).await;
    assert_eq!((status, forgotten), (200, json!({"forgotten": 0})));
    let (_, memory) = call(Method::GET, "/memory", "token-alice", None).await;
    assert_eq!(
        memory,
        json!({"user_id": "alice", "working_memory": null, "memories": []})
    );
    server.stop().await;
}

#[tokio::test]
async fn a_session_branches_at_a_message_to_try_that_turn_again() {
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        FauxTurn::text(format!(
            "You said: {}",
            request.last_user_text().unwrap_or_default()
        ))
    });
    let store = MemoryStore::new();
    let server = on_store(&faux, &store, ServerConfig::default()).await;
    let (status, _) = server
        .post("/agents", json!({"definition": "helper", "id": "c1"}))
        .await;
    assert_eq!(status, 201);
    for text in ["Hi", "Tell me a joke"] {
        let (status, _) = server
            .post("/agents/c1/prompt?wait=true", json!({"text": text}))
            .await;
        assert_eq!(status, 200);
    }
    let texts = async |session: &str| -> Vec<String> {
        let (status, page) = server.get(&format!("/sessions/{session}/messages")).await;
        assert_eq!(status, 200, "{page}");
        page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|message| message["content"][0]["text"].as_str().unwrap().to_owned())
            .collect()
    };
    let asked = texts("c1").await;

    // The second turn again, edited: the branch's agent runs it at once.
    let (status, branch) = server
        .post(
            "/sessions/c1/fork",
            json!({"at": 2, "id": "c1-b", "prompt": "Tell me a riddle"}),
        )
        .await;
    assert_eq!(
        (status, &branch["branch"], &branch["agent"]["id"]),
        (201, &json!({"parent": "c1", "at": 2}), &json!("c1-b")),
        "{branch}"
    );
    server.events("c1-b", Some(0)).await.until_end().await;
    assert_eq!(
        texts("c1-b").await,
        [
            "Hi",
            "You said: Hi",
            "Tell me a riddle",
            "You said: Tell me a riddle"
        ]
    );
    assert_eq!(texts("c1").await, asked);
    let requests = faux.requests();
    assert_eq!(
        requests[2].context.messages[..2],
        requests[1].context.messages[..2]
    );
    let (status, branches) = server.get("/sessions/c1/branches").await;
    assert_eq!(
        (
            status,
            branches.as_array().unwrap().len(),
            &branches[0]["id"]
        ),
        (200, 1, &json!("c1-b"))
    );

    // Forks the session cannot give: typed problems, nothing made.
    for (body, wanted) in [
        (json!({"at": 5}), (422, "at")),
        (json!({"at": 1, "id": "c1-b"}), (409, "id")),
        (json!({"at": 1, "id": ""}), (422, "id")),
        (json!({"at": -1}), (422, "at")),
    ] {
        let (status, problem) = server.post("/sessions/c1/fork", body.clone()).await;
        assert_eq!(
            (status, problem["field"].as_str().unwrap_or_default()),
            wanted,
            "{body}: {problem}"
        );
    }
    let (status, _) = server.post("/sessions/nobody/fork", json!({"at": 0})).await;
    assert_eq!(status, 404);
    let (_, branches) = server.get("/sessions/c1/branches").await;
    assert_eq!(branches.as_array().unwrap().len(), 1);

    // The original deleted: the branch keeps what it began with.
    let (status, _) = server
        .send(reqwest::Method::DELETE, "/sessions/c1", None)
        .await;
    assert_eq!(status, 204);
    assert_eq!(texts("c1-b").await.len(), 4);
    server.stop().await;
}

#[tokio::test]
async fn a_shutdown_lets_runs_in_flight_finish_and_refuses_new_work_meanwhile() {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let waits = {
        let gate = gate.clone();
        tiller::FnTool::new("wait", "Waits", json!({"type": "object"}), move |_, _| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok(tiller::ToolOutput::text("waited"))
            }
        })
    };
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("wait", json!({})));
    faux.push(FauxTurn::text("Done."));
    let mut definitions = Definitions::new()
        .with_default_model(faux.model())
        .with_tools(tiller::agents::ToolRegistry::new().with(std::sync::Arc::new(waits)));
    definitions
        .insert(
            AgentFile::parse(
                "waiter.yaml",
                "type: object\ndescription: You wait.\njson_schema_extra: {kind: agent, name: waiter, tools: [{name: wait}]}\n",
            )
            .unwrap(),
        )
        .unwrap();
    let config = ServerConfig {
        finish_runs: Duration::from_secs(60),
        ..ServerConfig::default()
    };
    let server = Running::serve(definitions, config).await;
    let (status, _) = server
        .post("/agents", json!({"definition": "waiter", "id": "w1"}))
        .await;
    assert_eq!(status, 201);
    let mut events = server.events("w1", None).await;
    assert_eq!(
        server
            .post("/agents/w1/prompt", json!({"text": "Go"}))
            .await
            .0,
        202
    );
    while events.next().await.kind != "tool_execution_start" {}

    let (base, http) = (server.base.clone(), server.http.clone());
    let stopping = tokio::spawn(server.stop());
    // Once shutdown has begun, a prompt is refused for it, not for being busy.
    let refused = loop {
        let response = http
            .post(format!("{base}/agents/w1/prompt"))
            .header("content-type", "application/json")
            .body(r#"{"text": "More"}"#)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let problem: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
        if status != 409 {
            break (status, problem["type"].clone());
        }
    };
    assert_eq!(refused, (503, json!("urn:tiller:problem:shutting-down")));
    let response = http
        .post(format!("{base}/agents"))
        .header("content-type", "application/json")
        .body(r#"{"definition": "waiter"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    // The run itself may still be steered, and goes on to its end.
    let response = http
        .post(format!("{base}/agents/w1/steer"))
        .header("content-type", "application/json")
        .body(r#"{"text": "Take your time"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    gate.notify_one();
    let tail = events.until_end().await;
    assert_eq!(
        kinds(&tail),
        [
            "tool_execution_end",
            "message_start",
            "message_end",
            "turn_end",
            "turn_start",
            "message_start",
            "message_end",
            "message_start",
            "message_update",
            "message_update",
            "message_update",
            "message_end",
            "turn_end",
            "agent_end"
        ]
    );
    stopping.await.unwrap();
    let last = faux.requests().last().unwrap().context.messages.len();
    assert_eq!(
        last, 4,
        "the answer came after the tool result and the steering"
    );
}

#[tokio::test]
async fn mcp_hosts_list_and_call_the_definitions_over_streamable_http_with_a_token() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello over MCP."));
    let server = Running::start(&faux, closed(&[("token-acme", "acme")])).await;
    let endpoint = format!("{}/mcp", server.base);

    // Without the token: refused.
    let refused = tiller::mcp::McpClient::connect(
        tiller::mcp::McpServer::http("tiller", &endpoint)
            .with_connect_timeout(Duration::from_secs(10)),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(&refused, tiller::mcp::McpError::Connect { detail, .. } if detail.contains("401")),
        "{refused:?}"
    );

    let client = tiller::mcp::McpClient::connect(
        tiller::mcp::McpServer::http("tiller", &endpoint)
            .with_prefix("")
            .with_bearer_token("token-acme"),
    )
    .await
    .unwrap();
    let tools = client.tools();
    assert_eq!(
        tools.iter().map(|tool| tool.name()).collect::<Vec<_>>(),
        ["helper"]
    );
    let ctx =
        tiller::ToolContext::detached("call-1", tokio_util::sync::CancellationToken::new(), |_| {});
    let answer = tools[0]
        .execute(json!({"text": "Hi"}), ctx)
        .await
        .map_err(|error| error.message().to_owned())
        .unwrap();
    assert_eq!(answer.text_content(), "Hello over MCP.");
    assert_eq!(faux.requests().len(), 1);
    client.close();

    // A page elsewhere that rebinds its name to this loopback server is refused.
    let rebound = server
        .http
        .post(&endpoint)
        .bearer_auth("token-acme")
        .header("host", "evil.example")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 403);
    server.stop().await;
}

#[tokio::test]
async fn an_agent_is_compacted_over_http_and_its_session_keeps_every_message() {
    let faux = FauxProvider::new();
    // A 400-token window: the latest 100 tokens are kept.
    let definitions = Definitions::new().with_default_model(faux.model().with_context_window(400));
    let server = Running::serve(definitions, ServerConfig::default()).await;
    let (status, _) = server
        .post("/agents", json!({"definition": "helper", "id": "long"}))
        .await;
    assert_eq!(status, 201);
    for turn in 0..3 {
        faux.push(FauxTurn::text(vec![format!("answer{turn}"); 40].join(" ")));
        let (status, outcome) = server
            .post(
                "/agents/long/prompt?wait=true",
                json!({"text": format!("question {turn}")}),
            )
            .await;
        assert_eq!(
            (status, &outcome["end"]),
            (200, &json!("completed")),
            "{outcome}"
        );
    }

    // A body that is not one.
    let (status, problem) = server
        .post("/agents/long/compact", json!({"instruction": "x"}))
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("instruction")),
        "{problem}"
    );
    let (status, _) = server.post("/agents/ghost/compact", json!({})).await;
    assert_eq!(status, 404);

    faux.push(FauxTurn::text("They asked three questions."));
    let (status, outcome) = server
        .post(
            "/agents/long/compact?wait=true",
            json!({"instructions": "Keep the numbers."}),
        )
        .await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(outcome["end"], "completed");
    assert_eq!(outcome["messages"], json!([]));
    let report = &outcome["compactions"][0];
    assert_eq!(
        (&report["reason"], &report["summary_id"]),
        (&json!("manual"), &json!(6)),
        "{outcome}"
    );
    let asked = faux.requests().pop().unwrap().context;
    assert!(
        asked.system_prompt.as_deref().is_some_and(|prompt| prompt
            .starts_with("You write the memory of a long conversation")
            && prompt.ends_with("the user also asks: Keep the numbers.")),
        "{:?}",
        asked.system_prompt
    );

    let (_, state) = server.get("/agents/long").await;
    let messages = state["messages"].as_array().unwrap();
    assert_eq!(
        (&messages[0]["role"], &messages[0]["kind"]),
        (&json!("custom"), &json!("compaction"))
    );
    assert_eq!(
        messages[0]["payload"]["summary"],
        "They asked three questions."
    );
    let kept = messages.len() - 1;
    let session = state["session_id"].as_str().unwrap();
    let (status, page) = server.get(&format!("/sessions/{session}/messages")).await;
    assert_eq!(status, 200);
    assert_eq!(page["total"], json!(6 + 1 + kept), "{page}");
    assert_eq!(page["messages"][0]["content"][0]["text"], "question 0");
    assert_eq!(page["messages"][6]["kind"], "compaction");
    server.stop().await;
}

/// A snapshot update (a `message_update` with the message as it stands) as the
/// lean update it stands for, and the message.
fn unsnapshot(event: &Sse) -> (Sse, Value) {
    assert_eq!(event.kind, "message_update");
    let mut lean = event.clone();
    let message = lean.data["event"]
        .as_object_mut()
        .and_then(|event| event.remove("message"))
        .expect("a snapshot carries the message");
    (lean, message)
}
