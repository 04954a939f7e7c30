//! The runtime's guarantees (docs/runtime-semantics.md): responsive while busy,
//! aborts that leave a valid transcript, queues that lose nothing, subscribers that
//! are never blocked, and failures the supervisor recovers from.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::{
    agent, endless, idle, is_agent_end, is_restart, patient, roles, tool_started, tools, until,
};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentError, AgentEvent, AgentMessage, AgentSettings, AgentSpec, AgentTool, Delivered, FnTool,
    Supervisor, SupervisorConfig, ToolOutput,
    ai::StopReason,
    run::{SteeringDelivery, ToolExecutionMode},
    runtime::{AgentStatus, Notice},
};
use tokio::sync::Notify;

#[tokio::test(start_paused = true)]
async fn abort_during_a_stream_keeps_the_partial_answer() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(
        FauxTurn::text("Once upon a time")
            .chunk_size(5)
            .delay(Duration::from_secs(1)),
    );
    let mut events = agent.subscribe();
    agent.prompt("story").await.unwrap();
    until(&mut events, |e| {
        matches!(
            &e.event,
            Delivered::Event(AgentEvent::MessageUpdate {
                assistant_message_event: tiller::ai::AssistantEvent::TextDelta { .. },
                ..
            })
        )
    })
    .await;
    let streaming = agent.state().await.unwrap().streaming_message.unwrap();
    assert_eq!(streaming.text(), "Once ", "the state follows the stream");
    agent.abort();
    idle(&agent).await;
    let state = agent.state().await.unwrap();
    assert!(!state.is_streaming);
    assert_eq!(state.streaming_message, None);
    assert_eq!(roles(&state.messages), ["user", "assistant"]);
    let reply = state.messages[1].as_assistant().unwrap();
    assert_eq!(
        (reply.stop_reason, reply.text().as_str()),
        (StopReason::Aborted, "Once ")
    );
    assert_eq!(state.error.as_deref(), Some("the request was aborted"));
}

#[tokio::test]
async fn abort_during_a_slow_tool_leaves_no_orphaned_call() {
    let (_supervisor, agent, faux) = agent(|s| s.with_tools(tools(vec![patient()]))).await;
    faux.push(FauxTurn::new().with_tool_call_id("call-1", "patient", json!({})));
    let mut events = agent.subscribe();
    agent.prompt("wait").await.unwrap();
    until(&mut events, tool_started("call-1")).await;
    let state = agent.state().await.unwrap();
    assert_eq!(
        (state.is_streaming, state.pending_tool_calls.clone()),
        (true, vec!["call-1".to_owned()])
    );
    agent.abort();
    idle(&agent).await;
    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
    assert_eq!(
        state.messages[2].as_tool_result().unwrap().tool_call_id,
        "call-1"
    );
    assert_eq!(
        state.messages[3].as_assistant().unwrap().stop_reason,
        StopReason::Aborted
    );
    assert!(state.pending_tool_calls.is_empty());
}

/// Three echo calls; the first waits until released.
fn gated_turn() -> FauxTurn {
    FauxTurn::new()
        .with_tool_call_id("call-1", "gate", json!({"value": "one"}))
        .with_tool_call_id("call-2", "gate", json!({"value": "two"}))
        .with_tool_call_id("call-3", "gate", json!({"value": "three"}))
}

fn gate(release: &Arc<Notify>, ran: &Arc<std::sync::Mutex<Vec<String>>>) -> Arc<dyn AgentTool> {
    let (release, ran) = (release.clone(), ran.clone());
    Arc::new(FnTool::new(
        "gate",
        "Runs when released",
        json!({"type": "object", "properties": {"value": {"type": "string"}}}),
        move |args, _| {
            let (release, ran) = (release.clone(), ran.clone());
            async move {
                let value = args["value"].as_str().unwrap().to_owned();
                if value == "one" {
                    release.notified().await;
                }
                ran.lock().unwrap().push(value.clone());
                Ok(ToolOutput::text(value))
            }
        },
    ))
}

async fn steer_during_a_batch(delivery: SteeringDelivery) -> (Vec<String>, Vec<AgentMessage>) {
    let release = Arc::new(Notify::new());
    let ran = Arc::new(std::sync::Mutex::new(Vec::new()));
    let gate = gate(&release, &ran);
    let (_supervisor, agent, faux) = agent(|mut s| {
        s.set_tools(tools(vec![gate]));
        s.definition.run.steering_delivery = delivery;
        s.definition.run.tool_execution = ToolExecutionMode::Sequential;
        s
    })
    .await;
    faux.push(gated_turn());
    faux.push(FauxTurn::text("changing course"));
    let mut events = agent.subscribe();
    agent.prompt("go").await.unwrap();
    until(&mut events, tool_started("call-1")).await;
    agent.steer("stop, do something else").await.unwrap();
    release.notify_one();
    idle(&agent).await;
    let ran = ran.lock().unwrap().clone();
    (ran, agent.state().await.unwrap().messages)
}

