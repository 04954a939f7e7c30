//! The event contract, case by case as pi-agent-core's agent-loop tests specify it:
//! text replies, tool calls, parallel tools finishing out of order, steering in both
//! deliveries, follow-ups, context transforms, custom messages and `continue`.

#![allow(clippy::unwrap_used)]

mod common;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{
    collect, config, context, describe, echo, end_reason, label, lines, log, logged, prompt, roles,
    user_text, value_schema,
};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_ai::{AssistantMessage, Message, Model};
use tiller_core::{
    AgentEvent, AgentMessage, AgentTool, ContinueError, CustomMessage, FnTool, RunEnd,
    SteeringDelivery, ToolExecutionMode, ToolOutput, agent_loop, agent_loop_continue,
};
use tokio::sync::Notify;

#[tokio::test]
async fn a_text_reply() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hi there!"));
    let run = agent_loop(
        vec![AgentMessage::user("Hello")],
        context(vec![], vec![]),
        config(&faux),
        Default::default(),
    );
    let (events, messages) = collect(run).await;
    assert_eq!(
        describe(&events),
        lines(&[
            "agent_start",
            "turn_start",
            "message_start user:Hello",
            "message_end user:Hello",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 2",
        ])
    );
    assert_eq!(roles(&messages), ["user", "assistant"]);
    assert_eq!(messages[1].as_assistant().unwrap().text(), "Hi there!");
}

#[tokio::test]
async fn a_tool_call_and_its_result() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("tool-1", "echo", json!({"value": "hello"})));
    faux.push(FauxTurn::text("done"));
    let executed = log();
    let run = agent_loop(
        vec![AgentMessage::user("echo something")],
        context(vec![echo(&executed)], vec![]),
        config(&faux),
        Default::default(),
    );
    let (events, messages) = collect(run).await;
    assert_eq!(logged(&executed), ["hello"]);
    assert_eq!(
        describe(&events),
        lines(&[
            "agent_start",
            "turn_start",
            "message_start user:echo something",
            "message_end user:echo something",
            "message_start assistant",
            "message_update tool_call_start",
            "message_update tool_call_delta",
            "message_update tool_call_end",
            "message_end assistant",
            "tool_execution_start tool-1",
            "tool_execution_end tool-1",
            "message_start tool_result:tool-1",
            "message_end tool_result:tool-1",
            "turn_end ToolUse [\"tool-1\"]",
            "turn_start",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 4",
        ])
    );
    assert_eq!(
        roles(&messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
    let result = messages[2].as_tool_result().unwrap();
    assert_eq!(
        (result.is_error, &result.details),
        (false, &json!({"value": "hello"}))
    );
    let second = &faux.requests()[1].context;
    assert!(
        matches!(second.messages.last(), Some(Message::ToolResult(r)) if r.tool_call_id == "tool-1")
    );
}

/// Two tools that can only both finish if they run at the same time: the first
/// waits for the second.
fn gated_pair(order: &Arc<std::sync::Mutex<Vec<String>>>) -> Arc<dyn AgentTool> {
    let second_done = Arc::new(Notify::new());
    let order = order.clone();
    Arc::new(FnTool::new(
        "echo",
        "Echo tool",
        value_schema(),
        move |args, _ctx| {
            let (second_done, order) = (second_done.clone(), order.clone());
            async move {
                let value = args["value"].as_str().unwrap().to_owned();
                if value == "first" {
                    second_done.notified().await;
                } else {
                    second_done.notify_one();
                }
                order.lock().unwrap().push(value.clone());
                Ok(ToolOutput::text(value))
            }
        },
    ))
}

#[tokio::test]
async fn parallel_tools_end_as_they_finish_but_results_keep_call_order() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("tool-1", "echo", json!({"value": "first"}))
            .with_tool_call_id("tool-2", "echo", json!({"value": "second"})),
    );
    faux.push(FauxTurn::text("done"));
    let finished = log();
    let run = agent_loop(
        vec![AgentMessage::user("echo both")],
        context(vec![gated_pair(&finished)], vec![]),
        config(&faux),
        Default::default(),
    );
    let (events, messages) = collect(run).await;
    assert_eq!(logged(&finished), ["second", "first"]);
    let tool_events: Vec<String> = describe(&events)
        .into_iter()
        .filter(|e| {
            e.starts_with("tool_") || e.contains("tool_result") || e.starts_with("turn_end ToolUse")
        })
        .collect();
    assert_eq!(
        tool_events,
        lines(&[
            "tool_execution_start tool-1",
            "tool_execution_start tool-2",
            "tool_execution_end tool-2",
            "tool_execution_end tool-1",
            "message_start tool_result:tool-1",
            "message_end tool_result:tool-1",
            "message_start tool_result:tool-2",
            "message_end tool_result:tool-2",
            "turn_end ToolUse [\"tool-1\", \"tool-2\"]",
        ])
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
}

