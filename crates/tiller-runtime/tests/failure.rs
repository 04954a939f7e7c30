//! When an agent's actor fails mid-run, nothing is lost and the transcript stays
//! valid: a message the loop took from a queue is either in the transcript or back at
//! the front of its queue, and tool calls left without results are answered.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{
    agent, assert_valid, echo, idle, is_agent_end, is_restart, roles, tool_started, tools, until,
};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::FauxTurn;
use tiller::{AgentMessage, AgentTool, FnTool, ToolOutput, run::ToolExecutionMode};
use tokio::sync::Notify;

/// An `on_message` hook that panics, once, on the first message `breaks` matches.
fn breaking_once(
    breaks: impl Fn(&AgentMessage) -> bool + Send + Sync + 'static,
) -> tiller::runtime::OnMessage {
    let broke = AtomicBool::new(false);
    Arc::new(
        move |_: &tiller::runtime::AgentId, message: &AgentMessage| {
            if breaks(message) && !broke.swap(true, Ordering::SeqCst) {
                panic!("the persistence hook broke");
            }
        },
    )
}

/// A tool that returns once `gate` is notified.
fn gated(gate: &Arc<Notify>) -> Arc<dyn AgentTool> {
    let gate = gate.clone();
    Arc::new(FnTool::new(
        "gate",
        "Waits",
        json!({"type": "object"}),
        move |_, _| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok(ToolOutput::text("opened"))
            }
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steering_message_the_loop_took_is_queued_again_when_the_actor_fails() {
    let gate = Arc::new(Notify::new());
    // The second call's result is announced after the loop took the steering
    // message (sequential calls: steering is read between them), so the actor fails
    // while that message is taken but not yet in the transcript.
    let hooks = breaking_once(|message| {
        message
            .as_tool_result()
            .is_some_and(|result| result.tool_call_id == "faux_call_2")
    });
    let (_supervisor, agent, faux) = agent(|s| {
        let mut settings = s
            .with_tools(tools(vec![gated(&gate), echo()]))
            .with_on_message(hooks);
        settings.definition.run.tool_execution = ToolExecutionMode::Sequential;
        settings
    })
    .await;
    faux.push(FauxTurn::tool_call("gate", json!({})).with_tool_call("echo", json!({"value": "b"})));
    faux.push(FauxTurn::text("steered"));
    let mut events = agent.subscribe();
    agent.prompt("go").await.unwrap();
    until(&mut events, tool_started("faux_call_1")).await;
    agent.steer("change of plan").await.unwrap();
    gate.notify_one();
    until(&mut events, is_restart).await;
    idle(&agent).await;

    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant", "tool_result", "tool_result"]
    );
    assert_valid(&state.messages);
    assert!(
        agent.has_queued_messages().await.unwrap(),
        "the taken message is queued again"
    );

    agent.prompt(tiller::Prompt::Continue).await.unwrap();
    until(&mut events, is_agent_end).await;
    let state = agent.state().await.unwrap();
    assert_valid(&state.messages);
    assert_eq!(
        roles(&state.messages[4..]),
        ["user", "assistant"],
        "delivered in the next run"
    );
    let steering = serde_json::to_value(&state.messages[4]).unwrap();
    assert_eq!(steering["content"][0]["text"], "change of plan");
    assert!(!agent.has_queued_messages().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_left_open_by_a_failure_are_answered() {
    let hooks = breaking_once(|message| {
        message
            .as_assistant()
            .is_some_and(|assistant| assistant.tool_calls().next().is_some())
    });
    let (_supervisor, agent, faux) =
        agent(|s| s.with_tools(tools(vec![echo()])).with_on_message(hooks)).await;
    faux.push(FauxTurn::tool_call("echo", json!({"value": "a"})));
    let mut events = agent.subscribe();
    agent.prompt("go").await.unwrap();
    until(&mut events, is_restart).await;
    idle(&agent).await;
    let state = agent.state().await.unwrap();
    assert_valid(&state.messages);
    assert_eq!(roles(&state.messages), ["user", "assistant", "tool_result"]);
    let result = state.messages[2].as_tool_result().unwrap();
    assert!(result.is_error);
    assert_eq!(
        result.text_content(),
        "Tool call \"echo\" was interrupted: the agent stopped before it finished and was brought back from its session."
    );
}
