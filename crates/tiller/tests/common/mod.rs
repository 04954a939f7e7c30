//! Helpers for the agent tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentEvent, AgentHandle, AgentMessage, AgentSettings, AgentSpec, AgentTool, Delivered,
    Envelope, FnTool, Notice, Subscription, Supervisor, ToolOutput, ToolSet,
};

/// A supervisor and one agent on a faux model.
pub(crate) async fn agent(
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
pub(crate) fn endless() -> FauxTurn {
    FauxTurn::text("this will take a while").delay(Duration::from_secs(3600))
}

/// Reads `subscription` until an envelope matches; fails after ten seconds. Every
/// run's messages seen on the way (in `agent_end`) must keep the transcript rule.
pub(crate) async fn until(
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

/// Asserts that every tool call in `messages` has exactly one result in place.
pub(crate) fn assert_valid(messages: &[AgentMessage]) {
    if let Err(error) = tiller::check_transcript(messages) {
        panic!("invalid transcript: {error}\n{messages:#?}");
    }
}

/// Whether an envelope carries `agent_end`.
pub(crate) fn is_agent_end(envelope: &Envelope) -> bool {
    matches!(
        envelope.event,
        Delivered::Event(AgentEvent::AgentEnd { .. })
    )
}

/// Whether an envelope carries the start of the tool call `id`.
pub(crate) fn tool_started(id: &'static str) -> impl Fn(&Envelope) -> bool {
    move |envelope| matches!(&envelope.event, Delivered::Event(AgentEvent::ToolExecutionStart { tool_call_id, .. }) if tool_call_id == id)
}

/// Whether an envelope is the given notice kind.
pub(crate) fn is_restart(envelope: &Envelope) -> bool {
    matches!(
        envelope.event,
        Delivered::Notice(Notice::AgentRestarted { .. })
    )
}

/// Waits for the agent to be idle; fails after ten seconds.
pub(crate) async fn idle(agent: &AgentHandle) {
    tokio::time::timeout(Duration::from_secs(10), agent.wait_for_idle())
        .await
        .expect("the agent never became idle");
}

/// The roles of a transcript.
pub(crate) fn roles(messages: &[AgentMessage]) -> Vec<&'static str> {
    messages.iter().map(AgentMessage::role).collect()
}

/// A tool that waits for its run to be cancelled, then says so.
pub(crate) fn patient() -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        "patient",
        "Waits to be cancelled",
        json!({"type": "object"}),
        |_, ctx| async move {
            ctx.cancel().cancelled().await;
            Err(tiller::ToolError::new("cancelled"))
        },
    ))
}

/// A tool that echoes `value`.
pub(crate) fn echo() -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        "echo",
        "Echo",
        json!({"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}),
        |args, _| async move { Ok(ToolOutput::text(args["value"].as_str().unwrap_or_default())) },
    ))
}

/// Tools as a set.
pub(crate) fn tools(tools: Vec<Arc<dyn AgentTool>>) -> ToolSet {
    ToolSet::new(tools).unwrap()
}

/// The text of the last user message a faux request ended with.
pub(crate) fn last_user(faux: &FauxProvider, request: usize) -> String {
    faux.requests()[request]
        .last_user_text()
        .unwrap_or_default()
}

/// An `on_message` hook that panics (failing the agent), once, at the first
/// assistant message; `panicked` says whether it has.
pub(crate) fn panicking_once(panicked: &Arc<std::sync::atomic::AtomicBool>) -> tiller::OnMessage {
    let panicked = panicked.clone();
    Arc::new(move |_: &tiller::AgentId, message: &AgentMessage| {
        if message.as_assistant().is_some()
            && !panicked.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("the persistence hook broke");
        }
    })
}
