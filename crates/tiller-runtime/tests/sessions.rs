//! Sessions in a store: resumed by a new supervisor (as after a restart of the
//! process), restarted from the store after a failure, left mid-tool by a crash,
//! and agents that hibernate and thaw with their subscribers attached.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::{assert_valid, echo, is_agent_end, is_restart, roles, run_ends, tools, until};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::{Change, MemoryStore, SessionRecord, SessionWrite, SqlStore, StoreWriter};
use tiller::{
    AgentEvent, AgentMessage, AgentSettings, AgentSpec, Delivered, Prompt, Supervisor,
    SupervisorConfig, runtime::AgentStatus, store::SessionStore,
};
use tiller_test_support::sqlite::TempSqlite;

/// A session id no other test (or earlier run against a shared database) uses.
fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), tiller::ai::now_ms())
}

/// Stored messages as the agent's state shows them.
fn plain(messages: &[Arc<AgentMessage>]) -> Vec<AgentMessage> {
    messages.iter().map(|message| (**message).clone()).collect()
}

fn settings(faux: &FauxProvider) -> AgentSettings {
    AgentSettings::new(faux.model()).with_tools(tools(vec![echo()]))
}

/// A conversation with a tool call, queued messages and a changed setting, then a
/// shutdown; a second supervisor on the same store brings it all back, and the next
/// prompt goes on from there.
async fn resumes_in_a_new_supervisor(store: Arc<dyn SessionStore>) {
    let session = unique("resumed");
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("echo", json!({"value": "a"})));
    faux.push(FauxTurn::text("Echoed."));
    let first = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = first
        .spawn(
            AgentSpec::new(settings(&faux))
                .with_session(session.clone())
                .with_name("resumable"),
        )
        .await
        .unwrap();
    assert_eq!(agent.run("echo a").await.unwrap().text(), "Echoed.");
    agent.steer("steer later").await.unwrap();
    agent.follow_up("follow later").await.unwrap();
    agent
        .update_settings(|s| s.definition.system_prompt = Some("Be brief.".into()))
        .await
        .unwrap();
    let before = agent.state().await.unwrap();
    first.shutdown().await;

    let second = Supervisor::with_store(SupervisorConfig::default(), store)
        .await
        .unwrap();
    let resumed = second
        .resume(|info| (info.record.id == session).then(|| settings(&faux)))
        .await
        .unwrap();
    assert_eq!(resumed.len(), 1);
    let agent = &resumed[0];
    assert_eq!(agent.id().as_str(), session);
    assert_eq!(agent.name(), Some("resumable"));
    let after = agent.state().await.unwrap();
    assert_eq!(after.messages, before.messages);
    assert_eq!(
        roles(&after.messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
    assert_eq!(after.steering_queue, before.steering_queue);
    assert_eq!(after.follow_up_queue, before.follow_up_queue);
    assert_eq!(after.definition.system_prompt.as_deref(), Some("Be brief."));

    // The queued messages go first: steering, then the follow-up.
    faux.push(FauxTurn::text("Steered."));
    faux.push(FauxTurn::text("Followed."));
    let outcome = agent.run(Prompt::Continue).await.unwrap();
    assert_eq!(outcome.text(), "Followed.");
    let state = agent.state().await.unwrap();
    assert_valid(&state.messages);
    assert_eq!(
        roles(&state.messages[4..]),
        ["user", "assistant", "user", "assistant"]
    );
    assert!(state.steering_queue.is_empty() && state.follow_up_queue.is_empty());
    let requests = faux.requests();
    assert_eq!(
        requests.last().unwrap().context.system_prompt.as_deref(),
        Some("Be brief.")
    );
    second.shutdown().await;
    let stored = second.store().load(&session).await.unwrap().unwrap();
    assert_eq!(plain(&stored.messages), state.messages);
    assert!(stored.steering.is_empty() && stored.follow_up.is_empty());
}

#[tokio::test]
async fn a_session_resumes_from_memory() {
    resumes_in_a_new_supervisor(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn a_session_resumes_from_sqlite() {
    let db = TempSqlite::new();
    let store = SqlStore::open(db.url()).await.unwrap();
    resumes_in_a_new_supervisor(Arc::new(store)).await;
}

#[tokio::test]
async fn a_session_resumes_from_postgres() {
    let Some(url) = tiller_test_support::postgres::postgres_url() else {
        return;
    };
    let store = SqlStore::open(&url).await.unwrap();
    resumes_in_a_new_supervisor(Arc::new(store)).await;
}

/// What a process killed mid-tool leaves in the store: the call without its result,
/// a queued follow-up. Resumed, the call is answered as interrupted (in the store
/// too), the follow-up still waits, and the next prompt works.
#[tokio::test]
async fn a_session_left_mid_tool_resumes_with_the_call_answered() {
    let db = TempSqlite::new();
    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let faux = FauxProvider::new();
    let mut call = tiller::ai::AssistantMessage::empty(&faux.model());
    call.stop_reason = tiller::ai::StopReason::ToolUse;
    call.content = vec![tiller::ai::AssistantContent::ToolCall(Box::new(
        tiller::ai::ToolCall {
            id: "call_1".into(),
            name: "echo".into(),
            arguments: json!({"value": "x"}),
            arguments_error: None,
            signature: None,
        },
    ))];
    let and_then = AgentMessage::user("and then");
    let writer = StoreWriter::for_store(store.clone());
    let append = |seq: u64, message: AgentMessage| {
        SessionWrite::new(
            "crashed",
            Change::Append {
                seq,
                message: message.into(),
                dequeued: None,
            },
        )
    };
    writer
        .write(vec![
            SessionWrite::new("crashed", Change::Create(SessionRecord::new("crashed"))),
            append(0, AgentMessage::user("run echo")),
            append(1, call.into()),
            SessionWrite::new(
                "crashed",
                Change::Enqueue {
                    queue: tiller::store::QueueKind::FollowUp,
                    seq: 0,
                    message: and_then.clone(),
                },
            ),
        ])
        .await
        .unwrap();

    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(settings(&faux)).with_session("crashed"))
        .await
        .unwrap();
    let state = agent.state().await.unwrap();
    assert_valid(&state.messages);
    assert_eq!(roles(&state.messages), ["user", "assistant", "tool_result"]);
    let result = state.messages[2].as_tool_result().unwrap();
    assert!(result.is_error);
    assert_eq!(
        result.text_content(),
        "Tool call \"echo\" was interrupted: the agent stopped before it finished and was brought back from its session."
    );
    assert_eq!(state.follow_up_queue, vec![and_then]);

    faux.push(FauxTurn::text("Back."));
    faux.push(FauxTurn::text("And then some."));
    assert_eq!(
        agent.run("what happened?").await.unwrap().text(),
        "And then some."
    );
    supervisor.shutdown().await;
    let stored = store.load("crashed").await.unwrap().unwrap();
    assert!(stored.follow_up.is_empty(), "the follow-up was delivered");
    let stored = plain(&stored.messages);
    assert_valid(&stored);
    assert_eq!(
        roles(&stored),
        [
            "user",
            "assistant",
            "tool_result",
            "user",
            "assistant",
            "user",
            "assistant"
        ]
    );
}

/// A failure restarts the agent from its SQLite session, subscribers attached
/// throughout, and the next run's events reach the same subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_agent_restarts_from_sqlite_with_its_subscribers() {
    let db = TempSqlite::new();
    let store = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store)
        .await
        .unwrap();
    let faux = FauxProvider::new();
    let broke = Arc::new(AtomicBool::new(false));
    let hooks = common::panicking_once(&broke);
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings(&faux).with_on_message(hooks))
                .with_session(unique("restarted")),
        )
        .await
        .unwrap();
    let mut events = agent.subscribe();
    faux.push(FauxTurn::text("first"));
    faux.push(FauxTurn::text("second"));
    agent.prompt("one").await.unwrap();
    until(&mut events, is_restart).await;
    common::idle(&agent).await;
    assert_eq!(
        roles(&agent.state().await.unwrap().messages),
        ["user", "assistant"]
    );
    agent.prompt("two").await.unwrap();
    let end = until(&mut events, is_agent_end).await;
    let Delivered::Event(AgentEvent::AgentEnd { messages, .. }) = &end.event else {
        unreachable!()
    };
    assert_eq!(
        messages.last().unwrap().as_assistant().unwrap().text(),
        "second"
    );
    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant", "user", "assistant"]
    );
    let stored = supervisor
        .store()
        .load(agent.session_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(plain(&stored.messages), state.messages);
    supervisor.shutdown().await;
}

