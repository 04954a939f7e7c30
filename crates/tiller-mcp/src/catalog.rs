//! What an MCP server offers besides tools: its resources, which an agent reads
//! through a `read_resource` tool of its own (`{prefix}read_resource`, kept or
//! dropped by the same include and exclude lists as the server's tools), and its
//! prompts, whose text a host can use as a run's instructions
//! ([`McpClient::prompt`](crate::McpClient::prompt)).

use std::collections::HashSet;

use futures::future::BoxFuture;
use rmcp::model::{GetPromptRequestParams, GetPromptResult, ReadResourceRequestParams};
use rmcp::{Peer, RoleClient};
use serde_json::{Map, Value, json};
use tiller_ai::Content;
use tiller_core::{AgentTool, ToolContext, ToolError, ToolOutput};

use crate::client::McpClient;
use crate::config::McpServer;
use crate::error::McpError;
use crate::tool::{content_of, resource_content};

/// The server's name for the resource-reading tool, before its prefix.
pub const READ_RESOURCE: &str = "read_resource";

/// The most resources the read tool's description lists.
const LISTED_RESOURCES: usize = 50;

/// A resource an MCP server offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpResource {
    /// Its URI, which reads it.
    pub uri: String,
    /// Its name.
    pub name: String,
    /// What it is, if the server says.
    pub description: Option<String>,
}

/// A prompt an MCP server offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpPrompt {
    /// Its name.
    pub name: String,
    /// What it is for, if the server says.
    pub description: Option<String>,
    /// The names of the arguments it takes.
    pub arguments: Vec<String>,
}

/// The resources and prompts of a server, as last listed, less those its
/// configuration withholds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    pub(crate) resources: Vec<McpResource>,
    pub(crate) prompts: Vec<McpPrompt>,
    /// The URIs of the resources withheld by name, which the read tool refuses.
    pub(crate) withheld: HashSet<String>,
}

/// Lists what the server says it offers, less what `config` withholds
/// ([`McpServer::exclude_components`]); a listing that fails leaves that part
/// empty (and is logged), the tools being what matters most.
pub(crate) async fn read_catalog(peer: &Peer<RoleClient>, config: &McpServer) -> Catalog {
    let server = config.name.as_str();
    let offers = peer.peer_info().map(|info| info.capabilities.clone());
    let mut catalog = Catalog::default();
    let Some(offers) = offers else {
        return catalog;
    };
    if offers.resources.is_some() {
        match peer.list_all_resources().await {
            Ok(resources) => {
                for resource in resources {
                    if config.offers(&resource.name) && config.offers(&resource.uri) {
                        catalog.resources.push(McpResource {
                            uri: resource.uri.clone(),
                            name: resource.name.clone(),
                            description: resource.description.clone(),
                        });
                    } else {
                        catalog.withheld.insert(resource.uri.clone());
                    }
                }
            }
            Err(error) => {
                tracing::warn!(server, %error, "could not list an MCP server's resources")
            }
        }
    }
    if offers.prompts.is_some() {
        match peer.list_all_prompts().await {
            Ok(prompts) => {
                catalog.prompts = prompts
                    .into_iter()
                    .filter(|prompt| config.offers(&prompt.name))
                    .map(|prompt| McpPrompt {
                        name: prompt.name,
                        description: prompt.description,
                        arguments: prompt
                            .arguments
                            .unwrap_or_default()
                            .into_iter()
                            .map(|argument| argument.name)
                            .collect(),
                    })
                    .collect();
            }
            Err(error) => tracing::warn!(server, %error, "could not list an MCP server's prompts"),
        }
    }
    catalog
}

