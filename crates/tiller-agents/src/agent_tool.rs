//! [`AgentAsTool`]: an agent definition as a tool. Each call spawns a fresh agent
//! of the definition under a supervisor, working for the caller's context, runs it
//! on the call's `text`, streams its answer's text as the call's updates, and
//! answers with the final answer (its structured output in the details). The
//! agent is stopped afterwards; a cancelled call aborts it. `tiller mcp` offers
//! definitions to MCP hosts this way.

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tiller_ai::AssistantEvent;
use tiller_core::{AgentEvent, AgentTool, Output, RunEnd, ToolContext, ToolError, ToolOutput};

use crate::{AgentSpec, RunOutcome, Supervisor};
use tiller_runtime::Delivered;

/// An agent definition as a tool (see the module docs).
pub struct AgentAsTool {
    supervisor: Supervisor,
    spec: AgentSpec,
    name: String,
    description: String,
    parameters: Value,
}

impl AgentAsTool {
    /// A tool named `name` (letters, digits, `_` and `-` kept, others made `_`)
    /// that runs agents of `spec` under `supervisor`.
    pub fn new(
        supervisor: Supervisor,
        spec: AgentSpec,
        name: &str,
        description: impl Into<String>,
    ) -> Self {
        AgentAsTool {
            supervisor,
            spec,
            name: model_safe_name(name),
            description: description.into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "What to ask the agent."}
                },
                "required": ["text"],
                "additionalProperties": false
            }),
        }
    }
}

impl AgentTool for AgentAsTool {
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
            let Some(text) = args["text"].as_str() else {
                return Err(ToolError::new(
                    "`text` must be a string: what to ask the agent",
                ));
            };
            let spec = self.spec.clone().with_context(ctx.agent().clone());
            let agent = self
                .supervisor
                .spawn(spec)
                .await
                .map_err(|error| ToolError::new(error.to_string()))?;
            let streaming = ctx.clone();
            let relay = agent.relay(move |envelope| {
                if let Delivered::Event(AgentEvent::MessageUpdate {
                    assistant_message_event: AssistantEvent::TextDelta { delta, .. },
                    ..
                }) = &envelope.event
                {
                    streaming.update(ToolOutput::text(delta.clone()));
                }
            });
            let outcome = tokio::select! {
                outcome = agent.run(text) => Some(outcome),
                () = ctx.cancel().cancelled() => None,
            };
            drop(relay);
            self.supervisor.stop(agent.id().as_str()).await;
            let outcome = outcome
                .ok_or_else(|| ToolError::new("cancelled"))?
                .map_err(|error| ToolError::new(error.to_string()))?;
            answer(&outcome, "the agent")
        })
    }
}

/// The final answer of an agent's run as a tool's output (its structured output
/// in the details); any other end, an error naming `who`.
pub(crate) fn answer(outcome: &RunOutcome, who: &str) -> Result<ToolOutput, ToolError> {
    match (&outcome.end, &outcome.output) {
        (RunEnd::Completed, Some(Output::Valid { value })) => {
            Ok(ToolOutput::text(outcome.text()).with_details(value.clone()))
        }
        (RunEnd::Completed, None) => Ok(ToolOutput::text(outcome.text())),
        (end, _) => Err(ToolError::new(match outcome.error() {
            Some(error) => format!("{who}'s run ended ({end:?}): {error}"),
            None => format!("{who}'s run ended ({end:?}) without an answer"),
        })),
    }
}

/// `name` in the characters providers accept in a tool's or schema's name
/// (letters, digits, `-`; others become `_`), at most 64 of them.
pub(crate) fn model_safe_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}
