//! `tiller` end to end against the real llama.cpp servers on this machine (started
//! by `scripts/local-llm.sh`; skipped where they are not installed, unless
//! `TILLER_LIVE=required`; see `tiller_test_support::live`). Asserts the event stream's shape, never the
//! model's wording.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Scratch, envelopes, event_kind, finish, tiller};
use pretty_assertions::assert_eq;
use serde_json::Value;
use tiller_test_support::live::{LocalServer, MODEL_ID};

#[tokio::test]
async fn run_with_jsonl_events_against_llama_server() {
    run_with_jsonl_events(LocalServer::LlamaServer).await;
}

#[tokio::test]
async fn run_with_jsonl_events_against_llama_cpp_python() {
    run_with_jsonl_events(LocalServer::LlamaCppPython).await;
}

async fn run_with_jsonl_events(server: LocalServer) {
    if !server.is_available() {
        return;
    }
    let url = server.base_url();
    let run = finish(tiller(&[
        "run",
        "--base-url",
        &url,
        "--model",
        MODEL_ID,
        "--max-tokens",
        "24",
        "--events",
        "jsonl",
        "Say hello to the world.",
    ]))
    .await;

    let lines = envelopes(&run.stdout);
    let mut kinds: Vec<String> = lines.iter().map(event_kind).collect();
    let deltas = kinds
        .iter()
        .filter(|kind| *kind == "message_update:text_delta")
        .count();
    assert!(deltas >= 2, "{deltas} text deltas");
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "agent_start",
            "turn_start",
            "message_start:user",
            "message_end:user",
            "message_start:assistant",
            "message_update:text_start",
            "message_update:text_delta",
            "message_update:text_end",
            "message_end:assistant",
            "turn_end",
            "agent_end",
        ]
    );
    let end = &lines.last().unwrap()["event"];
    assert_eq!(end["reason"], "completed");
    let reply = &end["messages"][1];
    assert_eq!(
        (&reply["role"], &reply["provider"], &reply["model"]),
        (
            &Value::from("assistant"),
            &Value::from("openai-compatible"),
            &Value::from(MODEL_ID)
        )
    );
    // The server samples (the command sets no temperature), so the answer may end
    // by itself or at the token limit; the exit status must say which.
    let expected = match reply["stop_reason"].as_str().unwrap() {
        "stop" => (Some(0), ""),
        "length" => (
            Some(1),
            "tiller: the answer was cut off at the model's output limit\n",
        ),
        other => panic!("stop reason {other}: {reply}"),
    };
    assert_eq!((run.code(), run.stderr.as_str()), expected);
    // Only llama-server reports usage.
    let counted = reply["usage"]["output"].as_u64().unwrap() > 0;
    assert_eq!(counted, server == LocalServer::LlamaServer, "{reply}");
}

/// llama-server turns `response_format` into a grammar: the small model's answer is
/// schema-valid JSON, which `tiller run` prints validated.
#[tokio::test]
async fn structured_output_from_llama_server_is_schema_valid_json() {
    let server = LocalServer::LlamaServer;
    if !server.is_available() {
        return;
    }
    let scratch = Scratch::new();
    let agent = scratch.write(
        "city.yaml",
        "type: object\n\
         description: You answer questions about cities.\n\
         properties:\n  name: {type: string, maxLength: 24}\n  country: {type: string, enum: [Norway, Sweden, Denmark]}\n\
         required: [name, country]\n\
         additionalProperties: false\n\
         json_schema_extra:\n  kind: agent\n  name: city\n  structured_output: true\n",
    );
    let url = server.base_url();
    let run = finish(tiller(&[
        "run",
        "--agent",
        agent.to_str().unwrap(),
        "--base-url",
        &url,
        "--model",
        MODEL_ID,
        "--max-tokens",
        "60",
        "Which city is the capital of Norway?",
    ]))
    .await;
    assert_eq!(
        (run.code(), run.stderr.as_str()),
        (Some(0), ""),
        "{}",
        run.stdout
    );
    let answer: Value = serde_json::from_str(&run.stdout).unwrap();
    let fields = answer.as_object().unwrap();
    assert_eq!(
        fields.keys().collect::<Vec<_>>(),
        ["country", "name"],
        "{answer}"
    );
    assert!(
        answer["name"]
            .as_str()
            .is_some_and(|name| name.chars().count() <= 24)
    );
    assert!(["Norway", "Sweden", "Denmark"].contains(&answer["country"].as_str().unwrap()));
}

