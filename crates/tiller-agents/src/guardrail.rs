//! Guardrails as agent files name them (`guardrails: {input: [...], output:
//! [...], tool_calls: [...]}`): each name is a Rust guardrail the host registered
//! with [`Definitions::with_guardrail`](crate::Definitions::with_guardrail), or
//! another agent's definition, asked with [`agent_guardrail`].

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tiller_core::{
    AgentEvent, AgentMessage, Guardrail, GuardrailInput, GuardrailStage, LoopConfig, LoopContext,
    Output, Verdict, agent_loop,
};

use crate::{AgentSettings, OutputSchema};

/// The guardrails an agent file names, by stage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardrailNames {
    /// Checks of each run's new user messages.
    pub input: Vec<String>,
    /// Checks of the final answer.
    pub output: Vec<String>,
    /// Checks of each tool call.
    pub tool_calls: Vec<String>,
    /// Whether the input checks run beside the first model call rather than
    /// before it (see [`tiller_core::guardrail`]).
    pub input_beside: bool,
}

impl GuardrailNames {
    /// Whether it names no guardrail.
    pub fn is_empty(&self) -> bool {
        self.stages().iter().all(|(_, _, names)| names.is_empty())
    }

    /// Each stage, its field's name and the names it lists.
    pub fn stages(&self) -> [(GuardrailStage, &'static str, &[String]); 3] {
        [
            (GuardrailStage::Input, "input", &self.input),
            (GuardrailStage::Output, "output", &self.output),
            (GuardrailStage::ToolCall, "tool_calls", &self.tool_calls),
        ]
    }
}

/// The answer a guardrail agent must give.
fn verdict_schema() -> OutputSchema {
    OutputSchema::new(
        "guardrail_verdict",
        json!({
            "type": "object",
            "properties": {
                "pass": {"type": "boolean", "description": "Whether the text may go through."},
                "reason": {"type": "string", "description": "Why, in a sentence."}
            },
            "required": ["pass", "reason"],
            "additionalProperties": false
        }),
    )
}

/// A guardrail that asks an agent made with `settings` (its model and
/// instructions; no tools) whether the text passes: it is told the stage and the
/// text, and answers `{"pass": bool, "reason": "..."}` as structured output. An
/// answer that is not such a verdict fails the check.
pub fn agent_guardrail(name: impl Into<String>, settings: &AgentSettings) -> Guardrail {
    let name = name.into();
    let model = settings.definition.model.clone();
    let system_prompt = settings.definition.system_prompt.clone();
    let mut run = settings.definition.run.clone();
    run.stream.output_schema = Some(verdict_schema());
    run.max_turns = run.max_turns.min(3);
    let agent = name.clone();
    Guardrail::new(name, move |input: GuardrailInput| {
        let model = model.clone();
        let system_prompt = system_prompt.clone();
        let run = run.clone();
        let agent = agent.clone();
        async move {
            let model =
                model.ok_or_else(|| format!("the guardrail agent `{agent}` has no model"))?;
            let what = match input.stage {
                GuardrailStage::Input => "the user's input",
                GuardrailStage::Output => "the assistant's final answer",
                GuardrailStage::ToolCall => "a tool call (its name, then its arguments as JSON)",
            };
            let prompt = format!("Check {what}:\n\n{}", input.text);
            let context = LoopContext {
                system_prompt,
                ..LoopContext::default()
            };
            let config = LoopConfig {
                run,
                context: input.context,
                ..LoopConfig::new(model)
            };
            let mut events = agent_loop(
                vec![AgentMessage::user(prompt)],
                context,
                config,
                Default::default(),
            );
            let mut output = None;
            while let Some(event) = events.next().await {
                if let AgentEvent::AgentEnd { output: end, .. } = event {
                    output = end;
                }
            }
            let Some(Output::Valid { value }) = output else {
                return Err(format!("the guardrail agent `{agent}` gave no verdict").into());
            };
            let reason = value["reason"].as_str().unwrap_or_default().to_owned();
            Ok(if value["pass"].as_bool() == Some(true) {
                Verdict::Pass
            } else {
                Verdict::Fail { reason }
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiller_ai::faux::{FauxProvider, FauxTurn};
    use tiller_core::{AgentContext, Guardrails};

    #[tokio::test]
    async fn an_agent_answers_pass_or_fail_with_a_reason() {
        let faux = FauxProvider::new();
        faux.push(FauxTurn::text(r#"{"pass": true, "reason": "on topic"}"#));
        faux.push(FauxTurn::text(
            r#"{"pass": false, "reason": "asks for a password"}"#,
        ));
        faux.push(FauxTurn::text("I cannot decide."));
        faux.push(FauxTurn::text("Still no verdict."));
        faux.push(FauxTurn::text("None."));
        let settings = AgentSettings::new(faux.model()).with_system_prompt("Judge politely.");
        let guardrails = Guardrails {
            input: vec![agent_guardrail("judge", &settings)],
            ..Guardrails::default()
        };
        let context = AgentContext::default();
        let check = |text: &str| guardrails.check(GuardrailStage::Input, text.to_owned(), &context);
        assert_eq!(check("What is the weather?").await, None);
        let tripped = check("Tell me the admin password").await.unwrap();
        assert_eq!(
            (tripped.guardrail.as_str(), tripped.reason.as_str()),
            ("judge", "asks for a password")
        );
        let undecided = check("?").await.unwrap();
        assert_eq!(
            undecided.reason,
            "the guardrail failed: the guardrail agent `judge` gave no verdict"
        );
        let asked = faux.requests();
        let system = asked[0]
            .context
            .system_prompt
            .as_deref()
            .unwrap_or_default();
        assert!(system.starts_with("Judge politely."), "{system}");
        let question = asked[0]
            .context
            .messages
            .last()
            .and_then(|message| match message {
                tiller_ai::Message::User(user) => Some(user.text_content()),
                _ => None,
            });
        assert_eq!(
            question.as_deref(),
            Some("Check the user's input:\n\nWhat is the weather?")
        );
    }
}
