//! Dormant agents (`SupervisorConfig::dormant_after`): idle long enough, an agent
//! gives up its actor but keeps its state in memory; the next request starts an
//! actor from that state, with no store read, and its subscribers carry on.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{echo, log, logged, remind, roles, run_ends, tools};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::{MemoryStore, SessionStore};
use tiller::{
    AgentEvent, AgentHandle, AgentMessage, AgentSettings, AgentSpec, Delivered, Op, Supervisor,
    SupervisorConfig, runtime::AgentStatus,
};

fn settings(faux: &FauxProvider) -> AgentSettings {
    AgentSettings::new(faux.model()).with_tools(tools(vec![echo()]))
}

async fn supervisor(
    dormant_after: Duration,
    hibernate_after: Option<Duration>,
) -> (Supervisor, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let config = SupervisorConfig {
        dormant_after: Some(dormant_after),
        hibernate_after,
        ..SupervisorConfig::default()
    };
    let supervisor = Supervisor::with_store(config, store.clone()).await.unwrap();
    (supervisor, store)
}

/// A supervisor as [`supervisor`] makes it, its store, a faux model and an
/// agent of it with [`settings`].
async fn one_agent(
    dormant_after: Duration,
    hibernate_after: Option<Duration>,
) -> (Supervisor, Arc<MemoryStore>, FauxProvider, AgentHandle) {
    let (supervisor, store) = supervisor(dormant_after, hibernate_after).await;
    let faux = FauxProvider::new();
    let agent = supervisor
        .spawn(AgentSpec::new(settings(&faux)))
        .await
        .unwrap();
    (supervisor, store, faux, agent)
}

/// The roles of the messages the model was sent in each request.
fn requested(faux: &FauxProvider) -> Vec<Vec<&'static str>> {
    faux.requests()
        .into_iter()
        .map(|request| {
            let messages: Vec<AgentMessage> = request
                .context
                .messages
                .into_iter()
                .map(AgentMessage::Llm)
                .collect();
            roles(&messages)
        })
        .collect()
}

/// Idle past `dormant_after`, an agent's actor stops and the agent stays idle;
/// a prompt wakes it with its whole transcript, and the subscription taken
/// before sees both runs, numbered without a gap. A dormant agent needs nothing
/// from the store to wake: its session deleted behind its back, it still
/// answers with its transcript (a thaw would have stopped it).
#[tokio::test(start_paused = true)]
async fn an_idle_agent_gives_up_its_actor_and_wakes_from_memory() {
    let (supervisor, store, faux, agent) = one_agent(Duration::from_secs(30), None).await;
    let mut events = agent.subscribe();
    faux.push(FauxTurn::text("before"));
    agent.run("hello").await.unwrap();
    assert!(agent.has_actor());
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!agent.has_actor());
    assert_eq!(agent.status(), AgentStatus::Idle);

    faux.push(FauxTurn::text("after"));
    agent.run("again").await.unwrap();
    assert!(agent.has_actor());
    assert_eq!(
        requested(&faux),
        [vec!["user"], vec!["user", "assistant", "user"]]
    );
    let ends = run_ends(&mut events, 2).await;
    assert_eq!(ends, [vec!["user", "assistant"], vec!["user", "assistant"]]);

    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!agent.has_actor());
    assert!(store.delete(agent.session_id()).await.unwrap());
    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant", "user", "assistant"]
    );
    assert_eq!(agent.status(), AgentStatus::Idle);
    supervisor.shutdown().await;
}

/// What an agent holds comes back whole from a dormant spell: its transcript,
/// queued messages, changed settings and the idempotency keys of the ops it
/// applied (an op retried after the spell is acknowledged, not applied again).
#[tokio::test(start_paused = true)]
async fn everything_an_agent_holds_survives_its_dormant_spell() {
    let (supervisor, _store) = supervisor(Duration::from_secs(30), None).await;
    let faux = FauxProvider::new();
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings(&faux))
                .with_messages(vec![AgentMessage::user("a question from before")]),
        )
        .await
        .unwrap();
    // The same op, with the same key, each time.
    let follow_up = || {
        agent.submit_keyed(
            Op::FollowUp {
                message: AgentMessage::user("later, please"),
            },
            "follow-1",
        )
    };
    follow_up().await.unwrap();
    agent.steer("steer this way").await.unwrap();
    agent
        .update_settings(|settings| settings.definition.system_prompt = Some("Be brief.".into()))
        .await
        .unwrap();
    let before = serde_json::to_value(agent.state().await.unwrap()).unwrap();
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!agent.has_actor());

    let after = serde_json::to_value(agent.state().await.unwrap()).unwrap();
    assert!(agent.has_actor());
    assert_eq!(after, before);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!agent.has_actor());
    follow_up().await.unwrap();
    let state = agent.state().await.unwrap();
    assert_eq!(state.follow_up_queue.len(), 1);
    assert_eq!(state.steering_queue.len(), 1);
    assert_eq!(state.definition.system_prompt.as_deref(), Some("Be brief."));
    supervisor.shutdown().await;
}

