//! Agents on shards (`SupervisorConfig::shards`): each agent's actor, run and
//! tools stay on the one shard thread its id hashes to, across runs and after
//! hibernation; a model streamed over real HTTP arrives whole and in order.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{idle, is_agent_end, until};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentEvent, AgentSettings, AgentSpec, AgentTool, Delivered, FnTool, Supervisor,
    SupervisorConfig, ToolOutput, ToolSet, runtime::Shards,
};
use tiller_test_support::Cassette;
use tiller_test_support::MockServer;
use tiller_test_support::events::describe;

/// Two shards; `hibernate_after` as given.
fn sharded(hibernate_after: Option<Duration>) -> SupervisorConfig {
    SupervisorConfig {
        shards: Shards::Count(2),
        hibernate_after,
        ..SupervisorConfig::default()
    }
}

/// A `where` tool that notes the thread it ran on, per agent (its argument).
fn where_tool(seen: &Arc<Mutex<HashMap<String, Vec<String>>>>) -> Arc<dyn AgentTool> {
    let seen = seen.clone();
    Arc::new(FnTool::new(
        "where",
        "Says where it ran",
        json!({"type": "object", "properties": {"agent": {"type": "string"}}}),
        move |arguments, _| {
            let seen = seen.clone();
            async move {
                let agent = arguments["agent"].as_str().unwrap_or_default().to_owned();
                let thread = std::thread::current()
                    .name()
                    .unwrap_or("unnamed")
                    .to_owned();
                seen.lock().unwrap().entry(agent).or_default().push(thread);
                Ok(ToolOutput::text("here"))
            }
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agents_runs_and_tools_stay_on_its_shard_even_after_hibernation() {
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        // Each run: one call of `where` naming the agent (its prompt), then an answer.
        if request
            .context
            .messages
            .last()
            .is_some_and(|message| matches!(message, tiller::ai::Message::ToolResult(_)))
        {
            FauxTurn::text("done")
        } else {
            let agent = request.last_user_text().unwrap_or_default();
            FauxTurn::tool_call("where", json!({ "agent": agent }))
        }
    });
    // Hibernated at once, so that every run begins with a thaw.
    let supervisor = Supervisor::with_config(sharded(Some(Duration::ZERO)))
        .await
        .unwrap();
    let settings =
        AgentSettings::new(faux.model()).with_tools(ToolSet::new(vec![where_tool(&seen)]).unwrap());
    let mut agents = Vec::new();
    for n in 0..32 {
        let agent = supervisor
            .spawn(AgentSpec::new(settings.clone()).with_id(format!("agent-{n}")))
            .await
            .unwrap();
        agents.push(agent);
    }
    for _ in 0..2 {
        for (n, agent) in agents.iter().enumerate() {
            let mut events = agent.subscribe();
            agent.prompt(format!("agent-{n}")).await.unwrap();
            until(&mut events, is_agent_end).await;
            idle(agent).await;
        }
    }
    supervisor.shutdown().await;
    let seen = seen.lock().unwrap();
    let mut threads = BTreeSet::new();
    for n in 0..32 {
        let ran = &seen[&format!("agent-{n}")];
        assert_eq!(ran.len(), 2, "agent-{n}: {ran:?}");
        assert!(ran[0].starts_with("tiller-shard-"), "agent-{n}: {ran:?}");
        assert_eq!(ran[0], ran[1], "agent-{n} moved between shards");
        threads.insert(ran[0].clone());
    }
    // 32 agents hashed over two shards: both have some.
    assert_eq!(
        threads,
        BTreeSet::from(["tiller-shard-0".to_owned(), "tiller-shard-1".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_agent_streams_its_model_over_http_whole_and_in_order() {
    let cassette = Cassette::load(
        "openai",
        "chat_terminal_metadata_matrix__streaming_gpt_4o_mini_roomy_plain_one",
    );
    let server = MockServer::start().await;
    let supervisor = Supervisor::with_config(sharded(None)).await.unwrap();
    let model =
        tiller::Model::openai_compatible(server.base_url(), "gpt-test").with_provider("openai");
    let mut settings = AgentSettings::new(model);
    settings.definition.run.stream.transport.api_key = Some(tiller::ai::ApiKey::new("test-key"));
    let mut expected = None;
    for n in 0..4 {
        server.push_cassette(&cassette);
        let agent = supervisor
            .spawn(AgentSpec::new(settings.clone()).with_id(format!("s{n}")))
            .await
            .unwrap();
        let mut events = agent.subscribe();
        agent.prompt("Say hello.").await.unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            let mut seen = Vec::new();
            while let Some(envelope) = events.next().await {
                if let Delivered::Event(event) = &envelope.event {
                    seen.push(event.clone());
                    if matches!(event, AgentEvent::AgentEnd { .. }) {
                        break;
                    }
                }
            }
            seen
        })
        .await
        .expect("the run never ended");
        let described = describe(&seen);
        // Every agent, whichever shard, sees the same events in the same order.
        match &expected {
            None => expected = Some(described),
            Some(expected) => assert_eq!(&described, expected),
        }
    }
    let described = expected.unwrap();
    assert_eq!(described.first().map(String::as_str), Some("agent_start"));
    assert_eq!(
        described.last().map(String::as_str),
        Some("agent_end Completed 2")
    );
    assert!(
        described
            .iter()
            .any(|line| line.starts_with("message_update"))
    );
    supervisor.shutdown().await;
}