/// Forty turns of `tiller chat --session` against SmolLM2's 4,096-token window:
/// each turn adds 100 to 150 tokens, so the conversation passes the window around
/// turn 30 and can only go on compacted. Every turn must end completed; the store
/// must hold a summary and, before it, every original message.
#[tokio::test]
async fn a_forty_turn_chat_outlives_smollm2s_context_window() {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    let server = LocalServer::LlamaServer;
    if !server.is_available() {
        return;
    }
    let url = server.base_url();
    let scratch = Scratch::new();
    let store = format!("sqlite://{}", scratch.path().join("sessions.db").display());
    let mut command = tiller(&[
        "chat",
        "--base-url",
        &url,
        "--model",
        MODEL_ID,
        "--max-tokens",
        "64",
        "--context-window",
        "4096",
        "--store",
        &store,
        "--session",
        "forty",
        "--events",
        "jsonl",
    ]);
    command.stdin(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = common::lines(child.stdout.take().unwrap());
    let mut compactions = 0;
    for turn in 1..=40 {
        let note = format!(
            "Note {turn}: the delivery for order {turn} goes to warehouse {} on day {}, packed in {} crates of apples, pears and plums, checked twice by the night shift before the trucks leave. The driver calls the office when the trucks reach the bridge, and again at the gate, so that the loading team is ready with the forklifts and the paperwork for customs. Reply with one short sentence.\n",
            turn % 7,
            turn % 28 + 1,
            turn * 3
        );
        stdin.write_all(note.as_bytes()).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(300), async {
            loop {
                let line = lines.recv().await.expect("tiller chat ended early");
                let envelope: Value = serde_json::from_str(&line).unwrap();
                match envelope["event"]["type"].as_str().unwrap() {
                    "compaction_end" => {
                        assert!(
                            envelope["event"]["summary_id"].is_u64(),
                            "turn {turn}: {envelope}"
                        );
                        compactions += 1;
                    }
                    "agent_end" => return envelope,
                    _ => {}
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("turn {turn} did not end"));
        assert_eq!(end["event"]["reason"], "completed", "turn {turn}: {end}");
        let answer = end["event"]["messages"].as_array().unwrap().last().unwrap();
        assert_eq!(answer["role"], "assistant", "turn {turn}: {end}");
        assert!(answer.get("error_message").is_none(), "turn {turn}: {end}");
    }
    drop(stdin);
    // 1 when the last answer stopped at --max-tokens, which each turn allows.
    let exit = common::exit_of(&mut child).await;
    assert!(matches!(exit.code(), Some(0 | 1)), "{exit:?}");
    assert!(compactions >= 1, "forty turns and no compaction");

    let store = tiller::store::SqlStore::open(&store).await.unwrap();
    let stored = tiller::store::SessionStore::load(&store, "forty")
        .await
        .unwrap()
        .unwrap();
    // Every note once, in order, each summary's copies of kept messages skipped.
    let mut notes = Vec::new();
    let mut copies = 0;
    for message in &stored.messages {
        if copies > 0 {
            copies -= 1;
            continue;
        }
        if let Some(summary) = tiller::run::compaction::CompactionSummary::of(message) {
            copies = summary.kept;
            continue;
        }
        if let Some(user) = message.as_user() {
            notes.push(user.text_content());
        }
    }
    assert_eq!(notes.len(), 40, "{notes:?}");
    for (n, note) in notes.iter().enumerate() {
        assert!(note.starts_with(&format!("Note {}: ", n + 1)), "{notes:?}");
    }
}
