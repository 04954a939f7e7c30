//! [`ToolRegistry`]: the tools a host offers agent definitions by name (which an
//! agent narrows with a [`tiller_core::ToolFilter`]).
//!
//! ```
//! use std::sync::Arc;
//! use tiller::{AgentTool, ToolError, tool, agents::ToolRegistry};
//!
//! /// Search the knowledge base.
//! #[tool]
//! async fn search(query: String) -> Result<String, ToolError> {
//!     Ok(format!("nothing found for {query}"))
//! }
//!
//! let registry = ToolRegistry::new().with(Arc::new(SearchTool));
//! assert!(registry.get("search").is_some());
//! assert_eq!(registry.names().collect::<Vec<_>>(), ["search"]);
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

#[cfg(feature = "mcp")]
use tiller_mcp::{McpClient, McpError, McpServer};

use crate::AgentTool;

/// Tools by name, for definitions that name them (`- name: search` in an agent
/// file), and connections to MCP servers, for definitions that list them (in
/// `mcp_servers`). The built-in `action` tool needs no entry. Cheap to clone.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn AgentTool>>,
    #[cfg(feature = "mcp")]
    mcp: BTreeMap<String, McpClient>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        ToolRegistry::default()
    }

    /// The same registry with `tool`, replacing a tool of the same name.
    pub fn with(mut self, tool: Arc<dyn AgentTool>) -> Self {
        self.register(tool);
        self
    }

    /// Adds `tool`, replacing a tool of the same name.
    pub fn register(&mut self, tool: Arc<dyn AgentTool>) {
        self.tools.insert(tool.name().to_owned(), tool);
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn AgentTool>> {
        self.tools.get(name).cloned()
    }

    /// The names it holds, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// The same registry with an MCP server's connection: agent files listing
    /// the server (by name, in `mcp_servers`) take its tools from it, as listed
    /// when each agent is made.
    #[cfg(feature = "mcp")]
    pub fn with_mcp(mut self, client: McpClient) -> Self {
        self.mcp.insert(client.name().to_owned(), client);
        self
    }

    /// The connection to the MCP server `name`.
    #[cfg(feature = "mcp")]
    pub fn mcp(&self, name: &str) -> Option<&McpClient> {
        self.mcp.get(name)
    }

    /// The text of the MCP prompt `spec` — `server/name`, or a name that one
    /// connected server offers — filled with `arguments`: instructions for a run
    /// (`DefinitionPatch::system_prompt`).
    #[cfg(feature = "mcp")]
    pub async fn mcp_prompt(
        &self,
        spec: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, McpError> {
        let unknown = |detail: String| McpError::Prompt {
            server: spec
                .split_once('/')
                .map_or("", |(server, _)| server)
                .to_owned(),
            name: spec.to_owned(),
            detail,
        };
        if let Some((server, name)) = spec.split_once('/') {
            let client = self
                .mcp
                .get(server)
                .ok_or_else(|| unknown(format!("no MCP server named `{server}` is connected")))?;
            return client.prompt(name, arguments).await;
        }
        let offering: Vec<&McpClient> = self
            .mcp
            .values()
            .filter(|client| client.prompts().iter().any(|prompt| prompt.name == spec))
            .collect();
        match offering[..] {
            [client] => client.prompt(spec, arguments).await,
            [] => Err(unknown("no connected MCP server offers it".to_owned())),
            _ => Err(unknown(format!(
                "several servers offer it ({}): name one as `server/{spec}`",
                offering
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Connects to those of `servers` it has no connection to (by name).
    #[cfg(feature = "mcp")]
    pub async fn connect_mcp(&mut self, servers: &[McpServer]) -> Result<(), McpError> {
        for server in servers {
            if !self.mcp.contains_key(&server.name) {
                let client = McpClient::connect(server.clone()).await?;
                self.mcp.insert(server.name.clone(), client);
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = f.debug_struct("ToolRegistry");
        shown.field("tools", &self.tools.keys().collect::<Vec<_>>());
        #[cfg(feature = "mcp")]
        shown.field("mcp", &self.mcp.keys().collect::<Vec<_>>());
        shown.finish()
    }
}
