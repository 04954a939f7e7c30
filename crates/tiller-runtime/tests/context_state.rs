//! Context that persists and tools can write: the seed's `issues_discussed`
//! example. A tool counts the issues discussed through its `ToolContext`; the
//! count is stored with its result and the next run's system prompt function
//! sees it — in a new process on the same SQLite file, with every id of the
//! context back, and after a thaw.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::{MemoryStore, SessionStore, SqlStore};
use tiller::{
    AgentContext, AgentSettings, AgentSpec, FnTool, Supervisor, SupervisorConfig, ToolOutput,
    ToolSet,
    run::{ContextState, StoredContext},
    runtime::AgentStatus,
};
use tiller_test_support::sqlite::TempSqlite;

/// How many issues the conversation went through, and the last one.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct IssuesDiscussed {
    count: u32,
    last: Option<String>,
}

impl ContextState for IssuesDiscussed {
    const NAME: &'static str = "issues_discussed";
}

fn settings(faux: &FauxProvider) -> AgentSettings {
    let discuss = FnTool::new(
        "discuss_issue",
        "Notes that an issue was discussed",
        json!({"type": "object", "properties": {"issue": {"type": "string"}}, "required": ["issue"]}),
        |args, ctx| async move {
            let issue = args["issue"].as_str().unwrap_or_default().to_owned();
            ctx.update_state(|discussed: &mut IssuesDiscussed| {
                discussed.count += 1;
                discussed.last = Some(issue);
            });
            Ok(ToolOutput::text("noted"))
        },
    );
    AgentSettings::new(faux.model())
        .with_tools(ToolSet::new([Arc::new(discuss) as _]).unwrap())
        .with_system_prompt_fn(|context: &AgentContext| {
            let discussed = context.state::<IssuesDiscussed>().unwrap_or_default();
            format!(
                "You help {}. Issues discussed so far: {} (last: {}).",
                context.user_id().unwrap_or("someone"),
                discussed.count,
                discussed.last.as_deref().unwrap_or("none")
            )
        })
}

/// The system prompt of the model's last request.
fn last_prompt(faux: &FauxProvider) -> String {
    faux.requests()
        .last()
        .unwrap()
        .context
        .system_prompt
        .clone()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_tools_state_is_stored_with_its_result_and_the_next_run_sees_it() {
    let db = TempSqlite::new();
    let faux = FauxProvider::new();
    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let first = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let context = AgentContext::new()
        .with_tenant_id("acme")
        .with_user_id("ana")
        .with_client_id("web")
        .with_evaluation(true);
    let agent = first
        .spawn(
            AgentSpec::new(settings(&faux))
                .with_session("support")
                .with_context(context),
        )
        .await
        .unwrap();

    faux.push(FauxTurn::tool_call(
        "discuss_issue",
        json!({"issue": "login fails"}),
    ));
    faux.push(FauxTurn::text("Noted the login issue."));
    agent.run("Login fails for me.").await.unwrap();
    assert_eq!(
        last_prompt(&faux),
        "You help ana. Issues discussed so far: 0 (last: none).",
        "the run that discusses it started before"
    );
    // Stored with the result, in the same write.
    let stored = store.load("support").await.unwrap().unwrap();
    let result = stored.messages[2].as_tool_result().unwrap();
    assert_eq!(
        result.state["issues_discussed"],
        json!({"count": 1, "last": "login fails"})
    );
    let kept: StoredContext = stored.record.context.decode().unwrap();
    assert_eq!(
        kept.states["issues_discussed"],
        json!({"count": 1, "last": "login fails"})
    );

    faux.push(FauxTurn::text("Anything else?"));
    agent.run("Thanks.").await.unwrap();
    assert_eq!(
        last_prompt(&faux),
        "You help ana. Issues discussed so far: 1 (last: login fails)."
    );

    faux.push(FauxTurn::tool_call(
        "discuss_issue",
        json!({"issue": "billing"}),
    ));
    faux.push(FauxTurn::text("Noted billing."));
    agent.run("And billing is wrong.").await.unwrap();
    first.shutdown().await;

    // A new process on the same file, resuming with no context of its own: every
    // id, the evaluation flag and the state come back.
    let second = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let resumed = second
        .spawn(
            AgentSpec::new(settings(&faux))
                .with_session("support")
                .with_owner(Some("acme".into()), Some("ana".into())),
        )
        .await
        .unwrap();
    let state = resumed.state().await.unwrap();
    assert_eq!(
        (
            state.context.client_id.as_deref(),
            state.context.evaluation,
            state.context.user_id.as_deref()
        ),
        (Some("web"), true, Some("ana"))
    );
    faux.push(FauxTurn::text("Two issues so far."));
    resumed.run("Where are we?").await.unwrap();
    assert_eq!(
        last_prompt(&faux),
        "You help ana. Issues discussed so far: 2 (last: billing)."
    );
    second.shutdown().await;
}

/// A hibernated agent thaws with the state its tools set: the store has it.
#[tokio::test(start_paused = true)]
async fn a_thawed_agent_has_the_state_its_tools_set() {
    let faux = FauxProvider::new();
    let config = SupervisorConfig {
        hibernate_after: Some(Duration::from_secs(60)),
        ..SupervisorConfig::default()
    };
    let supervisor = Supervisor::with_store(config, Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings(&faux)).with_context(
                AgentContext::new()
                    .with_user_id("bo")
                    .with_state(&IssuesDiscussed::default()),
            ),
        )
        .await
        .unwrap();
    faux.push(FauxTurn::tool_call(
        "discuss_issue",
        json!({"issue": "printer"}),
    ));
    faux.push(FauxTurn::text("Noted."));
    agent.run("The printer jams.").await.unwrap();
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(agent.status(), AgentStatus::Hibernated);
    faux.push(FauxTurn::text("One so far."));
    agent.run("How many?").await.unwrap();
    assert_eq!(
        last_prompt(&faux),
        "You help bo. Issues discussed so far: 1 (last: printer)."
    );
    supervisor.shutdown().await;
}

/// A call sees the state an earlier call of the same run set: two issues in one
/// run count two.
#[tokio::test]
async fn calls_of_one_run_build_on_each_others_state() {
    let faux = FauxProvider::new();
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(settings(&faux)))
        .await
        .unwrap();
    faux.push(FauxTurn::tool_call(
        "discuss_issue",
        json!({"issue": "login"}),
    ));
    faux.push(FauxTurn::tool_call(
        "discuss_issue",
        json!({"issue": "billing"}),
    ));
    faux.push(FauxTurn::text("Both noted."));
    agent.run("Login and billing are broken.").await.unwrap();
    faux.push(FauxTurn::text("Two."));
    agent.run("How many?").await.unwrap();
    assert_eq!(
        last_prompt(&faux),
        "You help someone. Issues discussed so far: 2 (last: billing)."
    );
    supervisor.shutdown().await;
}
