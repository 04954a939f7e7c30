//! Keeping what the model is sent valid: every tool call answered by exactly one
//! result right after its assistant message, and every result after its call.
//!
//! Runs of this loop never leave an orphan, but transcripts come from elsewhere too
//! (restored sessions, hand-edited histories, a `transform_context` that pruned
//! between a call and its result), and providers reject such requests outright.

use std::borrow::Cow;
use std::collections::HashMap;

use tiller_ai::{
    AssistantContent, AssistantMessage, Content, Message, Model, StopReason, ToolCall,
    ToolResultMessage, now_ms,
};

/// Said in place of a result that was never recorded.
pub(crate) const MISSING_RESULT: &str =
    "No result was recorded for this tool call; it did not complete.";

/// `messages` with orphan calls answered by synthetic error results, results moved
/// next to their calls, a result whose call is missing given a synthesized call of
/// `model`'s just before it (so what the tool said still reaches the model), and
/// repeated results dropped; unchanged (and not copied) when already valid. Also
/// says how many messages were added or dropped.
pub(crate) fn repair<'a>(
    messages: Vec<Cow<'a, Message>>,
    model: &Model,
) -> (Vec<Cow<'a, Message>>, usize) {
    if is_valid(&messages) {
        return (messages, 0);
    }
    let total = messages.len();
    let mut slots: Vec<Option<Cow<'_, Message>>> = messages.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(total);
    let mut changes = 0;
    let mut i = 0;
    while i < total {
        let Some(message) = slots[i].take() else {
            i += 1;
            continue;
        };
        let calls: Vec<(String, String)> = match message.as_ref() {
            Message::Assistant(assistant) => assistant
                .tool_calls()
                .map(|c| (c.id.clone(), c.name.clone()))
                .collect(),
            Message::ToolResult(result) => {
                // No call before it in its turn: the call is made up.
                out.push(Cow::Owned(synthesized_call(result, model)));
                out.push(message);
                changes += 1;
                i += 1;
                continue;
            }
            Message::User(_) => Vec::new(),
        };
        out.push(message);
        i += 1;
        if calls.is_empty() {
            continue;
        }
        let region_end = (i..total)
            .find(|&j| matches!(slots[j].as_deref(), Some(Message::Assistant(_))))
            .unwrap_or(total);
        let mut results: HashMap<String, Cow<'_, Message>> = HashMap::new();
        let mut uncalled = Vec::new();
        for slot in &mut slots[i..region_end] {
            if let Some(Message::ToolResult(result)) = slot.as_deref() {
                let id = result.tool_call_id.clone();
                let called = calls.iter().any(|(call_id, _)| *call_id == id);
                let taken = slot.take();
                if called && !results.contains_key(&id) {
                    results.extend(taken.map(|m| (id, m)));
                } else if !called {
                    uncalled.extend(taken);
                } else {
                    changes += 1;
                }
            }
        }
        for (id, name) in &calls {
            out.push(results.remove(id).unwrap_or_else(|| {
                changes += 1;
                Cow::Owned(missing_result(id, name).into())
            }));
        }
        for result in uncalled {
            if let Message::ToolResult(answer) = result.as_ref() {
                out.push(Cow::Owned(synthesized_call(answer, model)));
                changes += 1;
            }
            out.push(result);
        }
    }
    (out, changes)
}

fn missing_result(id: &str, name: &str) -> ToolResultMessage {
    let call = ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments: serde_json::Value::Null,
        arguments_error: None,
        signature: None,
    };
    ToolResultMessage {
        content: vec![Content::text(MISSING_RESULT)],
        timestamp: now_ms(),
        ..ToolResultMessage::text(&call, "", true)
    }
}

