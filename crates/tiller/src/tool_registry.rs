//! [`ToolRegistry`]: the tools a host offers agent definitions by name, and
//! [`ToolFilter`], the include and exclude lists an agent narrows them with.
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

use serde::{Deserialize, Serialize};

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

/// Which of an agent's tools it keeps: those `include` matches (all when it is
/// empty), less those `exclude` matches. A pattern is a tool's name, or a prefix
/// ending in `*` (`fs_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFilter {
    /// The tools to keep; every tool when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// The tools to drop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

impl ToolFilter {
    /// Whether the tool `name` is kept.
    pub fn keeps(&self, name: &str) -> bool {
        let matches = |pattern: &String| match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => pattern == name,
        };
        (self.include.is_empty() || self.include.iter().any(matches))
            && !self.exclude.iter().any(matches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_then_exclude_with_prefixes() {
        let filter = ToolFilter {
            include: vec!["fs_*".into(), "search".into()],
            exclude: vec!["fs_write".into()],
        };
        let kept: Vec<&str> = ["fs_read", "fs_write", "search", "action"]
            .into_iter()
            .filter(|name| filter.keeps(name))
            .collect();
        assert_eq!(kept, ["fs_read", "search"]);
        assert!(ToolFilter::default().keeps("anything"));
    }
}
