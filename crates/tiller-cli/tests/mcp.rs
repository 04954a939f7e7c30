//! Agent files listing MCP servers, end to end: `tiller run` with an agent file
//! that takes its tools from the reference filesystem MCP server (from the npm
//! registry, `scripts/mcp.sh install`), a scripted model calling one of them. The
//! model is offered the server's tools under the server's prefix, less those the
//! file excludes, and gets the file's text back. Skipped with one line when the
//! server is missing, unless `TILLER_LIVE=required`.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Dialect, Scratch, finish};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_test_support::MockServer;

#[tokio::test]
async fn an_agent_file_listing_an_mcp_server_uses_its_tools_and_never_offers_the_excluded() {
    let Some(bin) =
        tiller_test_support::live::installed("mcp.sh", "bin", "the agent file MCP test")
    else {
        return;
    };
    let scratch = Scratch::new();
    std::fs::create_dir(scratch.path().join("docs")).unwrap();
    scratch.write("docs/notes.txt", "The meeting is at 10.");
    let docs = scratch.path().join("docs").canonicalize().unwrap();
    let notes = docs.join("notes.txt");
    let agent = scratch.write(
        "agent.yaml",
        &format!(
            "type: object\n\
             description: You answer from the documents.\n\
             json_schema_extra:\n  kind: agent\n  name: reader\n\
             \x20 mcp_servers:\n\
             \x20   - name: docs\n\
             \x20     command: [\"{}\", \"{}\"]\n\
             \x20     exclude_tools: [\"write_*\", edit_file, move_file, create_directory]\n\
             \x20 exclude_tools: [docs_read_media_file]\n",
            bin.join("mcp-server-filesystem").display(),
            docs.display()
        ),
    );
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "docs_read_text_file", json!({"path": notes})));
    server.push(dialect.text(&["It is at 10."]));
    let run = finish(dialect.tiller(
        &server,
        "run",
        &["--agent", agent.to_str().unwrap(), "When is the meeting?"],
    ))
    .await;
    assert_eq!(
        (run.code(), run.stdout.as_str()),
        (Some(0), "It is at 10.\n"),
        "{}",
        run.stderr
    );

    let requests = server.requests();
    let offered: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["function"]["name"].as_str().unwrap())
        .collect();
    assert!(offered.contains(&"docs_read_text_file"), "{offered:?}");
    assert!(offered.contains(&"docs_list_directory"), "{offered:?}");
    for excluded in [
        "docs_write_file",
        "docs_edit_file",
        "docs_move_file",
        "docs_read_media_file",
    ] {
        assert!(
            !offered.contains(&excluded),
            "{excluded} offered: {offered:?}"
        );
    }
    assert_eq!(
        dialect.tool_results(&requests[1]),
        [json!({"id": "call_1", "text": "The meeting is at 10."})]
    );
}

