//! The rule every transcript keeps, as code: each tool call of each assistant
//! message is answered by exactly one tool result, after the call and before the next
//! user or assistant message, and no result answers nothing.
//!
//! Runs keep the rule themselves: a call that never ran (an aborted or failed
//! response, a skip, a cut-off) gets a synthetic error result. [`check_transcript`]
//! says whether a transcript keeps it (the tests apply it to every transcript they
//! see); [`answer_open_calls`] answers the calls left open when a run was lost
//! mid-turn (an actor that failed), so the stored transcript keeps it too.

use std::collections::HashSet;

use tiller_ai::{Message, ToolResultMessage};

use crate::message::AgentMessage;
use crate::request::{UserRequest, open_requests};

/// How a transcript breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TranscriptError {
    /// A tool call got no result before the next message of the conversation.
    #[error("message {index}: tool call `{id}` was never answered")]
    Unanswered {
        /// The position of the assistant message holding the call.
        index: usize,
        /// The call's id.
        id: String,
    },
    /// A tool result answers no open call (none, or one already answered).
    #[error("message {index}: the tool result for `{id}` answers no open call")]
    Unexpected {
        /// The position of the result.
        index: usize,
        /// The call id it names.
        id: String,
    },
}

/// Checks that every tool call in `messages` has exactly one result, in place;
/// calls of the last response parked on the user's reply (see
/// [`crate::request`]) may still wait for theirs.
pub fn check_transcript(messages: &[AgentMessage]) -> Result<(), TranscriptError> {
    let waiting = open_requests(messages);
    let waiting: Vec<&str> = waiting.iter().map(UserRequest::tool_call_id).collect();
    check(messages.iter().map(AgentMessage::as_llm), &waiting)
}

/// The rule over the messages the model sees, in order; `None` stands for a message
/// it does not see (a custom one), which neither opens nor closes a call. The
/// request repair uses the same walk. Calls named in `waiting` may be open at the end.
pub(crate) fn check<'a>(
    messages: impl Iterator<Item = Option<&'a Message>>,
    waiting: &[&str],
) -> Result<(), TranscriptError> {
    let mut open: Vec<(usize, &str)> = Vec::new();
    let unanswered = |open: &[(usize, &str)]| match open.first() {
        Some((index, id)) => Err(TranscriptError::Unanswered {
            index: *index,
            id: (*id).to_owned(),
        }),
        None => Ok(()),
    };
    for (index, message) in messages.enumerate() {
        match message {
            Some(Message::ToolResult(result)) => {
                let id = result.tool_call_id.as_str();
                let Some(at) = open.iter().position(|(_, open_id)| *open_id == id) else {
                    return Err(TranscriptError::Unexpected {
                        index,
                        id: id.to_owned(),
                    });
                };
                open.remove(at);
            }
            Some(Message::Assistant(assistant)) => {
                unanswered(&open)?;
                open.extend(assistant.tool_calls().map(|call| (index, call.id.as_str())));
            }
            Some(Message::User(_)) => unanswered(&open)?,
            None => {}
        }
    }
    open.retain(|(_, id)| !waiting.contains(id));
    unanswered(&open)
}

/// Answers each call of the last assistant message that has no result yet with an
/// error result saying `reason`; returns how many it added. Used when a run is lost
/// between a response and its results.
pub fn answer_open_calls(messages: &mut Vec<AgentMessage>, reason: &str) -> usize {
    let Some(last) = messages.iter().rposition(|m| m.as_assistant().is_some()) else {
        return 0;
    };
    let answered: HashSet<&str> = messages[last + 1..]
        .iter()
        .filter_map(AgentMessage::as_tool_result)
        .map(|result| result.tool_call_id.as_str())
        .collect();
    // A call parked on the user's reply is waiting, not lost.
    let waiting = open_requests(messages);
    let answered: HashSet<&str> = answered
        .into_iter()
        .chain(waiting.iter().map(UserRequest::tool_call_id))
        .collect();
    let missing: Vec<AgentMessage> = messages[last]
        .as_assistant()
        .into_iter()
        .flat_map(|assistant| assistant.tool_calls())
        .filter(|call| !answered.contains(call.id.as_str()))
        .map(|call| {
            let text = format!("Tool call \"{}\" was interrupted: {reason}", call.name);
            AgentMessage::from(ToolResultMessage::text(call, text, true))
        })
        .collect();
    let added = missing.len();
    messages.extend(missing);
    added
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::tests;

    fn assistant(calls: &[&str]) -> AgentMessage {
        tests::assistant(calls).into()
    }

    fn result(id: &str) -> AgentMessage {
        tests::result(id).into()
    }

    #[test]
    fn every_call_needs_exactly_one_result_in_place() {
        let user = AgentMessage::user("hi");
        assert_eq!(
            check_transcript(&[
                user.clone(),
                assistant(&["a", "b"]),
                result("b"),
                result("a")
            ]),
            Ok(())
        );
        assert_eq!(
            check_transcript(&[assistant(&["a", "b"]), result("a")]),
            Err(TranscriptError::Unanswered {
                index: 0,
                id: "b".into()
            })
        );
        assert_eq!(
            check_transcript(&[assistant(&["a"]), user, result("a")]),
            Err(TranscriptError::Unanswered {
                index: 0,
                id: "a".into()
            })
        );
        assert_eq!(
            check_transcript(&[assistant(&["a"]), result("a"), result("a")]),
            Err(TranscriptError::Unexpected {
                index: 2,
                id: "a".into()
            })
        );
    }

    #[test]
    fn open_calls_are_answered_once() {
        let mut messages = vec![assistant(&["a", "b"]), result("a")];
        assert_eq!(answer_open_calls(&mut messages, "the agent failed"), 1);
        assert_eq!(check_transcript(&messages), Ok(()));
        let answer = messages[2].as_tool_result().unwrap();
        assert!(answer.is_error);
        assert_eq!(answer.tool_call_id, "b");
        assert_eq!(answer_open_calls(&mut messages, "again"), 0);
    }
}
