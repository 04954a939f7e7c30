//! [`ActionTool`]: the built-in `action` tool. The model calls
//! `action(type, payload)` to ask the application for something beside its text
//! (show a chart, open a page, file a ticket); each call becomes an
//! [`AgentEvent::Action`](crate::AgentEvent::Action) for subscribers and stays in
//! the transcript as a tool call and its result. With per-type schemas, only those
//! types are offered and each payload is validated against its type's schema.
//!
//! [`WidgetTool`]s are actions with an id: `display_widget(id, kind, data)` shows
//! something that lasts (a progress bar, a table, a form) and `update_widget(id,
//! data)` changes the widget of that id in place; each is an `action` event of its
//! tool's name whose payload carries the id. A conversation's widgets are part of
//! it: the ids shown are the agent's state ([`ShownWidgets`], stored with the
//! session), so `update_widget` is refused for an id never shown, and what each
//! shows now is read back from the stored transcript ([`widgets_of`]).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use serde::{Deserialize, Serialize};

use crate::context::ContextState;
use crate::message::AgentMessage;
use crate::tool::{AgentTool, ToolContext, ToolError, ToolExecution, ToolOutput};
use crate::validate;

/// The most widgets one conversation shows.
pub const MAX_WIDGETS: usize = 256;

/// The built-in `action` tool.
pub struct ActionTool {
    description: String,
    parameters: Value,
    /// The declared types and their payload validators; empty: any type.
    types: BTreeMap<String, jsonschema::Validator>,
}

impl ActionTool {
    /// The name the model calls it by.
    pub const NAME: &'static str = "action";

    /// An `action` tool taking any type and any object payload.
    pub fn new() -> Self {
        ActionTool {
            description: DESCRIPTION.to_owned(),
            parameters: parameters(&[]),
            types: BTreeMap::new(),
        }
    }

    /// An `action` tool offering only these types, each payload checked against
    /// its type's JSON Schema. An unusable schema is an error naming the type.
    pub fn with_types(types: BTreeMap<String, Value>) -> Result<Self, String> {
        if types.is_empty() {
            return Ok(ActionTool::new());
        }
        let mut validators = BTreeMap::new();
        let mut description = format!("{DESCRIPTION} The types and their payloads:");
        for (name, schema) in &types {
            let validator = jsonschema::validator_for(schema)
                .map_err(|error| format!("action type `{name}`: {error}"))?;
            validators.insert(name.clone(), validator);
            description.push_str(&format!("\n- {name}: {schema}"));
        }
        Ok(ActionTool {
            description,
            parameters: parameters(&types.keys().cloned().collect::<Vec<_>>()),
            types: validators,
        })
    }
}

impl Default for ActionTool {
    fn default() -> Self {
        ActionTool::new()
    }
}

const DESCRIPTION: &str = "Ask the application to carry out an action beside your answer (show something to the user, open a page, record a decision). `type` names the action; `payload` holds its data.";

/// The arguments' schema; `types`, when not empty, are the only types offered.
fn parameters(types: &[String]) -> Value {
    let mut kind = json!({"type": "string", "description": "The action's type."});
    if !types.is_empty() {
        kind["enum"] = json!(types);
    }
    json!({
        "type": "object",
        "properties": {
            "type": kind,
            "payload": {"type": "object", "description": "The action's data."}
        },
        "required": ["type", "payload"]
    })
}

impl AgentTool for ActionTool {
    fn name(&self) -> &str {
        Self::NAME
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
            let action_type = args["type"].as_str().unwrap_or_default().to_owned();
            let payload = args["payload"].clone();
            if let Some(validator) = self.types.get(&action_type) {
                let errors = validate::errors(validator, &payload);
                if !errors.is_empty() {
                    return Err(ToolError::new(format!(
                        "the payload of action `{action_type}` does not match its schema:\n  - {}",
                        errors.join("\n  - ")
                    )));
                }
            }
            let said = format!("Action `{action_type}` sent.");
            Ok(acted(&ctx, action_type, payload, said))
        })
    }
}