#[tokio::test]
async fn an_mcp_server_that_cannot_start_fails_the_run_before_the_model_is_called() {
    let scratch = Scratch::new();
    let agent = scratch.write(
        "agent.yaml",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: broken\n  mcp_servers:\n    - {name: ghost, command: [/nonexistent/mcp-server]}\n",
    );
    let server = MockServer::start().await;
    let run = finish(Dialect::OpenAi.tiller(
        &server,
        "run",
        &["--agent", agent.to_str().unwrap(), "Hello"],
    ))
    .await;
    assert_eq!(run.code(), Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .starts_with("tiller: MCP server `ghost`: cannot run `/nonexistent/mcp-server`"),
        "{}",
        run.stderr
    );
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn the_python_sdk_lists_and_calls_tillers_agents_over_tiller_mcp() {
    let Some(python) =
        tiller_test_support::live::installed("mcp.sh", "python", "the MCP Python SDK test")
    else {
        return;
    };
    let scratch = Scratch::new();
    std::fs::create_dir(scratch.path().join("agents")).unwrap();
    scratch.write(
        "agents/helper.yaml",
        "type: object\ntitle: Answers politely.\ndescription: You help.\njson_schema_extra: {kind: agent, name: helper}\n",
    );
    let client =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/mcp_client.py");
    let output = tokio::process::Command::new(python)
        .arg(client)
        .arg(env!("CARGO_BIN_EXE_tiller"))
        .arg(scratch.path().join("agents"))
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("TILLER_PROVIDER")
        .env_remove("TILLER_MODEL")
        .env_remove("TILLER_BASE_URL")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["server"], "tiller");
    assert_eq!(
        seen["tools"],
        json!([{
            "name": "helper",
            "description": "Asks the agent `helper` (it answers with its final answer). Answers politely.",
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "What to ask the agent."}},
                "required": ["text"],
                "additionalProperties": false
            }
        }])
    );
    let answer = seen["answered"]["content"][0]["text"].as_str().unwrap();
    assert!(
        answer.starts_with("You said: \"hello from MCP\"."),
        "{answer}"
    );
    // Not an error result (the flag is false or left out).
    assert_ne!(seen["answered"]["isError"], true);
    // The answer's text came as progress too, piece by piece.
    let streamed: String = seen["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|piece| piece.as_str().unwrap())
        .collect();
    assert_eq!(streamed, answer);
    assert_eq!(seen["refused"]["isError"], true);
    assert_eq!(
        seen["refused"]["content"][0]["text"],
        "`text` must be a string: what to ask the agent"
    );
    // Each definition is a prompt too: its instructions.
    assert_eq!(
        seen["prompts"],
        json!([{"name": "helper", "description": "The instructions of the agent `helper`. Answers politely."}])
    );
    assert_eq!(
        seen["prompt"]["messages"],
        json!([{"role": "user", "content": {"type": "text", "text": "You help."}}])
    );
}

/// An agent file's MCP server offers its prompts as a run's instructions
/// (`--instructions-prompt`, its arguments from `--prompt-arg`) and its resources
/// through `{prefix}read_resource`, which the file's exclude list can drop.
#[tokio::test]
async fn an_mcp_servers_prompt_instructs_the_run_and_its_resources_are_read_through_a_tool() {
    let Some(bin) = tiller_test_support::live::installed("mcp.sh", "bin", "the MCP prompts test")
    else {
        return;
    };
    let scratch = Scratch::new();
    let file = |exclude: &str| {
        format!(
            "type: object\n\
             description: You answer.\n\
             json_schema_extra:\n  kind: agent\n  name: weather\n\
             \x20 mcp_servers:\n\
             \x20   - name: every\n\
             \x20     command: [\"{}\", stdio]\n\
             \x20     include_tools: [echo, read_resource]\n\
             \x20 exclude_tools: [{exclude}]\n",
            bin.join("mcp-server-everything").display(),
        )
    };
    let agent = scratch.write("agent.yaml", &file("nothing"));
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.text(&["Sunny."]));
    let run = finish(dialect.tiller(
        &server,
        "run",
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--instructions-prompt",
            "every/args-prompt",
            "--prompt-arg",
            "city=Paris",
            "Well?",
        ],
    ))
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let request = &server.requests()[0];
    assert_eq!(
        request.body["messages"][0],
        json!({"role": "system", "content": "What's weather in Paris?"})
    );
    let offered: Vec<&str> = request.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["every_echo", "every_read_resource"]);

    // Excluded like any tool; an unknown prompt is an error before the model is called.
    let agent = scratch.write("agent.yaml", &file("every_read_resource"));
    server.push(dialect.text(&["Sunny."]));
    let run = finish(dialect.tiller(
        &server,
        "run",
        &["--agent", agent.to_str().unwrap(), "Well?"],
    ))
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let offered = server.requests()[1].body["tools"].clone();
    assert_eq!(offered.as_array().unwrap().len(), 1, "{offered}");
    let unknown = finish(dialect.tiller(
        &server,
        "run",
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--instructions-prompt",
            "nope",
            "Well?",
        ],
    ))
    .await;
    assert_eq!(unknown.code(), Some(1), "{}", unknown.stderr);
    assert!(
        unknown
            .stderr
            .contains("prompt `nope`: no connected MCP server offers it"),
        "{}",
        unknown.stderr
    );
    assert_eq!(server.requests().len(), 2);
}
