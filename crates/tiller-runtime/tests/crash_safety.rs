//! Crash safety in the runtime: a tool call is committed before its tool starts
//! (write-ahead); a response the store cannot keep runs no tool; and one writer per
//! session — an agent whose session another supervisor (another process) claimed
//! stops at its next write, or at its thaw, and writes nothing more.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assert_valid, roles, tools, until};
use futures::future::BoxFuture;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::{
    MemoryStore, SessionFilter, SessionInfo, SessionWrite, SqlStore, StoreError, StoredSession,
};
use tiller::{
    AgentError, AgentMessage, AgentSettings, AgentSpec, AgentTool, Delivered, FnTool, RunEnd,
    Supervisor, SupervisorConfig, ToolOutput,
    runtime::{AgentStatus, Notice},
    store::SessionStore,
};
use tiller_test_support::sqlite::TempSqlite;

/// A memory store whose commits take a second, or fail while they carry a
/// response with tool calls when `refuse_calls` is set.
struct SlowStore {
    inner: MemoryStore,
    refuse_calls: bool,
}

impl SessionStore for SlowStore {
    fn apply<'a>(&'a self, batch: &'a [SessionWrite]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let calls = batch.iter().any(|write| match &write.change {
                tiller::store::Change::Append { message, .. } => message
                    .as_assistant()
                    .is_some_and(|m| m.tool_calls().next().is_some()),
                _ => false,
            });
            if self.refuse_calls && calls {
                return Err(StoreError::Database("the disk is full".to_owned()));
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

/// A `probe` tool that records, when it starts, whether the store already holds
/// the response that called it.
fn probe(store: MemoryStore, seen: Arc<Mutex<Vec<bool>>>) -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        "probe",
        "Looks at the store",
        json!({"type": "object"}),
        move |_, ctx| {
            let (store, seen) = (store.clone(), seen.clone());
            async move {
                let stored = store.load("probed").await.unwrap().unwrap();
                let committed = stored.messages.iter().any(|message| {
                    message
                        .as_assistant()
                        .is_some_and(|m| m.tool_calls().any(|call| call.id == ctx.call_id()))
                });
                seen.lock().unwrap().push(committed);
                Ok(ToolOutput::text("looked"))
            }
        },
    ))
}

/// Every commit takes a second of (paused) time: a tool started before its call
/// was committed would run at once and find the call missing. Each of the three
/// calls finds it.
#[tokio::test(start_paused = true)]
async fn a_tool_starts_only_once_its_call_is_committed() {
    let inner = MemoryStore::new();
    let store = Arc::new(SlowStore {
        inner: inner.clone(),
        refuse_calls: false,
    });
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store)
        .await
        .unwrap();
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("probe", json!({})));
    faux.push(
        FauxTurn::new()
            .with_tool_call("probe", json!({}))
            .with_tool_call("probe", json!({})),
    );
    faux.push(FauxTurn::text("Both looked."));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let settings = AgentSettings::new(faux.model())
        .with_tools(tools(vec![probe(inner.clone(), seen.clone())]));
    let agent = supervisor
        .spawn(AgentSpec::new(settings).with_id("probed"))
        .await
        .unwrap();
    let outcome = agent.run("Look twice.").await.unwrap();
    assert_eq!(outcome.end, RunEnd::Completed);
    assert_eq!(*seen.lock().unwrap(), [true, true, true]);
    supervisor.shutdown().await;
}

