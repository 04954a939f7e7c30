//! What the outside cannot do to a run: a hook, resolver or transform that never
//! returns cannot outlive an abort; a failed or aborted response still answers its
//! tool calls; no queue is drained after an abort; a chatty tool's output is cut; a
//! dropped tool cannot report after its call was answered.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    assert_valid, collect, config, context, describe, end_reason, lines, result_text, value_schema,
};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_core::{
    AgentEvent, AgentMessage, AgentTool, BeforeToolCall, FnTool, LoopConfig, Prompt, RunEnd,
    ToolContext, ToolOutput, agent_loop, run_loop,
};
use tokio_util::sync::CancellationToken;

fn noop() -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        "noop",
        "Does nothing",
        value_schema(),
        |_args, _ctx| async { Ok(ToolOutput::text("done")) },
    ))
}

/// Runs `config` on a prompt, aborting at the first event `trigger` matches.
async fn abort_when(
    config: LoopConfig,
    tools: Vec<Arc<dyn AgentTool>>,
    trigger: impl Fn(&AgentEvent) -> bool,
) -> (Vec<AgentEvent>, Vec<AgentMessage>) {
    let cancel = CancellationToken::new();
    let mut run = agent_loop(
        vec![AgentMessage::user("go")],
        context(tools, vec![]),
        config,
        cancel.clone(),
    );
    let mut events = Vec::new();
    while let Some(event) = run.next().await {
        if trigger(&event) {
            cancel.cancel();
        }
        events.push(event);
    }
    let messages = run.result().await;
    assert_valid(&messages);
    (events, messages)
}

#[tokio::test(start_paused = true)]
async fn a_before_tool_call_hook_that_never_returns_cannot_outlive_an_abort() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("noop", json!({"value": "x"})));
    let config = config(&faux).with_before_tool_call(|_info| async {
        futures::future::pending::<()>().await;
        Ok(BeforeToolCall::Proceed)
    });
    let (events, messages) = abort_when(config, vec![noop()], |event| {
        matches!(event, AgentEvent::ToolExecutionStart { .. })
    })
    .await;
    assert_eq!(end_reason(&events), RunEnd::Aborted);
    assert_eq!(
        result_text(&messages[2]),
        "Tool \"noop\" was aborted before it finished."
    );
}

#[tokio::test(start_paused = true)]
async fn a_transform_or_key_resolver_that_never_returns_cannot_outlive_an_abort() {
    let faux = FauxProvider::new();
    let hung_transform = config(&faux).with_transform_context(|_messages, _cancel| async {
        futures::future::pending::<()>().await;
        Ok(vec![])
    });
    let hung_resolver = config(&faux).with_api_key_resolver(|_provider| async {
        futures::future::pending::<()>().await;
        None
    });
    for config in [hung_transform, hung_resolver] {
        let (events, messages) = abort_when(config, vec![], |event| {
            matches!(event, AgentEvent::TurnStart)
        })
        .await;
        assert_eq!(end_reason(&events), RunEnd::Aborted);
        assert_eq!(common::roles(&messages), ["user", "assistant"]);
        assert_eq!(
            messages[1].as_assistant().unwrap().error_message.as_deref(),
            Some("the request was aborted")
        );
    }
}