/// A prompt's messages as one text: each message's content, blocks as the
/// tools' results show them, messages apart by a blank line.
pub(crate) fn prompt_text(result: GetPromptResult) -> String {
    result
        .messages
        .into_iter()
        .map(|message| match content_of(message.content) {
            Content::Text(text) => text.text,
            Content::Image(image) => format!("[image: {}]", image.mime_type),
            Content::File(file) => format!("[file {}: {}]", file.name, file.mime_type),
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

impl McpClient {
    /// The server's resources, as last listed (none when it offers none).
    pub fn resources(&self) -> Vec<McpResource> {
        self.shared().catalog().resources.clone()
    }

    /// The server's prompts, as last listed (none when it offers none).
    pub fn prompts(&self) -> Vec<McpPrompt> {
        self.shared().catalog().prompts.clone()
    }

    /// The prompt `name` filled with `arguments`, as one text (its messages apart
    /// by a blank line): instructions for a run.
    pub async fn prompt(
        &self,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<String, McpError> {
        let shared = self.shared();
        let failed = |detail: String| McpError::Prompt {
            server: shared.name().to_owned(),
            name: name.to_owned(),
            detail,
        };
        let catalog = shared.catalog();
        if !catalog.prompts.iter().any(|prompt| prompt.name == name) {
            let known: Vec<&str> = catalog.prompts.iter().map(|p| p.name.as_str()).collect();
            return Err(failed(format!(
                "no such prompt (it offers: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        }
        let peer = shared.peer().map_err(failed)?;
        let mut params = GetPromptRequestParams::new(name);
        if !arguments.is_empty() {
            params = params.with_arguments(arguments);
        }
        let result = tokio::time::timeout(shared.call_timeout(), peer.get_prompt(params))
            .await
            .map_err(|_| failed(format!("no answer within {:?}", shared.call_timeout())))?
            .map_err(|error| failed(error.to_string()))?;
        Ok(prompt_text(result))
    }

    /// The tool that reads this server's resources, when it offers any and the
    /// filters keep it.
    pub(crate) fn resource_tool(&self) -> Option<ReadResourceTool> {
        let shared = self.shared();
        let catalog = shared.catalog();
        if catalog.resources.is_empty() || !shared.config().filter().keeps(READ_RESOURCE) {
            return None;
        }
        let mut description = format!(
            "Reads a resource of the MCP server `{}` by its URI. It offers:",
            shared.name()
        );
        for resource in catalog.resources.iter().take(LISTED_RESOURCES) {
            description.push_str(&format!("\n- {} ({})", resource.uri, resource.name));
            if let Some(about) = &resource.description {
                description.push_str(&format!(": {about}"));
            }
        }
        if catalog.resources.len() > LISTED_RESOURCES {
            description.push_str(&format!(
                "\n… and {} more",
                catalog.resources.len() - LISTED_RESOURCES
            ));
        }
        Some(ReadResourceTool {
            client: self.clone(),
            name: shared.config().tool_name(READ_RESOURCE),
            description,
            parameters: json!({
                "type": "object",
                "properties": {"uri": {"type": "string", "description": "The resource's URI."}},
                "required": ["uri"]
            }),
        })
    }
}

/// Reads a resource of an MCP server: `{prefix}read_resource(uri)`.
pub struct ReadResourceTool {
    client: McpClient,
    name: String,
    description: String,
    parameters: Value,
}

impl AgentTool for ReadResourceTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn execute<'a>(
        &'a self,
        args: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let shared = self.client.shared();
            let uri = args["uri"].as_str().unwrap_or_default().to_owned();
            if !shared.config().offers(&uri) || shared.catalog().withheld.contains(&uri) {
                return Err(ToolError::new(format!("`{uri}` is not offered")));
            }
            let peer = shared.peer().map_err(ToolError::new)?;
            let read = peer.read_resource(ReadResourceRequestParams::new(uri.clone()));
            let result = tokio::select! {
                read = tokio::time::timeout(shared.call_timeout(), read) => read,
                () = ctx.cancel().cancelled() => return Err(ToolError::new("cancelled")),
            };
            let result = result
                .map_err(|_| {
                    ToolError::new(format!(
                        "`{uri}` was not read within {:?}",
                        shared.call_timeout()
                    ))
                })?
                .map_err(|error| ToolError::new(format!("`{uri}` could not be read: {error}")))?;
            Ok(ToolOutput {
                content: result.contents.into_iter().map(resource_content).collect(),
                ..ToolOutput::default()
            })
        })
    }
}
