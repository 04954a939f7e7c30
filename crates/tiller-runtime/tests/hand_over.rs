//! What a host that moves agents between processes (a cluster) asks of the
//! runtime: ops acknowledged once durable and applied once per idempotency key,
//! also in the next process; a session held at a given epoch with event numbers
//! going on; an agent evicted without another write; a run handed over between
//! two turns.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{assert_valid, echo, is_agent_end, roles, tools, until};
use futures::future::BoxFuture;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::{
    Change, MemoryStore, SessionFilter, SessionInfo, SessionStatus, SessionWrite, StoreError,
    StoredSession,
};
use tiller::{
    AgentError, AgentEvent, AgentMessage, AgentSettings, AgentSpec, Delivered, FnTool, Op, RunEnd,
    SpawnError, Supervisor, SupervisorConfig, ToolOutput,
    runtime::{Notice, Workload},
    store::SessionStore,
};
use tiller_test_support::sqlite::TempSqlite;
use tokio::sync::Notify;

/// A memory store whose commits each take `delay`, and which holds the first
/// batch `hold` picks until it is released.
struct SlowStore {
    inner: MemoryStore,
    delay: Duration,
    hold: Option<Hold>,
}

/// A batch held back by a [`SlowStore`].
struct Hold {
    /// Picks the batch.
    picks: fn(&[SessionWrite]) -> bool,
    /// Whether it was picked already.
    picked: AtomicBool,
    /// Told once the batch is held.
    held: Notify,
    /// Lets it go.
    release: Notify,
}

impl SlowStore {
    fn new(inner: MemoryStore, delay: Duration) -> Self {
        SlowStore {
            inner,
            delay,
            hold: None,
        }
    }

    fn holding(inner: MemoryStore, picks: fn(&[SessionWrite]) -> bool) -> Self {
        let hold = Hold {
            picks,
            picked: AtomicBool::new(false),
            held: Notify::new(),
            release: Notify::new(),
        };
        SlowStore {
            hold: Some(hold),
            ..SlowStore::new(inner, Duration::ZERO)
        }
    }
}

impl SessionStore for SlowStore {
    fn apply<'a>(&'a self, batch: &'a [SessionWrite]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            if let Some(hold) = &self.hold
                && (hold.picks)(batch)
                && !hold.picked.swap(true, Ordering::SeqCst)
            {
                hold.held.notify_one();
                hold.release.notified().await;
            }
            self.inner.apply(batch).await
        })
    }

    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<StoredSession>, StoreError>> {
        self.inner.load(id)
    }

    fn claim<'a>(
        &'a self,
        id: &'a str,
        epoch: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<StoredSession>, StoreError>> {
        self.inner.claim(id, epoch)
    }

    fn list<'a>(
        &'a self,
        filter: &'a SessionFilter,
    ) -> BoxFuture<'a, Result<Vec<SessionInfo>, StoreError>> {
        self.inner.list(filter)
    }

    fn messages<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Arc<AgentMessage>>, StoreError>> {
        self.inner.messages(id, from, limit)
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.delete(id)
    }

    fn prune(&self, before: i64) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.inner.prune(before)
    }
}

/// The roles of the transcript the store keeps for `session`.
async fn stored_roles(store: &Arc<dyn SessionStore>, session: &str) -> Vec<String> {
    let stored = store.load(session).await.unwrap().unwrap();
    let messages: Vec<AgentMessage> = stored.messages.iter().map(|m| (**m).clone()).collect();
    roles(&messages).into_iter().map(str::to_owned).collect()
}

/// `prompt` returns once the prompt is in the store, even when a commit takes a
/// while: a process that dies after the acknowledgement loses nothing it
/// acknowledged.
#[tokio::test]
async fn a_prompt_is_acknowledged_once_its_message_is_stored() {
    let inner = MemoryStore::new();
    let store = Arc::new(SlowStore::new(inner.clone(), Duration::from_millis(200)));
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store)
        .await
        .unwrap();
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello."));
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())).with_id("durable"))
        .await
        .unwrap();
    agent.prompt("Remember this.").await.unwrap();
    let stored = inner.load("durable").await.unwrap().unwrap();
    assert_eq!(
        stored.messages[0].as_user().unwrap().text_content(),
        "Remember this."
    );
    agent.wait_for_idle().await;
    supervisor.shutdown().await;
}

