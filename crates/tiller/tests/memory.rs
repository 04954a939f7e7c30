//! Memory that outlives a session, end to end: real agents on a supervisor
//! whose store is an SQLite file, a scripted model, the memory tools and the
//! working memory in each run's instructions.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::agents::MemoryConfig;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::{MemoryOwner, SessionStore};
use tiller::{
    AgentContext, AgentHandle, AgentMessage, AgentSettings, AgentSpec, Supervisor, SupervisorConfig,
};
use tiller_test_support::sqlite::TempSqlite;

async fn supervisor(db: &TempSqlite) -> (Supervisor, Arc<dyn SessionStore>) {
    let store = tiller::store::open(db.url()).await.unwrap();
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    (supervisor, store)
}

async fn spawn(
    supervisor: &Supervisor,
    store: &Arc<dyn SessionStore>,
    faux: &FauxProvider,
    context: AgentContext,
) -> AgentHandle {
    let settings = AgentSettings::new(faux.model()).with_system_prompt("You help.");
    let settings = MemoryConfig::default().applied_to(settings, store.clone());
    supervisor
        .spawn(AgentSpec::new(settings).with_context(context))
        .await
        .unwrap()
}

/// The text of each tool result of `agent`'s transcript, in order.
async fn tool_results(agent: &AgentHandle) -> Vec<(String, bool)> {
    let state = agent.state().await.unwrap();
    state
        .messages
        .iter()
        .filter_map(|message| match message {
            AgentMessage::Llm(tiller::ai::Message::ToolResult(result)) => {
                Some((result.text_content(), result.is_error))
            }
            _ => None,
        })
        .collect()
}

fn working(document: &str) -> String {
    format!(
        "You help.\n\n## Working memory\nWhat you keep about this user across conversations. Replace it whole with `update_working_memory` when you learn something lasting about them.\n<working_memory>\n{document}\n</working_memory>"
    )
}

#[tokio::test]
async fn what_an_agent_keeps_of_a_user_comes_back_in_a_new_session_and_a_new_process() {
    let db = TempSqlite::new();
    let (supervisor, store) = supervisor(&db).await;
    let faux = FauxProvider::new();
    let ada = AgentContext::new()
        .with_user_id("ada")
        .with_tenant_id("acme");
    let first = spawn(&supervisor, &store, &faux, ada.clone()).await;
    faux.push(
        FauxTurn::tool_call("update_working_memory", json!({"document": "Name: Ada"}))
            .with_tool_call("remember", json!({"fact": "Ada's cat is called Turing"})),
    );
    faux.push(FauxTurn::text("Noted."));
    first.run("I'm Ada; my cat is Turing.").await.unwrap();
    assert_eq!(
        tool_results(&first).await,
        [
            ("Working memory saved (9 bytes).".to_owned(), false),
            ("Remembered.".to_owned(), false)
        ]
    );
    assert_eq!(
        faux.requests()[0].context.system_prompt,
        Some(working("(empty)"))
    );
    supervisor.shutdown().await;

    // Another process on the same store, a new session.
    let (supervisor, store) = self::supervisor(&db).await;
    let second = spawn(&supervisor, &store, &faux, ada.clone()).await;
    faux.push(FauxTurn::tool_call(
        "recall",
        json!({"query": "What are the cats called?"}),
    ));
    faux.push(FauxTurn::text("Your cat is Turing, Ada."));
    second.run("What's my cat called?").await.unwrap();
    let requests = faux.requests();
    assert_eq!(
        requests[2].context.system_prompt,
        Some(working("Name: Ada"))
    );
    assert_eq!(
        tool_results(&second).await,
        [("- Ada's cat is called Turing".to_owned(), false)]
    );
    assert_ne!(second.session_id(), first.session_id());

    // The store holds it under Ada of acme alone.
    let owner = MemoryOwner::new("acme", "ada");
    assert_eq!(
        store.working_memory(&owner).await.unwrap().as_deref(),
        Some("Name: Ada")
    );
    let facts = store.memories(&owner, 0, 10).await.unwrap();
    assert_eq!(facts.len(), 1);
    assert!(
        store
            .memories(&MemoryOwner::new("other", "ada"), 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    supervisor.shutdown().await;
}

#[tokio::test]
async fn another_user_and_a_user_of_no_name_see_nothing_of_it() {
    let db = TempSqlite::new();
    let (supervisor, store) = supervisor(&db).await;
    let faux = FauxProvider::new();
    let ada = AgentContext::new().with_user_id("ada");
    store
        .set_working_memory(&MemoryOwner::new("default", "ada"), "Name: Ada")
        .await
        .unwrap();
    store
        .remember(&MemoryOwner::new("default", "ada"), "Ada's cat is Turing")
        .await
        .unwrap();

    let bob = spawn(&supervisor, &store, &faux, ada.with_user_id("bob")).await;
    faux.push(FauxTurn::tool_call("recall", json!({"query": "cat"})));
    faux.push(FauxTurn::text("I know nothing of a cat."));
    bob.run("Whose cat is Turing?").await.unwrap();
    assert_eq!(
        faux.requests()[0].context.system_prompt,
        Some(working("(empty)"))
    );
    assert_eq!(
        tool_results(&bob).await,
        [("Nothing remembered matches \"cat\".".to_owned(), false)]
    );

    let nobody = spawn(&supervisor, &store, &faux, AgentContext::new()).await;
    faux.push(
        FauxTurn::tool_call("recall", json!({"query": "cat"}))
            .with_tool_call("update_working_memory", json!({"document": "x"})),
    );
    faux.push(FauxTurn::text("No memory here."));
    nobody.run("Hello").await.unwrap();
    assert_eq!(
        faux.requests()[2].context.system_prompt.as_deref(),
        Some("You help.")
    );
    let refused = "memory is kept per user, and this conversation has no user id";
    assert_eq!(
        tool_results(&nobody).await,
        [(refused.to_owned(), true), (refused.to_owned(), true)]
    );
    supervisor.shutdown().await;
}

#[tokio::test]
async fn a_fact_past_its_bound_is_refused_to_the_model_and_nothing_is_kept() {
    let db = TempSqlite::new();
    let (supervisor, store) = supervisor(&db).await;
    let faux = FauxProvider::new();
    let agent = spawn(
        &supervisor,
        &store,
        &faux,
        AgentContext::new().with_user_id("ada"),
    )
    .await;
    let long = "x".repeat(tiller::store::MAX_MEMORY_BYTES + 1);
    faux.push(
        FauxTurn::tool_call("remember", json!({"fact": long}))
            .with_tool_call("remember", json!({"fact": "  "})),
    );
    faux.push(FauxTurn::text("Could not."));
    agent.run("Remember this").await.unwrap();
    assert_eq!(
        tool_results(&agent).await,
        [
            (
                "a memory of 4097 bytes is over the limit of 4096".to_owned(),
                true
            ),
            ("a memory needs some text".to_owned(), true)
        ]
    );
    assert!(
        store
            .memories(&MemoryOwner::new("default", "ada"), 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    supervisor.shutdown().await;
}
