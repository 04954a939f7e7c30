//! A judge: another agent that reads a run and answers `{pass, score, reason}`
//! as its structured output.

use serde_json::{Value, json};
use tiller_ai::{Message, OutputSchema};
use tiller_core::AgentMessage;

use crate::expect::{Judge, Judged};

/// The answer every judge gives: whether the run meets the rubric, how well
/// (0 to 1), and why.
pub(crate) fn verdict_schema() -> OutputSchema {
    OutputSchema::new(
        "verdict",
        json!({
            "type": "object",
            "properties": {
                "pass": {"type": "boolean", "description": "Whether the answer meets the rubric"},
                "score": {"type": "number", "minimum": 0, "maximum": 1, "description": "How well, from 0 to 1"},
                "reason": {"type": "string", "description": "Why, in one sentence"}
            },
            "required": ["pass", "score", "reason"],
            "additionalProperties": false
        }),
    )
}

/// What the judge is asked: the rubric, then the run's conversation as text.
pub(crate) fn question<'m>(
    judge: &Judge,
    conversation: impl IntoIterator<Item = &'m AgentMessage>,
) -> String {
    let mut text = format!(
        "Judge the assistant's answer in the conversation below against this rubric.\n\nRubric: {}\n\nThe conversation:\n",
        judge.rubric
    );
    for message in conversation {
        let AgentMessage::Llm(message) = message else {
            continue;
        };
        let (who, said) = match message {
            Message::User(user) => ("user", user.text_content()),
            Message::Assistant(assistant) => {
                let mut said = assistant.text();
                for call in assistant.tool_calls() {
                    said.push_str(&format!("\n[calls {} with {}]", call.name, call.arguments));
                }
                ("assistant", said)
            }
            Message::ToolResult(result) => ("tool", result.text_content()),
        };
        text.push_str(&format!("\n{who}: {said}\n"));
    }
    text
}

/// The verdict in a judge's valid output.
pub(crate) fn verdict(output: &Value) -> Option<Judged> {
    serde_json::from_value(output.clone()).ok()
}