#[tokio::test]
async fn steering_mid_batch_skips_the_rest_when_it_interrupts() {
    let (ran, messages) = steer_during_a_batch(SteeringDelivery::Interrupt).await;
    assert_eq!(ran, ["one"]);
    assert_eq!(
        roles(&messages),
        [
            "user",
            "assistant",
            "tool_result",
            "tool_result",
            "tool_result",
            "user",
            "assistant"
        ]
    );
    for skipped in &messages[3..5] {
        let result = skipped.as_tool_result().unwrap();
        assert!(result.is_error);
        assert_eq!(
            result.content,
            vec![tiller::ai::Content::text(
                "Skipped due to queued user message."
            )]
        );
    }
}

#[tokio::test]
async fn steering_mid_batch_waits_for_the_turn_when_asked() {
    let (ran, messages) = steer_during_a_batch(SteeringDelivery::AfterTurn).await;
    assert_eq!(ran, ["one", "two", "three"]);
    assert_eq!(
        roles(&messages),
        [
            "user",
            "assistant",
            "tool_result",
            "tool_result",
            "tool_result",
            "user",
            "assistant"
        ]
    );
    assert!(
        messages[2..5]
            .iter()
            .all(|m| !m.as_tool_result().unwrap().is_error)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_racing_the_end_of_a_run_is_never_lost() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.respond_with(|_| FauxTurn::text("ok"));
    for round in 0..300u32 {
        agent.run(format!("round {round}")).await.unwrap();
        agent.prompt("go").await.unwrap();
        let racer = {
            let agent = agent.clone();
            tokio::spawn(async move {
                for _ in 0..round % 7 {
                    tokio::task::yield_now().await;
                }
                agent.follow_up(format!("follow-up {round}")).await.unwrap();
            })
        };
        racer.await.unwrap();
        idle(&agent).await;
        let wanted = format!("follow-up {round}");
        let delivered = agent
            .state()
            .await
            .unwrap()
            .messages
            .iter()
            .filter(|m| {
                m.as_user()
                    .is_some_and(|user| user.text_content() == wanted)
            })
            .count();
        let queued = agent.has_queued_messages().await.unwrap();
        assert_eq!(
            delivered + usize::from(queued),
            1,
            "round {round}: delivered {delivered}, queued {queued}"
        );
        if queued {
            agent.prompt(tiller::Prompt::Continue).await.unwrap();
            idle(&agent).await;
            assert!(!agent.has_queued_messages().await.unwrap());
        }
    }
}

#[tokio::test]
async fn a_slow_subscriber_is_told_what_it_missed_while_a_fast_one_gets_everything() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("x".repeat(200)).chunk_size(1));
    let supervisor = Supervisor::with_config(SupervisorConfig {
        subscriber_buffer: 16,
        ..SupervisorConfig::default()
    })
    .await
    .unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())))
        .await
        .unwrap();
    let mut slow = agent.subscribe();
    let fast = agent.subscribe_with_buffer(10_000);
    let reader = tokio::spawn(async move {
        let mut fast = fast;
        let mut seqs = Vec::new();
        loop {
            let envelope = fast.next().await.unwrap();
            assert!(
                matches!(envelope.event, Delivered::Event(_)),
                "the fast subscriber never lags: {envelope:?}"
            );
            seqs.push(envelope.seq);
            if is_agent_end(&envelope) {
                return seqs;
            }
        }
    });
    agent.prompt("go").await.unwrap();
    let seqs = reader.await.unwrap();
    let total = seqs.len() as u64;
    assert_eq!(
        seqs,
        (seqs[0]..seqs[0] + total).collect::<Vec<_>>(),
        "every event, in order"
    );

    let first = slow.next().await.unwrap();
    let Delivered::Notice(Notice::Lagged { missed }) = first.event else {
        panic!("expected a lagged notice: {first:?}");
    };
    assert_eq!(
        first.seq, seqs[0],
        "the notice starts where the missing events start"
    );
    let mut rest = Vec::new();
    loop {
        let envelope = slow.next().await.unwrap();
        rest.push(envelope.seq);
        if is_agent_end(&envelope) {
            break;
        }
    }
    assert_eq!(rest.len(), 16, "the buffer's worth");
    assert_eq!(
        missed + rest.len() as u64,
        total,
        "missed plus received is everything"
    );
    assert_eq!(rest[0], seqs[0] + missed);
}