#[tokio::test]
async fn a_tool_that_must_run_alone_makes_the_turn_sequential() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("tool-1", "slow", json!({"value": "a"}))
            .with_tool_call_id("tool-2", "fast", json!({"value": "b"})),
    );
    faux.push(FauxTurn::text("done"));
    let order = log();
    let slow = {
        let order = order.clone();
        FnTool::new("slow", "Slow", value_schema(), move |_args, _ctx| {
            let order = order.clone();
            async move {
                order.lock().unwrap().push("slow:start".into());
                tokio::task::yield_now().await;
                order.lock().unwrap().push("slow:end".into());
                Ok(ToolOutput::text("slow"))
            }
        })
        .sequential()
    };
    let fast = {
        let order = order.clone();
        FnTool::new("fast", "Fast", value_schema(), move |_args, _ctx| {
            let order = order.clone();
            async move {
                order.lock().unwrap().push("fast".into());
                Ok(ToolOutput::text("fast"))
            }
        })
    };
    let tools: Vec<Arc<dyn AgentTool>> = vec![Arc::new(slow), Arc::new(fast)];
    let (events, _) = prompt("go", context(tools, vec![]), config(&faux)).await;
    assert_eq!(logged(&order), ["slow:start", "slow:end", "fast"]);
    let tool_events: Vec<String> = describe(&events)
        .into_iter()
        .filter(|e| e.starts_with("tool_"))
        .collect();
    assert_eq!(
        tool_events,
        lines(&[
            "tool_execution_start tool-1",
            "tool_execution_end tool-1",
            "tool_execution_start tool-2",
            "tool_execution_end tool-2"
        ])
    );
}

/// A message source that hands over `text` once, the first time `ready()` holds.
fn once(
    text: &str,
    ready: impl Fn() -> bool + Send + Sync + 'static,
) -> impl Fn() -> futures::future::Ready<Vec<AgentMessage>> + Send + Sync + 'static {
    let message = AgentMessage::user(text);
    let given = AtomicBool::new(false);
    move || {
        let deliver = ready() && !given.swap(true, Ordering::SeqCst);
        futures::future::ready(if deliver {
            vec![message.clone()]
        } else {
            vec![]
        })
    }
}

fn three_calls() -> FauxTurn {
    FauxTurn::new()
        .with_tool_call_id("tool-1", "echo", json!({"value": "first"}))
        .with_tool_call_id("tool-2", "echo", json!({"value": "second"}))
        .with_tool_call_id("tool-3", "echo", json!({"value": "third"}))
}

#[tokio::test]
async fn interrupting_steering_skips_the_calls_left() {
    let faux = FauxProvider::new();
    faux.push(three_calls());
    faux.push(FauxTurn::text("ok, stopping"));
    let executed = log();
    let ran = executed.clone();
    let mut config =
        config(&faux).with_steering(once("stop that", move || !logged(&ran).is_empty()));
    config.run.tool_execution = ToolExecutionMode::Sequential;
    let (events, messages) = prompt("start", context(vec![echo(&executed)], vec![]), config).await;
    assert_eq!(logged(&executed), ["first"]);
    let described = describe(&events);
    let from_tools = described
        .iter()
        .position(|e| e == "tool_execution_start tool-1")
        .unwrap();
    assert_eq!(
        described[from_tools..].to_vec(),
        lines(&[
            "tool_execution_start tool-1",
            "tool_execution_end tool-1",
            "message_start tool_result:tool-1",
            "message_end tool_result:tool-1",
            "tool_execution_start tool-2",
            "tool_execution_end tool-2 error",
            "message_start tool_result:tool-2",
            "message_end tool_result:tool-2",
            "tool_execution_start tool-3",
            "tool_execution_end tool-3 error",
            "message_start tool_result:tool-3",
            "message_end tool_result:tool-3",
            "turn_end ToolUse [\"tool-1\", \"tool-2\", \"tool-3\"]",
            "turn_start",
            "message_start user:stop that",
            "message_end user:stop that",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 7",
        ])
    );
    for skipped in &messages[3..5] {
        assert_eq!(
            common::result_text(skipped),
            "Skipped due to queued user message."
        );
    }
    let second_request = &faux.requests()[1].context;
    assert!(
        matches!(second_request.messages.last(), Some(Message::User(_))),
        "the steering reached the model"
    );
}

