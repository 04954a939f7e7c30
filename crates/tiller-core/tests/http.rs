//! The loop over real HTTP: recorded tool-calling conversations replayed by a
//! loopback server, one per provider, with the tools answering as they did when
//! recorded. The follow-up request must carry each result tied to its call.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{end_reason, prompt, roles};
use pretty_assertions::assert_eq;
use serde_json::Value;
use tiller_ai::{ApiKey, Model};
use tiller_core::{
    AgentMessage, AgentTool, FnTool, LoopConfig, LoopContext, RunEnd, ToolOutput, ToolSet,
};
use tiller_test_support::{Cassette, MockServer};

/// Tools declared as in the recorded request, answering with the outputs the
/// recording sent back.
fn recorded_tools(declared: &[(String, String, Value)], outputs: &[(String, String)]) -> ToolSet {
    let tools = declared.iter().map(|(name, description, schema)| {
        let answer = outputs
            .iter()
            .find(|(tool, _)| tool == name)
            .map(|(_, out)| out.clone())
            .unwrap_or_default();
        Arc::new(FnTool::new(
            name.clone(),
            description.clone(),
            schema.clone(),
            move |_, _| {
                let answer = answer.clone();
                async move { Ok(ToolOutput::text(answer)) }
            },
        )) as Arc<dyn AgentTool>
    });
    ToolSet::new(tools).unwrap()
}

/// Runs the recorded prompt through the loop and checks it completed: two tool
/// results between the first answer and the last; answers the new messages.
async fn run_two_tool_rounds(
    config: LoopConfig,
    system: &str,
    user_prompt: &str,
    tools: ToolSet,
) -> Vec<AgentMessage> {
    let context = LoopContext {
        system_prompt: Some(system.to_owned()),
        messages: vec![],
        tools,
        ..LoopContext::default()
    };
    let (events, messages) = prompt(user_prompt, context, config).await;
    assert_eq!(end_reason(&events), RunEnd::Completed);
    assert_eq!(
        roles(&messages),
        [
            "user",
            "assistant",
            "tool_result",
            "tool_result",
            "assistant"
        ]
    );
    messages
}

#[tokio::test]
async fn an_openai_tool_conversation_over_http() {
    let cassette = Cassette::load(
        "openai",
        "completions_api__completions_api_streams_two_tool_calls_before_final_answer",
    );
    let first = &cassette.exchanges[0].request.body;
    let second = &cassette.exchanges[1].request.body;
    let system = first["messages"][0]["content"][0]["text"].as_str().unwrap();
    let prompt = first["messages"][1]["content"].as_str().unwrap();
    let declared: Vec<(String, String, Value)> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            (
                f["name"].as_str().unwrap().to_owned(),
                f["description"].as_str().unwrap().to_owned(),
                f["parameters"].clone(),
            )
        })
        .collect();
    let sent_back: Vec<&Value> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    let calls = &second["messages"][2]["tool_calls"];
    let outputs: Vec<(String, String)> = sent_back
        .iter()
        .map(|m| {
            let call = calls
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["id"] == m["tool_call_id"])
                .unwrap();
            (
                call["function"]["name"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();

    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    let model = Model::openai_compatible(server.base_url(), first["model"].as_str().unwrap())
        .with_provider("openai");
    let resolved = Arc::new(AtomicUsize::new(0));
    let config = {
        let resolved = resolved.clone();
        LoopConfig::new(model).with_api_key_resolver(move |provider| {
            assert_eq!(provider, "openai");
            resolved.fetch_add(1, Ordering::SeqCst);
            async { Some(ApiKey::new("resolved-key")) }
        })
    };
    let messages =
        run_two_tool_rounds(config, system, prompt, recorded_tools(&declared, &outputs)).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        resolved.load(Ordering::SeqCst),
        2,
        "the key is asked for before every model call"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.header("authorization") == Some("Bearer resolved-key"))
    );
    let follow_up = &requests[1].body["messages"];
    let ours: Vec<(String, String)> = follow_up
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let recorded: Vec<(String, String)> = sent_back
        .iter()
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(ours, recorded);
    assert_eq!(
        follow_up[2]["tool_calls"],
        second["messages"][2]["tool_calls"]
    );
    let answer = messages[4].as_assistant().unwrap().text();
    assert!(
        answer.contains("crimson-harbor") && answer.contains("silver-orchard"),
        "{answer}"
    );
}

#[tokio::test]
async fn an_anthropic_tool_conversation_over_http() {
    let cassette = Cassette::load(
        "anthropic",
        "streaming_tools__streaming_tools_batches_multiple_tool_results_in_one_followup_message",
    );
    let first = &cassette.exchanges[0].request.body;
    let second = &cassette.exchanges[1].request.body;
    let system = first["system"][0]["text"].as_str().unwrap();
    let prompt = first["messages"][0]["content"][0]["text"].as_str().unwrap();
    let declared: Vec<(String, String, Value)> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["description"].as_str().unwrap().to_owned(),
                t["input_schema"].clone(),
            )
        })
        .collect();
    let uses = second["messages"][1]["content"].as_array().unwrap();
    let results = second["messages"][2]["content"].as_array().unwrap();
    let outputs: Vec<(String, String)> = results
        .iter()
        .map(|r| {
            let call = uses.iter().find(|u| u["id"] == r["tool_use_id"]).unwrap();
            (
                call["name"].as_str().unwrap().to_owned(),
                r["content"][0]["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();

    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    let model = Model::anthropic_compatible(server.base_url(), first["model"].as_str().unwrap())
        .with_provider("anthropic");
    let mut config = LoopConfig::new(model);
    config.run.stream.transport.api_key = Some(ApiKey::new("test-key"));
    run_two_tool_rounds(config, system, prompt, recorded_tools(&declared, &outputs)).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let turns = requests[1].body["messages"].as_array().unwrap().clone();
    assert_eq!(
        turns
            .iter()
            .map(|t| t["role"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["user", "assistant", "user"]
    );
    let ours: Vec<(String, String)> = turns[2]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["tool_use_id"].as_str().unwrap().to_owned(),
                b["content"][0]["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let recorded: Vec<(String, String)> = results
        .iter()
        .map(|b| {
            (
                b["tool_use_id"].as_str().unwrap().to_owned(),
                b["content"][0]["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        ours, recorded,
        "both results in one user turn, tied to their calls"
    );
}
