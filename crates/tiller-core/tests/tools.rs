//! Tool calls done right: validated arguments, every failure an error result the
//! model reads (never the end of the run), hooks around each call, truncated calls
//! never run, and runs that stop when their tools say so.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{
    config, context, describe, echo, end_reason, lines, log, logged, prompt, result_text, roles,
    value_schema,
};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_ai::{Content, StopReason};
use tiller_core::{
    AfterToolCall, AgentEvent, AgentTool, BeforeToolCall, FnTool, RunEnd, ToolError, ToolOutput,
};

fn adder(log: &Arc<std::sync::Mutex<Vec<String>>>) -> Arc<dyn AgentTool> {
    let log = log.clone();
    Arc::new(FnTool::new(
        "add",
        "Add two integers",
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": false}),
        move |args, _ctx| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(args.to_string());
                Ok(ToolOutput::text(
                    (args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()).to_string(),
                ))
            }
        },
    ))
}

#[tokio::test]
async fn invalid_arguments_are_fed_back_and_the_corrected_call_runs() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("call-1", "add", json!({"a": "two", "c": 1})));
    faux.push(FauxTurn::new().with_tool_call_id("call-2", "add", json!({"a": 2, "b": "3"})));
    faux.push(FauxTurn::text("5"));
    let calls = log();
    let (events, messages) = prompt(
        "2 + 3?",
        context(vec![adder(&calls)], vec![]),
        config(&faux),
    )
    .await;
    assert_eq!(
        logged(&calls),
        ["{\"a\":2,\"b\":3}"],
        "only the corrected call ran, its \"3\" coerced"
    );
    assert_eq!(
        roles(&messages),
        [
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "tool_result",
            "assistant"
        ]
    );
    let failure = result_text(&messages[2]);
    assert!(
        failure.starts_with("Validation failed for tool \"add\":\n"),
        "{failure}"
    );
    for expected in [
        "  - /a: \"two\" is not of type \"integer\"",
        "  - root: \"b\" is a required property",
        "\nReceived arguments:\n{\n  \"a\": \"two\",\n  \"c\": 1\n}",
    ] {
        assert!(
            failure.contains(expected),
            "missing {expected:?} in {failure}"
        );
    }
    assert!(messages[2].as_tool_result().unwrap().is_error);
    assert_eq!(result_text(&messages[4]), "5");
    assert_eq!(end_reason(&events), RunEnd::Completed);
}

#[tokio::test]
async fn unknown_tools_failing_tools_and_panicking_tools_are_error_results() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("a", "nope", json!({}))
            .with_tool_call_id("b", "fails", json!({}))
            .with_tool_call_id("c", "panics", json!({}))
            .with_tool_call_id("d", "echo", json!({"value": "still runs"})),
    );
    faux.push(FauxTurn::text("recovered"));
    let ran = log();
    let fails: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "fails",
        "Fails",
        json!({"type": "object"}),
        |_, _| async { Err::<ToolOutput, _>(ToolError::new("disk full")) },
    ));
    let panics: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "panics",
        "Panics",
        json!({"type": "object"}),
        |_, _| async {
            if true {
                panic!("the tool blew up");
            }
            Ok(ToolOutput::default())
        },
    ));
    let (events, messages) = prompt(
        "go",
        context(vec![fails, panics, echo(&ran)], vec![]),
        config(&faux),
    )
    .await;
    let results: Vec<(String, bool)> = messages[2..6]
        .iter()
        .map(|m| (result_text(m), m.as_tool_result().unwrap().is_error))
        .collect();
    assert_eq!(
        results,
        [
            (
                "Tool \"nope\" not found. Available tools: fails, panics, echo.".to_owned(),
                true
            ),
            ("disk full".to_owned(), true),
            (
                "Tool \"panics\" panicked: the tool blew up".to_owned(),
                true
            ),
            ("echoed: still runs".to_owned(), false),
        ]
    );
    assert_eq!(logged(&ran), ["still runs"]);
    assert_eq!(
        messages.last().unwrap().as_assistant().unwrap().text(),
        "recovered"
    );
    assert_eq!(end_reason(&events), RunEnd::Completed);
}

