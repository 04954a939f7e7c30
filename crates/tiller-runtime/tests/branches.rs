//! Sessions that branch: a conversation forked at one of its messages and
//! carried on from there asks the model what the original asked it at that
//! point (the same system prompt, written from the context as it stood, the
//! same messages), while the original stays as it was.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use pretty_assertions::assert_eq;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::{SessionFilter, SessionStore, SqlStore, StoreError};
use tiller::{
    AgentContext, AgentError, AgentSettings, AgentSpec, FnTool, Supervisor, SupervisorConfig,
    ToolOutput, ToolSet,
    run::{ContextState, StoredContext},
};
use tiller_test_support::sqlite::TempSqlite;

/// The issues the conversation went through.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct Discussed {
    count: u32,
    last: Option<String>,
}

impl ContextState for Discussed {
    const NAME: &'static str = "discussed";
}

/// An agent whose tool counts issues in its context, and whose system prompt
/// says what it counted.
fn settings(faux: &FauxProvider) -> Arc<AgentSettings> {
    let discuss = FnTool::new(
        "discuss",
        "Notes that an issue was discussed",
        json!({"type": "object", "properties": {"issue": {"type": "string"}}, "required": ["issue"]}),
        |args, ctx| async move {
            let issue = args["issue"].as_str().unwrap_or_default().to_owned();
            ctx.update_state(|discussed: &mut Discussed| {
                discussed.count += 1;
                discussed.last = Some(issue);
            });
            Ok(ToolOutput::text("noted"))
        },
    );
    Arc::new(
        AgentSettings::new(faux.model())
            .with_tools(ToolSet::new([Arc::new(discuss) as _]).unwrap())
            .with_system_prompt_fn(|context: &AgentContext| {
                let discussed = context.state::<Discussed>().unwrap_or_default();
                format!(
                    "Issues so far: {} (last: {}).",
                    discussed.count,
                    discussed.last.as_deref().unwrap_or("none")
                )
            }),
    )
}

#[tokio::test]
async fn a_branch_asks_the_model_what_the_original_asked_at_its_fork() {
    let db = TempSqlite::new();
    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let faux = FauxProvider::new();
    let settings = settings(&faux);
    let original = supervisor
        .spawn(AgentSpec::new(settings.clone()).with_session("original"))
        .await
        .unwrap();
    for issue in ["billing", "login"] {
        faux.push(FauxTurn::tool_call("discuss", json!({"issue": issue})));
        faux.push(FauxTurn::text("Noted."));
        original.run(format!("Discuss {issue}.")).await.unwrap();
    }
    faux.push(FauxTurn::text("Login."));
    original.run("Which issue was last?").await.unwrap();
    // 0 user, 1 call, 2 result, 3 answer; 4 user, 5 call, 6 result, 7 answer;
    // 8 user, 9 answer.
    let asked = faux.requests()[4].context.clone();
    assert_eq!(
        asked.system_prompt.as_deref(),
        Some("Issues so far: 2 (last: login).")
    );

    // Again from the last question, and from the second issue.
    original.fork(8, "again").await.unwrap();
    original.fork(4, "earlier").await.unwrap();
    for (branch, at, prompt) in [
        ("again", 8, "Issues so far: 2 (last: login)."),
        ("earlier", 4, "Issues so far: 1 (last: billing)."),
    ] {
        let agent = supervisor
            .spawn(AgentSpec::new(settings.clone()).with_session(branch))
            .await
            .unwrap();
        faux.push(FauxTurn::text("Once more."));
        agent.run("Which issue was last?").await.unwrap();
        let retried = faux.requests().last().unwrap().context.clone();
        assert_eq!(retried.system_prompt.as_deref(), Some(prompt), "{branch}");
        assert_eq!(retried.tools, asked.tools);
        assert_eq!(retried.messages[..at], asked.messages[..at], "{branch}");
        assert_eq!(retried.messages.len(), at + 1);
        let context: StoredContext = store
            .load(branch)
            .await
            .unwrap()
            .unwrap()
            .record
            .context
            .decode()
            .unwrap();
        assert_eq!(
            context.states["discussed"]["count"],
            json!(if at == 8 { 2 } else { 1 })
        );
    }

    // The original is as it was, and lists its branches.
    assert_eq!(original.state().await.unwrap().messages.len(), 10);
    let branches = store
        .list(&SessionFilter {
            parent: Some("original".to_owned()),
            ..SessionFilter::default()
        })
        .await
        .unwrap();
    let mut listed: Vec<_> = branches
        .iter()
        .map(|info| {
            (
                info.record.id.as_str(),
                info.record.branch.as_ref().unwrap().at,
                info.messages,
            )
        })
        .collect();
    listed.sort();
    assert_eq!(listed, [("again", 8, 10), ("earlier", 4, 6)]);

    // Past the end, or to no session: refused, nothing written.
    assert_eq!(
        original.fork(11, "beyond").await.unwrap_err(),
        AgentError::Store(StoreError::ForkPastEnd {
            session: "original".to_owned(),
            at: 11,
            messages: 10
        })
    );
    assert!(matches!(
        original.fork(2, "").await.unwrap_err(),
        AgentError::InvalidBranch { .. }
    ));
    assert_eq!(
        original.fork(2, "again").await.unwrap_err(),
        AgentError::Store(StoreError::SessionExists("again".to_owned()))
    );
    assert_eq!(store.load("beyond").await.unwrap(), None);
    supervisor.shutdown().await;
}
