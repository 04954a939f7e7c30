//! Ending well: turn limits and stop conditions end runs visibly, orphaned calls are
//! answered before the model sees them, and failing callbacks end the run with an
//! error message instead of leaving it hanging.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{config, context, describe, echo, end_reason, lines, log, logged, prompt, roles};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_ai::{
    AssistantContent, AssistantMessage, Message, StopReason, ToolCall, ToolChoice,
    ToolResultMessage,
};
use tiller_core::{AgentMessage, RunEnd};

fn always_calling_echo(faux: &FauxProvider) {
    faux.respond_with(|_| FauxTurn::tool_call("echo", json!({"value": "again"})));
}

#[tokio::test]
async fn the_turn_limit_ends_a_run_that_would_go_on() {
    let faux = FauxProvider::new();
    always_calling_echo(&faux);
    let mut config = config(&faux);
    config.run.max_turns = 2;
    let ran = log();
    let (events, messages) = prompt("loop", context(vec![echo(&ran)], vec![]), config).await;
    assert_eq!(faux.requests().len(), 2);
    assert_eq!(
        roles(&messages),
        [
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "tool_result"
        ]
    );
    assert_eq!(end_reason(&events), RunEnd::TurnLimit);
}

#[tokio::test]
async fn the_default_turn_limit_is_fifty() {
    let faux = FauxProvider::new();
    always_calling_echo(&faux);
    let ran = log();
    let (events, _) = prompt("loop", context(vec![echo(&ran)], vec![]), config(&faux)).await;
    assert_eq!(
        (faux.requests().len(), end_reason(&events)),
        (50, RunEnd::TurnLimit)
    );
}

/// A forced choice holds until the model has called a tool, then gives way, so the
/// model can answer; the next run starts forced again. A choice that forces nothing
/// holds for the whole run.
#[tokio::test]
async fn a_forced_tool_choice_gives_way_once_a_tool_was_called() {
    let faux = FauxProvider::new();
    let ran = log();
    for (choice, after, expected) in [
        (
            ToolChoice::Tool("echo".into()),
            Some(ToolChoice::None),
            [
                Some(ToolChoice::Tool("echo".into())),
                Some(ToolChoice::None),
            ],
        ),
        (
            ToolChoice::Required,
            None,
            [Some(ToolChoice::Required), None],
        ),
        (
            ToolChoice::Auto,
            Some(ToolChoice::None),
            [Some(ToolChoice::Auto), Some(ToolChoice::Auto)],
        ),
    ] {
        let config = config(&faux).with_tool_choice(choice, after);
        for run in 0..2 {
            faux.push(FauxTurn::tool_call("echo", json!({"value": run})));
            faux.push(FauxTurn::text("done"));
            let before = faux.requests().len();
            let (events, _) = prompt("go", context(vec![echo(&ran)], vec![]), config.clone()).await;
            assert_eq!(end_reason(&events), RunEnd::Completed);
            let sent: Vec<_> = faux.requests()[before..]
                .iter()
                .map(|request| request.tool_choice.clone())
                .collect();
            assert_eq!(sent, expected, "run {run}");
        }
    }
}

#[tokio::test]
async fn a_stop_condition_ends_the_run_after_its_turn() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("echo", json!({"value": "work"})));
    faux.push(
        FauxTurn::new()
            .with_text("All done.")
            .with_tool_call("finish", json!({"value": "x"})),
    );
    let steering_polls = Arc::new(AtomicUsize::new(0));
    let follow_up_polls = Arc::new(AtomicUsize::new(0));
    let config = {
        let (s, f) = (steering_polls.clone(), follow_up_polls.clone());
        config(&faux)
            .with_steering(move || {
                s.fetch_add(1, Ordering::SeqCst);
                async { vec![] }
            })
            .with_follow_up(move || {
                f.fetch_add(1, Ordering::SeqCst);
                async { vec![AgentMessage::user("should stay queued")] }
            })
            .with_stop_when(|turn| {
                // The first turn called only echo; the second, finish too.
                let finished = turn
                    .get_result("finish")
                    .is_some_and(|result| result.text_content() == "finished");
                assert!(turn.has_tool_calls());
                assert_eq!(finished, turn.turn == 2);
                turn.called("finish") && finished && turn.text() == "All done."
            })
    };
    let ran = log();
    let finish = Arc::new(tiller_core::FnTool::new(
        "finish",
        "Finish",
        common::value_schema(),
        |_, _| async { Ok(tiller_core::ToolOutput::text("finished")) },
    ));
    let (events, messages) = prompt("go", context(vec![echo(&ran), finish], vec![]), config).await;
    assert_eq!(end_reason(&events), RunEnd::StopCondition);
    assert_eq!(
        roles(&messages),
        [
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "tool_result"
        ]
    );
    assert_eq!(
        steering_polls.load(Ordering::SeqCst),
        2,
        "at the start and after the first turn"
    );
    assert_eq!(
        follow_up_polls.load(Ordering::SeqCst),
        0,
        "follow-ups stay queued"
    );
}

fn assistant_calling(ids: &[&str]) -> AgentMessage {
    let mut message = AssistantMessage::empty(&tiller_ai::Model::openai_compatible(
        "http://unused/v1",
        "m",
    ));
    message.stop_reason = StopReason::ToolUse;
    message.content = ids
        .iter()
        .map(|id| {
            AssistantContent::ToolCall(Box::new(ToolCall {
                id: (*id).into(),
                name: "echo".into(),
                arguments: json!({"value": "v"}),
                arguments_error: None,
                signature: None,
            }))
        })
        .collect();
    message.into()
}