/// Declares the action `action_type` with `payload` through `ctx`: the result
/// says `said` and keeps both in its details.
fn acted(ctx: &ToolContext, action_type: String, payload: Value, said: String) -> ToolOutput {
    ctx.act(action_type.clone(), payload.clone());
    ToolOutput::text(said).with_details(json!({"type": action_type, "payload": payload}))
}

/// The built-in widget tools: `display_widget` and `update_widget` (see the
/// module docs).
pub struct WidgetTool {
    name: &'static str,
    description: &'static str,
    parameters: Value,
}

impl WidgetTool {
    /// The name of the tool that shows a widget.
    pub const DISPLAY: &'static str = "display_widget";
    /// The name of the tool that changes a shown widget.
    pub const UPDATE: &'static str = "update_widget";

    /// `display_widget(id, kind, data)`.
    pub fn display() -> Self {
        WidgetTool {
            name: Self::DISPLAY,
            description: "Show the user a widget beside your answer (a progress bar, a table, a chart, a form): `id` names it for later updates, `kind` says what it is, `data` holds what it shows.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string", "minLength": 1, "maxLength": 128, "description": "A name for the widget, unique in this conversation."},
                    "kind": {"type": "string", "minLength": 1, "maxLength": 128, "description": "What the widget is (progress, table, chart, …)."},
                    "data": {"type": "object", "description": "What it shows."}
                },
                "required": ["id", "kind", "data"]
            }),
        }
    }

    /// `update_widget(id, data)`.
    pub fn update() -> Self {
        WidgetTool {
            name: Self::UPDATE,
            description: "Change a widget you showed with display_widget: `id` names it, `data` replaces what it shows.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string", "minLength": 1, "maxLength": 128, "description": "The widget's name, as display_widget gave it."},
                    "data": {"type": "object", "description": "What it shows now."}
                },
                "required": ["id", "data"]
            }),
        }
    }

    /// The widget tool named `name`, if it is one.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            Self::DISPLAY => Some(Self::display()),
            Self::UPDATE => Some(Self::update()),
            _ => None,
        }
    }
}

/// The widgets a conversation has shown: their ids and kinds, the agent's
/// state (stored with the session, and with each widget call's result).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShownWidgets {
    /// Each shown widget's kind, by its id.
    pub kinds: BTreeMap<String, String>,
}

impl ContextState for ShownWidgets {
    const NAME: &'static str = "widgets";
}

/// A widget as it stands in a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Widget {
    /// Its id.
    pub id: String,
    /// What it is (progress, table, …).
    pub kind: String,
    /// What it shows now.
    pub data: Value,
    /// The place in the transcript of the result that last showed it.
    pub shown_at: u64,
    /// The place of the result that last changed it (`shown_at` when none did).
    pub updated_at: u64,
}