/// A follow-up acknowledged while a run is ending, after its loop last looked
/// at the queue, is not left waiting for the next prompt: a run of its own
/// takes it once the first run's end is told.
#[tokio::test]
async fn a_follow_up_queued_as_a_run_ends_gets_a_run_of_its_own() {
    // The run's end writes what its wall clock spent, with no model call:
    // held there, the run has ended in its loop and not yet in its actor.
    let store = Arc::new(SlowStore::holding(MemoryStore::new(), |batch| {
        batch.iter().any(
            |write| matches!(&write.change, Change::Spend { spent, .. } if spent.model_calls == 0),
        )
    }));
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("First."));
    faux.push(FauxTurn::text("Second."));
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())).with_id("late"))
        .await
        .unwrap();
    let mut events = agent.subscribe();
    agent.prompt("One.").await.unwrap();
    let hold = store.hold.as_ref().unwrap();
    hold.held.notified().await;
    let queued = tokio::spawn({
        let agent = agent.clone();
        async move { agent.follow_up(AgentMessage::user("Two.")).await }
    });
    while agent.workload().await.unwrap().queued == 0 {
        tokio::task::yield_now().await;
    }
    hold.release.notify_one();
    queued.await.unwrap().unwrap();
    let mut ends = Vec::new();
    while ends.len() < 2 {
        let end = until(&mut events, is_agent_end).await;
        if let Delivered::Event(AgentEvent::AgentEnd { reason, .. }) = &end.event {
            ends.push(*reason);
        }
    }
    assert_eq!(ends, [RunEnd::Completed, RunEnd::Completed]);
    let state = agent.state().await.unwrap();
    let texts: Vec<String> = state
        .messages
        .iter()
        .map(|m| match m.as_user() {
            Some(user) => user.text_content(),
            None => m.as_assistant().unwrap().text(),
        })
        .collect();
    assert_eq!(texts, ["One.", "First.", "Two.", "Second."]);
    assert_eq!(agent.workload().await.unwrap().queued, 0);
    supervisor.shutdown().await;
}

/// An op sent twice with one idempotency key is applied once: in the process
/// that applied it, and in the next one that holds the session, which reads the
/// key back from the store. A run started twice tells the second sender so.
#[tokio::test]
async fn an_op_with_an_idempotency_key_is_applied_once() {
    let db = TempSqlite::new();
    let faux = FauxProvider::new();
    let settings = Arc::new(AgentSettings::new(faux.model()));
    let spec = || AgentSpec::new(settings.clone()).with_session("keyed");
    let queued = |op: &str| Op::FollowUp {
        message: AgentMessage::user(op),
    };

    let first = Supervisor::with_store(
        SupervisorConfig::default(),
        tiller::store::open(db.url()).await.unwrap(),
    )
    .await
    .unwrap();
    let agent = first.spawn(spec()).await.unwrap();
    agent.submit_keyed(queued("one"), "k1").await.unwrap();
    agent.submit_keyed(queued("one"), "k1").await.unwrap();
    agent.submit_keyed(queued("two"), "k2").await.unwrap();
    assert_eq!(agent.workload().await.unwrap().queued, 2);
    first.shutdown().await;

    let second = Supervisor::with_store(
        SupervisorConfig::default(),
        tiller::store::open(db.url()).await.unwrap(),
    )
    .await
    .unwrap();
    let agent = second.spawn(spec()).await.unwrap();
    agent.submit_keyed(queued("two"), "k2").await.unwrap();
    assert_eq!(
        agent.workload().await.unwrap(),
        Workload {
            running: false,
            waiting: false,
            queued: 2
        }
    );

    faux.push(FauxTurn::text("Noted."));
    faux.push(FauxTurn::text("Both."));
    faux.push(FauxTurn::text("Done."));
    let prompt = Op::Prompt {
        messages: vec![AgentMessage::user("go")],
    };
    let outcome = agent
        .run_op(prompt.clone(), Some("k3".into()))
        .await
        .unwrap();
    assert_eq!(outcome.end, RunEnd::Completed);
    let after = agent.state().await.unwrap().messages.len();
    assert_eq!(
        agent.run_op(prompt.clone(), Some("k3".into())).await,
        Err(AgentError::Duplicate {
            key: "k3".to_owned()
        })
    );
    agent.submit_keyed(prompt, "k3").await.unwrap();
    agent.wait_for_idle().await;
    let state = agent.state().await.unwrap();
    assert_eq!(state.messages.len(), after);
    assert_valid(&state.messages);
    second.shutdown().await;
}

