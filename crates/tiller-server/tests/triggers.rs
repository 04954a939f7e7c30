//! `POST /triggers/{topic}`: an event of the caller's tenant starts the agents
//! whose triggers match it, each the tenant's own; a payload past the limit is
//! 413, a bad topic 422.

#![allow(clippy::unwrap_used)]

mod support;

use pretty_assertions::assert_eq;
use reqwest::Method;
use serde_json::json;
use support::{Running, closed};
use tiller::Definitions;
use tiller::agent_file::AgentFile;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller_server::MAX_EVENT_BYTES;

const SUPPORT: &str = r#"type: object
description: You triage tickets.
json_schema_extra:
  kind: agent
  name: support
  triggers:
    - {on: ticket.opened, match: {priority: high}, session: "ticket-{id}"}
"#;

#[tokio::test]
async fn an_event_starts_the_tenants_own_agent_of_its_session() {
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        FauxTurn::text(format!(
            "Triaged: {}",
            request.last_user_text().unwrap_or_default()
        ))
    });
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("support.yaml", SUPPORT).unwrap())
        .unwrap();
    let server = Running::serve(
        definitions,
        closed(&[("token-acme", "acme"), ("token-globex", "globex")]),
    )
    .await;

    for token in ["token-acme", "token-globex"] {
        let mut everything = server
            .stream("/events", &[("authorization", &format!("Bearer {token}"))])
            .await;
        let (status, matched) = server
            .send_as(
                Method::POST,
                "/triggers/ticket.opened",
                Some(token),
                Some(json!({"id": 9, "priority": "high"})),
            )
            .await;
        assert_eq!((status, matched), (202, json!({"matched": 1})));
        let run = everything.until_end().await;
        let ended = &run.last().unwrap().data;
        assert_eq!(
            ended["event"]["messages"][1]["content"][0]["text"],
            "Triaged: Event `ticket.opened`:\n1. {\"id\":9,\"priority\":\"high\"}"
        );
    }
    // Each tenant sees its own agent of ticket 9, and only it.
    for (token, tenant) in [("token-acme", "acme"), ("token-globex", "globex")] {
        let (_, listed) = server
            .send_as(Method::GET, "/agents", Some(token), None)
            .await;
        let ids: Vec<&str> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|agent| agent["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [format!("{tenant}:support:ticket-9")]);
    }

    // A low-priority ticket matches nothing; a payload past the limit is 413; a
    // topic with a control character is 422; no token is 401.
    let (status, matched) = server
        .send_as(
            Method::POST,
            "/triggers/ticket.opened",
            Some("token-acme"),
            Some(json!({"id": 10, "priority": "low"})),
        )
        .await;
    assert_eq!((status, matched), (202, json!({"matched": 0})));
    let big = json!({"id": 1, "text": "x".repeat(MAX_EVENT_BYTES)});
    let (status, problem) = server
        .send_as(
            Method::POST,
            "/triggers/ticket.opened",
            Some("token-acme"),
            Some(big),
        )
        .await;
    assert_eq!(
        (status, &problem["type"]),
        (413, &json!("urn:tiller:problem:body"))
    );
    let (status, problem) = server
        .send_as(
            Method::POST,
            "/triggers/bad%01topic",
            Some("token-acme"),
            Some(json!({})),
        )
        .await;
    assert_eq!((status, &problem["field"]), (422, &json!("topic")));
    let (status, _) = server
        .send_as(
            Method::POST,
            "/triggers/ticket.opened",
            None,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 401);
    server.stop().await;
}