/// A response the store refuses to keep: none of its calls runs, each is answered
/// with an error result saying why, and the run ends with an error.
#[tokio::test(start_paused = true)]
async fn a_response_the_store_refuses_runs_no_tool() {
    let inner = MemoryStore::new();
    let store = Arc::new(SlowStore {
        inner: inner.clone(),
        refuse_calls: true,
    });
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store)
        .await
        .unwrap();
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("probe", json!({})));
    faux.push(FauxTurn::text("never asked"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let settings =
        AgentSettings::new(faux.model()).with_tools(tools(vec![probe(inner, seen.clone())]));
    let agent = supervisor
        .spawn(AgentSpec::new(settings).with_id("probed"))
        .await
        .unwrap();
    let outcome = agent.run("Look.").await.unwrap();
    assert_eq!(outcome.end, RunEnd::Error);
    assert!(seen.lock().unwrap().is_empty(), "the tool never started");
    assert_eq!(faux.requests().len(), 1);
    assert_eq!(
        roles(&outcome.messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
    assert_valid(&outcome.messages);
    let result = outcome.messages[2].as_tool_result().unwrap();
    assert!(result.is_error);
    assert!(
        result
            .text_content()
            .ends_with("the response could not be stored before its calls ran (the session store failed: the disk is full)."),
        "{}",
        result.text_content()
    );
    supervisor.shutdown().await;
}

/// Two supervisors on one store, as two processes would be: the second takes the
/// session over, and the first's agent stops at its next write — its run aborted,
/// its subscribers told, its requests refused — having written nothing more.
async fn a_session_taken_over_stops_its_old_holder(
    first_store: Arc<dyn SessionStore>,
    second_store: Arc<dyn SessionStore>,
) {
    let session = format!("shared-{}-{}", std::process::id(), tiller::ai::now_ms());
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("First answer."));
    let first = Supervisor::with_store(SupervisorConfig::default(), first_store.clone())
        .await
        .unwrap();
    let old = first
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())).with_session(session.clone()))
        .await
        .unwrap();
    old.run("Hello from the first.").await.unwrap();

    let second = Supervisor::with_store(SupervisorConfig::default(), second_store.clone())
        .await
        .unwrap();
    let new = second
        .spawn(
            AgentSpec::new(AgentSettings::new(faux.model()))
                .with_session(session.clone())
                .with_own_settings(),
        )
        .await
        .unwrap();
    assert_eq!(new.state().await.unwrap().messages.len(), 2);

    // The old holder's next write (its prompt's message) is refused.
    let mut events = old.subscribe();
    faux.push(FauxTurn::text("Never stored."));
    let _ = old.prompt("Hello again from the first.").await;
    let stopped = until(&mut events, |envelope| {
        matches!(
            &envelope.event,
            Delivered::Notice(Notice::AgentStopped { .. })
        )
    })
    .await;
    let Delivered::Notice(Notice::AgentStopped { reason }) = &stopped.event else {
        unreachable!()
    };
    assert!(
        reason.starts_with(&format!(
            "session `{session}` was taken over by another process (its epoch is 1, this writer's 0)"
        )),
        "{reason}"
    );
    assert!(matches!(old.status(), AgentStatus::Stopped { .. }));
    assert_eq!(
        old.steer("Are you there?").await,
        Err(AgentError::Stopped {
            reason: reason.clone()
        })
    );

    // The new holder goes on; the store has its messages and none of the old one's.
    faux.push(FauxTurn::text("Second answer."));
    new.run("Hello from the second.").await.unwrap();
    let stored = second_store.load(&session).await.unwrap().unwrap();
    let texts: Vec<String> = stored
        .messages
        .iter()
        .map(
            |message| match (message.as_user(), message.as_assistant()) {
                (Some(user), _) => user.text_content(),
                (_, Some(assistant)) => assistant.text(),
                _ => String::new(),
            },
        )
        .collect();
    assert_eq!(
        texts,
        [
            "Hello from the first.",
            "First answer.",
            "Hello from the second.",
            "Second answer."
        ]
    );
    assert_eq!(stored.record.epoch, 1);
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn a_session_taken_over_in_memory_stops_its_old_holder() {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    a_session_taken_over_stops_its_old_holder(store.clone(), store).await;
}

#[tokio::test]
async fn a_session_taken_over_in_sqlite_stops_its_old_holder() {
    let db = TempSqlite::new();
    let first = SqlStore::open(db.url()).await.unwrap();
    let second = SqlStore::open(db.url()).await.unwrap();
    a_session_taken_over_stops_its_old_holder(Arc::new(first), Arc::new(second)).await;
}