/// A spec may name the epoch to hold its session at (a lease's) and the number
/// of its first event: the store fences out older epochs, events go on from that
/// number, and a notice a host adds is numbered among them.
#[tokio::test]
async fn a_session_is_held_at_the_epoch_given_and_events_go_on_from_a_number() {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let faux = FauxProvider::new();
    let settings = Arc::new(AgentSettings::new(faux.model()));
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings.clone())
                .with_session("leased")
                .with_epoch(40)
                .with_first_event(100),
        )
        .await
        .unwrap();
    assert_eq!(
        store.load("leased").await.unwrap().unwrap().record.epoch,
        40
    );
    let mut events = agent.subscribe();
    agent.notify(Notice::OwnerChanged {
        host: "h1".to_owned(),
        epoch: 40,
    });
    faux.push(FauxTurn::text("Hi."));
    agent.prompt("hello").await.unwrap();
    let mut numbers = Vec::new();
    loop {
        let envelope = futures::StreamExt::next(&mut events).await.unwrap();
        numbers.push(envelope.seq);
        if is_agent_end(&envelope) {
            break;
        }
    }
    let expected: Vec<u64> = (100..100 + numbers.len() as u64).collect();
    assert_eq!(numbers, expected);
    agent.notify(Notice::TurnRestarted);
    let restarted = futures::StreamExt::next(&mut events).await.unwrap();
    assert_eq!(
        (restarted.seq, &restarted.event),
        (
            100 + numbers.len() as u64,
            &Delivered::Notice(Notice::TurnRestarted)
        )
    );

    // Another process claiming under an older lease is refused; a newer one
    // fences this holder out.
    let other = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let older = other
        .spawn(
            AgentSpec::new(settings.clone())
                .with_session("leased")
                .with_epoch(39),
        )
        .await;
    assert!(
        matches!(
            older,
            Err(SpawnError::Store(StoreError::TakenOver {
                epoch: 39,
                current: 40,
                ..
            }))
        ),
        "{older:?}"
    );
    let newer = other
        .spawn(
            AgentSpec::new(settings)
                .with_session("leased")
                .with_epoch(41),
        )
        .await
        .unwrap();
    assert_eq!(
        store.load("leased").await.unwrap().unwrap().record.epoch,
        41
    );
    let refused = agent.follow_up(AgentMessage::user("late")).await;
    assert!(
        matches!(
            refused,
            Err(AgentError::Store(StoreError::TakenOver { .. }))
        ),
        "{refused:?}"
    );
    drop(newer);
    other.shutdown().await;
    supervisor.shutdown().await;
}

/// A tool that never finishes on its own.
fn stuck() -> Arc<dyn tiller::AgentTool> {
    Arc::new(FnTool::new(
        "stuck",
        "Never finishes",
        json!({"type": "object"}),
        |_, _| async {
            std::future::pending::<()>().await;
            Ok(ToolOutput::text("never"))
        },
    ))
}

