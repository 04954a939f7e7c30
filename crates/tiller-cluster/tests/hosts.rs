//! Hosts of one cluster in one process, each with its own supervisor, on a real
//! three-node NATS cluster and a real PostgreSQL: requests through any host,
//! events from any host, an agent no host holds brought up on demand, a busy
//! agent taken over when its host goes, a drain between two turns, and a host
//! that lost its heartbeat fencing itself. (The chaos tests run the real binary
//! in processes of its own, with real kills: `tiller-cli`'s `cluster` tests.)

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::SessionRecord;
use tiller::{
    AgentMessage, AgentSettings, AgentSpec, AgentTool, FnTool, Op, Prompt, Supervisor, ToolOutput,
    ToolSet,
};
use tiller_cluster::{
    Activator, Cluster, ClusterConfig, EventSubject, Followed, Following, NatsSecurity,
};
use tiller_test_support::nats::NatsCluster;
use tiller_test_support::postgres::postgres_url;

/// Brings agents up on the test's faux model with its tools.
struct Faux {
    faux: FauxProvider,
    tools: Vec<Arc<dyn AgentTool>>,
}

impl Faux {
    fn settings(&self) -> AgentSettings {
        AgentSettings::new(self.faux.model()).with_tools(ToolSet::new(self.tools.clone()).unwrap())
    }
}

impl Activator for Faux {
    fn spec(&self, _session: &SessionRecord) -> Result<AgentSpec, String> {
        Ok(AgentSpec::new(self.settings()))
    }
}

/// A test's cluster: NATS, the store's URL, and the way agents are made.
struct Setup {
    nats: NatsCluster,
    store: String,
    faux: Arc<Faux>,
}

impl Setup {
    fn new(tools: Vec<Arc<dyn AgentTool>>) -> Option<Setup> {
        let store = postgres_url()?;
        let nats = NatsCluster::start(3)?;
        Some(Setup {
            nats,
            store,
            faux: Arc::new(Faux {
                faux: FauxProvider::new(),
                tools,
            }),
        })
    }

    async fn host(&self, id: &str) -> Cluster {
        let store = tiller::store::open(&self.store).await.unwrap();
        let supervisor = Supervisor::with_store(Default::default(), store)
            .await
            .unwrap();
        let user = self.nats.user("tiller");
        let mut config = ClusterConfig::new(user.urls.into_iter().map(Into::into).collect(), id);
        config.security = NatsSecurity::mutual_tls(user.ca, user.cert, user.key);
        Cluster::join(config, supervisor, self.faux.clone())
            .await
            .unwrap()
    }

    async fn agent(&self, on: &Cluster) -> (String, EventSubject) {
        let handle = on
            .spawn(AgentSpec::new(self.faux.settings()))
            .await
            .unwrap();
        let id = handle.id().to_string();
        let subject = EventSubject {
            agent: id.clone(),
            tenant: None,
            user: None,
        };
        (id, subject)
    }
}

fn prompt(text: &str) -> Op {
    Op::from(Prompt::from(text))
}

/// The event types `following` reads up to and with the first `until`, with
/// their numbers; fails after forty seconds, naming what it read.
async fn read_until(following: &mut Following, until: &str) -> Vec<(u64, String)> {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(40), async {
        while let Some(item) = following.next().await {
            let kind = item.event_type().to_owned();
            let seq = match &item {
                Followed::Event { seq, .. } | Followed::Lagged { seq, .. } => *seq,
            };
            seen.push((seq, kind.clone()));
            if kind == until {
                return true;
            }
        }
        false
    })
    .await;
    match read {
        Ok(true) => seen,
        Ok(false) => panic!("the events ended before `{until}`: {seen:?}"),
        Err(_) => panic!("`{until}` never came; read {seen:?}"),
    }
}

fn kinds(events: &[(u64, String)]) -> Vec<&str> {
    events.iter().map(|(_, kind)| kind.as_str()).collect()
}