/// The widgets `messages` (a transcript from its place `first` on) show, in the
/// order first shown, each with its latest data: what their widget calls that
/// succeeded said.
pub fn widgets_of<M: std::borrow::Borrow<AgentMessage>>(first: u64, messages: &[M]) -> Vec<Widget> {
    let mut widgets: Vec<Widget> = Vec::new();
    for (seq, message) in (first..).zip(messages) {
        let Some(result) = message.borrow().as_tool_result() else {
            continue;
        };
        if result.is_error {
            continue;
        }
        let details = &result.details;
        let tool = result.tool_name.as_str();
        let Some(id) = details["payload"]["id"].as_str() else {
            continue;
        };
        let data = details["payload"]["data"].clone();
        let known = widgets.iter().position(|widget| widget.id == id);
        match (tool, known) {
            (WidgetTool::DISPLAY, known) => {
                let widget = Widget {
                    id: id.to_owned(),
                    kind: details["payload"]["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    data,
                    shown_at: seq,
                    updated_at: seq,
                };
                match known {
                    Some(index) => widgets[index] = widget,
                    None => widgets.push(widget),
                }
            }
            (WidgetTool::UPDATE, Some(index)) => {
                widgets[index].data = data;
                widgets[index].updated_at = seq;
            }
            _ => {}
        }
    }
    widgets
}

impl AgentTool for WidgetTool {
    fn name(&self) -> &str {
        self.name
    }

    /// One at a time: each call reads the widgets the calls before it showed,
    /// those of its own turn included.
    fn execution(&self) -> ToolExecution {
        ToolExecution::Sequential
    }

    fn description(&self) -> &str {
        self.description
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
            let id = args["id"].as_str().unwrap_or_default().to_owned();
            let mut shown = ctx.state::<ShownWidgets>().unwrap_or_default();
            let done = if self.name == Self::DISPLAY {
                if !shown.kinds.contains_key(&id) && shown.kinds.len() >= MAX_WIDGETS {
                    return Err(ToolError::new(format!(
                        "this conversation shows {MAX_WIDGETS} widgets, the most it may: update one of them instead"
                    )));
                }
                let kind = args["kind"].as_str().unwrap_or_default().to_owned();
                shown.kinds.insert(id.clone(), kind);
                ctx.set_state(&shown);
                "shown"
            } else {
                if !shown.kinds.contains_key(&id) {
                    return Err(ToolError::new(format!(
                        "no widget `{id}` was shown in this conversation: show it with display_widget first"
                    )));
                }
                "updated"
            };
            let said = format!("Widget `{id}` {done}.");
            Ok(acted(&ctx, self.name.to_owned(), args, said))
        })
    }
}

