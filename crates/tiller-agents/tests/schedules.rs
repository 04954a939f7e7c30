//! Agents started on a schedule: a definition's `every` and `cron` triggers
//! fire through its triggers as `schedule.NAME.N` events, each slot once
//! however many processes share the store (on a paused clock).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use pretty_assertions::assert_eq;
use tiller::agents::agent_file::AgentFile;
use tiller::agents::{Schedules, Triggers};
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::MemoryStore;
use tiller::{Definitions, Supervisor, SupervisorConfig};
use tokio::sync::mpsc;

const DIGEST: &str = r#"type: object
description: You write a digest.
json_schema_extra:
  kind: agent
  name: digest
  triggers:
    - {every: 1m, session: digest}
"#;

#[tokio::test(start_paused = true)]
async fn each_slot_fires_once_whatever_the_number_of_hosts() {
    let faux = FauxProvider::new();
    let (said, mut heard) = mpsc::unbounded_channel();
    faux.respond_with(move |request| {
        let _ = said.send(request.last_user_text().unwrap_or_default());
        FauxTurn::text("Digest written.")
    });
    let supervisor =
        Supervisor::with_store(SupervisorConfig::default(), Arc::new(MemoryStore::new()))
            .await
            .unwrap();
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("digest.yaml", DIGEST).unwrap())
        .unwrap();
    let file = definitions.get("digest", None).unwrap();
    assert_eq!(file.triggers[0].on, "schedule.digest.0");
    let _triggers = Triggers::attach(&supervisor, definitions.clone());
    // Two schedulers on one store, as two hosts of a cluster are.
    let first = Schedules::start(&supervisor, &definitions);
    let second = Schedules::start(&supervisor, &definitions);

    let mut slots = Vec::new();
    for _ in 0..3 {
        let prompt = heard.recv().await.unwrap();
        let (head, payload) = prompt.split_once("\n1. ").unwrap();
        assert_eq!(head, "Event `schedule.digest.0`:");
        let payload: serde_json::Value = serde_json::from_str(payload).unwrap();
        assert_eq!(payload["schedule"], "every 1m");
        slots.push(
            payload["slot"]
                .as_str()
                .unwrap()
                .parse::<jiff::Zoned>()
                .unwrap()
                .timestamp()
                .as_second(),
        );
    }
    drop((first, second));
    // Three slots a minute apart, on whole minutes, none twice.
    assert_eq!(slots[0] % 60, 0);
    assert_eq!(slots, [slots[0], slots[0] + 60, slots[0] + 120]);
    tokio::task::yield_now().await;
    assert!(heard.try_recv().is_err(), "no slot fired twice");
    supervisor.shutdown().await;
}
