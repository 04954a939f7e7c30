//! [`AgentDefinition`]: an agent's data — its model, instructions, tool names and
//! options — serializable, stored with its session, shown in its state, and
//! changed by a [`crate::DefinitionPatch`]. The code that goes with it (tools,
//! hooks, prompt functions) is [`crate::AgentCode`]; a resumed agent's host
//! supplies that again.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller_ai::Model;
use tiller_core::RunOptions;

/// How many queued messages one delivery takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueMode {
    /// One message each time the queue is read, so each gets its own response.
    #[default]
    OneAtATime,
    /// Every queued message at once.
    All,
}

/// How much a steering or follow-up queue holds at most: past either bound, a
/// message is refused with [`crate::AgentError::QueueFull`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueLimits {
    /// The most messages one queue holds (default 256).
    pub max_messages: usize,
    /// The most bytes one queue holds, counted as the messages' JSON (default 1 MiB).
    pub max_bytes: usize,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            max_messages: 256,
            max_bytes: 1 << 20,
        }
    }
}

/// An agent's data: everything about it but its transcript, its queues and its
/// code. Serializable: it is what the session store keeps of an agent, what its
/// state shows, and what travels between hosts.
///
/// ```
/// use tiller::AgentDefinition;
/// # let model = tiller::faux::FauxProvider::new().model();
/// let mut definition = AgentDefinition::new(model);
/// definition.system_prompt = Some("Answer briefly.".into());
/// definition.run.max_turns = 8;
/// definition.run.stream.temperature = Some(0.2);
/// let json = serde_json::to_value(&definition)?;
/// assert_eq!(json["run"]["stream"]["temperature"].as_f64().map(|t| t as f32), Some(0.2));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentDefinition {
    /// The model; an agent without one refuses to run.
    pub model: Option<Model>,
    /// The models asked, in order, when the one before fails in a way retrying
    /// did not fix (see [`tiller_core::LoopConfig::fallbacks`]).
    pub fallbacks: Vec<Model>,
    /// Instructions sent ahead of the conversation.
    pub system_prompt: Option<String>,
    /// The names of the agent's tools, whose code is [`crate::AgentCode::tools`].
    pub tools: Vec<String>,
    /// How its runs behave: request options (`run.stream`: thinking level,
    /// temperature, token limit, tool choice, retries, timeouts, limits, output
    /// schema), the tool choice after a forced call, steering delivery, tool
    /// execution, the turn limit, the grace after an abort, the tool-output limit.
    pub run: RunOptions,
    /// How many steering messages one delivery takes.
    pub steering_mode: QueueMode,
    /// How many follow-up messages one delivery takes.
    pub follow_up_mode: QueueMode,
    /// How much each of the steering and follow-up queues holds at most.
    pub queue_limits: QueueLimits,
}

impl Default for AgentDefinition {
    fn default() -> Self {
        AgentDefinition {
            model: None,
            fallbacks: Vec::new(),
            system_prompt: None,
            tools: Vec::new(),
            run: RunOptions::default(),
            steering_mode: QueueMode::OneAtATime,
            follow_up_mode: QueueMode::OneAtATime,
            queue_limits: QueueLimits::default(),
        }
    }
}

impl AgentDefinition {
    /// The defaults, with this model.
    pub fn new(model: Model) -> Self {
        AgentDefinition {
            model: Some(model),
            ..AgentDefinition::default()
        }
    }

    /// The form the session store keeps: the fields that differ from the
    /// defaults, and the model and its fallbacks without their headers (which
    /// may hold secrets).
    pub fn stored(&self) -> Value {
        static DEFAULTS: OnceLock<Value> = OnceLock::new();
        let defaults = DEFAULTS
            .get_or_init(|| serde_json::to_value(AgentDefinition::default()).unwrap_or_default());
        let mut kept = self.clone();
        for model in kept.model.iter_mut().chain(&mut kept.fallbacks) {
            model.headers = Default::default();
        }
        let mut value = serde_json::to_value(&kept).unwrap_or_default();
        without_defaults(&mut value, defaults);
        value
    }

    /// Serializes `definition` as it may be shown to whoever reads an agent's
    /// state: the model and its fallbacks without their headers (which may hold
    /// secrets) and without their servers (the operator's addresses; shown empty).
    pub(crate) fn serialize_shown<S: serde::Serializer>(
        definition: &AgentDefinition,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        if definition.model.is_none() && definition.fallbacks.is_empty() {
            return definition.serialize(to);
        }
        let mut shown = definition.clone();
        for model in shown.model.iter_mut().chain(&mut shown.fallbacks) {
            model.headers = Default::default();
            model.base_url = String::new();
        }
        shown.serialize(to)
    }

    /// Reads a definition a session store kept: the form [`AgentDefinition::stored`]
    /// writes, or the flat one sessions were stored in before (its thinking level,
    /// temperature, token and turn limits, steering delivery and tool execution
    /// at the top).
    pub fn from_stored(stored: &str) -> Result<AgentDefinition, serde_json::Error> {
        let mut value: Value = serde_json::from_str(stored)?;
        if let Value::Object(fields) = &mut value
            && fields.contains_key("thinking_level")
        {
            let mut run = serde_json::Map::new();
            let mut stream = serde_json::Map::new();
            for (old, new) in [
                ("thinking_level", "thinking"),
                ("temperature", "temperature"),
                ("max_tokens", "max_tokens"),
            ] {
                if let Some(field) = fields.remove(old) {
                    stream.insert(new.to_owned(), field);
                }
            }
            for name in ["max_turns", "steering_delivery", "tool_execution"] {
                if let Some(field) = fields.remove(name) {
                    run.insert(name.to_owned(), field);
                }
            }
            run.insert("stream".to_owned(), Value::Object(stream));
            fields.insert("run".to_owned(), Value::Object(run));
        }
        serde_json::from_value(value)
    }

