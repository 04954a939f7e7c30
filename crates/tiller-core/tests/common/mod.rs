//! Helpers for the loop tests: tools that record what they did, and a compact
//! rendering of events so whole sequences can be compared exactly.

#![allow(dead_code, clippy::unwrap_used)]

// The shared kit; each test uses some of it.
#[allow(unused_imports)]
pub(crate) use tiller_test_support::events::{describe, end_reason, lines};
#[allow(unused_imports)]
pub(crate) use tiller_test_support::tools::{echo, log, logged, value_schema};
#[allow(unused_imports)]
pub(crate) use tiller_test_support::transcript::{
    assert_valid, label, result_text, roles, user_text,
};

use std::sync::Arc;

use futures::StreamExt;
use tiller_ai::faux::FauxProvider;
use tiller_core::{
    AgentEvent, AgentLoop, AgentMessage, AgentTool, LoopConfig, LoopContext, ToolSet, agent_loop,
};

/// Every event of a run and the messages it returned.
pub(crate) async fn collect(mut run: AgentLoop) -> (Vec<AgentEvent>, Vec<AgentMessage>) {
    let mut events = Vec::new();
    while let Some(event) = run.next().await {
        events.push(event);
    }
    let AgentEvent::AgentEnd { messages, .. } = events.last().cloned().unwrap() else {
        panic!("the run did not end with agent_end: {events:#?}");
    };
    assert_eq!(
        run.result().await,
        messages,
        "result() returns agent_end's messages"
    );
    assert_valid(&messages);
    (events, messages)
}

/// Runs the loop on one user prompt to the end: its events and new messages.
pub(crate) async fn prompt(
    text: &str,
    context: LoopContext,
    config: LoopConfig,
) -> (Vec<AgentEvent>, Vec<AgentMessage>) {
    collect(agent_loop(
        vec![AgentMessage::user(text)],
        context,
        config,
        Default::default(),
    ))
    .await
}

/// A context with these tools and messages.
pub(crate) fn context(tools: Vec<Arc<dyn AgentTool>>, messages: Vec<AgentMessage>) -> LoopContext {
    LoopContext {
        system_prompt: Some("You are helpful.".into()),
        messages,
        tools: ToolSet::new(tools).unwrap(),
        ..LoopContext::default()
    }
}

/// A config for a faux model.
pub(crate) fn config(faux: &FauxProvider) -> LoopConfig {
    LoopConfig::new(faux.model())
}