/// With `dormant_after` zero, an agent is spawned dormant: no actor starts
/// until its first request, which wakes it with the transcript it was given.
#[tokio::test]
async fn with_dormancy_at_once_an_agent_is_spawned_dormant() {
    let (supervisor, _store) = supervisor(Duration::ZERO, None).await;
    let faux = FauxProvider::new();
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings(&faux))
                .with_messages(vec![AgentMessage::user("a question from before")]),
        )
        .await
        .unwrap();
    assert!(!agent.has_actor());
    assert_eq!(agent.status(), AgentStatus::Idle);
    let mut events = agent.subscribe();

    faux.push(FauxTurn::text("an answer"));
    agent.run("and now?").await.unwrap();
    assert_eq!(requested(&faux), [vec!["user", "user"]]);
    let first = events.next().await.unwrap();
    assert!(matches!(
        first.event,
        Delivered::Event(AgentEvent::AgentStart)
    ));
    let state = agent.state().await.unwrap();
    assert_eq!(roles(&state.messages), ["user", "user", "assistant"]);
    supervisor.shutdown().await;
}

/// With `hibernate_after` too, a dormant agent hibernates once it has been idle
/// that long in all; a request during its dormant spell starts the count again,
/// and the spell it ended does not hibernate the next.
#[tokio::test(start_paused = true)]
async fn a_dormant_agent_hibernates_once_idle_for_hibernate_after() {
    let (supervisor, _store, faux, agent) =
        one_agent(Duration::from_secs(10), Some(Duration::from_secs(60))).await;
    faux.push(FauxTurn::text("before"));
    agent.run("hello").await.unwrap();
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(!agent.has_actor());
    assert_eq!(agent.status(), AgentStatus::Idle);

    // At 30 s, a request wakes it: dormant again at 40 s, hibernated at 90 s.
    tokio::time::sleep(Duration::from_secs(19)).await;
    agent.workload().await.unwrap();
    assert!(agent.has_actor());
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!agent.has_actor());
    assert_eq!(agent.status(), AgentStatus::Idle);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(agent.status(), AgentStatus::Hibernated);

    faux.push(FauxTurn::text("after"));
    agent.run("again").await.unwrap();
    assert_eq!(
        requested(&faux),
        [vec!["user"], vec!["user", "assistant", "user"]]
    );
    supervisor.shutdown().await;
}

/// An agent parked on the user's reply goes dormant still waiting for it; the
/// reply wakes it and the tool runs with the answer.
#[tokio::test(start_paused = true)]
async fn a_waiting_agent_goes_dormant_waiting_and_the_reply_wakes_it() {
    let (supervisor, _store) = supervisor(Duration::from_secs(30), None).await;
    let done = log();
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("c1", "remind", json!({"what": "call Juan"})));
    faux.push(FauxTurn::text("Done."));
    let agent = supervisor
        .spawn(AgentSpec::new(
            AgentSettings::new(faux.model()).with_tools(tools(vec![remind(&done, "When?")])),
        ))
        .await
        .unwrap();
    agent.run("remind me").await.unwrap();
    assert_eq!(agent.status(), AgentStatus::WaitingForInput);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!agent.has_actor());
    assert_eq!(agent.status(), AgentStatus::WaitingForInput);

    agent.answer("c1", "Friday").await.unwrap();
    agent.wait_for_idle().await;
    assert_eq!(logged(&done), ["call Juan @ Friday"]);
    assert_eq!(agent.status(), AgentStatus::Idle);
    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        // The question and its answer are kept as custom messages.
        [
            "user",
            "assistant",
            "custom",
            "custom",
            "tool_result",
            "assistant"
        ]
    );
    supervisor.shutdown().await;
}

/// A wake ends the timer that would have hibernated the spell it ended: an
/// agent woken again and again keeps one timer, not one per spell.
#[tokio::test(start_paused = true)]
async fn a_wake_stops_the_timer_of_the_spell_it_ends() {
    let (supervisor, _store, _faux, agent) =
        one_agent(Duration::from_secs(1), Some(Duration::from_secs(3_600))).await;
    let runtime = tokio::runtime::Handle::current().metrics();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!agent.has_actor());
    let tasks = runtime.num_alive_tasks();
    for _ in 0..100 {
        agent.workload().await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!agent.has_actor());
    }
    assert_eq!(runtime.num_alive_tasks(), tasks);
    assert_eq!(agent.status(), AgentStatus::Idle);
    supervisor.shutdown().await;
}