    /// This definition, as a session stored it, taken up by an agent whose own
    /// definition is `own`: the stored model (unless `own` has the same provider
    /// and id, whose own model keeps its headers), instructions and options, with
    /// what is never stored (headers, key, HTTP client, approvals) and the
    /// budgets and fallbacks from `own`.
    /// The names of stored tools `own` lacks are the error.
    pub fn resumed_by(mut self, own: &AgentDefinition) -> Result<AgentDefinition, Vec<String>> {
        let missing: Vec<String> = self
            .tools
            .iter()
            .filter(|name| !own.tools.contains(name))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        if let (Some(own_model), Some(stored)) = (&own.model, &self.model)
            && own_model.provider == stored.provider
            && own_model.id == stored.id
        {
            self.model = own.model.clone();
        }
        // The tools are the agent's own: the stored names are a subset of them.
        self.tools = own.tools.clone();
        let (stream, own_stream) = (&mut self.run.stream, &own.run.stream);
        stream.transport.headers = own_stream.transport.headers.clone();
        stream.transport.api_key = own_stream.transport.api_key.clone();
        stream.transport.http_client = own_stream.transport.http_client.clone();
        self.run.approvals = own.run.approvals.clone();
        // The operator's limits and fallbacks, as they stand now.
        self.run.budget = own.run.budget;
        self.fallbacks = own.fallbacks.clone();
        Ok(self)
    }
}

/// Removes from `value` every field equal to the same field of `defaults`,
/// object by object.
fn without_defaults(value: &mut Value, defaults: &Value) {
    let (Value::Object(fields), Value::Object(default_fields)) = (value, defaults) else {
        return;
    };
    fields.retain(|name, field| match default_fields.get(name) {
        Some(default) if default == field => false,
        Some(default) => {
            without_defaults(field, default);
            true
        }
        None => true,
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_definition_stored_in_the_flat_shape_of_before_reads_back() {
        let old = r#"{"model": null, "system_prompt": "Be brief.", "thinking_level": "low", "tools": ["add"],
            "temperature": 0.5, "max_tokens": 64, "max_turns": 7, "steering_mode": "all",
            "follow_up_mode": "one_at_a_time", "steering_delivery": "after_turn", "tool_execution": "sequential"}"#;
        let definition = AgentDefinition::from_stored(old).unwrap();
        let stream = &definition.run.stream;
        assert_eq!(
            (
                stream.thinking,
                stream.temperature,
                stream.max_tokens,
                definition.run.max_turns
            ),
            (tiller_ai::ThinkingLevel::Low, Some(0.5), Some(64), 7)
        );
        assert_eq!(definition.steering_mode, QueueMode::All);
        assert_eq!(definition.tools, ["add"]);
        assert_eq!(
            serde_json::to_value(definition.run.tool_execution).unwrap(),
            serde_json::json!("sequential")
        );
    }

    #[test]
    fn a_shown_definition_holds_neither_headers_nor_the_server() {
        #[derive(Serialize)]
        struct Shown(#[serde(serialize_with = "AgentDefinition::serialize_shown")] AgentDefinition);
        let mut definition = AgentDefinition::new(tiller_ai::faux::demo_model());
        let model = definition.model.as_mut().unwrap();
        model.headers.insert("authorization", "secret");
        model.base_url = "http://10.0.0.7:8080/v1".into();
        let shown = serde_json::to_string(&Shown(definition)).unwrap();
        assert!(
            !shown.contains("secret") && !shown.contains("10.0.0.7"),
            "{shown}"
        );
        assert!(shown.contains(r#""base_url":"""#), "{shown}");
    }

    #[test]
    fn a_changed_field_deep_in_the_options_reads_back() {
        let mut definition = AgentDefinition::default();
        definition.run.stream.thinking_budgets.high = 20_000;
        let stored = definition.stored().to_string();
        let back = AgentDefinition::from_stored(&stored).unwrap();
        assert_eq!(
            back.run.stream.thinking_budgets,
            definition.run.stream.thinking_budgets
        );
    }

    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    #[test]
    fn the_stored_form_keeps_what_differs_from_the_defaults_and_reads_back_whole() {
        let mut definition = AgentDefinition::new(tiller_ai::faux::demo_model());
        definition.system_prompt = Some("Be brief.".into());
        definition.run.max_turns = 7;
        definition.run.stream.temperature = Some(0.5);
        definition.run.stream.retry.max_retries = 1;
        definition
            .model
            .as_mut()
            .unwrap()
            .headers
            .insert("authorization", "secret");
        let stored = definition.stored();
        assert_eq!(stored["run"]["max_turns"], json!(7));
        assert_eq!(stored["run"]["stream"]["retry"], json!({"max_retries": 1}));
        assert_eq!(stored["run"].get("cancel_grace_ms"), None);
        assert!(!stored.to_string().contains("secret"));
        let back: AgentDefinition = serde_json::from_value(stored).unwrap();
        let mut expected = definition.clone();
        expected.model.as_mut().unwrap().headers = Default::default();
        assert_eq!(
            serde_json::to_value(back).unwrap(),
            serde_json::to_value(expected).unwrap()
        );
    }
}
