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
use tiller::agents::agent_file::AgentFile;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller_server::{MAX_EVENT_BYTES, Quotas};

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

const WATCHER: &str = r#"type: object
description: You watch orders.
json_schema_extra:
  kind: agent
  name: watcher
  triggers:
    - {on: order.paid, debounce_ms: 5, session: "order-{id}"}
    - {on: order.held, debounce_ms: 3600000, session: "order-{id}"}
"#;

/// A server of the `watcher` agent whose tenant `acme` may hold 20 live agents
/// (its user `ann` too) and `globex` 3 trigger windows holding 200 bytes.
async fn watching(faux: &FauxProvider) -> Running {
    faux.respond_with(|_| FauxTurn::text("Noted."));
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("watcher.yaml", WATCHER).unwrap())
        .unwrap();
    let mut config = support::closed_for(&[
        ("token-acme", "acme", None),
        ("token-ann", "acme", Some("ann")),
        ("token-globex", "globex", None),
    ]);
    let quotas = |quotas: Quotas| (quotas, Quotas::default());
    let (acme, users) = quotas(Quotas {
        agents: Some(20),
        ..Quotas::default()
    });
    config.tokens = config.tokens.with_quotas("acme", acme, users);
    let (globex, users) = quotas(Quotas {
        trigger_windows: Some(3),
        trigger_bytes: Some(200),
        ..Quotas::default()
    });
    config.tokens = config.tokens.with_quotas("globex", globex, users);
    Running::serve(definitions, config).await
}

/// A flood of distinct keys: 3,000 events of `acme`, each a session of its
/// own. The first 20 are taken (202) and each reaches its session; every
/// other is 429 `quota-exceeded` (`quotas.agents`); never more than 20 live
/// agents. Printed: what was acknowledged, refused and stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_keys_stays_within_the_tenants_quota_of_agents() {
    let faux = FauxProvider::new();
    let server = watching(&faux).await;
    let (mut acknowledged, mut refused) = (Vec::new(), 0);
    for id in 0..3_000 {
        let (status, body) = server
            .send_as(
                Method::POST,
                "/triggers/order.paid",
                Some("token-acme"),
                Some(json!({"id": id})),
            )
            .await;
        match status {
            202 => acknowledged.push(id),
            429 => {
                assert_eq!(
                    (&body["type"], &body["field"]),
                    (
                        &json!("urn:tiller:problem:quota-exceeded"),
                        &json!("quotas.agents")
                    ),
                    "{body}"
                );
                refused += 1;
            }
            _ => panic!("{status} {body}"),
        }
    }
    assert_eq!(acknowledged.len(), 20);
    // Each acknowledged event reaches its session once its window closes (a
    // client reads the session until it has it, as a client would).
    let mut stored = 0;
    for id in &acknowledged {
        let path = format!("/sessions/acme:watcher:order-{id}/messages");
        let read = async {
            loop {
                let (status, page) = server
                    .send_as(Method::GET, &path, Some("token-acme"), None)
                    .await;
                match page["messages"][0]["content"][0]["text"].as_str() {
                    Some(text) if status == 200 => return text.to_owned(),
                    _ => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
                }
            }
        };
        let prompt = tokio::time::timeout(std::time::Duration::from_secs(30), read)
            .await
            .expect("an acknowledged event reaches its session");
        assert_eq!(prompt, format!("Event `order.paid`:\n1. {{\"id\":{id}}}"));
        stored += 1;
    }
    let (_, listed) = server
        .send_as(Method::GET, "/agents", Some("token-acme"), None)
        .await;
    let live = listed.as_array().unwrap().len();
    assert_eq!(live, 20);
    eprintln!(
        "trigger flood: 3000 events posted, {} acknowledged, {refused} refused (429 quotas.agents), {stored} stored in their sessions, {live} live agents of a quota of 20",
        acknowledged.len()
    );
    server.stop().await;
}