fn result_for(id: &str) -> AgentMessage {
    let call = ToolCall {
        id: id.into(),
        name: "echo".into(),
        arguments: json!({}),
        arguments_error: None,
        signature: None,
    };
    ToolResultMessage::text(&call, "old result", false).into()
}

#[tokio::test]
async fn orphans_in_the_transcript_are_answered_before_the_model_sees_it() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("fine"));
    let history = vec![
        result_for("stray"),
        AgentMessage::user("earlier"),
        assistant_calling(&["x", "y"]),
        result_for("y"),
    ];
    let ran = log();
    let (_, messages) = prompt("now", context(vec![echo(&ran)], history), config(&faux)).await;
    assert_eq!(
        roles(&messages),
        ["user", "assistant"],
        "the history itself is not rewritten"
    );
    let sent: Vec<String> = faux.requests()[0]
        .context
        .messages
        .iter()
        .map(|m| match m {
            Message::User(_) => "user".to_owned(),
            Message::Assistant(_) => "assistant".to_owned(),
            Message::ToolResult(r) => format!(
                "{}:{}",
                r.tool_call_id,
                if r.is_error { "error" } else { "ok" }
            ),
        })
        .collect();
    // The stray result keeps what it said, behind a call made up for it.
    assert_eq!(
        sent,
        [
            "assistant",
            "stray:ok",
            "user",
            "assistant",
            "x:error",
            "y:ok",
            "user"
        ]
    );
}

#[tokio::test]
async fn a_failing_transform_ends_the_run_with_an_error_message() {
    let faux = FauxProvider::new();
    let config =
        config(&faux).with_transform_context(|_, _| async { Err("the summarizer is down".into()) });
    let (events, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(
        describe(&events)[4..].to_vec(),
        lines(&[
            "message_start assistant",
            "message_end assistant",
            "turn_end Error []",
            "agent_end Error 2"
        ])
    );
    let failed = messages[1].as_assistant().unwrap();
    assert_eq!(
        failed.error_message.as_deref(),
        Some("transform_context failed: the summarizer is down")
    );
    assert!(faux.requests().is_empty());
}

#[tokio::test]
async fn panicking_callbacks_end_the_run_or_are_contained() {
    let faux = FauxProvider::new();
    let config = config(&faux).with_convert_to_llm(|_| panic!("converter bug"));
    let (events, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(end_reason(&events), RunEnd::Error);
    assert_eq!(
        messages[1].as_assistant().unwrap().error_message.as_deref(),
        Some("convert_to_llm panicked: converter bug")
    );

    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("answer"));
    let config = common::config(&faux)
        .with_steering(|| async { panic!("queue bug") })
        .with_stop_when(|_| panic!("predicate bug"));
    let (events, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(roles(&messages), ["user", "assistant", "assistant"]);
    assert_eq!(
        messages[1].as_assistant().unwrap().text(),
        "answer",
        "a panicking steering source counts as empty"
    );
    assert_eq!(
        messages[2].as_assistant().unwrap().error_message.as_deref(),
        Some("the stop condition panicked: predicate bug")
    );
    assert_eq!(end_reason(&events), RunEnd::Error);
}

#[tokio::test]
async fn a_failed_model_response_ends_the_run() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("partial").fail("overloaded"));
    let (events, messages) = prompt("hi", context(vec![], vec![]), config(&faux)).await;
    assert_eq!(end_reason(&events), RunEnd::Error);
    let reply = messages[1].as_assistant().unwrap();
    assert_eq!(
        (reply.text().as_str(), reply.error_message.as_deref()),
        ("partial", Some("faux reported an error: overloaded"))
    );
    assert!(
        matches!(events[events.len() - 2], tiller_core::AgentEvent::TurnEnd { ref tool_results, .. } if tool_results.is_empty())
    );
}

/// A pause asked during a turn ends the run where the next turn would start: the
/// turn finishes with its tool results, a steering message already taken joins
/// the transcript, and no further model call is made. A run that would end
/// anyway ends as it would.
#[tokio::test]
async fn a_pause_ends_the_run_between_two_turns() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("echo", json!({"value": "work"})));
    faux.push(FauxTurn::text("Never asked."));
    let pause = tokio_util::sync::CancellationToken::new();
    let mut config = {
        let pause = pause.clone();
        config(&faux).with_steering(move || {
            // Asked after the tool ran, at the turn's end.
            pause.cancel();
            async { vec![AgentMessage::user("and then?")] }
        })
    };
    config.first_steering = Some(Vec::new());
    config.pause = Some(pause);
    let ran = log();
    let (events, messages) = prompt("go", context(vec![echo(&ran)], vec![]), config).await;
    assert_eq!(end_reason(&events), RunEnd::Paused);
    assert_eq!(faux.requests().len(), 1);
    assert_eq!(
        roles(&messages),
        ["user", "assistant", "tool_result", "user"]
    );
    assert_eq!(logged(&ran), ["work"]);

    // Paused before it starts: a run that answers at once completes.
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Done."));
    let mut config = common::config(&faux);
    let pause = tokio_util::sync::CancellationToken::new();
    pause.cancel();
    config.pause = Some(pause);
    let (events, _) = prompt("go", context(vec![], vec![]), config).await;
    assert_eq!(end_reason(&events), RunEnd::Completed);
}