/// Idle past `hibernate_after`, an agent leaves memory; the next request brings it
/// back from the store, and its subscriber sees the new run as if nothing happened.
#[tokio::test(start_paused = true)]
async fn an_idle_agent_hibernates_and_thaws_on_the_next_request() {
    let config = SupervisorConfig {
        hibernate_after: Some(Duration::from_secs(60)),
        ..SupervisorConfig::default()
    };
    let supervisor = Supervisor::with_store(config, Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    let faux = FauxProvider::new();
    let agent = supervisor
        .spawn(AgentSpec::new(settings(&faux)))
        .await
        .unwrap();
    let mut events = agent.subscribe();
    faux.push(FauxTurn::text("before"));
    agent.run("hello").await.unwrap();
    assert_eq!(agent.status(), AgentStatus::Idle);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(agent.status(), AgentStatus::Hibernated);

    // Steering a hibernated agent thaws it; the message is queued as usual.
    agent.steer("while asleep").await.unwrap();
    assert_eq!(agent.status(), AgentStatus::Idle);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(agent.status(), AgentStatus::Hibernated);

    faux.push(FauxTurn::text("steered"));
    agent.prompt("again").await.unwrap();
    // The one subscription saw both runs, numbered without a gap.
    let ends = run_ends(&mut events, 2).await;
    assert_eq!(
        ends,
        [vec!["user", "assistant"], vec!["user", "user", "assistant"]]
    );
    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant", "user", "user", "assistant"]
    );
    supervisor.shutdown().await;
}