#[cfg(test)]
mod tests {
    /// Each widget tool sends an action of its name whose payload carries the id;
    /// the result says what happened and keeps the payload in its details.
    #[tokio::test]
    async fn widgets_are_actions_with_an_id() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shown = json!({"id": "build", "kind": "progress", "data": {"done": 1, "of": 3}});
        let changed = json!({"id": "build", "data": {"done": 3, "of": 3}});
        let display = WidgetTool::named("display_widget").unwrap();
        let update = WidgetTool::named("update_widget").unwrap();
        let showing = context(&seen);
        let first = display
            .execute(shown.clone(), showing.clone())
            .await
            .unwrap();
        let state = showing.state::<ShownWidgets>().unwrap();
        assert_eq!(
            state.kinds,
            BTreeMap::from([("build".to_owned(), "progress".to_owned())])
        );
        // A later call of the conversation sees what was shown.
        let later = context(&seen).with_agent(crate::AgentContext::new().with_state(&state));
        let second = update.execute(changed.clone(), later).await.unwrap();
        assert_eq!(
            (first.text_content(), second.text_content()),
            (
                "Widget `build` shown.".to_owned(),
                "Widget `build` updated.".to_owned()
            )
        );
        assert_eq!(
            second.details,
            json!({"type": "update_widget", "payload": changed})
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [
                ("display_widget".to_owned(), shown),
                ("update_widget".to_owned(), changed)
            ]
        );
        assert!(WidgetTool::named("action").is_none());
    }

    /// `update_widget` is refused for an id never shown, and `display_widget`
    /// past [`MAX_WIDGETS`] of them; neither sends an action.
    #[tokio::test]
    async fn a_widget_never_shown_is_not_updated_and_their_number_is_bounded() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let update = WidgetTool::update();
        let refused = update
            .execute(json!({"id": "ghost", "data": {}}), context(&seen))
            .await
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "no widget `ghost` was shown in this conversation: show it with display_widget first"
        );
        let full = ShownWidgets {
            kinds: (0..MAX_WIDGETS)
                .map(|n| (format!("w{n}"), "table".to_owned()))
                .collect(),
        };
        let agent = crate::AgentContext::new().with_state(&full);
        let display = WidgetTool::display();
        let refused = display
            .execute(
                json!({"id": "one-more", "kind": "table", "data": {}}),
                context(&seen).with_agent(agent.clone()),
            )
            .await
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "this conversation shows 256 widgets, the most it may: update one of them instead"
        );
        // Showing one of them again is no new widget.
        display
            .execute(
                json!({"id": "w3", "kind": "chart", "data": {}}),
                context(&seen).with_agent(agent),
            )
            .await
            .unwrap();
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    /// A transcript's widgets: first shown first, each with its latest data;
    /// failed calls and other tools' results count for nothing.
    #[test]
    fn a_transcripts_widgets_are_read_from_its_results() {
        let result = |tool: &str, payload: Value, is_error: bool| -> AgentMessage {
            let call = tiller_ai::ToolCall {
                id: "c".into(),
                name: tool.into(),
                arguments: json!({}),
                arguments_error: None,
                signature: None,
            };
            let mut message = tiller_ai::ToolResultMessage::text(&call, "ok", is_error);
            message.details = json!({"type": tool, "payload": payload});
            AgentMessage::from(tiller_ai::Message::from(message))
        };
        let messages = [
            AgentMessage::user("go"),
            result(
                "display_widget",
                json!({"id": "a", "kind": "progress", "data": {"n": 1}}),
                false,
            ),
            result(
                "display_widget",
                json!({"id": "b", "kind": "table", "data": {"rows": []}}),
                false,
            ),
            result("update_widget", json!({"id": "a", "data": {"n": 2}}), false),
            result("update_widget", json!({"id": "a", "data": {"n": 9}}), true),
            result("action", json!({"id": "a", "data": {"n": 7}}), false),
        ];
        assert_eq!(
            widgets_of(10, &messages),
            [
                Widget {
                    id: "a".into(),
                    kind: "progress".into(),
                    data: json!({"n": 2}),
                    shown_at: 11,
                    updated_at: 13
                },
                Widget {
                    id: "b".into(),
                    kind: "table".into(),
                    data: json!({"rows": []}),
                    shown_at: 12,
                    updated_at: 12
                }
            ]
        );
    }

    use std::sync::{Arc, Mutex};

    use pretty_assertions::assert_eq;
    use tokio_util::sync::CancellationToken;

    use super::*;

    fn context(seen: &Arc<Mutex<Vec<(String, Value)>>>) -> ToolContext {
        let seen = seen.clone();
        ToolContext::detached("call_1", CancellationToken::new(), |_| {})
            .with_actions(move |kind, payload| seen.lock().unwrap().push((kind, payload)))
    }

    #[tokio::test]
    async fn typed_payloads_are_checked_and_emitted() {
        let tool = ActionTool::with_types(BTreeMap::from([(
            "open_page".to_owned(),
            json!({"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}),
        )]))
        .unwrap();
        assert_eq!(
            tool.parameters()["properties"]["type"]["enum"],
            json!(["open_page"])
        );
        let seen = Arc::new(Mutex::new(Vec::new()));
        let output = tool
            .execute(
                json!({"type": "open_page", "payload": {"url": "https://example.com"}}),
                context(&seen),
            )
            .await
            .unwrap();
        assert_eq!(output.text_content(), "Action `open_page` sent.");
        let error = tool
            .execute(json!({"type": "open_page", "payload": {}}), context(&seen))
            .await
            .unwrap_err();
        assert_eq!(
            error.message(),
            "the payload of action `open_page` does not match its schema:\n  - root: \"url\" is a required property"
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [(
                "open_page".to_owned(),
                json!({"url": "https://example.com"})
            )]
        );
        assert!(
            ActionTool::with_types(BTreeMap::from([("bad".to_owned(), json!({"type": 3}))]))
                .is_err_and(|error| error.starts_with("action type `bad`: "))
        );
    }
}