#[tokio::test]
async fn calls_of_a_response_cut_by_the_token_limit_never_run() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("ok", "echo", json!({"value": "complete"}))
            .with_raw_tool_call("echo", "{\"value\": \"hel")
            .stop_reason(StopReason::Length),
    );
    faux.push(FauxTurn::text("done"));
    let ran = log();
    let (events, messages) = prompt("go", context(vec![echo(&ran)], vec![]), config(&faux)).await;
    assert!(
        logged(&ran).is_empty(),
        "not even the call whose arguments parsed"
    );
    for result in &messages[2..4] {
        let text = result_text(result);
        assert!(text.contains("output token limit"), "{text}");
    }
    assert_eq!(faux.requests().len(), 2, "the model is asked again");
    assert_eq!(end_reason(&events), RunEnd::Completed);
}

#[tokio::test]
async fn unusable_arguments_are_reported_with_what_arrived() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_raw_tool_call("echo", "{\"value\": \"x\",,}"));
    faux.push(FauxTurn::text("sorry"));
    let ran = log();
    let (_, messages) = prompt("go", context(vec![echo(&ran)], vec![]), config(&faux)).await;
    assert!(logged(&ran).is_empty());
    let text = result_text(&messages[2]);
    assert!(
        text.starts_with(
            "Tool call \"echo\" was not executed: the tool call's arguments are not valid JSON: "
        ),
        "{text}"
    );
    assert!(text.ends_with("Received: {\"value\": \"x\",,}"), "{text}");
}

#[tokio::test]
async fn before_tool_call_can_rewrite_or_block() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("one", "echo", json!({"value": "hello"}))
            .with_tool_call_id("two", "echo", json!({"value": "secret"})),
    );
    faux.push(FauxTurn::text("done"));
    let ran = log();
    let config = config(&faux).with_before_tool_call(|info| async move {
        Ok(match info.args["value"].as_str() {
            Some("secret") => BeforeToolCall::Block {
                reason: "Blocked by policy".into(),
                terminate: false,
            },
            _ => BeforeToolCall::Rewrite(json!({"value": 123})),
        })
    });
    let (_, messages) = prompt("go", context(vec![echo_any(&ran)], vec![]), config).await;
    assert_eq!(
        logged(&ran),
        ["123"],
        "rewritten arguments run without revalidation"
    );
    assert_eq!(result_text(&messages[3]), "Blocked by policy");
    assert!(messages[3].as_tool_result().unwrap().is_error);
}

/// Like `echo`, but records whatever `value` it gets.
fn echo_any(log: &Arc<std::sync::Mutex<Vec<String>>>) -> Arc<dyn AgentTool> {
    let log = log.clone();
    Arc::new(FnTool::new(
        "echo",
        "Echo",
        value_schema(),
        move |args, _| {
            log.lock()
                .unwrap()
                .push(args["value"].to_string().trim_matches('"').to_owned());
            async { Ok(ToolOutput::text("ok")) }
        },
    ))
}

#[tokio::test]
async fn after_tool_call_can_replace_the_result() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("one", "echo", json!({"value": "hello"})));
    faux.push(FauxTurn::text("done"));
    let seen = log();
    let config = {
        let seen = seen.clone();
        config(&faux).with_after_tool_call(move |info, output, is_error| {
            seen.lock().unwrap().push(format!(
                "{} {} {is_error}",
                info.args["value"],
                output.text_content()
            ));
            async move {
                Ok(AfterToolCall {
                    content: Some(vec![Content::text("redacted")]),
                    details: Some(json!({"audited": true})),
                    is_error: Some(true),
                    terminate: None,
                })
            }
        })
    };
    let ran = log();
    let (events, messages) = prompt("go", context(vec![echo(&ran)], vec![]), config).await;
    assert_eq!(logged(&seen), ["\"hello\" echoed: hello false"]);
    let result = messages[2].as_tool_result().unwrap();
    assert_eq!(
        (result_text(&messages[2]), &result.details, result.is_error),
        ("redacted".to_owned(), &json!({"audited": true}), true)
    );
    let end = events.iter().find_map(|e| match e {
        AgentEvent::ToolExecutionEnd {
            result, is_error, ..
        } => Some((result.text_content(), *is_error)),
        _ => None,
    });
    assert_eq!(
        end,
        Some(("redacted".to_owned(), true)),
        "tool_execution_end shows the final result"
    );
}