#[tokio::test]
async fn several_waiters_all_see_the_agent_go_idle() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(endless());
    agent.prompt("go").await.unwrap();
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let agent = agent.clone();
            tokio::spawn(async move { agent.wait_for_idle().await })
        })
        .collect();
    tokio::task::yield_now().await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    agent.abort();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn reset_during_a_run_aborts_it_then_clears_everything() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(endless());
    agent.prompt("go").await.unwrap();
    agent.steer("queued").await.unwrap();
    agent.follow_up("later").await.unwrap();
    agent.reset().await.unwrap();
    assert_eq!(agent.status(), AgentStatus::Idle);
    let state = agent.state().await.unwrap();
    assert!(state.messages.is_empty());
    assert_eq!(state.error, None);
    assert!(!agent.has_queued_messages().await.unwrap());
    faux.push(FauxTurn::text("fresh start"));
    assert_eq!(agent.run("again").await.unwrap().text(), "fresh start");
}

#[tokio::test]
async fn a_failing_agent_restarts_with_its_transcript_handles_and_subscriptions() {
    let panicked = Arc::new(AtomicBool::new(false));
    let (_supervisor, agent, faux) =
        agent(|s| s.with_on_message(common::panicking_once(&panicked))).await;
    faux.push(FauxTurn::text("first answer"));
    faux.push(FauxTurn::text("second answer"));
    let mut events = agent.subscribe();
    agent.prompt("hello").await.unwrap();
    let notice = until(&mut events, is_restart).await;
    let Delivered::Notice(Notice::AgentRestarted { reason }) = &notice.event else {
        unreachable!()
    };
    assert!(reason.contains("the persistence hook broke"), "{reason}");
    idle(&agent).await;
    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant"],
        "intact up to the last finished message"
    );
    assert!(!state.is_streaming);

    agent.prompt("again").await.unwrap();
    let end = until(&mut events, is_agent_end).await;
    assert!(end.seq > notice.seq, "the same subscription goes on");
    assert_eq!(
        agent
            .state()
            .await
            .unwrap()
            .messages
            .last()
            .unwrap()
            .as_assistant()
            .unwrap()
            .text(),
        "second answer"
    );
}

#[tokio::test]
async fn an_agent_failing_past_its_budget_stays_down_and_says_why() {
    let faux = FauxProvider::new();
    faux.respond_with(|_| FauxTurn::text("boom"));
    let supervisor = Supervisor::with_config(SupervisorConfig {
        max_restarts: 1,
        ..SupervisorConfig::default()
    })
    .await
    .unwrap();
    let hooks: tiller::runtime::OnMessage =
        Arc::new(|_: &tiller::runtime::AgentId, message: &AgentMessage| {
            if message.as_assistant().is_some() {
                panic!("always broken");
            }
        });
    let agent = supervisor
        .spawn(AgentSpec::new(
            AgentSettings::new(faux.model()).with_on_message(hooks),
        ))
        .await
        .unwrap();
    let mut events = agent.subscribe();
    agent.prompt("one").await.unwrap();
    until(&mut events, is_restart).await;
    idle(&agent).await;
    agent.prompt("two").await.unwrap();
    let stopped = until(&mut events, |e| {
        matches!(e.event, Delivered::Notice(Notice::AgentStopped { .. }))
    })
    .await;
    assert!(events.next().await.is_none(), "the subscription ends");
    let Delivered::Notice(Notice::AgentStopped { reason }) = &stopped.event else {
        unreachable!()
    };
    assert!(
        reason.contains("restart budget of 1") && reason.contains("always broken"),
        "{reason}"
    );
    let refused = agent.prompt("three").await.unwrap_err();
    assert!(matches!(refused, AgentError::Stopped { .. }), "{refused:?}");
    assert!(matches!(agent.status(), AgentStatus::Stopped { .. }));
    assert_eq!(agent.steer("hello?").await, Err(refused));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_many_running_agents_gracefully() {
    let supervisor = Supervisor::start().await.unwrap();
    let faux = FauxProvider::new();
    faux.respond_with(|_| endless());
    let settings = Arc::new(AgentSettings::new(faux.model()));
    let mut agents = Vec::new();
    for n in 0..100 {
        let agent = supervisor
            .spawn(AgentSpec::new(settings.clone()).with_name(format!("worker-{n}")))
            .await
            .unwrap();
        let events = agent.subscribe();
        agent.prompt("work").await.unwrap();
        agents.push((agent, events));
    }
    assert!(
        supervisor
            .list()
            .iter()
            .all(|a| a.status == AgentStatus::Running)
    );
    tokio::time::timeout(Duration::from_secs(10), supervisor.shutdown())
        .await
        .unwrap();
    for (agent, events) in agents.iter_mut() {
        let mut last_two = Vec::new();
        while let Some(envelope) = events.next().await {
            last_two.push(envelope);
            if last_two.len() > 2 {
                last_two.remove(0);
            }
        }
        assert!(
            matches!(
                (&last_two[0].event, &last_two[1].event),
                (
                    Delivered::Event(AgentEvent::AgentEnd { .. }),
                    Delivered::Notice(Notice::AgentStopped { .. })
                )
            ),
            "agent_end, then agent_stopped: {last_two:?}"
        );
        assert_eq!(last_two[1].seq, last_two[0].seq + 1);
        assert!(matches!(agent.status(), AgentStatus::Stopped { .. }));
        // The actor is gone; the store has the whole transcript.
        let stored = supervisor
            .store()
            .load(agent.session_id())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            stored
                .messages
                .last()
                .unwrap()
                .as_assistant()
                .unwrap()
                .stop_reason,
            StopReason::Aborted
        );
        assert!(matches!(
            agent.prompt("more").await,
            Err(AgentError::Stopped { .. })
        ));
    }
    assert!(supervisor.is_empty());
    assert!(matches!(
        supervisor.spawn(AgentSpec::new(settings)).await,
        Err(tiller::SpawnError::ShutDown)
    ));
}

