//! The agent is its actor: a host's own ractor actor drives an agent with the
//! public messages, and requests racing a failure are either handled by the
//! restarted actor or refused, never lost after being acknowledged.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{agent, endless, idle, is_agent_end, is_restart, until};
use pretty_assertions::assert_eq;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tiller::faux::FauxTurn;
use tiller::{AgentError, AgentMessage, Op, Prompt, RunEnd, runtime::AgentMsg};

/// A host actor that turns its own messages into the agent's.
struct Host;

enum HostMsg {
    Ask(String),
    Stop,
}

impl Actor for Host {
    type Msg = HostMsg;
    type State = ActorRef<AgentMsg>;
    type Arguments = ActorRef<AgentMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<HostMsg>,
        agent: ActorRef<AgentMsg>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(agent)
    }

    async fn handle(
        &self,
        _myself: ActorRef<HostMsg>,
        message: HostMsg,
        agent: &mut ActorRef<AgentMsg>,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            HostMsg::Ask(text) => {
                let accepted = ractor::call_t!(
                    agent,
                    |reply| AgentMsg::submit(Op::from(Prompt::from(text)), reply),
                    1000
                )?;
                accepted?;
            }
            HostMsg::Stop => agent.cast(AgentMsg::from(Op::Abort))?,
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_host_actor_prompts_and_aborts_an_agent_with_its_messages() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(endless());
    let mut events = agent.subscribe();
    let (host, _) = Actor::spawn(None, Host, agent.actor().await.unwrap())
        .await
        .unwrap();
    host.cast(HostMsg::Ask("take your time".into())).unwrap();
    host.cast(HostMsg::Stop).unwrap();
    let end = until(&mut events, is_agent_end).await;
    let tiller::Delivered::Event(tiller::AgentEvent::AgentEnd { reason, .. }) = &end.event else {
        unreachable!()
    };
    assert_eq!(*reason, RunEnd::Aborted);
    let state = ractor::call_t!(agent.actor().await.unwrap(), AgentMsg::State, 1000).unwrap();
    assert_eq!(common::roles(&state.messages), ["user", "assistant"]);
    host.stop(None);
}

/// Steering sent without pause while the agent fails and restarts: every steer
/// acknowledged is in the transcript or the queue exactly once, in order; every
/// refused one (`Failed`: it was in the failed actor's mailbox) is nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_racing_a_restart_are_kept_or_refused_never_lost() {
    let broke = Arc::new(AtomicBool::new(false));
    let hooks = common::panicking_once(&broke);
    let (_supervisor, agent, faux) = agent(|s| {
        let mut settings = s.with_on_message(hooks);
        // Room for every steer: the bound is not what this test is about.
        settings.definition.queue_limits.max_messages = 1_000;
        settings
    })
    .await;
    faux.push(FauxTurn::text("first"));
    let mut events = agent.subscribe();
    agent.prompt("go").await.unwrap();
    let mut acknowledged = Vec::new();
    for n in 0..300 {
        let text = format!("steer {n}");
        match agent.steer(text.as_str()).await {
            Ok(()) => acknowledged.push(text),
            Err(AgentError::Failed { .. }) => {}
            Err(other) => panic!("unexpected {other}"),
        }
    }
    until(&mut events, is_restart).await;
    idle(&agent).await;
    assert!(broke.load(Ordering::SeqCst));

    let state = agent.state().await.unwrap();
    let text = |message: &AgentMessage| {
        message
            .as_user()
            .map(|user| serde_json::to_value(user).unwrap()["content"][0]["text"].clone())
            .and_then(|text| text.as_str().map(str::to_owned))
    };
    let seen: Vec<String> = state
        .messages
        .iter()
        .chain(&state.steering_queue)
        .filter_map(text)
        .filter(|text| text.starts_with("steer "))
        .collect();
    assert_eq!(seen, acknowledged);
    assert!(acknowledged.len() > 250, "most steers were acknowledged");
}
