//! Compaction in an agent: the summary and copies of the kept messages in the
//! store after every original, the agent brought back from its summary after a
//! restart, a compaction asked for, and what a compaction refuses.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::run::compaction::{COMPACTION_KIND, CompactionSummary};
use tiller::store::SqlStore;
use tiller::{
    AgentError, AgentMessage, AgentSettings, AgentSpec, Supervisor, SupervisorConfig,
    run::{CompactionReason, ContinueError},
    store::SessionStore,
};
use tiller_test_support::sqlite::TempSqlite;

/// A conversation of `turns` questions and answers of 40 words (~80 tokens).
fn conversation(faux: &FauxProvider, turns: usize) -> Vec<AgentMessage> {
    let mut messages = Vec::new();
    for turn in 0..turns {
        messages.push(AgentMessage::user(format!("question {turn}")));
        let mut answer = tiller::ai::AssistantMessage::empty(&faux.model());
        answer.content.push(tiller::ai::AssistantContent::Text(
            tiller::ai::TextContent::new(vec![format!("answer{turn}"); 40].join(" ")),
        ));
        messages.push(answer.into());
    }
    messages
}

/// An agent on a 400-token window: compaction past 300, the latest 100 kept.
fn settings(faux: &FauxProvider) -> AgentSettings {
    AgentSettings::new(faux.model().with_context_window(400))
}

fn kinds(messages: &[AgentMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|message| match message {
            AgentMessage::Custom(custom) => format!("custom:{}", custom.kind),
            message => message.role().to_owned(),
        })
        .collect()
}

#[tokio::test]
async fn a_compacted_session_keeps_every_original_and_comes_back_from_its_summary() {
    let db = TempSqlite::new();
    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let faux = FauxProvider::new();
    let history = conversation(&faux, 6);
    let first = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = first
        .spawn(AgentSpec::new(settings(&faux)).with_session("long"))
        .await
        .unwrap();
    agent.set_messages(history.clone()).await.unwrap();
    faux.push(FauxTurn::text("They asked questions 0 to 4."));
    faux.push(FauxTurn::text("Here is the answer."));
    let outcome = agent.run("question 6").await.unwrap();

    let [report] = outcome.compactions.as_slice() else {
        panic!("one compaction: {:?}", outcome.compactions);
    };
    assert_eq!(report.reason, CompactionReason::Threshold);
    assert_eq!(report.summary_id, Some(13));
    assert!(report.tokens_after < report.tokens_before, "{report:?}");
    let state = agent.state().await.unwrap();
    assert_eq!(
        kinds(&state.messages),
        [
            "custom:compaction",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert_eq!(state.messages[1..4], history[9..]);
    first.shutdown().await;

    // The store has every original, then the summary and the kept messages again.
    let stored = store.load("long").await.unwrap().unwrap();
    let stored: Vec<AgentMessage> = stored.messages.iter().map(|m| (**m).clone()).collect();
    assert_eq!(stored.len(), 13 + 1 + 4 + 1);
    assert_eq!(stored[..12], history[..]);
    assert_eq!(stored[12].as_user().unwrap().text_content(), "question 6");
    let summary = CompactionSummary::of(&stored[13]).unwrap();
    assert_eq!(
        (
            summary.summary.as_str(),
            summary.first_seq,
            summary.last_seq,
            summary.kept
        ),
        ("They asked questions 0 to 4.", 0, 8, 4)
    );
    assert_eq!(stored[14..], state.messages[1..]);
    // An original stays reachable by its place, as `lookup` and the server read it.
    let first_message = store.messages("long", 0, 1).await.unwrap();
    assert_eq!(
        first_message[0].as_user().unwrap().text_content(),
        "question 0"
    );

    // A new process starts from the summary, and the model sees it first.
    let second = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = second
        .spawn(AgentSpec::new(settings(&faux)).with_session("long"))
        .await
        .unwrap();
    assert_eq!(agent.state().await.unwrap().messages, state.messages);
    faux.push(FauxTurn::text("Seven."));
    agent.run("question 7").await.unwrap();
    let request = faux.requests().last().unwrap().context.clone();
    let tiller::ai::Message::User(first_sent) = &request.messages[0] else {
        panic!("the summary goes first, as a user message");
    };
    assert!(
        first_sent
            .text_content()
            .ends_with("was compacted. Summary:]\nThey asked questions 0 to 4."),
        "{}",
        first_sent.text_content()
    );
    assert_eq!(request.messages.len(), 7);
    second.shutdown().await;
}

#[tokio::test]
async fn a_compaction_asked_for_runs_alone_with_its_instructions() {
    let faux = FauxProvider::new();
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(settings(&faux)))
        .await
        .unwrap();

    // Nothing to compact yet.
    assert_eq!(
        agent.compact(None).await.unwrap_err(),
        AgentError::CannotStart(ContinueError::EmptyContext)
    );
    agent
        .set_messages(vec![AgentMessage::user("hi"), AgentMessage::user("there")])
        .await
        .unwrap();
    let AgentError::NotCompacted { reason } = agent.compact(None).await.unwrap_err() else {
        panic!("a short transcript is not compacted");
    };
    assert!(reason.starts_with("nothing to compact"), "{reason}");

    agent.set_messages(conversation(&faux, 6)).await.unwrap();
    faux.push(FauxTurn::text("Numbers: 0 to 4."));
    let report = agent
        .compact(Some("Keep every number.".to_owned()))
        .await
        .unwrap();
    assert_eq!(report.reason, CompactionReason::Manual);
    assert_eq!(report.summary_id, Some(12));
    let asked = faux.requests().pop().unwrap().context;
    // The request adds to the summarizer's instructions: still a summary.
    assert_eq!(
        asked.system_prompt,
        Some(tiller::run::compaction::with_request(
            tiller::run::compaction::DEFAULT_INSTRUCTIONS,
            "Keep every number."
        ))
    );
    assert!(
        asked
            .system_prompt
            .as_deref()
            .unwrap()
            .ends_with("\n\nFor this summary, the user also asks: Keep every number.")
    );
    let state = agent.state().await.unwrap();
    let AgentMessage::Custom(summary) = &state.messages[0] else {
        panic!("the summary comes first");
    };
    assert_eq!(summary.kind, COMPACTION_KIND);
    assert_eq!(state.messages.len(), 1 + 3);

    // During a run, a compaction is refused.
    faux.push(FauxTurn::text("slow answer").delay(Duration::from_secs(30)));
    agent.prompt("question 6").await.unwrap();
    assert_eq!(agent.compact(None).await.unwrap_err(), AgentError::Busy);
    agent.abort();
    agent.wait_for_idle().await;
    supervisor.shutdown().await;
}
