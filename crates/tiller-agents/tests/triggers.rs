//! Agents started by events: a definition's triggers match published events by
//! topic and fields, gather each session's events for the debounce window into
//! one prompt (on a paused clock), keep one session per key and per tenant, and
//! thaw a hibernated agent.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::agents::agent_file::AgentFile;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::MemoryStore;
use tiller::{
    Definitions, Supervisor, SupervisorConfig,
    agents::Triggers,
    runtime::{AgentStatus, Event, EventError},
};
use tokio::sync::mpsc;

const SUPPORT: &str = r#"type: object
description: You triage tickets.
json_schema_extra:
  kind: agent
  name: support
  triggers:
    - on: ticket.opened
      match: {priority: high}
      debounce_ms: 2000
      session: "ticket-{ticket.id}"
"#;

/// A faux model that tells the test each prompt it is asked, and answers it.
fn listening() -> (FauxProvider, mpsc::UnboundedReceiver<String>) {
    let faux = FauxProvider::new();
    let (said, heard) = mpsc::unbounded_channel();
    faux.respond_with(move |request| {
        let _ = said.send(request.last_user_text().unwrap_or_default());
        FauxTurn::text("On it.")
    });
    (faux, heard)
}

async fn attached(config: SupervisorConfig, faux: &FauxProvider) -> (Supervisor, Triggers) {
    let supervisor = Supervisor::with_store(config, Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("support.yaml", SUPPORT).unwrap())
        .unwrap();
    let triggers = Triggers::attach(&supervisor, definitions);
    (supervisor, triggers)
}

fn opened(id: u32, priority: &str) -> Event {
    Event::new(
        "ticket.opened",
        json!({"ticket": {"id": id}, "priority": priority}),
    )
}

