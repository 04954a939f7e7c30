//! `tiller mcp`: the agent definitions of a folder offered to an MCP host over
//! stdio, each a tool that runs the agent ([`tiller::agents::AgentAsTool`] served by
//! [`tiller::mcp::McpToolServer`]), until the host disconnects.

use std::path::Path;

use tiller::{Supervisor, agents::AskAgentConfig, mcp::McpToolServer};

use crate::outcome::Exit;
use crate::serve::connected_definitions;

/// Runs `tiller mcp`.
pub async fn mcp(agents: Option<&Path>, llms: Option<&Path>) -> Exit {
    let definitions = match connected_definitions(agents, llms).await {
        Ok(definitions) => definitions,
        Err(exit) => return exit,
    };
    let supervisor = match Supervisor::start().await {
        Ok(supervisor) => supervisor,
        Err(error) => return Exit::failed(error),
    };
    let definitions = definitions.with_ask_agent(&supervisor, AskAgentConfig::default());
    let tools = match definitions.agent_tools(&supervisor) {
        Ok(tools) => tools,
        Err(error) => return Exit::usage(error),
    };
    let served = McpToolServer::new("tiller", tools)
        .with_prompts(definitions.prompts())
        .with_instructions("Each tool is an agent: call it with `text`, what to ask it; each prompt is an agent's instructions.")
        .serve_stdio()
        .await;
    supervisor.shutdown().await;
    match served {
        Ok(()) => Exit::Success,
        Err(error) => {
            say!("tiller: the MCP connection failed: {error}");
            Exit::Failed
        }
    }
}
