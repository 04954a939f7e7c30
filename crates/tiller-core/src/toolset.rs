//! [`ToolSet`]: an agent's tools, checked once and ready to validate calls.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller_ai::Tool;

use crate::tool::AgentTool;
use crate::validate;

/// An agent's tools with their argument schemas compiled. Cheap to clone.
///
/// Building one checks every tool: its name must suit every provider
/// (`[A-Za-z0-9_-]{1,64}`) and be unique, and its parameters must be a valid JSON
/// Schema of an object.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: Arc<[Registered]>,
    definitions: Arc<[Tool]>,
    by_name: Arc<HashMap<String, usize>>,
}

pub(crate) struct Registered {
    pub(crate) tool: Arc<dyn AgentTool>,
    validator: jsonschema::Validator,
}

impl Registered {
    /// The arguments after coercion, or the validation failure text for the model.
    pub(crate) fn check(&self, mut args: Value) -> Result<Value, String> {
        validate::coerce(self.tool.parameters(), &mut args);
        let errors = validate::errors(&self.validator, &args);
        if errors.is_empty() {
            Ok(args)
        } else {
            Err(validate::failure_text(self.tool.name(), &errors, &args))
        }
    }
}

/// Why a set of tools was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolSetError {
    /// A name providers would reject.
    #[error("tool name `{0}` is invalid: use 1 to 64 letters, digits, `_` or `-`")]
    InvalidName(String),
    /// Two tools share a name.
    #[error("two tools are named `{0}`")]
    DuplicateName(String),
    /// The parameters are not a usable schema.
    #[error("the parameters of tool `{name}` are not a valid JSON Schema of an object: {message}")]
    InvalidSchema {
        /// The tool.
        name: String,
        /// What is wrong.
        message: String,
    },
}

impl ToolSet {
    /// Checks and compiles `tools`.
    pub fn new(tools: impl IntoIterator<Item = Arc<dyn AgentTool>>) -> Result<Self, ToolSetError> {
        let mut registered = Vec::new();
        let mut definitions = Vec::new();
        let mut by_name = HashMap::new();
        for tool in tools {
            let name = tool.name().to_owned();
            let valid_name = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid_name {
                return Err(ToolSetError::InvalidName(name));
            }
            if by_name.insert(name.clone(), registered.len()).is_some() {
                return Err(ToolSetError::DuplicateName(name));
            }
            let invalid = |message: String| ToolSetError::InvalidSchema {
                name: name.clone(),
                message,
            };
            let parameters = tool.parameters();
            if parameters.get("type") != Some(&Value::String("object".into())) {
                return Err(invalid("the schema's `type` must be \"object\"".to_owned()));
            }
            let validator =
                jsonschema::validator_for(parameters).map_err(|e| invalid(e.to_string()))?;
            definitions.push(Tool::new(
                name.clone(),
                tool.description(),
                parameters.clone(),
            ));
            registered.push(Registered { tool, validator });
        }
        Ok(ToolSet {
            tools: registered.into(),
            definitions: definitions.into(),
            by_name: Arc::new(by_name),
        })
    }

    /// The definitions sent to the model.
    pub fn definitions(&self) -> &[Tool] {
        &self.definitions
    }

    /// The tools, in order.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<dyn AgentTool>> {
        self.tools.iter().map(|r| &r.tool)
    }

    /// Checks arguments for the tool `name` as a run does before calling it:
    /// coerced where the schema allows (`"3"` for an integer, say), then validated.
    /// `Err` is the text the model would read; an unknown tool is an error too.
    pub fn check_arguments(&self, name: &str, args: Value) -> Result<Value, String> {
        match self.get(name) {
            Some(registered) => registered.check(args),
            None => Err(format!("Tool \"{name}\" not found.")),
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Registered> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.tools.iter().map(|r| r.tool.name()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::{FnTool, ToolOutput};
    use serde_json::json;

    fn tool(name: &str, schema: Value) -> Arc<dyn AgentTool> {
        Arc::new(FnTool::new(name, "a tool", schema, |_, _| async {
            Ok(ToolOutput::default())
        }))
    }

    #[test]
    fn bad_tool_sets_are_refused_with_the_reason() {
        let object = json!({"type": "object"});
        assert_eq!(
            ToolSet::new([tool("a", object.clone()), tool("a", object.clone())]).unwrap_err(),
            ToolSetError::DuplicateName("a".into())
        );
        assert_eq!(
            ToolSet::new([tool("read file", object.clone())]).unwrap_err(),
            ToolSetError::InvalidName("read file".into())
        );
        assert!(matches!(
            ToolSet::new([tool("a", json!({"type": "string"}))]).unwrap_err(),
            ToolSetError::InvalidSchema { .. }
        ));
        assert!(matches!(
            ToolSet::new([tool(
                "a",
                json!({"type": "object", "properties": {"x": {"type": 5}}})
            )])
            .unwrap_err(),
            ToolSetError::InvalidSchema { .. }
        ));
        let set = ToolSet::new([tool("a", object.clone()), tool("b", object)]).unwrap();
        assert_eq!(
            set.definitions()
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(format!("{set:?}"), "[\"a\", \"b\"]");
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
        let matches = |pattern: &String| Self::matches(pattern, name);
        (self.include.is_empty() || self.include.iter().any(matches))
            && !self.exclude.iter().any(matches)
    }

    /// Whether `pattern` (a name, or `prefix*`) names `name`.
    pub fn matches(pattern: &str, name: &str) -> bool {
        match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => pattern == name,
        }
    }
}

#[cfg(test)]
mod filter_tests {
    use super::ToolFilter;

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
