//! Compaction with the real `tiller` binary and a session on SQLite: killed with
//! SIGKILL while its summary is being written, the transcript is whole and
//! uncompacted; killed as the compaction ends, the store has the summary and all
//! its copies or none of them; the next chat goes on from there, the store keeping
//! every original before the summary.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Scratch, exit_of, finish_with_input, lines, read_until, tiller};
use tiller::run::compaction::CompactionSummary;
use tiller::store::SqlStore;
use tiller::{AgentMessage, run::check_transcript, store::SessionStore};
use tiller_test_support::{CapturedRequest, MockResponse, MockServer, sse};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc::UnboundedReceiver;

/// Whether `request` asks for a compaction's summary.
fn summarizing(request: &CapturedRequest) -> bool {
    request.body.to_string().contains("You write the memory")
}

/// A streamed text reply whose usage counts the request as a provider would (a
/// token per four bytes of its messages).
fn reply(request: &CapturedRequest, text: &str) -> MockResponse {
    let mut events = sse::openai_text_events(&[text]);
    let prompt = request.body["messages"].to_string().len() as u64 / 4;
    events[3] = sse::openai_usage(prompt, text.len() as u64 / 4);
    MockResponse::sse(events.concat())
}

/// `tiller` started with `args`: the process, its standard input and its lines
/// of output.
fn chat(args: &[&str]) -> (Child, ChildStdin, UnboundedReceiver<String>) {
    let mut command = tiller(args);
    command.stdin(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    let output = lines(child.stdout.take().unwrap());
    (child, stdin, output)
}

/// The stored transcript of the session `long`.
async fn stored(store: &str) -> Vec<AgentMessage> {
    let store = SqlStore::open(store).await.unwrap();
    let session = store.load("long").await.unwrap().unwrap();
    session.messages.iter().map(|m| (**m).clone()).collect()
}

#[tokio::test]
async fn a_kill_during_a_compaction_leaves_it_done_or_not_never_half() {
    let scratch = Scratch::new();
    let store = format!("sqlite://{}", scratch.path().join("sessions.db").display());
    let server = MockServer::start().await;
    let stall = Arc::new(AtomicBool::new(true));
    let stalling = stall.clone();
    server.respond_with(move |request| {
        if summarizing(request) {
            return if stalling.load(Ordering::SeqCst) {
                MockResponse::sse(sse::openai_delta(
                    serde_json::json!({"role": "assistant", "content": ""}),
                ))
                .stall()
            } else {
                reply(request, "SUMMARY: questions and answers.")
            };
        }
        // About 80 tokens an answer: a 400-token window fills in four turns.
        reply(request, &"a long answer ".repeat(23))
    });
    let base_url = server.base_url();
    let args = [
        "chat",
        "--base-url",
        &base_url,
        "--model",
        "local-model",
        "--context-window",
        "400",
        "--store",
        &store,
        "--session",
        "long",
        "--events",
        "jsonl",
    ];

    let (mut child, mut stdin, mut events) = chat(&args);
    let mut prompts = 0;
    loop {
        prompts += 1;
        assert!(prompts < 10, "no compaction after {prompts} prompts");
        stdin
            .write_all(format!("question {prompts}\n").as_bytes())
            .await
            .unwrap();
        let read = read_until(&mut events, |line| {
            line.contains(r#""type":"agent_end""#) || line.contains(r#""type":"compaction_start""#)
        })
        .await;
        if read.last().unwrap().contains("compaction_start") {
            break;
        }
    }
    // The summary was asked for, and never comes: the process dies meanwhile.
    loop {
        let seen = server.requests();
        if seen.iter().any(summarizing) {
            break;
        }
        server.wait_for_requests(seen.len() + 1).await;
    }
    child.start_kill().unwrap();
    exit_of(&mut child).await;

    let before = stored(&store).await;
    check_transcript(&before).unwrap();
    assert!(before.iter().all(|m| CompactionSummary::of(m).is_none()));
    // Every answered question, and the last one if its write was committed.
    let answered = 2 * (prompts - 1);
    assert!(
        before.len() == answered || before.len() == answered + 1,
        "{} messages after {prompts} prompts",
        before.len()
    );

    // Killed again as the compaction ends: its write is in flight or done, and
    // the store has all of it or none of it.
    stall.store(false, Ordering::SeqCst);
    let (mut child, mut stdin, mut events) = chat(&args);
    stdin.write_all(b"once more\n").await.unwrap();
    read_until(&mut events, |line| {
        line.contains(r#""type":"compaction_end""#)
    })
    .await;
    child.start_kill().unwrap();
    exit_of(&mut child).await;
    let killed = stored(&store).await;
    check_transcript(&killed).unwrap();
    assert_eq!(killed[..before.len()], before[..]);
    match killed
        .iter()
        .position(|m| CompactionSummary::of(m).is_some())
    {
        None => {}
        Some(at) => {
            let summary = CompactionSummary::of(&killed[at]).unwrap();
            let kept = summary.kept as usize;
            assert!(
                killed.len() >= at + 1 + kept,
                "the summary without all its copies"
            );
            assert_eq!(
                killed[at + 1..at + 1 + kept],
                killed[summary.last_seq as usize + 1..at]
            );
        }
    }
    let before = killed;

    // The next chat on the session goes on from whichever it was.
    let finished = finish_with_input(tiller(&args), b"one more\n").await;
    assert_eq!(finished.code(), Some(0), "{}", finished.stderr);
    let after = stored(&store).await;
    check_transcript(&after).unwrap();
    assert_eq!(after[..before.len()], before[..]);
    assert!(after[before.len()..].iter().any(|m| {
        m.as_user()
            .is_some_and(|user| user.text_content() == "one more")
    }));
    assert!(after.last().unwrap().as_assistant().is_some());
    // Each summary is followed by copies of the messages it kept, which precede it.
    let mut summaries = 0;
    for (at, message) in after.iter().enumerate() {
        let Some(summary) = CompactionSummary::of(message) else {
            continue;
        };
        summaries += 1;
        assert_eq!(summary.summary, "SUMMARY: questions and answers.");
        let kept = summary.kept as usize;
        assert_eq!(
            after[at + 1..at + 1 + kept],
            after[summary.last_seq as usize + 1..at]
        );
    }
    assert!(summaries >= 1);
    let last = server.requests().pop().unwrap();
    assert!(!summarizing(&last));
    assert!(
        last.body["messages"]
            .to_string()
            .contains("SUMMARY: questions and answers."),
        "{}",
        last.body
    );
}