#[tokio::test]
async fn interrupting_steering_cancels_parallel_calls_still_running() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("tool-1", "quick", json!({}))
            .with_tool_call_id("tool-2", "waits", json!({})),
    );
    faux.push(FauxTurn::text("ok"));
    let saw_cancel = log();
    let quick_ran = log();
    let quick: Arc<dyn AgentTool> = {
        let quick_ran = quick_ran.clone();
        Arc::new(FnTool::new(
            "quick",
            "Quick",
            json!({"type": "object"}),
            move |_, _| {
                quick_ran.lock().unwrap().push("ran".into());
                async { Ok(ToolOutput::text("quick")) }
            },
        ))
    };
    let waits: Arc<dyn AgentTool> = {
        let saw_cancel = saw_cancel.clone();
        Arc::new(FnTool::new(
            "waits",
            "Waits for cancellation",
            json!({"type": "object"}),
            move |_, ctx| {
                let saw_cancel = saw_cancel.clone();
                async move {
                    ctx.cancel().cancelled().await;
                    saw_cancel.lock().unwrap().push("cancelled".into());
                    Err(tiller_core::ToolError::new("cancelled"))
                }
            },
        ))
    };
    let config = config(&faux).with_steering(once("change of plan", move || {
        !logged(&quick_ran).is_empty()
    }));
    let (events, messages) = prompt("go", context(vec![quick, waits], vec![]), config).await;
    assert_eq!(
        logged(&saw_cancel),
        ["cancelled"],
        "the running tool saw the cancellation"
    );
    assert_eq!(common::result_text(&messages[2]), "quick");
    assert_eq!(
        common::result_text(&messages[3]),
        "Skipped due to queued user message."
    );
    assert_eq!(user_text(&messages[4]).as_deref(), Some("change of plan"));
    assert_eq!(end_reason(&events), RunEnd::Completed);
}

#[tokio::test]
async fn steering_after_the_turn_lets_every_call_run() {
    let faux = FauxProvider::new();
    faux.push(three_calls());
    faux.push(FauxTurn::text("done"));
    let executed = log();
    let ran = executed.clone();
    let mut config =
        config(&faux).with_steering(once("interrupt", move || !logged(&ran).is_empty()));
    config.run.steering_delivery = SteeringDelivery::AfterTurn;
    config.run.tool_execution = ToolExecutionMode::Sequential;
    let (events, messages) = prompt("start", context(vec![echo(&executed)], vec![]), config).await;
    assert_eq!(logged(&executed), ["first", "second", "third"]);
    assert!(
        events
            .iter()
            .all(|e| !matches!(e, AgentEvent::ToolExecutionEnd { is_error: true, .. }))
    );
    let described = describe(&events);
    let turn_end = described
        .iter()
        .position(|e| e.starts_with("turn_end ToolUse"))
        .unwrap();
    assert_eq!(
        described[turn_end + 1..turn_end + 4].to_vec(),
        lines(&[
            "turn_start",
            "message_start user:interrupt",
            "message_end user:interrupt"
        ])
    );
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
}

#[tokio::test]
async fn follow_ups_start_a_new_turn_in_the_same_run() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("first answer"));
    faux.push(FauxTurn::text("second answer"));
    let follow_up = once("and one more thing", || true);
    let asked = Arc::new(AtomicUsize::new(0));
    let config = {
        let asked = asked.clone();
        config(&faux).with_follow_up(move || {
            asked.fetch_add(1, Ordering::SeqCst);
            follow_up()
        })
    };
    let (events, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(
        describe(&events),
        lines(&[
            "agent_start",
            "turn_start",
            "message_start user:hi",
            "message_end user:hi",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "turn_start",
            "message_start user:and one more thing",
            "message_end user:and one more thing",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 4",
        ])
    );
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "asked once per time the agent would stop"
    );
    assert_eq!(messages[3].as_assistant().unwrap().text(), "second answer");
}

#[tokio::test]
async fn steering_queued_before_the_run_joins_the_first_turn() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("answer"));
    let config = config(&faux).with_steering(once("also this", || true));
    let (events, _) = prompt("question", context(vec![], vec![]), config).await;
    assert_eq!(
        describe(&events)[..7].to_vec(),
        lines(&[
            "agent_start",
            "turn_start",
            "message_start user:question",
            "message_end user:question",
            "message_start user:also this",
            "message_end user:also this",
            "message_start assistant",
        ])
    );
    let sent = &faux.requests()[0].context.messages;
    assert_eq!(sent.len(), 2);
}

