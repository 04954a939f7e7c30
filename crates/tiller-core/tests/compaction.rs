//! Compaction in the loop: a scripted model with a tiny context window, its
//! threshold passed, its provider refusing a request as too long, and a second
//! refusal after compacting.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{collect, context, describe, end_reason, prompt};
use pretty_assertions::assert_eq;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_ai::{Message, StreamError};
use tiller_core::compaction::{CompactionSummary, DEFAULT_INSTRUCTIONS};
use tiller_core::{AgentEvent, AgentMessage, LoopConfig, RunEnd, agent_loop};
use tokio_util::sync::CancellationToken;

/// A conversation of `turns` questions and answers, each answer `words` words.
fn conversation(turns: usize, words: usize) -> Vec<AgentMessage> {
    let mut messages = Vec::new();
    for turn in 0..turns {
        messages.push(AgentMessage::user(format!("question {turn}")));
        let answer = vec![format!("answer{turn}"); words].join(" ");
        let mut message = tiller_ai::AssistantMessage::empty(&FauxProvider::new().model());
        message.content.push(tiller_ai::AssistantContent::Text(
            tiller_ai::TextContent::new(answer),
        ));
        messages.push(message.into());
    }
    messages
}

/// llama.cpp's refusal of a prompt longer than its context (`-c 400`).
fn too_long() -> StreamError {
    StreamError::Http {
        provider: "llamacpp".into(),
        status: 400,
        message: "request (612 tokens) exceeds the available context size (400 tokens), try increasing it (exceed_context_size_error)".into(),
        body: r#"{"error":{"code":400,"message":"request (612 tokens) exceeds the available context size (400 tokens), try increasing it","n_ctx":400,"n_prompt_tokens":612,"type":"exceed_context_size_error"}}"#.into(),
        retry_after_ms: None,
    }
}

/// The texts of the messages a request sent, each as its role and first words.
fn sent(request: &tiller_ai::faux::FauxRequest) -> Vec<String> {
    request
        .context
        .messages
        .iter()
        .map(|message| match message {
            Message::User(user) => format!("user:{}", user.text_content()),
            Message::Assistant(assistant) => {
                format!("assistant:{}", assistant.text().split(' ').next().unwrap())
            }
            Message::ToolResult(result) => format!("tool_result:{}", result.tool_call_id),
        })
        .collect()
}

#[tokio::test]
async fn past_the_threshold_the_oldest_turns_become_a_summary_before_the_model_call() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("They talked about questions 0 to 3."));
    faux.push(FauxTurn::text("Here is the answer."));
    // 400 tokens: compaction past 300, the latest 100 kept; each turn is ~50.
    let config = LoopConfig::new(faux.model().with_context_window(400));
    let history = conversation(6, 40);
    let (events, messages) = prompt("question 6", context(vec![], history), config).await;

    assert_eq!(
        describe(&events),
        [
            "agent_start",
            "turn_start",
            "message_start user:question 6",
            "message_end user:question 6",
            "compaction_start \"threshold\"",
            "compaction_end \"threshold\" summary 13 kept 4",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 2",
        ]
    );
    assert_eq!(end_reason(&events), RunEnd::Completed);
    // The run's new messages are still all of them: the prompt and the answer.
    assert_eq!(messages.len(), 2);

    let requests = faux.requests();
    let summarizing = &requests[0].context;
    assert_eq!(
        summarizing.system_prompt.as_deref(),
        Some(DEFAULT_INSTRUCTIONS)
    );
    let Message::User(asked) = &summarizing.messages[0] else {
        panic!("the summarizer is sent one user message");
    };
    // A window of 400 leaves room for the latest of the replaced turns only.
    let text = asked.text_content();
    assert!(
        text.starts_with("[Earlier messages omitted.]\n\n"),
        "{text}"
    );
    assert!(text.ends_with("\n\nUser: question 4"), "{text}");
    assert_eq!(
        sent(&requests[1]),
        [
            "user:[The conversation before this point (stored as message:0 to message:8) was compacted. Summary:]\nThey talked about questions 0 to 3.",
            "assistant:answer4",
            "user:question 5",
            "assistant:answer5",
            "user:question 6",
        ]
    );
    let summary = events
        .iter()
        .find_map(|event| match event {
            AgentEvent::CompactionEnd {
                summary: Some(summary),
                tokens_before,
                tokens_after,
                ..
            } => Some((
                CompactionSummary::of(summary).unwrap(),
                *tokens_before,
                *tokens_after,
            )),
            _ => None,
        })
        .unwrap();
    let (summary, before, after) = summary;
    assert_eq!(
        (summary.first_seq, summary.last_seq, summary.kept),
        (0, 8, 4)
    );
    assert!(before > 300 && after < before, "{before} → {after}");
}

