//! [`ToolRegistry`]: the tools a host offers agent definitions by name (which an
//! agent narrows with a [`tiller_core::ToolFilter`]).
//!
//! ```
//! use std::sync::Arc;
//! use tiller::{AgentTool, ToolError, ToolRegistry, tool};
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

use crate::AgentTool;

/// Tools by name, for definitions that name them (`- name: search` in an agent
/// file). The built-in `action` tool needs no entry. Cheap to clone.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn AgentTool>>,
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
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ToolRegistry")
            .field(&self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}