#[tokio::test]
async fn custom_messages_stay_in_the_transcript_but_not_in_the_request() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Response"));
    let notification = AgentMessage::from(CustomMessage::new(
        "notification",
        json!({"text": "This is a notification"}),
    ));
    let run = agent_loop(
        vec![AgentMessage::user("Hello")],
        context(vec![], vec![notification]),
        config(&faux),
        Default::default(),
    );
    let (_, messages) = collect(run).await;
    assert_eq!(roles(&messages), ["user", "assistant"]);
    let sent = &faux.requests()[0].context.messages;
    assert_eq!(sent.len(), 1, "only the user message: {sent:?}");
}

#[tokio::test]
async fn transform_context_runs_before_convert_to_llm_and_keeps_the_history() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Response"));
    let model = Model::openai_compatible("http://unused/v1", "m");
    let old_reply = |text: &str| {
        let mut reply = AssistantMessage::empty(&model);
        reply.content.push(tiller_ai::AssistantContent::Text(
            tiller_ai::TextContent::new(text),
        ));
        AgentMessage::from(reply)
    };
    let history = vec![
        AgentMessage::user("old message 1"),
        old_reply("old response 1"),
        AgentMessage::user("old message 2"),
        old_reply("old response 2"),
    ];
    let transformed = Arc::new(AtomicUsize::new(0));
    let converted = Arc::new(AtomicUsize::new(0));
    let config = {
        let (transformed, converted) = (transformed.clone(), converted.clone());
        config(&faux)
            .with_transform_context(move |messages, _cancel| {
                let kept = messages[messages.len() - 2..].to_vec();
                transformed.store(kept.len(), Ordering::SeqCst);
                async move { Ok(kept) }
            })
            .with_convert_to_llm(move |messages| {
                converted.store(messages.len(), Ordering::SeqCst);
                messages
                    .iter()
                    .filter_map(|m| m.as_llm().map(Cow::Borrowed))
                    .collect()
            })
    };
    let (_, messages) = prompt("new message", context(vec![], history), config).await;
    assert_eq!(
        (
            transformed.load(Ordering::SeqCst),
            converted.load(Ordering::SeqCst)
        ),
        (2, 2)
    );
    let sent = &faux.requests()[0].context.messages;
    assert_eq!(sent.len(), 2);
    assert!(matches!(&sent[1], Message::User(_)));
    assert_eq!(
        roles(&messages),
        ["user", "assistant"],
        "the run's new messages; the history is untouched"
    );
}

#[tokio::test]
async fn continue_refuses_an_empty_context_and_an_assistant_tail() {
    let faux = FauxProvider::new();
    assert_eq!(
        agent_loop_continue(context(vec![], vec![]), config(&faux), Default::default()).err(),
        Some(ContinueError::EmptyContext)
    );
    let reply = AgentMessage::from(AssistantMessage::empty(&faux.model()));
    assert_eq!(
        agent_loop_continue(
            context(vec![], vec![AgentMessage::user("hi"), reply]),
            config(&faux),
            Default::default()
        )
        .err(),
        Some(ContinueError::EndsWithAssistant)
    );
    assert!(faux.requests().is_empty());
}

#[tokio::test]
async fn continue_emits_no_events_for_existing_messages() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Response"));
    let run = agent_loop_continue(
        context(vec![], vec![AgentMessage::user("Hello")]),
        config(&faux),
        Default::default(),
    )
    .unwrap();
    let (events, messages) = collect(run).await;
    let ends: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::MessageEnd { message } => Some(label(message)),
            _ => None,
        })
        .collect();
    assert_eq!(ends, ["assistant"]);
    assert_eq!(roles(&messages), ["assistant"]);
    assert_eq!(
        describe(&events)[..3].to_vec(),
        lines(&["agent_start", "turn_start", "message_start assistant"])
    );
}

#[tokio::test]
async fn continue_from_a_custom_message_the_converter_turns_into_a_user_message() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Response to custom message"));
    let hook = AgentMessage::from(CustomMessage::new("hook", json!({"text": "Hook content"})));
    let config = config(&faux).with_convert_to_llm(|messages| {
        messages
            .iter()
            .map(|m| match m {
                AgentMessage::Custom(custom) => Cow::Owned(Message::user(
                    custom.payload["text"].as_str().unwrap_or_default(),
                )),
                AgentMessage::Llm(message) => Cow::Borrowed(message),
            })
            .collect()
    });
    let run = agent_loop_continue(context(vec![], vec![hook]), config, Default::default()).unwrap();
    let (_, messages) = collect(run).await;
    assert_eq!(roles(&messages), ["assistant"]);
    let sent = &faux.requests()[0];
    assert_eq!(sent.last_user_text().as_deref(), Some("Hook content"));
}

