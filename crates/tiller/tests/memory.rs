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
        .remember(
            &MemoryOwner::new("default", "ada"),
            "Ada's cat is Turing",
            None,
        )
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

/// With an embedding model (here a scripted OpenAI-compatible server), each
/// fact is kept with its vector and a recall finds it by meaning where no word
/// matches; a fact whose embedding fails is kept all the same, found by words.
#[tokio::test]
async fn with_embeddings_a_fact_is_found_by_meaning_and_kept_when_embedding_fails() {
    use tiller::agents::EmbeddingsConfig;
    use tiller_test_support::{MockResponse, MockServer};
    let db = TempSqlite::new();
    let (supervisor, store) = supervisor(&db).await;
    let embeddings = MockServer::start().await;
    let vector = |values: [f32; 2]| {
        MockResponse::json(200, &json!({"data": [{"index": 0, "embedding": values}]}))
    };
    embeddings.push(vector([1.0, 0.0]));
    embeddings.push(MockResponse::json(
        400,
        &json!({"error": {"message": "input too long"}}),
    ));
    embeddings.push(vector([0.9, 0.1]));
    let memory = MemoryConfig {
        embeddings: Some(EmbeddingsConfig {
            provider: "local".to_owned(),
            model: "nomic".to_owned(),
            base_url: Some(embeddings.base_url()),
            dimensions: None,
            api_key_env: None,
        }),
        ..MemoryConfig::default()
    };
    let faux = FauxProvider::new();
    let settings = memory.applied_to(AgentSettings::new(faux.model()), store.clone());
    let ada = AgentContext::new().with_user_id("ada");
    let agent = supervisor
        .spawn(AgentSpec::new(settings).with_context(ada))
        .await
        .unwrap();
    faux.push(FauxTurn::tool_call(
        "remember",
        json!({"fact": "Ada's cat is called Turing"}),
    ));
    faux.push(FauxTurn::tool_call(
        "remember",
        json!({"fact": "Ada likes tea"}),
    ));
    faux.push(FauxTurn::text("Noted."));
    agent.run("My cat is Turing; I like tea.").await.unwrap();
    faux.push(FauxTurn::tool_call("recall", json!({"query": "pet"})));
    faux.push(FauxTurn::text("Turing."));
    agent.run("What is my pet called?").await.unwrap();
    assert_eq!(
        tool_results(&agent).await,
        [
            ("Remembered.".to_owned(), false),
            (
                "Remembered, to be found by its words only (it could not be embedded: HTTP 400 from local: input too long)."
                    .to_owned(),
                false
            ),
            ("- Ada's cat is called Turing".to_owned(), false),
        ]
    );
    let inputs: Vec<_> = embeddings
        .requests()
        .into_iter()
        .map(|request| (request.path, request.body["input"].clone()))
        .collect();
    assert_eq!(
        inputs,
        [
            (
                "/v1/embeddings".to_owned(),
                json!(["Ada's cat is called Turing"])
            ),
            ("/v1/embeddings".to_owned(), json!(["Ada likes tea"])),
            ("/v1/embeddings".to_owned(), json!(["pet"])),
        ]
    );
    // Both facts are kept; words still find the one without a vector.
    let owner = MemoryOwner::new("default", "ada");
    assert_eq!(store.memories(&owner, 0, 10).await.unwrap().len(), 2);
    let by_words = store.recall(&owner, "tea", 5).await.unwrap();
    assert_eq!(by_words[0].text, "Ada likes tea");
    supervisor.shutdown().await;
}