#[tokio::test]
async fn a_refusal_as_too_long_compacts_once_and_asks_again_unannounced() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().fail_with(too_long()));
    faux.push(FauxTurn::text("A summary."));
    faux.push(FauxTurn::text("The answer."));
    // The model's window is not known (128,000): the refusal names 400.
    let config = LoopConfig::new(faux.model());
    let (events, messages) =
        prompt("question 6", context(vec![], conversation(6, 40)), config).await;

    assert_eq!(
        describe(&events),
        [
            "agent_start",
            "turn_start",
            "message_start user:question 6",
            "message_end user:question 6",
            "compaction_start \"overflow\"",
            "compaction_end \"overflow\" summary 13 kept 4",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 2",
        ]
    );
    assert_eq!(end_reason(&events), RunEnd::Completed);
    assert_eq!(
        messages.last().unwrap().as_assistant().unwrap().text(),
        "The answer."
    );
    let requests = faux.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(sent(&requests[2]).len(), 5, "{:?}", sent(&requests[2]));
}

#[tokio::test]
async fn a_second_refusal_ends_the_run_with_context_overflow() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().fail_with(too_long()));
    faux.push(FauxTurn::text("A summary."));
    faux.push(FauxTurn::new().fail_with(too_long()));
    let config = LoopConfig::new(faux.model());
    let (events, messages) =
        prompt("question 6", context(vec![], conversation(6, 40)), config).await;

    assert_eq!(
        describe(&events),
        [
            "agent_start",
            "turn_start",
            "message_start user:question 6",
            "message_end user:question 6",
            "compaction_start \"overflow\"",
            "compaction_end \"overflow\" summary 13 kept 4",
            "message_start assistant",
            "message_end assistant",
            "turn_end Error []",
            "agent_end ContextOverflow 2",
        ]
    );
    assert_eq!(end_reason(&events), RunEnd::ContextOverflow);
    let error = messages
        .last()
        .unwrap()
        .as_assistant()
        .unwrap()
        .error_message
        .clone()
        .unwrap();
    assert!(
        error.ends_with("; the context was compacted once and still does not fit"),
        "{error}"
    );
    assert!(
        error.contains("exceeds the available context size"),
        "{error}"
    );
}

#[tokio::test]
async fn with_compaction_off_a_refusal_ends_the_run_at_once() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().fail_with(too_long()));
    let mut config = LoopConfig::new(faux.model());
    config.run.compaction.enabled = false;
    let (events, messages) =
        prompt("question 6", context(vec![], conversation(6, 40)), config).await;
    assert_eq!(end_reason(&events), RunEnd::ContextOverflow);
    assert!(
        !describe(&events)
            .iter()
            .any(|e| e.starts_with("compaction"))
    );
    let error = messages
        .last()
        .unwrap()
        .as_assistant()
        .unwrap()
        .error_message
        .clone()
        .unwrap();
    assert!(error.ends_with("; compaction is off"), "{error}");
    assert_eq!(faux.requests().len(), 1);
}

#[tokio::test]
async fn a_failed_summary_leaves_the_transcript_and_the_model_is_asked_anyway() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().fail("the summarizer is down"));
    faux.push(FauxTurn::text("Still answering."));
    let config = LoopConfig::new(faux.model().with_context_window(400));
    let (events, _) = prompt("question 6", context(vec![], conversation(6, 40)), config).await;
    let lines = describe(&events);
    assert_eq!(
        lines[4..6],
        [
            "compaction_start \"threshold\"",
            "compaction_end \"threshold\" failed: faux reported an error: the summarizer is down",
        ]
    );
    assert_eq!(end_reason(&events), RunEnd::Completed);
    // Every message went to the model.
    assert_eq!(sent(&faux.requests()[1]).len(), 13);
}

#[tokio::test]
async fn a_refusal_whose_compaction_fails_says_so() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().fail_with(too_long()));
    faux.push(FauxTurn::new().fail("the summarizer is down"));
    let config = LoopConfig::new(faux.model());
    let (events, messages) =
        prompt("question 6", context(vec![], conversation(6, 40)), config).await;
    assert_eq!(end_reason(&events), RunEnd::ContextOverflow);
    let error = messages
        .last()
        .unwrap()
        .as_assistant()
        .unwrap()
        .error_message
        .clone()
        .unwrap();
    assert!(
        error.ends_with("; the compaction failed: faux reported an error: the summarizer is down"),
        "{error}"
    );
}

#[tokio::test]
async fn an_abort_while_the_summary_is_written_ends_the_run_aborted_and_the_transcript_whole() {
    let faux = FauxProvider::new();
    let cancel = CancellationToken::new();
    let mut config = LoopConfig::new(faux.model().with_context_window(400));
    let aborting = cancel.clone();
    config.hooks.summarize = Some(Arc::new(move |_, _| {
        // The user aborts while the summary is being written, which never ends.
        aborting.cancel();
        Box::pin(std::future::pending())
    }));
    let (events, messages) = collect(agent_loop(
        vec![AgentMessage::user("question 6")],
        context(vec![], conversation(6, 40)),
        config,
        cancel,
    ))
    .await;
    assert_eq!(
        describe(&events)[4..],
        [
            "compaction_start \"threshold\"",
            "compaction_end \"threshold\" failed: the request was aborted",
            "message_start assistant",
            "message_end assistant",
            "turn_end Aborted []",
            "agent_end Aborted 2",
        ]
    );
    assert_eq!(faux.requests().len(), 0);
    // The run's messages: the prompt and the aborted answer, nothing replaced.
    assert_eq!(messages.len(), 2);
}