#[tokio::test]
async fn failing_and_panicking_hooks_become_error_results() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("one", "echo", json!({"value": "a"}))
            .with_tool_call_id("two", "echo", json!({"value": "b"})),
    );
    faux.push(FauxTurn::text("done"));
    let ran = log();
    let config = config(&faux)
        .with_before_tool_call(|info| async move {
            if info.args["value"] == "a" {
                panic!("before hook bug");
            }
            Ok(BeforeToolCall::Proceed)
        })
        .with_after_tool_call(|_, _, _| async {
            Err::<AfterToolCall, _>("audit log unavailable".into())
        });
    let (events, messages) = prompt("go", context(vec![echo(&ran)], vec![]), config).await;
    assert_eq!(
        result_text(&messages[2]),
        "before_tool_call panicked: before hook bug"
    );
    assert_eq!(
        result_text(&messages[3]),
        "after_tool_call failed: audit log unavailable"
    );
    assert_eq!(logged(&ran), ["b"]);
    assert_eq!(end_reason(&events), RunEnd::Completed);
}

fn terminator(terminate_for: &'static [&'static str]) -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        "finish",
        "Finish",
        value_schema(),
        move |args, _| {
            let value = args["value"].as_str().unwrap().to_owned();
            async move {
                let output = ToolOutput::text(value.clone());
                Ok(if terminate_for.contains(&value.as_str()) {
                    output.terminating()
                } else {
                    output
                })
            }
        },
    ))
}

#[tokio::test]
async fn a_run_stops_when_every_result_of_a_turn_terminates() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("one", "finish", json!({"value": "x"}))
            .with_tool_call_id("two", "finish", json!({"value": "y"})),
    );
    let (events, messages) = prompt(
        "go",
        context(vec![terminator(&["x", "y"])], vec![]),
        config(&faux),
    )
    .await;
    assert_eq!(faux.requests().len(), 1);
    assert_eq!(
        roles(&messages),
        ["user", "assistant", "tool_result", "tool_result"]
    );
    assert_eq!(end_reason(&events), RunEnd::ToolsTerminated);
    assert_eq!(
        describe(&events)
            .iter()
            .filter(|e| e.starts_with("turn_end"))
            .count(),
        1
    );
}

#[tokio::test]
async fn one_terminating_result_is_not_enough() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("one", "finish", json!({"value": "x"}))
            .with_tool_call_id("two", "finish", json!({"value": "y"})),
    );
    faux.push(FauxTurn::text("done"));
    let (events, messages) = prompt(
        "go",
        context(vec![terminator(&["x"])], vec![]),
        config(&faux),
    )
    .await;
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
    assert_eq!(end_reason(&events), RunEnd::Completed);
}

#[tokio::test]
async fn a_blocking_hook_can_terminate_and_after_hooks_can_too() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("one", "echo", json!({"value": "x"})));
    let ran = log();
    let config = config(&faux).with_before_tool_call(|_| async {
        Ok(BeforeToolCall::Block {
            reason: "Blocked by policy".into(),
            terminate: true,
        })
    });
    let (events, _) = prompt("go", context(vec![echo(&ran)], vec![]), config).await;
    assert!(logged(&ran).is_empty());
    assert_eq!(
        (faux.requests().len(), end_reason(&events)),
        (1, RunEnd::ToolsTerminated)
    );

    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("one", "echo", json!({"value": "x"})));
    let config = common::config(&faux).with_after_tool_call(|_, _, _| async {
        Ok(AfterToolCall {
            terminate: Some(true),
            ..AfterToolCall::default()
        })
    });
    let (events, _) = prompt("go", context(vec![echo(&ran)], vec![]), config).await;
    assert_eq!(
        (faux.requests().len(), end_reason(&events)),
        (1, RunEnd::ToolsTerminated)
    );
}

/// Write-ahead: a response with calls to run is made durable (the config's
/// `write_ahead` is awaited) after its `message_end` and before any of its calls
/// starts; a plain answer, and calls that will not run, wait for nothing.
#[tokio::test]
async fn a_response_is_durable_before_its_calls_start() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("c1", "echo", json!({"value": "a"}))
            .with_tool_call_id("c2", "echo", json!({"value": "b"})),
    );
    faux.push(
        FauxTurn::new()
            .with_raw_tool_call("echo", "{\"value\": \"cut")
            .stop_reason(StopReason::Length),
    );
    faux.push(FauxTurn::text("done"));
    let ran = log();
    let waits = ran.clone();
    let config = config(&faux).with_write_ahead(move || {
        let waits = waits.clone();
        async move {
            waits.lock().unwrap().push("durable".to_owned());
            Ok(())
        }
    });
    let (_, messages) = prompt("go", context(vec![echo(&ran)], vec![]), config).await;
    assert_eq!(logged(&ran), ["durable", "a", "b"]);
    assert_eq!(
        roles(&messages),
        [
            "user",
            "assistant",
            "tool_result",
            "tool_result",
            "assistant",
            "tool_result",
            "assistant"
        ]
    );
}