/// With `hibernate_after` zero, an agent is spawned hibernated: its session is
/// written and no actor starts. Its first request brings it back from the store
/// whole, and a subscriber attached before sees the run.
#[tokio::test]
async fn with_hibernation_at_once_an_agent_is_spawned_hibernated() {
    let db = TempSqlite::new();
    let config = SupervisorConfig {
        hibernate_after: Some(Duration::ZERO),
        ..SupervisorConfig::default()
    };
    let supervisor =
        Supervisor::with_store(config, Arc::new(SqlStore::open(db.url()).await.unwrap()))
            .await
            .unwrap();
    let faux = FauxProvider::new();
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings(&faux))
                .with_messages(vec![AgentMessage::user("a question from before")]),
        )
        .await
        .unwrap();
    assert_eq!(agent.status(), AgentStatus::Hibernated);
    let mut events = agent.subscribe();

    faux.push(FauxTurn::text("an answer"));
    agent.run("and now?").await.unwrap();
    let ended = until(&mut events, is_agent_end).await;
    let Delivered::Event(AgentEvent::AgentEnd { messages, .. }) = &ended.event else {
        unreachable!()
    };
    assert_eq!(roles(messages), ["user", "assistant"]);
    let state = agent.state().await.unwrap();
    assert_eq!(roles(&state.messages), ["user", "user", "assistant"]);
    supervisor.shutdown().await;
}

/// Resumed with compression, a long answer comes back cut in its middle (its start
/// and end kept) with a marker naming it;
/// the model reads it whole with `lookup`; the store keeps it whole.
#[tokio::test]
async fn a_long_answer_is_cut_on_reload_and_read_back_with_lookup() {
    let db = TempSqlite::new();
    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let faux = FauxProvider::new();
    let long = format!(
        "The plan, step by step: {}",
        "do the next thing. ".repeat(40)
    );
    faux.push(FauxTurn::text(long.clone()));
    let compressed =
        || tiller::agents::Compression::default().applied_to(settings(&faux), store.clone());
    let first = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = first
        .spawn(AgentSpec::new(settings(&faux)).with_session("long"))
        .await
        .unwrap();
    agent.run("make a plan").await.unwrap();
    first.shutdown().await;

    let second = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = second
        .spawn(AgentSpec::new(compressed()).with_session("long"))
        .await
        .unwrap();
    let state = agent.state().await.unwrap();
    let cut = state.messages[1].as_assistant().unwrap().text();
    let length = long.chars().count();
    let start: String = long.chars().take(300).collect();
    let end: String = long.chars().skip(length - 100).collect();
    assert_eq!(
        cut,
        format!(
            "{start}\n[… {} characters cut. The whole message is \"message:1\": call the `lookup` tool with that name to read it.]\n{end}",
            length - 400
        )
    );
    // The tool comes with the compression; the session does not store its name.
    assert!(!state.definition.tools.iter().any(|tool| tool == "lookup"));

    faux.push(FauxTurn::tool_call("lookup", json!({"name": "message:1"})));
    faux.push(FauxTurn::text("Step one is to do the next thing."));
    agent.run("what was step one?").await.unwrap();
    let state = agent.state().await.unwrap();
    let read = state.messages[4].as_tool_result().unwrap();
    assert!(!read.is_error);
    assert_eq!(read.text_content(), long);
    // The model saw the cut answer, never the whole one, until it asked.
    let first_request = &faux.requests()[1];
    let seen = first_request.context.messages[1].clone();
    let tiller::ai::Message::Assistant(seen) = seen else {
        panic!("the answer is the second message")
    };
    assert_eq!(seen.text(), cut);
    second.shutdown().await;
    let stored = store.load("long").await.unwrap().unwrap();
    assert_eq!(stored.messages[1].as_assistant().unwrap().text(), long);
}