#[tokio::test]
async fn agents_are_found_by_id_or_name_from_any_thread() {
    let supervisor = Supervisor::start().await.unwrap();
    let settings = Arc::new(AgentSettings::default());
    let named = supervisor
        .spawn(
            AgentSpec::new(settings.clone())
                .with_id("a-1")
                .with_name("planner"),
        )
        .await
        .unwrap();
    let other = supervisor
        .spawn(AgentSpec::new(settings.clone()))
        .await
        .unwrap();
    // Made up: a time-ordered UUID, never repeated across restarts.
    let made_up = other.id().to_string();
    assert_eq!(
        (made_up.len(), made_up.as_bytes()[14]),
        (36, b'7'),
        "{made_up}"
    );
    assert_eq!(
        supervisor
            .spawn(AgentSpec::new(settings.clone()).with_name("planner"))
            .await
            .unwrap_err(),
        tiller::SpawnError::NameTaken("planner".into())
    );
    assert_eq!(
        supervisor
            .spawn(AgentSpec::new(settings.clone()).with_id("a-1"))
            .await
            .unwrap_err(),
        tiller::SpawnError::IdTaken("a-1".into())
    );
    let found = {
        let supervisor = supervisor.clone();
        std::thread::spawn(move || supervisor.find("planner").map(|h| h.id().clone()))
            .join()
            .unwrap()
    };
    assert_eq!(found.as_ref().map(|id| id.as_str()), Some("a-1"));
    assert_eq!(supervisor.get(&made_up).unwrap().id(), other.id());
    let listed: Vec<(String, Option<String>)> = supervisor
        .list()
        .into_iter()
        .map(|a| (a.id.to_string(), a.name))
        .collect();
    assert_eq!(
        listed,
        [
            (made_up.clone(), None),
            ("a-1".to_owned(), Some("planner".to_owned())),
        ]
    );
    assert!(supervisor.stop("a-1").await);
    assert!(supervisor.find("planner").is_none());
    assert!(matches!(
        named.state().await,
        Err(AgentError::Stopped { .. })
    ));
    assert!(matches!(
        named.prompt("hi").await,
        Err(AgentError::Stopped { .. })
    ));
}

#[tokio::test]
async fn subscribers_see_every_event_of_the_loop_in_order() {
    let (_supervisor, agent, faux) = agent(|s| s.with_tools(tools(vec![common::echo()]))).await;
    faux.push(FauxTurn::new().with_tool_call_id("c1", "echo", json!({"value": "v"})));
    faux.push(FauxTurn::text("done"));
    let mut events = agent.subscribe();
    agent.prompt("go").await.unwrap();
    let mut seen = Vec::new();
    let mut seqs = Vec::new();
    loop {
        let envelope = events.next().await.unwrap();
        assert_eq!(envelope.agent_id, *agent.id());
        seqs.push(envelope.seq);
        let Delivered::Event(event) = &envelope.event else {
            panic!("{envelope:?}")
        };
        seen.push(
            serde_json::to_value(event).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        if is_agent_end(&envelope) {
            break;
        }
    }
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        seen,
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
            "tool_execution_start",
            "tool_execution_end",
            "message_start",
            "message_end",
            "turn_end",
            "turn_start",
            "message_start",
            "message_update",
            "message_update",
            "message_update",
            "message_end",
            "turn_end",
            "agent_end",
        ]
    );
    let json = serde_json::to_value(&*events_last(&agent).await).unwrap();
    assert_eq!(json["agent_id"], agent.id().as_str());
}

/// A fresh subscription's view of one more short run's last envelope.
async fn events_last(agent: &tiller::AgentHandle) -> Arc<tiller::Envelope> {
    let mut events = agent.subscribe();
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("bye"));
    let model = faux.model();
    agent
        .update_settings(move |s| s.definition.model = Some(model))
        .await
        .unwrap();
    agent.prompt("bye").await.unwrap();
    until(&mut events, is_agent_end).await
}