#[tokio::test]
async fn a_failed_response_still_answers_its_tool_calls() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::tool_call("noop", json!({"value": "x"}))
            .with_tool_call("noop", json!({"value": "y"}))
            .fail("connection reset"),
    );
    let (events, messages) = collect(agent_loop(
        vec![AgentMessage::user("go")],
        context(vec![noop()], vec![]),
        config(&faux),
        Default::default(),
    ))
    .await;
    assert_eq!(end_reason(&events), RunEnd::Error);
    assert_eq!(
        common::roles(&messages),
        ["user", "assistant", "tool_result", "tool_result"]
    );
    assert_eq!(
        result_text(&messages[2]),
        "Tool call \"noop\" was not executed: the response failed (faux reported an error: connection reset)."
    );
    let tail: Vec<String> = describe(&events).into_iter().rev().take(10).rev().collect();
    assert_eq!(
        tail,
        lines(&[
            "tool_execution_start faux_call_1",
            "tool_execution_end faux_call_1 error",
            "message_start tool_result:faux_call_1",
            "message_end tool_result:faux_call_1",
            "tool_execution_start faux_call_2",
            "tool_execution_end faux_call_2 error",
            "message_start tool_result:faux_call_2",
            "message_end tool_result:faux_call_2",
            "turn_end Error [\"faux_call_1\", \"faux_call_2\"]",
            "agent_end Error 4",
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn no_queue_is_drained_after_an_abort() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("wait", json!({"value": "x"})));
    let queued = Arc::new(Mutex::new(vec![
        AgentMessage::user("steer"),
        AgentMessage::user("follow"),
    ]));
    let wait: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "wait",
        "Waits for the abort",
        value_schema(),
        |_args, ctx| async move {
            ctx.cancel().cancelled().await;
            Ok(ToolOutput::text("stopped"))
        },
    ));
    let source = |queued: &Arc<Mutex<Vec<AgentMessage>>>| {
        let queued = queued.clone();
        move || {
            let mut queued = queued.lock().unwrap();
            let one = queued.len().min(1);
            let taken: Vec<AgentMessage> = queued.drain(..one).collect();
            async move { taken }
        }
    };
    let mut config = config(&faux);
    config = config
        .with_steering(source(&queued))
        .with_follow_up(source(&queued));
    // The first read of steering, at the start, takes nothing yet.
    let first = queued.lock().unwrap().split_off(0);
    let refill = queued.clone();
    let (events, messages) = abort_when(config, vec![wait], move |event| {
        if matches!(event, AgentEvent::ToolExecutionStart { .. }) {
            refill.lock().unwrap().extend(first.clone());
            return true;
        }
        false
    })
    .await;
    assert_eq!(end_reason(&events), RunEnd::Aborted);
    assert_eq!(queued.lock().unwrap().len(), 2, "both messages stay queued");
    assert_eq!(
        common::roles(&messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
}

#[tokio::test]
async fn a_chatty_tools_output_is_cut_with_a_marker() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("chatty", json!({"value": "x"})));
    faux.push(FauxTurn::text("ok"));
    let chatty: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "chatty",
        "Talks a lot",
        value_schema(),
        |_args, _ctx| async { Ok(ToolOutput::text("é".repeat(150_000))) },
    ));
    let mut config = config(&faux);
    config.run.max_tool_output_bytes = 1001;
    let (_, messages) = collect(agent_loop(
        vec![AgentMessage::user("go")],
        context(vec![chatty], vec![]),
        config,
        Default::default(),
    ))
    .await;
    let text = result_text(&messages[2]);
    assert_eq!(
        text,
        format!(
            "{}[… 299000 more bytes cut: the output exceeded the limit of 1001 bytes]",
            "é".repeat(500)
        )
    );
}

/// Details count against the output limit too (an MCP server's structured
/// content arrives there): past it they are replaced by a note, in the event and
/// in the transcript alike.
#[tokio::test]
async fn a_tools_oversized_details_are_cut_with_a_note() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("structured", json!({"value": "x"})));
    faux.push(FauxTurn::text("ok"));
    let structured: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "structured",
        "Answers with a lot of structure",
        value_schema(),
        |_args, _ctx| async {
            Ok(ToolOutput {
                details: json!({"rows": vec!["row"; 100_000]}),
                ..ToolOutput::text("see the details")
            })
        },
    ));
    let mut config = config(&faux);
    config.run.max_tool_output_bytes = 1001;
    let (events, messages) = collect(agent_loop(
        vec![AgentMessage::user("go")],
        context(vec![structured], vec![]),
        config,
        Default::default(),
    ))
    .await;
    let cut = json!({"cut": "the details exceeded the limit of 1001 bytes"});
    assert_eq!(messages[2].as_tool_result().unwrap().details, cut);
    let ended = events
        .iter()
        .find_map(|event| match event {
            AgentEvent::ToolExecutionEnd { result, .. } => Some(result.details.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(ended, cut);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_tool_cannot_report_after_its_call_was_answered() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("stubborn", json!({"value": "x"})));
    let kept: Arc<Mutex<Option<ToolContext>>> = Arc::default();
    let slot = kept.clone();
    let cancel = CancellationToken::new();
    let abort = cancel.clone();
    let stubborn: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "stubborn",
        "Ignores aborts",
        value_schema(),
        move |_args, ctx| {
            *slot.lock().unwrap() = Some(ctx);
            abort.cancel();
            async {
                futures::future::pending::<()>().await;
                Ok(ToolOutput::text("never"))
            }
        },
    ));
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink_events = events.clone();
    let sink = Arc::new(move |event: AgentEvent| sink_events.lock().unwrap().push(event));
    let config = config(&faux);
    tokio::time::timeout(
        Duration::from_secs(60),
        run_loop(
            Prompt::Messages(vec![AgentMessage::user("go")]),
            context(vec![stubborn], vec![]),
            config,
            cancel,
            sink,
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let count = events.lock().unwrap().len();
    kept.lock()
        .unwrap()
        .as_ref()
        .unwrap()
        .update(ToolOutput::text("late"));
    assert_eq!(
        events.lock().unwrap().len(),
        count,
        "no event after agent_end"
    );
    assert!(matches!(
        events.lock().unwrap().last(),
        Some(AgentEvent::AgentEnd { .. })
    ));
}