#[tokio::test]
async fn tools_report_progress_between_start_and_end() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("tool-1", "count", json!({"to": 2})));
    faux.push(FauxTurn::text("counted"));
    let count: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "count",
        "Counts",
        json!({"type": "object", "properties": {"to": {"type": "integer"}}}),
        |_, ctx| async move {
            for n in 1..=2 {
                ctx.update(ToolOutput::text(n.to_string()));
            }
            Ok(ToolOutput::text("2"))
        },
    ));
    let (events, _) = prompt("count", context(vec![count], vec![]), config(&faux)).await;
    let tool_events: Vec<String> = describe(&events)
        .into_iter()
        .filter(|e| e.starts_with("tool_"))
        .collect();
    assert_eq!(
        tool_events,
        lines(&[
            "tool_execution_start tool-1",
            "tool_execution_update tool-1 1",
            "tool_execution_update tool-1 2",
            "tool_execution_end tool-1"
        ])
    );
    // Each update carries the call's arguments, as pi's clients read them.
    let args: Vec<&serde_json::Value> = events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::ToolExecutionUpdate { args, .. } => Some(&**args),
            _ => None,
        })
        .collect();
    assert_eq!(args, [&json!({"to": 2}), &json!({"to": 2})]);
}

#[tokio::test(start_paused = true)]
async fn message_updates_stream_while_the_model_is_still_answering() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::text("one two three")
            .chunk_size(4)
            .delay(Duration::from_millis(50)),
    );
    let mut run = agent_loop(
        vec![AgentMessage::user("count")],
        context(vec![], vec![]),
        config(&faux),
        Default::default(),
    );
    let started = tokio::time::Instant::now();
    let mut first_delta_at = None;
    while let Some(event) = futures::StreamExt::next(&mut run).await {
        if matches!(event, AgentEvent::MessageUpdate { .. }) && first_delta_at.is_none() {
            first_delta_at = Some(started.elapsed());
        }
    }
    assert_eq!(
        first_delta_at,
        Some(Duration::ZERO),
        "text_start arrives before any delay"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(200),
        "four chunks, one delay each"
    );
}

/// A call's `tool_execution_start` carries what interfaces show: the tool's label,
/// or the name the model used when the tool has none or does not exist.
#[tokio::test]
async fn a_calls_start_carries_the_tools_label() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("t1", "lookup", json!({}))
            .with_tool_call_id("t2", "plain", json!({}))
            .with_tool_call_id("t3", "missing", json!({})),
    );
    faux.push(FauxTurn::text("done"));
    let tool = |name: &str| {
        FnTool::new(name, "A tool", json!({"type": "object"}), |_, _| async {
            Ok(ToolOutput::text("ok"))
        })
    };
    let tools: Vec<Arc<dyn AgentTool>> = vec![
        Arc::new(tool("lookup").with_label("Looking it up")),
        Arc::new(tool("plain")),
    ];
    let run = agent_loop(
        vec![AgentMessage::user("go")],
        context(tools, vec![]),
        config(&faux),
        Default::default(),
    );
    let (events, _) = collect(run).await;
    let labels: Vec<(&str, &str)> = events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::ToolExecutionStart {
                tool_name, label, ..
            } => Some((tool_name.as_str(), label.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        labels,
        [
            ("lookup", "Looking it up"),
            ("plain", "plain"),
            ("missing", "missing")
        ]
    );
}

/// Each `message_update` carries the response as it stands after its event, the
/// last one with the whole text; `message_end` has the same blocks.
#[tokio::test]
async fn each_update_carries_the_response_as_it_stands() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("one two three").chunk_size(4));
    let run = agent_loop(
        vec![AgentMessage::user("count")],
        context(vec![], vec![]),
        config(&faux),
        Default::default(),
    );
    let (events, messages) = collect(run).await;
    let texts: Vec<String> = events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::MessageUpdate { message, .. } => Some(message.get().text()),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts,
        [
            "",
            "one ",
            "one two ",
            "one two thre",
            "one two three",
            "one two three"
        ]
    );
    let Some(AgentEvent::MessageUpdate { message, .. }) = events
        .iter()
        .rfind(|event| matches!(event, AgentEvent::MessageUpdate { .. }))
    else {
        panic!("no update")
    };
    // The blocks are the final message's; usage and stop reason come with `done`.
    assert_eq!(
        message.get().content,
        messages[1].as_assistant().unwrap().content
    );
}