/// A response that cannot be made durable runs none of its calls: each is answered
/// with an error result saying why, the model is not asked again, and the run ends
/// with an error.
#[tokio::test]
async fn a_response_that_cannot_be_stored_runs_none_of_its_calls() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("c1", "echo", json!({"value": "a"}))
            .with_tool_call_id("c2", "echo", json!({"value": "b"})),
    );
    faux.push(FauxTurn::text("never asked"));
    let ran = log();
    let config = config(&faux).with_write_ahead(|| async { Err("the disk is full".to_owned()) });
    let (events, messages) = prompt("go", context(vec![echo(&ran)], vec![]), config).await;
    assert!(logged(&ran).is_empty());
    assert_eq!(faux.requests().len(), 1);
    let updates = describe(&events)
        .into_iter()
        .filter(|line| !line.starts_with("message_update"))
        .collect::<Vec<_>>();
    assert_eq!(
        updates,
        lines(&[
            "agent_start",
            "turn_start",
            "message_start user:go",
            "message_end user:go",
            "message_start assistant",
            "message_end assistant",
            "tool_execution_start c1",
            "tool_execution_end c1 error",
            "message_start tool_result:c1",
            "message_end tool_result:c1",
            "tool_execution_start c2",
            "tool_execution_end c2 error",
            "message_start tool_result:c2",
            "message_end tool_result:c2",
            "turn_end ToolUse [\"c1\", \"c2\"]",
            "message_start assistant",
            "message_end assistant",
            "agent_end Error 5",
        ])
    );
    assert_eq!(
        result_text(&messages[2]),
        "Tool call \"echo\" was not executed: the response could not be stored before its calls ran (the disk is full)."
    );
    let failure = messages[4].as_assistant().unwrap();
    assert_eq!(
        failure.error_message.as_deref(),
        Some(
            "the response's tool calls did not run: it could not be stored first (the disk is full)"
        )
    );
    assert_eq!(end_reason(&events), RunEnd::Error);
}

/// A tool that answers only once cancelled (which `seen` records), bounded by
/// `timeout` when given.
fn stuck(
    name: &str,
    timeout: Option<std::time::Duration>,
    seen: &Arc<std::sync::Mutex<Vec<String>>>,
) -> Arc<dyn AgentTool> {
    let seen = seen.clone();
    let label = name.to_owned();
    let tool = FnTool::new(
        name,
        "Answers when cancelled",
        value_schema(),
        move |_args, ctx| {
            let (seen, label) = (seen.clone(), label.clone());
            async move {
                ctx.cancel().cancelled().await;
                seen.lock().unwrap().push(format!("{label} cancelled"));
                Ok::<_, ToolError>(ToolOutput::text("too late"))
            }
        },
    );
    Arc::new(match timeout {
        Some(limit) => tool.with_timeout(limit),
        None => tool,
    })
}

#[tokio::test(start_paused = true)]
async fn a_tool_past_its_timeout_is_dropped_and_answered_as_an_error() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("call-1", "own", json!({"value": "a"}))
            .with_tool_call_id("call-2", "default", json!({"value": "b"})),
    );
    faux.push(FauxTurn::text("Both timed out."));
    let mut config = config(&faux);
    // The run's default bounds the tool without a timeout of its own; the
    // tool's own wins over it.
    config.run.tool_timeout = Some(std::time::Duration::from_secs(2));
    let seen = log();
    let tools = vec![
        stuck("own", Some(std::time::Duration::from_millis(250)), &seen),
        stuck("default", None, &seen),
    ];
    let (events, messages) = prompt("go", context(tools, vec![]), config).await;
    assert_eq!(end_reason(&events), RunEnd::Completed);
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
    assert_eq!(
        [result_text(&messages[2]), result_text(&messages[3])],
        [
            "Tool \"own\" timed out after 250 ms",
            "Tool \"default\" timed out after 2000 ms"
        ]
    );
    assert!(messages[2..4].iter().all(|m| match m {
        tiller_core::AgentMessage::Llm(tiller_ai::Message::ToolResult(r)) => r.is_error,
        _ => false,
    }));
    // Each was cancelled at its bound, and what it answered then came too late.
    assert_eq!(logged(&seen), ["own cancelled", "default cancelled"]);
}