/// Numbers rise by one from event to event, but where a new owner begins (its
/// `owner_changed` numbered past what the previous one may have published live).
fn consecutive(events: &[(u64, String)]) {
    for pair in events.windows(2) {
        if pair[1].1 == "owner_changed" {
            assert!(pair[1].0 > pair[0].0, "{events:?}");
        } else {
            assert_eq!(pair[1].0, pair[0].0 + 1, "{events:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_any_host_reaches_the_owner_and_its_events_every_host() {
    let Some(setup) = Setup::new(Vec::new()) else {
        return;
    };
    let a = setup.host("a").await;
    let b = setup.host("b").await;
    let (id, subject) = setup.agent(&a).await;
    assert_eq!(b.owner_of(&id).as_deref(), Some("a"));

    setup.faux.faux.push(FauxTurn::text("Hello there."));
    let mut following = b.follow(&subject, None).await.unwrap();
    b.submit(&id, prompt("hi"), "k1").await.unwrap();
    let events = read_until(&mut following, "agent_end").await;
    assert_eq!(
        kinds(&events),
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
    consecutive(&events);
    assert_eq!(events[0].0, 0);

    // The same key again: acknowledged, not run again.
    b.submit(&id, prompt("hi"), "k1").await.unwrap();
    let (state, holder) = b.state(&id).await.unwrap();
    assert_eq!(Some(holder.host), b.owner_of(&id));
    assert!(holder.epoch > 0);
    assert_eq!(state.messages.len(), 2);
    assert_eq!(
        state.messages[1].as_assistant().unwrap().text(),
        "Hello there."
    );
    assert!(b.metrics().forwarded_requests >= 2);
    assert_eq!(a.metrics().leases_held, 1);

    // A client coming back after event 5 reads on from there, on either host.
    let mut resumed = a.follow(&subject, Some(5)).await.unwrap();
    let again = read_until(&mut resumed, "agent_end").await;
    assert_eq!(again.first().map(|(seq, _)| *seq), Some(6));
    assert_eq!(again.len(), events.len() - 6);

    // A waiting run, through the other host.
    setup.faux.faux.push(FauxTurn::text("Twice."));
    let outcome = b.run(&subject, prompt("again"), "k2").await.unwrap();
    assert_eq!(outcome.text(), "Twice.");

    assert!(b.stop(&id).await.unwrap());
    assert_eq!(
        a.supervisor()
            .store()
            .load(&id)
            .await
            .unwrap()
            .unwrap()
            .record
            .status,
        tiller::store::SessionStatus::Closed
    );
    a.leave().await;
    b.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_no_host_holds_comes_back_on_its_next_request() {
    let Some(setup) = Setup::new(Vec::new()) else {
        return;
    };
    let a = setup.host("a").await;
    let b = setup.host("b").await;
    let (id, _) = setup.agent(&a).await;
    let store = a.supervisor().store().clone();
    let before = store.load(&id).await.unwrap().unwrap().record.epoch;
    // Host a goes (idle agents are not taken over at once).
    a.leave().await;
    setup.faux.faux.push(FauxTurn::text("Back."));
    b.submit(&id, prompt("are you there?"), "k1").await.unwrap();
    let after = store.load(&id).await.unwrap().unwrap().record.epoch;
    assert!(after > before, "{before} → {after}");
    assert_eq!(b.owner_of(&id).as_deref(), Some("b"));
    assert!(b.local(&id).is_some());
    b.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_agent_is_taken_over_when_its_host_goes_and_its_turn_run_again() {
    let Some(setup) = Setup::new(Vec::new()) else {
        return;
    };
    let a = setup.host("a").await;
    let b = setup.host("b").await;
    let (id, subject) = setup.agent(&a).await;
    let mut following = b.follow(&subject, None).await.unwrap();
    setup
        .faux
        .faux
        .push(FauxTurn::text("Never finished.").delay(Duration::from_secs(3_600)));
    setup.faux.faux.push(FauxTurn::text("Finished on b."));
    a.submit(&id, prompt("work"), "k1").await.unwrap();
    let started = read_until(&mut following, "message_end").await;
    assert_eq!(
        kinds(&started),
        ["agent_start", "turn_start", "message_start", "message_end"]
    );
    a.leave().await;
    let events = read_until(&mut following, "agent_end").await;
    let kinds = kinds(&events);
    let changed = kinds
        .iter()
        .position(|kind| *kind == "owner_changed")
        .unwrap_or_else(|| {
            panic!(
                "no owner_changed: {events:?}; b holds {:?}; faux asked {} times",
                b.local(&id).is_some(),
                setup.faux.faux.requests().len()
            )
        });
    assert_eq!(
        kinds[changed..changed + 3],
        ["owner_changed", "turn_restarted", "agent_start"]
    );
    assert!(!kinds[..changed].contains(&"agent_end"));
    consecutive(&[started.clone(), events.clone()].concat());
    let (state, _) = b.state(&id).await.unwrap();
    let texts: Vec<String> = state
        .messages
        .iter()
        .map(|message| match message.as_assistant() {
            Some(answer) => answer.text(),
            None => message.role().to_owned(),
        })
        .collect();
    assert_eq!(texts, ["user", "Finished on b."]);
    assert_eq!(b.metrics().failovers, 1);
    b.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_a_run_between_two_turns_and_it_goes_on_elsewhere() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let gated = {
        let gate = gate.clone();
        Arc::new(FnTool::new(
            "gate",
            "Waits for the test",
            json!({"type": "object"}),
            move |_, _| {
                let gate = gate.clone();
                async move {
                    gate.acquire().await.unwrap().forget();
                    Ok(ToolOutput::text("opened"))
                }
            },
        )) as Arc<dyn AgentTool>
    };
    let Some(setup) = Setup::new(vec![gated]) else {
        return;
    };
    let a = setup.host("a").await;
    let b = setup.host("b").await;
    let (id, subject) = setup.agent(&a).await;
    setup.faux.faux.push(FauxTurn::tool_call("gate", json!({})));
    setup.faux.faux.push(FauxTurn::text("Done on b."));
    let mut following = b.follow(&subject, None).await.unwrap();
    a.submit(&id, prompt("go"), "k1").await.unwrap();
    read_until(&mut following, "tool_execution_start").await;
    let (drained, ()) = tokio::join!(a.drain(), async {
        // The drain asks the run to pause before the tool finishes.
        tokio::task::yield_now().await;
        gate.add_permits(1);
    });
    assert_eq!(drained.moved, std::slice::from_ref(&id));
    assert!(drained.failed.is_empty(), "{:?}", drained.failed);
    let events = read_until(&mut following, "agent_end").await;
    let paused = kinds(&events);
    assert_eq!(
        paused[paused.len() - 1],
        "agent_end",
        "the run paused on a: {paused:?}"
    );
    let rest = read_until(&mut following, "agent_end").await;
    assert_eq!(kinds(&rest)[..2], ["owner_changed", "agent_start"]);
    assert!(!kinds(&rest).contains(&"turn_restarted"));
    let (state, holder) = b.state(&id).await.unwrap();
    assert_eq!(holder.host, "b");
    let roles: Vec<&str> = state.messages.iter().map(AgentMessage::role).collect();
    assert_eq!(roles, ["user", "assistant", "tool_result", "assistant"]);
    assert_eq!(b.owner_of(&id).as_deref(), Some("b"));
    a.leave().await;
    b.leave().await;
}

/// A host proves itself with an NKey seed file (`--nats-nkey`), on a node that
/// knows only that key's public half: it joins and serves; a host with another
/// seed, and one with none, are refused by the server; a file holding no seed
/// is refused before connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_proves_itself_with_an_nkey_seed_file() {
    let Some(store) = postgres_url() else {
        return;
    };
    let user = nkeys::KeyPair::new_user();
    let settings = format!(
        "authorization {{\n  users: [{{nkey: \"{}\"}}]\n}}",
        user.public_key()
    );
    let Some(node) = tiller_test_support::nats::NatsNode::start(&settings) else {
        return;
    };
    let scratch = std::env::temp_dir().join(format!("tiller-nkey-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let seed_file = |name: &str, text: String| {
        let path = scratch.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ours = seed_file(
        "ours.nk",
        format!("# this host\n{}\n", user.seed().unwrap()),
    );
    let theirs = seed_file("theirs.nk", nkeys::KeyPair::new_user().seed().unwrap());
    let nothing = seed_file("nothing.nk", "no seed here".to_owned());
    let faux = Arc::new(Faux {
        faux: FauxProvider::new(),
        tools: Vec::new(),
    });
    let join = |id: &str, nkey: Option<std::path::PathBuf>| {
        let (store, faux, url) = (store.clone(), faux.clone(), node.url.clone());
        let id = id.to_owned();
        async move {
            let supervisor = Supervisor::with_store(
                Default::default(),
                tiller::store::open(&store).await.unwrap(),
            )
            .await
            .unwrap();
            let mut config = ClusterConfig::new(vec![url.into()], id);
            config.replicas = 1;
            config.security.nkey_file = nkey;
            Cluster::join(config, supervisor, faux).await
        }
    };
    let host = join("nkey-host", Some(ours)).await.unwrap();
    faux.faux.push(FauxTurn::text("Signed in."));
    let agent = host.spawn(AgentSpec::new(faux.settings())).await.unwrap();
    host.submit(agent.id().as_str(), prompt("hi"), "k1")
        .await
        .unwrap();
    agent.wait_for_idle().await;
    for (id, nkey) in [("stranger", Some(theirs)), ("anonymous", None)] {
        let refused = join(id, nkey).await.unwrap_err();
        assert!(
            matches!(&refused, tiller_cluster::ClusterError::Nats(reason) if reason.contains("refused this host's credentials")),
            "{refused}"
        );
    }
    let unread = join("unread", Some(nothing)).await.unwrap_err();
    assert!(
        matches!(&unread, tiller_cluster::ClusterError::Config(reason) if reason.contains("no NKey user seed")),
        "{unread}"
    );
    host.leave().await;
    let _ = std::fs::remove_dir_all(&scratch);
}
