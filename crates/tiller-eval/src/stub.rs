//! Tools answered by a case: a stub takes a tool's place under its name,
//! description and schema, so the model sees the same tool, and answers what the
//! case gives instead of running.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use tiller_core::{AgentTool, ToolContext, ToolError, ToolOutput, ToolSet};

use crate::suite::Stub;

/// A tool that answers its case's [`Stub`].
struct StubTool {
    name: String,
    label: String,
    description: String,
    parameters: Value,
    answer: Stub,
}

impl AgentTool for StubTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn label(&self) -> &str {
        &self.label
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn execute<'a>(
        &'a self,
        _args: Value,
        _ctx: ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        let answer = match &self.answer {
            Stub::Text(text) => Ok(ToolOutput::text(text.clone())),
            Stub::Error { error } => Err(ToolError::Failed(error.clone())),
        };
        Box::pin(std::future::ready(answer))
    }
}

/// `tools` with each tool `stubs` names answered by its stub; refused (with
/// the reason) for a stub of a tool the agent does not have.
pub(crate) fn stubbed(tools: &ToolSet, stubs: &BTreeMap<String, Stub>) -> Result<ToolSet, String> {
    if let Some(unknown) = stubs
        .keys()
        .find(|name| !tools.definitions().iter().any(|tool| &tool.name == *name))
    {
        return Err(format!(
            "a stub for `{unknown}`, a tool the agent does not have"
        ));
    }
    let replaced = tools.tools().map(|tool| match stubs.get(tool.name()) {
        Some(answer) => Arc::new(StubTool {
            name: tool.name().to_owned(),
            label: tool.label().to_owned(),
            description: tool.description().to_owned(),
            parameters: tool.parameters().clone(),
            answer: answer.clone(),
        }) as Arc<dyn AgentTool>,
        None => tool.clone(),
    });
    ToolSet::new(replaced).map_err(|error| error.to_string())
}
