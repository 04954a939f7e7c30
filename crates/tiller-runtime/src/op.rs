//! [`Op`]: everything a caller can ask of an agent, as plain, serializable data.
//! [`crate::AgentHandle`]'s methods, the server's routes and WebSocket frames and
//! `tiller chat`'s lines all make an `Op` and hand it to the agent's actor; one
//! place, the actor, carries it out.
//!
//! On the wire an op is tagged by `type`; a message may be given as its text:
//!
//! ```
//! use tiller::{Op, run::Reply};
//!
//! let steer: Op = serde_json::from_str(r#"{"type": "steer", "text": "shorter"}"#)?;
//! let Op::Steer { message } = steer else { unreachable!() };
//! assert_eq!(message.as_user().unwrap().text_content(), "shorter");
//! let approve: Op = serde_json::from_str(r#"{"type": "approve", "request_id": "call_1"}"#)?;
//! assert_eq!(approve, Op::Reply(Reply::approve("call_1")));
//! # Ok::<(), serde_json::Error>(())
//! ```

use serde::{Deserialize, Deserializer, Serialize};
use tiller_core::{Prompt, Reply};

use crate::AgentMessage;
use crate::patch::DefinitionPatch;

/// One of the agent's two queues, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Queues {
    /// Steering messages.
    Steering,
    /// Follow-up messages.
    FollowUp,
    /// Both.
    Both,
}

/// What can be asked of an agent. Ops that change durable state are acknowledged
/// once the session store has the change; ops that start a run, once it started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Op {
    /// Start a run from new messages (refused with
    /// [`AgentError::Busy`](crate::AgentError::Busy) during one).
    Prompt {
        /// The messages, in order (on the wire also `"text": "…"`).
        #[serde(alias = "text", deserialize_with = "messages_or_text")]
        messages: Vec<AgentMessage>,
    },
    /// Start a run from the transcript as it stands, or from the oldest queued
    /// message when the model answered last.
    Continue,
    /// Queue a message for the model to see as soon as possible during a run.
    Steer {
        /// The message (on the wire also `"text": "…"`).
        #[serde(alias = "text", deserialize_with = "message_or_text")]
        message: AgentMessage,
    },
    /// Queue a message for when the agent would otherwise stop. One queued
    /// during a run that then completes is delivered by it, or by a run of its
    /// own that starts as it ends; one queued while the agent is idle waits for
    /// the next run.
    FollowUp {
        /// The message (on the wire also `"text": "…"`).
        #[serde(alias = "text", deserialize_with = "message_or_text")]
        message: AgentMessage,
    },
    /// Drop queued messages.
    ClearQueues {
        /// Which queue.
        queues: Queues,
    },
    /// Abort the active run; with none, give up the requests waiting for the
    /// user. Acknowledged once no run is active.
    Abort,
    /// Abort any run, then clear the transcript, both queues and the error.
    Reset,
    /// Replace the transcript (refused during a run).
    SetMessages {
        /// The new transcript.
        messages: Vec<AgentMessage>,
    },
    /// Compact the transcript now (see [`tiller_core::compaction`]): a run of
    /// its own, no model turn, refused with [`AgentError::Busy`](crate::AgentError::Busy)
    /// during a run.
    Compact {
        /// What the summary should keep or stress, in place of the policy's
        /// instructions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instructions: Option<String>,
    },
    /// Change the agent's definition; runs already started keep theirs.
    UpdateSettings {
        /// What changes.
        patch: Box<DefinitionPatch>,
    },
    /// Start session `session` as a branch of this one: its transcript the
    /// first `at` messages of this one's (shared in the store, not copied),
    /// its context as it stood there, its own from then on. Acknowledged once
    /// the branch is stored; its agent is brought up as any stored session's
    /// is. Refused when `at` is past the transcript's end.
    Fork {
        /// How many messages of the transcript the branch begins with: the
        /// place (from 0) of the first one it does not.
        at: u64,
        /// The branch's session id.
        session: String,
    },
    /// The user's reply to a request a parked run left open, which starts a run:
    /// on the wire `{"type": "answer" | "approve" | "deny", "request_id": …}`.
    #[serde(untagged)]
    Reply(Reply),
}

impl Op {
    /// Whether this op starts a run.
    pub fn starts_run(&self) -> bool {
        matches!(
            self,
            Op::Prompt { .. } | Op::Continue | Op::Reply(_) | Op::Compact { .. }
        )
    }
}

