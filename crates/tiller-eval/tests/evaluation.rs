//! Suites run from Rust on a host's own faux models: the suite's budget bounds
//! all its runs together, a conversation is the transcript the model sees, a
//! run id is used once, and runs are kept in sessions of their own.

#![allow(clippy::unwrap_used)]

use pretty_assertions::assert_eq;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_eval::{EvalError, Evaluation, Progress, Suite};
use tiller_runtime::Supervisor;
use tiller_store::SessionFilter;

/// A faux model that answers how many messages it was sent and the last one.
fn counting() -> FauxProvider {
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        FauxTurn::text(format!(
            "{} messages, the last: {}",
            request.context.messages.len(),
            request.last_user_text().unwrap_or_default()
        ))
    });
    faux
}

#[tokio::test]
async fn the_suites_budget_bounds_all_its_runs_together() {
    let cases: String = (0..6)
        .map(|n| format!("  - {{name: c{n}, input: hi {n}}}\n"))
        .collect();
    let suite = Suite::parse(
        "budget.yaml",
        &format!("models: [m]\nconcurrency: 1\nbudget: {{model_calls: 4}}\ncases:\n{cases}"),
    )
    .unwrap();
    let supervisor = Supervisor::start().await.unwrap();
    let mut told = Vec::new();
    let report = Evaluation::new(&suite)
        .with_run("budget")
        .with_model("m", counting().model())
        .on_progress(|progress| told.push(*progress))
        .run(&supervisor)
        .await
        .unwrap();
    // One at a time: the first four runs spend the four calls.
    let outcomes: Vec<(bool, Vec<String>)> = report
        .cells
        .iter()
        .map(|cell| (cell.runs[0].passed, cell.runs[0].failures.clone()))
        .collect();
    let ran_out = vec![
        "the suite's budget ran out (the tenant budget of model_calls ran out: 4 spent of 4)"
            .to_owned(),
    ];
    let not_run = vec!["not run: the suite's budget had run out".to_owned()];
    assert_eq!(
        outcomes,
        [
            (true, vec![]),
            (true, vec![]),
            (true, vec![]),
            (true, vec![]),
            (false, ran_out),
            (false, not_run),
        ]
    );
    assert!(!report.complete);
    assert_eq!(
        told.last(),
        Some(&Progress {
            done: 6,
            total: 6,
            passed: 4
        })
    );
    assert_eq!(told.len(), 6);
    // Its run id is taken now, and stays taken once its sessions are deleted:
    // what it spent would count against a budget again.
    let again = Suite::parse("again.yaml", "models: [m]\ncases: [{name: a, input: hi}]\n").unwrap();
    let rerun = || {
        Evaluation::new(&again)
            .with_run("budget")
            .with_model("m", counting().model())
            .run(&supervisor)
    };
    assert_eq!(
        rerun().await.unwrap_err(),
        EvalError::RunExists("budget".into())
    );
    let store = supervisor.store();
    let sessions = store
        .list(&SessionFilter {
            tenant_id: Some("eval-budget".into()),
            ..SessionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(sessions.len(), 5);
    for info in sessions {
        assert!(store.delete(&info.record.id).await.unwrap());
    }
    assert_eq!(
        rerun().await.unwrap_err(),
        EvalError::RunExists("budget".into())
    );
}

#[tokio::test]
async fn a_conversation_is_the_transcript_and_each_run_keeps_a_session_of_its_own() {
    let suite = Suite::parse(
        "talk.yaml",
        "models: [m]\nrepetitions: 2\ncases:\n  - name: talk\n    context: {user_id: ada}\n    conversation: [{user: Hi}, {assistant: Hello!}, {user: Again}]\n    expect: [{equals: '3 messages, the last: Again'}, {max_turns: 1}, {no_tool: true}]\n",
    )
    .unwrap();
    let supervisor = Supervisor::start().await.unwrap();
    let report = Evaluation::new(&suite)
        .with_run("talk")
        .with_model("m", counting().model())
        .run(&supervisor)
        .await
        .unwrap();
    assert_eq!((report.passed, report.runs), (2, 2));
    let sessions: Vec<String> = report.cells[0]
        .runs
        .iter()
        .map(|run| run.session.clone())
        .collect();
    assert_eq!(sessions, ["eval-talk.talk.m.0", "eval-talk.talk.m.1"]);
    let mut stored: Vec<(String, Option<String>, u64)> = supervisor
        .store()
        .list(&SessionFilter {
            tenant_id: Some("eval-talk".into()),
            ..SessionFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|info| (info.record.id, info.record.user_id, info.messages))
        .collect();
    stored.sort();
    assert_eq!(
        stored,
        [
            ("eval-talk.talk.m.0".to_owned(), Some("ada".to_owned()), 4),
            ("eval-talk.talk.m.1".to_owned(), Some("ada".to_owned()), 4),
        ]
    );
}

#[tokio::test]
async fn a_bad_run_id_or_model_is_refused_before_any_run() {
    let suite = Suite::parse(
        "s.yaml",
        "models: [nowhere/model]\ncases: [{name: a, input: hi}]\n",
    )
    .unwrap();
    let supervisor = Supervisor::start().await.unwrap();
    let refused = Evaluation::new(&suite)
        .with_run("a/b")
        .run(&supervisor)
        .await;
    assert_eq!(refused.unwrap_err(), EvalError::RunId("a/b".into()));
    let refused = Evaluation::new(&suite)
        .with_env(|_| None)
        .run(&supervisor)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        EvalError::Model(
            "models[0].model: nowhere/model: unknown model `nowhere/model`: expected \
             `provider/model-id` with a provider among openai, anthropic, gemini, \
             openai-responses, bedrock, openrouter, groq, deepseek, mistral, llamacpp, vllm, ollama"
                .into()
        )
    );
    assert!(
        supervisor
            .store()
            .list(&SessionFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}
