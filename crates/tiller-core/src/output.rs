//! Structured output: a run whose request options carry an
//! [`OutputSchema`](tiller_ai::OutputSchema) checks each final answer against it
//! with the validator tool arguments use. A failing answer is sent back to the
//! model with the errors, as a user message, up to
//! [`RunOptions::output_retries`](crate::RunOptions::output_retries) times; past
//! that the run ends with [`RunEnd::InvalidOutput`](crate::RunEnd::InvalidOutput)
//! and an [`OutputError`] holding the last answer and its errors.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::validate;

/// What came of a run's structured output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Output {
    /// The final answer parsed and matched the schema.
    Valid {
        /// The answer as JSON.
        value: Value,
    },
    /// No answer matched within the retries.
    Invalid(OutputError),
}

impl Output {
    /// The parsed answer, when it was valid.
    pub fn value(&self) -> Option<&Value> {
        match self {
            Output::Valid { value } => Some(value),
            Output::Invalid(_) => None,
        }
    }
}

/// A final answer that did not match the output schema, after the retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("the answer did not match the output schema after {attempts} attempts: {}", errors.join("; "))]
pub struct OutputError {
    /// The last answer's text.
    pub answer: String,
    /// How it failed: `path: message` for each schema violation, or why it is not
    /// JSON.
    pub errors: Vec<String>,
    /// How many answers were checked.
    pub attempts: u32,
}

/// The checker of one run: the compiled schema and the answers checked so far.
pub(crate) struct OutputCheck {
    validator: jsonschema::Validator,
    pub(crate) attempts: u32,
}

impl OutputCheck {
    /// A checker for `schema`; an unusable schema is the run's failure.
    pub(crate) fn new(schema: &Value) -> Result<Self, String> {
        let validator = jsonschema::validator_for(schema)
            .map_err(|error| format!("the output schema is not a valid JSON Schema: {error}"))?;
        Ok(OutputCheck {
            validator,
            attempts: 0,
        })
    }

    /// The answer as JSON, or why it does not match.
    pub(crate) fn check(&mut self, answer: &str) -> Result<Value, Vec<String>> {
        self.attempts += 1;
        let value: Value = serde_json::from_str(unfenced(answer))
            .map_err(|error| vec![format!("root: the answer is not JSON: {error}")])?;
        let errors = validate::errors(&self.validator, &value);
        if errors.is_empty() {
            Ok(value)
        } else {
            Err(errors)
        }
    }
}

/// The answer without surrounding space or a Markdown code fence.
fn unfenced(answer: &str) -> &str {
    let answer = answer.trim();
    let Some(inner) = answer
        .strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
    else {
        return answer;
    };
    // Drop the fence's language tag (`json`), up to the first line break.
    match inner.split_once('\n') {
        Some((tag, body)) if !tag.trim_start().starts_with(['{', '[']) => body.trim(),
        _ => inner.trim(),
    }
}

/// The user message that asks the model to answer again.
pub(crate) fn correction(errors: &[String]) -> String {
    let mut text = String::from("Your answer does not match the required JSON Schema:\n");
    for error in errors {
        text.push_str("  - ");
        text.push_str(error);
        text.push('\n');
    }
    text.push_str("\nAnswer again with only a JSON value that matches the schema.");
    text
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    #[test]
    fn answers_are_parsed_fenced_or_not_and_checked() {
        let schema = json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
            "required": ["city", "population"]
        });
        let mut check = OutputCheck::new(&schema).unwrap();
        assert_eq!(
            check.check("```json\n{\"city\": \"Oslo\", \"population\": 709000}\n```"),
            Ok(json!({"city": "Oslo", "population": 709000}))
        );
        assert_eq!(
            check.check(" {\"city\": \"Oslo\"} "),
            Err(vec![
                "root: \"population\" is a required property".to_owned()
            ])
        );
        assert_eq!(
            check.check("Oslo, about 709,000"),
            Err(vec![
                "root: the answer is not JSON: expected value at line 1 column 1".to_owned()
            ])
        );
        assert_eq!(check.attempts, 3);
        assert!(OutputCheck::new(&json!({"type": 12})).is_err());
    }
}