/// Evicting an agent stops it at once and writes nothing more: no result for the
/// call in progress, no aborted message; its session stays active for the next
/// holder, which answers the call "interrupted".
#[tokio::test]
async fn an_evicted_agent_writes_nothing_more() {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("stuck", json!({})));
    let settings = Arc::new(AgentSettings::new(faux.model()).with_tools(tools(vec![stuck()])));
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(settings.clone()).with_id("evicted"))
        .await
        .unwrap();
    let mut events = agent.subscribe();
    agent.prompt("go").await.unwrap();
    until(&mut events, |envelope| {
        matches!(
            envelope.event,
            Delivered::Event(AgentEvent::ToolExecutionStart { .. })
        )
    })
    .await;
    let actor = agent.actor().await.unwrap();
    assert!(supervisor.evict("evicted", "its lease was lost"));
    let stopped = until(&mut events, |envelope| {
        matches!(
            envelope.event,
            Delivered::Notice(Notice::AgentStopped { .. })
        )
    })
    .await;
    assert_eq!(
        stopped.event,
        Delivered::Notice(Notice::AgentStopped {
            reason: "its lease was lost".to_owned()
        })
    );
    actor.wait(Some(Duration::from_secs(10))).await.unwrap();
    // Everything submitted is committed by the shutdown.
    supervisor.shutdown().await;
    assert_eq!(stored_roles(&store, "evicted").await, ["user", "assistant"]);
    assert_eq!(
        store.load("evicted").await.unwrap().unwrap().record.status,
        SessionStatus::Active
    );
    assert!(matches!(
        agent.prompt("again").await,
        Err(AgentError::Stopped { .. })
    ));

    let next = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = next
        .spawn(AgentSpec::new(settings).with_session("evicted"))
        .await
        .unwrap();
    let state = agent.state().await.unwrap();
    assert_eq!(roles(&state.messages), ["user", "assistant", "tool_result"]);
    assert_valid(&state.messages);
    next.shutdown().await;
}

/// A hand-off ends the run where its next turn would start, with the turn's tool
/// results stored and no model call made; the next holder goes on from there
/// with `continue`, as if the run had not stopped.
#[tokio::test]
async fn a_hand_off_ends_the_run_between_two_turns() {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("gate", json!({})));
    faux.push(FauxTurn::text("Finished elsewhere."));
    let gate = Arc::new(tokio::sync::Notify::new());
    let gated = {
        let gate = gate.clone();
        Arc::new(FnTool::new(
            "gate",
            "Waits for the test",
            json!({"type": "object"}),
            move |_, _| {
                let gate = gate.clone();
                async move {
                    gate.notified().await;
                    Ok(ToolOutput::text("opened"))
                }
            },
        )) as Arc<dyn tiller::AgentTool>
    };
    let settings =
        Arc::new(AgentSettings::new(faux.model()).with_tools(tools(vec![gated, echo()])));
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(settings.clone()).with_id("moving"))
        .await
        .unwrap();
    let mut events = agent.subscribe();
    agent.prompt("go").await.unwrap();
    until(&mut events, |envelope| {
        matches!(
            envelope.event,
            Delivered::Event(AgentEvent::ToolExecutionStart { .. })
        )
    })
    .await;
    // The pause is asked before the tool finishes.
    let (handed, ()) = tokio::join!(supervisor.hand_off("moving", "moved"), async {
        gate.notify_one();
    });
    assert!(handed);
    let end = until(&mut events, is_agent_end).await;
    let Delivered::Event(AgentEvent::AgentEnd { reason, .. }) = &end.event else {
        unreachable!()
    };
    assert_eq!(*reason, RunEnd::Paused);
    assert_eq!(faux.requests().len(), 1);
    supervisor.shutdown().await;
    assert_eq!(
        stored_roles(&store, "moving").await,
        ["user", "assistant", "tool_result"]
    );

    let next = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = next
        .spawn(AgentSpec::new(settings).with_session("moving"))
        .await
        .unwrap();
    let outcome = agent.run_op(Op::Continue, None).await.unwrap();
    assert_eq!(outcome.text(), "Finished elsewhere.");
    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
    next.shutdown().await;
}