/// Windows and their bytes have quotas of their own; a key that cannot name a
/// session is 422, never taken and dropped; a user's event starts a session
/// of the user's own, which the user sees.
#[tokio::test]
async fn trigger_windows_bytes_and_keys_are_checked_before_an_event_is_taken() {
    let faux = FauxProvider::new();
    let server = watching(&faux).await;
    let post = |token: &'static str, topic: &'static str, payload: serde_json::Value| {
        let server = &server;
        async move {
            server
                .send_as(
                    Method::POST,
                    &format!("/triggers/{topic}"),
                    Some(token),
                    Some(payload),
                )
                .await
        }
    };
    // Three windows stay open an hour: the fourth is refused.
    for id in 0..3 {
        let (status, _) = post("token-globex", "order.held", json!({"id": id})).await;
        assert_eq!(status, 202);
    }
    let (status, problem) = post("token-globex", "order.held", json!({"id": 3})).await;
    assert_eq!(
        (status, &problem["field"]),
        (429, &json!("quotas.trigger_windows")),
        "{problem}"
    );
    // An open window's session takes more, until its bytes are spent.
    let (status, problem) = post(
        "token-globex",
        "order.held",
        json!({"id": 0, "note": "x".repeat(200)}),
    )
    .await;
    assert_eq!(
        (status, &problem["field"]),
        (429, &json!("quotas.trigger_bytes")),
        "{problem}"
    );
    // Keys that cannot name a session.
    for id in [json!("a\u{1}b"), json!("k".repeat(1_100))] {
        let (status, problem) = post("token-acme", "order.paid", json!({"id": id})).await;
        assert_eq!(
            (status, &problem["field"]),
            (422, &json!("payload")),
            "{problem}"
        );
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("cannot name a session"),
            "{problem}"
        );
    }
    // Ann's event: Ann's session, which Ann sees once its window closes.
    let (status, _) = post("token-ann", "order.paid", json!({"id": 7})).await;
    assert_eq!(status, 202);
    let listed = async {
        loop {
            let (_, listed) = server
                .send_as(Method::GET, "/agents", Some("token-ann"), None)
                .await;
            if listed.as_array().is_some_and(|agents| !agents.is_empty()) {
                return listed;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    let listed = tokio::time::timeout(std::time::Duration::from_secs(30), listed)
        .await
        .expect("Ann's event starts Ann's agent");
    assert_eq!(listed[0]["id"], "acme:ann:watcher:order-7");
    // The tenant's own token sees it too.
    let (_, listed) = server
        .send_as(Method::GET, "/agents", Some("token-acme"), None)
        .await;
    assert_eq!(listed[0]["id"], "acme:ann:watcher:order-7");
    server.stop().await;
}

/// A served definition's schedule fires on its own: its agent of the default
/// tenant answers the `schedule.NAME.N` event, its slot on the second.
#[tokio::test]
async fn a_served_schedule_starts_its_agent_on_its_own() {
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        FauxTurn::text(format!(
            "Ticked: {}",
            request.last_user_text().unwrap_or_default()
        ))
    });
    let ticker = "type: object\ndescription: You tick.\njson_schema_extra:\n  kind: agent\n  name: ticker\n  triggers: [{every: 1s, session: clock}]\n";
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("ticker.yaml", ticker).unwrap())
        .unwrap();
    let server = Running::serve(definitions, tiller_server::ServerConfig::default()).await;
    let mut everything = server.stream("/events", &[]).await;
    let run = everything.until_end().await;
    let ended = &run.last().unwrap();
    assert_eq!(ended.data["agent_id"], "default:ticker:clock");
    let text = ended.data["event"]["messages"][1]["content"][0]["text"]
        .as_str()
        .unwrap();
    let (head, payload) = text.split_once("\n1. ").unwrap();
    assert_eq!(head, "Ticked: Event `schedule.ticker.0`:");
    let payload: serde_json::Value = serde_json::from_str(payload).unwrap();
    assert_eq!(payload["schedule"], "every 1s");
    let slot = payload["slot"].as_str().unwrap();
    assert!(
        slot.ends_with("+00:00[UTC]") && !slot.contains('.'),
        "a whole second in UTC: {payload}"
    );
}
