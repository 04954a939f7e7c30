//! Abort: the response stops with stop reason `aborted`, running tools see the
//! cancellation, no tool starts after it, and every call still gets a result.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    collect, config, context, describe, end_reason, lines, log, logged, result_text, roles,
    value_schema,
};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::StopReason;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_core::{
    AgentEvent, AgentMessage, AgentTool, FnTool, RunEnd, ToolError, ToolExecutionMode, ToolOutput,
    agent_loop,
};
use tokio_util::sync::CancellationToken;

/// Reads a run to its end, cancelling when `trigger` first matches an event.
async fn run_cancelling(
    run: tiller_core::AgentLoop,
    cancel: &CancellationToken,
    trigger: impl Fn(&AgentEvent) -> bool,
) -> (Vec<AgentEvent>, Vec<AgentMessage>) {
    let mut run = run;
    let mut events = Vec::new();
    while let Some(event) = run.next().await {
        if trigger(&event) {
            cancel.cancel();
        }
        events.push(event);
    }
    let Some(AgentEvent::AgentEnd { messages, .. }) = events.last().cloned() else {
        panic!("no agent_end: {events:#?}");
    };
    common::assert_valid(&messages);
    (events, messages)
}

#[tokio::test(start_paused = true)]
async fn abort_while_the_model_streams() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::text("Once upon a time, far away")
            .chunk_size(5)
            .delay(Duration::from_secs(1)),
    );
    let cancel = CancellationToken::new();
    let run = agent_loop(
        vec![AgentMessage::user("story")],
        context(vec![], vec![]),
        config(&faux),
        cancel.clone(),
    );
    let (events, messages) = run_cancelling(run, &cancel, |e| {
        matches!(
            e,
            AgentEvent::MessageUpdate {
                assistant_message_event: tiller_ai::AssistantEvent::TextDelta { .. },
                ..
            }
        )
    })
    .await;
    assert_eq!(
        describe(&events)[4..].to_vec(),
        lines(&[
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_end assistant",
            "turn_end Aborted []",
            "agent_end Aborted 2",
        ])
    );
    let reply = messages[1].as_assistant().unwrap();
    assert_eq!(
        (reply.stop_reason, reply.text().as_str()),
        (StopReason::Aborted, "Once ")
    );
}

#[tokio::test(start_paused = true)]
async fn abort_during_a_slow_tool_stops_it_and_starts_nothing_after() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("tool-1", "slow", json!({"value": "a"}))
            .with_tool_call_id("tool-2", "slow", json!({"value": "b"})),
    );
    let seen = log();
    let slow: Arc<dyn AgentTool> = {
        let seen = seen.clone();
        Arc::new(FnTool::new(
            "slow",
            "Slow",
            value_schema(),
            move |args, ctx| {
                let seen = seen.clone();
                async move {
                    let value = args["value"].as_str().unwrap().to_owned();
                    seen.lock().unwrap().push(format!("{value}:started"));
                    tokio::select! {
                        () = ctx.cancel().cancelled() => {
                            seen.lock().unwrap().push(format!("{value}:saw the cancellation"));
                            Err(ToolError::new("stopped early"))
                        }
                        () = tokio::time::sleep(Duration::from_secs(3600)) => Ok(ToolOutput::text("finished")),
                    }
                }
            },
        ))
    };
    let cancel = CancellationToken::new();
    let mut config = config(&faux);
    config.run.tool_execution = ToolExecutionMode::Sequential;
    let run = agent_loop(
        vec![AgentMessage::user("go")],
        context(vec![slow], vec![]),
        config,
        cancel.clone(),
    );
    let (events, messages) = run_cancelling(run, &cancel, |e| matches!(e, AgentEvent::ToolExecutionStart { tool_call_id, .. } if tool_call_id == "tool-1")).await;
    assert_eq!(
        logged(&seen),
        ["a:started", "a:saw the cancellation"],
        "the second tool never started"
    );
    assert_eq!(
        roles(&messages),
        [
            "user",
            "assistant",
            "tool_result",
            "tool_result",
            "assistant"
        ]
    );
    assert_eq!(result_text(&messages[2]), "stopped early");
    assert_eq!(
        result_text(&messages[3]),
        "Tool \"slow\" was not executed: the run was aborted."
    );
    assert_eq!(
        messages[4].as_assistant().unwrap().stop_reason,
        StopReason::Aborted
    );
    assert_eq!(
        describe(&events)[describe(&events).len() - 6..].to_vec(),
        lines(&[
            "turn_end ToolUse [\"tool-1\", \"tool-2\"]",
            "turn_start",
            "message_start assistant",
            "message_end assistant",
            "turn_end Aborted []",
            "agent_end Aborted 5",
        ])
    );
    assert_eq!(faux.requests().len(), 1, "the model is not asked again");
}

#[tokio::test(start_paused = true)]
async fn abort_during_a_parallel_batch_answers_every_call() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("polite", "polite", json!({}))
            .with_tool_call_id("stubborn", "stubborn", json!({})),
    );
    let polite: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "polite",
        "Stops when asked",
        json!({"type": "object"}),
        |_, ctx| async move {
            ctx.cancel().cancelled().await;
            Err(ToolError::new("stopped as asked"))
        },
    ));
    let stubborn: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "stubborn",
        "Ignores cancellation",
        json!({"type": "object"}),
        |_, _| async {
            futures::future::pending::<()>().await;
            Ok(ToolOutput::text("never"))
        },
    ));
    let cancel = CancellationToken::new();
    let run = agent_loop(
        vec![AgentMessage::user("go")],
        context(vec![polite, stubborn], vec![]),
        config(&faux),
        cancel.clone(),
    );
    let started = tokio::time::Instant::now();
    let (events, messages) = run_cancelling(run, &cancel, |e| matches!(e, AgentEvent::ToolExecutionStart { tool_call_id, .. } if tool_call_id == "stubborn")).await;
    assert_eq!(result_text(&messages[2]), "stopped as asked");
    assert_eq!(
        result_text(&messages[3]),
        "Tool \"stubborn\" was aborted before it finished."
    );
    assert_eq!(end_reason(&events), RunEnd::Aborted);
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(100),
        "the stubborn tool got the grace period, no more"
    );
}

#[tokio::test]
async fn a_run_cancelled_before_it_starts_never_calls_the_model() {
    let faux = FauxProvider::new();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let (events, messages) = collect(agent_loop(
        vec![AgentMessage::user("hi")],
        context(vec![], vec![]),
        config(&faux),
        cancel,
    ))
    .await;
    assert_eq!(
        describe(&events),
        lines(&[
            "agent_start",
            "turn_start",
            "message_start user:hi",
            "message_end user:hi",
            "message_start assistant",
            "message_end assistant",
            "turn_end Aborted []",
            "agent_end Aborted 2",
        ])
    );
    assert_eq!(
        messages[1].as_assistant().unwrap().error_message.as_deref(),
        Some("the request was aborted")
    );
    assert!(faux.requests().is_empty());
}