impl From<Prompt> for Op {
    fn from(prompt: Prompt) -> Self {
        match prompt {
            Prompt::Messages(messages) => Op::Prompt { messages },
            Prompt::Continue => Op::Continue,
            Prompt::Reply(reply) => Op::Reply(reply),
            Prompt::Compact { instructions } => Op::Compact { instructions },
        }
    }
}

/// A message, or a user's text.
#[derive(Deserialize)]
#[serde(untagged)]
enum MessageOrText {
    Text(String),
    Message(AgentMessage),
}

impl From<MessageOrText> for AgentMessage {
    fn from(given: MessageOrText) -> Self {
        match given {
            MessageOrText::Text(text) => AgentMessage::user(text),
            MessageOrText::Message(message) => message,
        }
    }
}

fn message_or_text<'de, D: Deserializer<'de>>(from: D) -> Result<AgentMessage, D::Error> {
    MessageOrText::deserialize(from).map(AgentMessage::from)
}

fn messages_or_text<'de, D: Deserializer<'de>>(from: D) -> Result<Vec<AgentMessage>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        One(MessageOrText),
        Many(Vec<AgentMessage>),
    }
    Ok(match Given::deserialize(from)? {
        Given::One(one) => vec![one.into()],
        Given::Many(many) => many,
    })
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    /// The op `value` reads as, its messages' timestamps zeroed.
    fn op(value: serde_json::Value) -> Result<Op, serde_json::Error> {
        let mut op = serde_json::from_value(value)?;
        let messages = match &mut op {
            Op::Prompt { messages } => messages.iter_mut().collect(),
            Op::Steer { message } | Op::FollowUp { message } => vec![message],
            _ => Vec::new(),
        };
        for message in messages {
            if let AgentMessage::Llm(tiller_ai::Message::User(user)) = message {
                user.timestamp = 0;
            }
        }
        Ok(op)
    }

    #[test]
    fn ops_read_their_wire_forms_and_round_trip() {
        let mut user = tiller_ai::UserMessage::text("hi");
        user.timestamp = 0;
        let hi = AgentMessage::from(user);
        let cases = [
            (
                json!({"type": "prompt", "text": "hi"}),
                Op::Prompt {
                    messages: vec![hi.clone()],
                },
            ),
            (json!({"type": "continue"}), Op::Continue),
            (
                json!({"type": "follow_up", "text": "hi"}),
                Op::FollowUp {
                    message: hi.clone(),
                },
            ),
            (
                json!({"type": "clear_queues", "queues": "follow_up"}),
                Op::ClearQueues {
                    queues: Queues::FollowUp,
                },
            ),
            (json!({"type": "abort"}), Op::Abort),
            (
                json!({"type": "compact"}),
                Op::Compact { instructions: None },
            ),
            (
                json!({"type": "compact", "instructions": "keep the numbers"}),
                Op::Compact {
                    instructions: Some("keep the numbers".into()),
                },
            ),
            (json!({"type": "reset"}), Op::Reset),
            (
                json!({"type": "answer", "request_id": "c1", "text": "blue"}),
                Op::Reply(Reply::answer("c1", "blue")),
            ),
            (
                json!({"type": "deny", "request_id": "c1", "reason": "no"}),
                Op::Reply(Reply::deny("c1", Some("no".into()))),
            ),
        ];
        for (wire, expected) in cases {
            assert_eq!(op(wire.clone()).unwrap(), expected, "{wire}");
            let again = op(serde_json::to_value(&expected).unwrap()).unwrap();
            assert_eq!(again, expected);
        }
        let full = serde_json::to_value(Op::Steer {
            message: hi.clone(),
        })
        .unwrap();
        assert_eq!(op(full).unwrap(), Op::Steer { message: hi });
    }

    #[test]
    fn unknown_ops_and_bad_fields_are_errors() {
        for wire in [
            json!({"type": "launch"}),
            json!({"type": "steer"}),
            json!({"type": "steer", "text": 3}),
            json!({"type": "answer", "request_id": "c1"}),
            json!({"text": "hi"}),
            json!({"type": "steer", "text": "hi", "urgent": true}),
        ] {
            assert!(op(wire.clone()).is_err(), "{wire}");
        }
    }
}
