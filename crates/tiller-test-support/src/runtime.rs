//! Fixtures for tests of the runtime: an agent on a faux model, waiting for an
//! event or for idleness (with a deadline, never a sleep), and the predicates
//! tests wait with.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_core::{AgentEvent, AgentMessage};
use tiller_runtime::{
    AgentHandle, AgentId, AgentSettings, AgentSpec, Delivered, Envelope, Notice, OnMessage,
    Subscription, Supervisor,
};

use crate::transcript::assert_valid;

/// A supervisor and one agent on a faux model, its settings made by `settings`.
pub async fn agent(
    settings: impl FnOnce(AgentSettings) -> AgentSettings,
) -> (Supervisor, AgentHandle, FauxProvider) {
    let faux = FauxProvider::new();
    let supervisor = Supervisor::start().await.unwrap();
    let handle = supervisor
        .spawn(AgentSpec::new(settings(AgentSettings::new(faux.model()))))
        .await
        .unwrap();
    (supervisor, handle, faux)
}

/// A turn that waits an hour before streaming (to be aborted).
pub fn endless() -> FauxTurn {
    FauxTurn::text("this will take a while").delay(Duration::from_secs(3600))
}

/// Reads `subscription` until an envelope matches; fails after ten seconds. Every
/// run's messages seen on the way (in `agent_end`) must keep the transcript rule.
pub async fn until(
    subscription: &mut Subscription,
    found: impl Fn(&Envelope) -> bool,
) -> Arc<Envelope> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let envelope = subscription.next().await.expect("the subscription ended");
            if let Delivered::Event(AgentEvent::AgentEnd { messages, .. }) = &envelope.event {
                assert_valid(messages);
            }
            if found(&envelope) {
                return envelope;
            }
        }
    })
    .await
    .expect("the awaited event never came")
}

/// The roles of the messages of the next `runs` runs' `agent_end`s, checking on
/// the way that the events are numbered without a gap.
pub async fn run_ends(subscription: &mut Subscription, runs: usize) -> Vec<Vec<&'static str>> {
    let mut ends = Vec::new();
    let mut last_seq = None;
    while ends.len() < runs {
        let envelope = subscription.next().await.expect("the subscription ended");
        if let Some(last) = last_seq {
            assert_eq!(envelope.seq, last + 1, "a gap in the events' numbers");
        }
        last_seq = Some(envelope.seq);
        if let Delivered::Event(AgentEvent::AgentEnd { messages, .. }) = &envelope.event {
            ends.push(crate::transcript::roles(messages));
        }
    }
    ends
}

/// Whether an envelope carries `agent_end`.
pub fn is_agent_end(envelope: &Envelope) -> bool {
    matches!(
        envelope.event,
        Delivered::Event(AgentEvent::AgentEnd { .. })
    )
}

/// Whether an envelope carries the start of the tool call `id`.
pub fn tool_started(id: &'static str) -> impl Fn(&Envelope) -> bool {
    move |envelope| matches!(&envelope.event, Delivered::Event(AgentEvent::ToolExecutionStart { tool_call_id, .. }) if tool_call_id == id)
}

/// Whether an envelope is the notice of a restart.
pub fn is_restart(envelope: &Envelope) -> bool {
    matches!(
        envelope.event,
        Delivered::Notice(Notice::AgentRestarted { .. })
    )
}

/// Waits for the agent to be idle; fails after ten seconds.
pub async fn idle(agent: &AgentHandle) {
    tokio::time::timeout(Duration::from_secs(10), agent.wait_for_idle())
        .await
        .expect("the agent never became idle");
}

/// The text of the last user message faux request number `request` ended with.
pub fn last_user(faux: &FauxProvider, request: usize) -> String {
    faux.requests()[request]
        .last_user_text()
        .unwrap_or_default()
}

/// An `on_message` hook that panics (failing the agent), once, at the first
/// assistant message; `panicked` says whether it has.
pub fn panicking_once(panicked: &Arc<AtomicBool>) -> OnMessage {
    let panicked = panicked.clone();
    Arc::new(move |_: &AgentId, message: &AgentMessage| {
        if message.as_assistant().is_some() && !panicked.swap(true, Ordering::SeqCst) {
            panic!("the persistence hook broke");
        }
    })
}