/// An assistant message of `model` making the call `result` answers, with no
/// arguments: what a stored result whose call was lost is given.
fn synthesized_call(result: &ToolResultMessage, model: &Model) -> Message {
    let mut message = AssistantMessage::empty(model);
    message.stop_reason = StopReason::ToolUse;
    message.timestamp = result.timestamp;
    message.content = vec![AssistantContent::ToolCall(Box::new(ToolCall {
        id: result.tool_call_id.clone(),
        name: result.tool_name.clone(),
        arguments: serde_json::json!({}),
        arguments_error: None,
        signature: None,
    }))];
    message.into()
}

/// Whether every call is answered right after its message, once, and every
/// result has its call.
fn is_valid(messages: &[Cow<'_, Message>]) -> bool {
    crate::transcript::check(messages.iter().map(|message| Some(message.as_ref())), &[]).is_ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn model() -> Model {
        Model::openai_compatible("http://x/v1", "m")
    }

    /// An assistant message calling tools with these ids.
    pub(crate) fn assistant(calls: &[&str]) -> Message {
        let mut message = AssistantMessage::empty(&model());
        message.content = calls
            .iter()
            .map(|id| {
                AssistantContent::ToolCall(Box::new(ToolCall {
                    id: (*id).into(),
                    name: "t".into(),
                    arguments: serde_json::json!({}),
                    arguments_error: None,
                    signature: None,
                }))
            })
            .collect();
        message.into()
    }

    /// A successful result for the call `id`.
    pub(crate) fn result(id: &str) -> Message {
        let call = ToolCall {
            id: id.into(),
            name: "t".into(),
            arguments: serde_json::Value::Null,
            arguments_error: None,
            signature: None,
        };
        ToolResultMessage::text(&call, "ok", false).into()
    }

    fn shape(messages: &[Cow<'_, Message>]) -> Vec<String> {
        messages
            .iter()
            .map(|m| match m.as_ref() {
                Message::User(_) => "user".to_owned(),
                Message::Assistant(a) => format!(
                    "assistant{:?}",
                    a.tool_calls().map(|c| c.id.as_str()).collect::<Vec<_>>()
                ),
                Message::ToolResult(r) if r.is_error => format!("missing:{}", r.tool_call_id),
                Message::ToolResult(r) => format!("result:{}", r.tool_call_id),
            })
            .collect()
    }

    #[test]
    fn a_valid_transcript_is_returned_as_is() {
        let messages = [
            Message::user("hi"),
            assistant(&["a", "b"]),
            result("b"),
            result("a"),
            Message::user("more"),
        ];
        let (repaired, changes) = repair(messages.iter().map(Cow::Borrowed).collect(), &model());
        assert_eq!(changes, 0);
        assert!(repaired.iter().all(|m| matches!(m, Cow::Borrowed(_))));
    }

    #[test]
    fn orphans_are_answered_results_moved_strays_called_and_repeats_dropped() {
        let messages = [
            result("stray"),
            Message::user("hi"),
            assistant(&["a", "b"]),
            result("a"),
            Message::user("interrupting"),
            result("b"),
            result("a"),
            assistant(&["c"]),
            Message::user("next"),
        ];
        let (repaired, changes) = repair(messages.iter().map(Cow::Borrowed).collect(), &model());
        assert_eq!(
            shape(&repaired),
            [
                "assistant[\"stray\"]",
                "result:stray",
                "user",
                "assistant[\"a\", \"b\"]",
                "result:a",
                "result:b",
                "user",
                "assistant[\"c\"]",
                "missing:c",
                "user"
            ]
        );
        assert_eq!(
            changes, 3,
            "a call for the stray result, a repeat dropped, a missing result"
        );
        let Message::Assistant(made_up) = repaired[0].as_ref() else {
            panic!()
        };
        assert_eq!(
            made_up.tool_calls().next().map(|call| call.name.as_str()),
            Some("t")
        );
        let Message::ToolResult(missing) = repaired[8].as_ref() else {
            panic!()
        };
        assert_eq!(missing.content, vec![Content::text(MISSING_RESULT)]);
    }
}