#[tokio::test(start_paused = true)]
async fn events_in_a_window_become_one_prompt_per_session() {
    let (faux, mut heard) = listening();
    let (supervisor, _triggers) = attached(SupervisorConfig::default(), &faux).await;

    // Matching is by topic and fields: a low-priority ticket and another topic
    // start nothing.
    assert_eq!(supervisor.publish(opened(1, "high")), Ok(1));
    assert_eq!(supervisor.publish(opened(1, "low")), Ok(0));
    assert_eq!(
        supervisor.publish(Event::new(
            "ticket.closed",
            json!({"ticket": {"id": 1}, "priority": "high"})
        )),
        Ok(0)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(supervisor.publish(opened(2, "high")), Ok(1));
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(supervisor.publish(opened(1, "high")), Ok(1));

    // 1.5 s in: every window is still open, no agent asked.
    assert!(heard.try_recv().is_err());
    assert!(supervisor.list().is_empty());

    // Ticket 1's window closes at 2 s with both its events; ticket 2's at 2.5 s.
    let first = heard.recv().await.unwrap();
    assert_eq!(
        first,
        "2 events `ticket.opened`:\n1. {\"priority\":\"high\",\"ticket\":{\"id\":1}}\n2. {\"priority\":\"high\",\"ticket\":{\"id\":1}}"
    );
    let second = heard.recv().await.unwrap();
    assert_eq!(
        second,
        "Event `ticket.opened`:\n1. {\"priority\":\"high\",\"ticket\":{\"id\":2}}"
    );
    let mut ids: Vec<String> = supervisor
        .list()
        .into_iter()
        .map(|info| info.id.to_string())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["default:support:ticket-1", "default:support:ticket-2"]
    );

    // A bad topic is refused.
    assert!(matches!(
        supervisor.publish(Event::new("", json!({}))),
        Err(EventError::Topic(_))
    ));
    supervisor.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_key_keeps_its_session_and_a_sleeping_agent_thaws() {
    let (faux, mut heard) = listening();
    let config = SupervisorConfig {
        hibernate_after: Some(Duration::from_secs(60)),
        ..SupervisorConfig::default()
    };
    let (supervisor, _triggers) = attached(config, &faux).await;
    supervisor.publish(opened(7, "high")).unwrap();
    heard.recv().await.unwrap();
    let agent = supervisor.get("default:support:ticket-7").unwrap();
    agent.wait_for_idle().await;
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(agent.status(), AgentStatus::Hibernated);

    supervisor.publish(opened(7, "high")).unwrap();
    heard.recv().await.unwrap();
    agent.wait_for_idle().await;
    let state = agent.state().await.unwrap();
    let prompts: Vec<String> = state
        .messages
        .iter()
        .filter_map(|message| message.as_user().map(|user| user.text_content()))
        .collect();
    assert_eq!(prompts.len(), 2, "both events reached one session");
    assert_eq!(supervisor.list().len(), 1);
    supervisor.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn each_tenant_has_its_own_session_of_a_key() {
    let (faux, mut heard) = listening();
    let (supervisor, _triggers) = attached(SupervisorConfig::default(), &faux).await;
    for tenant in ["acme", "globex"] {
        assert_eq!(
            supervisor.publish(opened(1, "high").for_tenant(tenant)),
            Ok(1)
        );
    }
    heard.recv().await.unwrap();
    heard.recv().await.unwrap();
    for tenant in ["acme", "globex"] {
        let agent = supervisor
            .get(&format!("{tenant}:support:ticket-1"))
            .unwrap();
        agent.wait_for_idle().await;
        let state = agent.state().await.unwrap();
        assert_eq!(state.context.tenant_id.as_deref(), Some(tenant));
        assert_eq!(state.messages.len(), 2, "{tenant}: one prompt, one answer");
    }
    supervisor.shutdown().await;
}

/// A window holds `MAX_BATCH` events: the next one starts a window of its own,
/// which closes on its own time.
#[tokio::test(start_paused = true)]
async fn a_full_window_goes_at_once_and_the_next_event_opens_another() {
    let (faux, mut heard) = listening();
    let (supervisor, _triggers) = attached(SupervisorConfig::default(), &faux).await;
    for _ in 0..tiller::agents::trigger::MAX_BATCH {
        supervisor.publish(opened(3, "high")).unwrap();
    }
    let full = heard.recv().await.unwrap();
    assert!(full.starts_with("100 events `ticket.opened`:"), "{full}");
    // A second later, the full window's timer would have a second to go.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let at = tokio::time::Instant::now();
    supervisor.publish(opened(3, "high")).unwrap();
    let next = heard.recv().await.unwrap();
    assert!(next.starts_with("Event `ticket.opened`:"), "{next}");
    assert_eq!(at.elapsed(), Duration::from_millis(2_000));
    supervisor.shutdown().await;
}

/// Keys with the characters kept for sub-agents' sessions are escaped, and an
/// event matching two triggers of one session reaches it once.
#[tokio::test(start_paused = true)]
async fn a_key_is_escaped_and_a_session_gets_an_event_once() {
    let faux = FauxProvider::new();
    let (said, mut heard) = mpsc::unbounded_channel();
    faux.respond_with(move |request| {
        let _ = said.send(request.last_user_text().unwrap_or_default());
        FauxTurn::text("On it.")
    });
    let supervisor = Supervisor::start().await.unwrap();
    let mut definitions = Definitions::new().with_default_model(faux.model());
    let twice = r#"type: object
description: You triage.
json_schema_extra:
  kind: agent
  name: triage
  triggers:
    - {on: ticket.opened, session: "{ticket.id}"}
    - {on: ticket.opened, match: {priority: high}, session: "{ticket.id}"}
"#;
    definitions
        .insert(AgentFile::parse("triage.yaml", twice).unwrap())
        .unwrap();
    let _triggers = Triggers::attach(&supervisor, definitions);
    let event = Event::new(
        "ticket.opened",
        json!({"ticket": {"id": "a/b#c@d"}, "priority": "high"}),
    );
    assert_eq!(supervisor.publish(event), Ok(2));
    assert_eq!(
        heard.recv().await.unwrap(),
        "Event `ticket.opened`:\n1. {\"priority\":\"high\",\"ticket\":{\"id\":\"a/b#c@d\"}}"
    );
    assert!(supervisor.get("default:triage:a%2Fb%23c%40d").is_some());
    supervisor.shutdown().await;
}