#[tokio::test]
async fn a_session_taken_over_in_postgres_stops_its_old_holder() {
    let Some(url) = tiller_test_support::postgres::postgres_url() else {
        return;
    };
    let first = SqlStore::open(&url).await.unwrap();
    let second = SqlStore::open(&url).await.unwrap();
    a_session_taken_over_stops_its_old_holder(Arc::new(first), Arc::new(second)).await;
}

/// A hibernated agent whose session was taken over meanwhile does not thaw: its
/// next request finds the session's epoch moved on, and it stops.
#[tokio::test]
async fn a_hibernated_agent_whose_session_was_taken_over_stays_down() {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let config = SupervisorConfig {
        hibernate_after: Some(Duration::ZERO),
        ..SupervisorConfig::default()
    };
    let faux = FauxProvider::new();
    let first = Supervisor::with_store(config, store.clone()).await.unwrap();
    let old = first
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())).with_session("napping"))
        .await
        .unwrap();
    assert_eq!(old.status(), AgentStatus::Hibernated);
    let mut events = old.subscribe();
    let second = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    second
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())).with_session("napping"))
        .await
        .unwrap();
    // The request thaws it; the thaw finds the session taken over.
    assert!(matches!(
        old.follow_up("Wake up.").await,
        Err(AgentError::Stopped { reason }) if reason.contains("was taken over")
    ));
    until(&mut events, |envelope| {
        matches!(
            &envelope.event,
            Delivered::Notice(Notice::AgentStopped { .. })
        )
    })
    .await;
    assert!(
        matches!(old.status(), AgentStatus::Stopped { reason } if reason.contains("was taken over"))
    );
    assert!(
        store
            .load("napping")
            .await
            .unwrap()
            .unwrap()
            .follow_up
            .is_empty()
    );
    first.shutdown().await;
    second.shutdown().await;
}

/// An approved call is as durable as one that needed none: the approval is stored
/// before the tool starts, so a process taking the session over while the tool
/// runs (as after a crash) answers the call "interrupted" instead of asking the
/// user again — which could run it twice.
#[tokio::test]
async fn an_approved_call_caught_mid_tool_is_answered_interrupted_not_asked_again() {
    let db = TempSqlite::new();
    let first_store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let started = Arc::new(tokio::sync::Notify::new());
    let charge: Arc<dyn AgentTool> = {
        let started = started.clone();
        Arc::new(FnTool::new(
            "charge",
            "Charges a card",
            json!({"type": "object"}),
            move |_, ctx| {
                let started = started.clone();
                async move {
                    started.notify_one();
                    ctx.cancel().cancelled().await;
                    Ok(ToolOutput::text("charged"))
                }
            },
        ))
    };
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("charge", json!({})));
    let mut settings = AgentSettings::new(faux.model()).with_tools(tools(vec![charge]));
    settings
        .definition
        .run
        .approvals
        .insert("charge".to_owned(), tiller::run::Approval::Ask);
    let first = Supervisor::with_store(SupervisorConfig::default(), first_store)
        .await
        .unwrap();
    let agent = first
        .spawn(AgentSpec::new(settings.clone()).with_session("card"))
        .await
        .unwrap();
    assert_eq!(agent.run("Charge it.").await.unwrap().end, RunEnd::Parked);
    let waiting = agent.state().await.unwrap().waiting;
    agent.approve(waiting[0].tool_call_id()).await.unwrap();
    started.notified().await;

    // Another process takes the session over while the tool runs.
    let second_store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let second = Supervisor::with_store(SupervisorConfig::default(), second_store)
        .await
        .unwrap();
    let resumed = second
        .spawn(AgentSpec::new(settings).with_session("card"))
        .await
        .unwrap();
    let state = resumed.state().await.unwrap();
    assert!(state.waiting.is_empty(), "{:?}", state.waiting);
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant", "custom", "custom", "tool_result"]
    );
    assert_valid(&state.messages);
    let result = state.messages[4].as_tool_result().unwrap();
    assert_eq!(
        result.text_content(),
        "Tool call \"charge\" was interrupted: the agent stopped before it finished and was brought back from its session."
    );
    first.shutdown().await;
    second.shutdown().await;
}
