//! What a run starts from ([`Prompt`], [`LoopContext`]) and the one place the
//! checks before a run are made ([`check_start`]).

use tiller_ai::{Content, ImageContent, UserMessage};

use crate::compaction::ContextTokens;
use crate::message::AgentMessage;
use crate::request::{Reply, UserRequest, open_requests};
use crate::toolset::ToolSet;

/// What starts a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// New messages.
    Messages(Vec<AgentMessage>),
    /// The transcript as it stands.
    Continue,
    /// The user's reply to one of the requests a parked run left open (see
    /// [`crate::request`]).
    Reply(Reply),
    /// No model turn: compact the transcript (see [`crate::compaction`]), with
    /// these instructions for the summary added to the policy's.
    Compact {
        /// What the summary should keep or stress.
        instructions: Option<String>,
    },
}

impl Prompt {
    /// A user message of text and images.
    pub fn with_images(text: impl Into<String>, images: Vec<ImageContent>) -> Self {
        let mut message = UserMessage::text(text);
        message
            .content
            .extend(images.into_iter().map(Content::Image));
        Prompt::Messages(vec![message.into()])
    }
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        Prompt::Messages(vec![AgentMessage::user(text)])
    }
}

impl From<String> for Prompt {
    fn from(text: String) -> Self {
        Prompt::Messages(vec![AgentMessage::user(text)])
    }
}

impl From<AgentMessage> for Prompt {
    fn from(message: AgentMessage) -> Self {
        Prompt::Messages(vec![message])
    }
}

impl From<UserMessage> for Prompt {
    fn from(message: UserMessage) -> Self {
        Prompt::Messages(vec![message.into()])
    }
}

impl From<Vec<AgentMessage>> for Prompt {
    fn from(messages: Vec<AgentMessage>) -> Self {
        Prompt::Messages(messages)
    }
}

/// What a run starts from: the system prompt, the transcript and the tools.
#[derive(Debug, Clone, Default)]
pub struct LoopContext {
    /// Instructions sent ahead of the conversation.
    pub system_prompt: Option<String>,
    /// The transcript so far.
    pub messages: Vec<AgentMessage>,
    /// The tools the model may call.
    pub tools: ToolSet,
    /// The transcript's token count, when the caller keeps one; counted from the
    /// messages when not (see [`crate::compaction`]).
    pub tokens: Option<ContextTokens>,
    /// The place of the transcript's first message in the session's stored
    /// transcript (a compaction's summary says what it replaces by place).
    pub first_seq: u64,
}

/// Why a run cannot start from what it was given on the transcript it has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContinueError {
    /// A prompt without messages.
    #[error("a prompt needs at least one message")]
    EmptyPrompt,
    /// There is nothing to continue from.
    #[error("nothing to continue: the transcript is empty")]
    EmptyContext,
    /// The model already answered last; a new turn needs a new message first.
    #[error(
        "cannot continue from an assistant message: prompt, or queue a steering or follow-up message first"
    )]
    EndsWithAssistant,
    /// A reply was given, but no request waits for one.
    #[error("no tool call waits for a reply")]
    NothingToReply,
    /// A reply names a request that is not open (requests wait, but not this one).
    #[error("no open request has the id `{request_id}`; the open ones are {}", open.join(", "))]
    NoSuchRequest {
        /// The id the reply gave.
        request_id: String,
        /// The ids of the open requests, oldest first.
        open: Vec<String>,
    },
    /// The request the reply names wants another kind of reply (an answer for a
    /// question, approve or deny for an approval).
    #[error("the reply does not fit the waiting request ({})", waiting.describe())]
    ReplyDoesNotFit {
        /// What waits.
        waiting: Box<UserRequest>,
    },
    /// A request waits for the user's reply; only a reply goes on.
    #[error(
        "a tool call waits for the user's reply ({}): answer, approve or deny it first, or abort to give it up",
        waiting.describe()
    )]
    WaitingForReply {
        /// What waits.
        waiting: Box<UserRequest>,
    },
}

/// The request `reply` resolves in the transcript `messages`: the open one it
/// names, if the reply fits it.
pub fn check_reply<M: std::borrow::Borrow<AgentMessage>>(
    messages: &[M],
    reply: &Reply,
) -> Result<UserRequest, ContinueError> {
    let mut open = open_requests(messages);
    if open.is_empty() {
        return Err(ContinueError::NothingToReply);
    }
    let Some(position) = open
        .iter()
        .position(|request| request.tool_call_id() == reply.request_id())
    else {
        return Err(ContinueError::NoSuchRequest {
            request_id: reply.request_id().to_owned(),
            open: open
                .iter()
                .map(|request| request.tool_call_id().to_owned())
                .collect(),
        });
    };
    let waiting = open.swap_remove(position);
    if !reply.fits(&waiting) {
        return Err(ContinueError::ReplyDoesNotFit {
            waiting: Box::new(waiting),
        });
    }
    Ok(waiting)
}

/// Checks that a run can start from new messages on the transcript `messages`:
/// no request waits for the user's reply.
pub fn check_prompt<M: std::borrow::Borrow<AgentMessage>>(
    messages: &[M],
) -> Result<(), ContinueError> {
    match open_requests(messages).into_iter().next() {
        Some(waiting) => Err(ContinueError::WaitingForReply {
            waiting: Box::new(waiting),
        }),
        None => Ok(()),
    }
}

/// A run's beginning, checked against the transcript by [`check_start`]: new
/// messages, the transcript as it stands, or the user's reply to an open request.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Start {
    /// New messages, on a transcript where no request waits for the user.
    Messages(Vec<AgentMessage>),
    /// The transcript as it stands: not empty, not ending with the model's answer,
    /// no request open.
    Continue,
    /// The user's reply and the open request it resolves.
    Reply(UserRequest, Reply),
    /// A compaction and nothing else, with these instructions.
    Compact(Option<String>),
}

/// Decides whether a run can start from `prompt` on the transcript `messages`,
/// and how: the one place the checks before a run are made.
pub fn check_start<M: std::borrow::Borrow<AgentMessage>>(
    prompt: Prompt,
    messages: &[M],
) -> Result<Start, ContinueError> {
    match prompt {
        Prompt::Messages(new) if new.is_empty() => Err(ContinueError::EmptyPrompt),
        Prompt::Messages(new) => {
            check_prompt(messages)?;
            Ok(Start::Messages(new))
        }
        Prompt::Continue => {
            check_prompt(messages)?;
            match messages.last() {
                None => Err(ContinueError::EmptyContext),
                Some(message) if message.borrow().as_assistant().is_some() => {
                    Err(ContinueError::EndsWithAssistant)
                }
                Some(_) => Ok(Start::Continue),
            }
        }
        Prompt::Reply(reply) => Ok(Start::Reply(check_reply(messages, &reply)?, reply)),
        Prompt::Compact { .. } if messages.is_empty() => Err(ContinueError::EmptyContext),
        Prompt::Compact { instructions } => Ok(Start::Compact(instructions)),
    }
}

/// Checks that a run can continue from `context`.
pub fn check_continue(context: &LoopContext) -> Result<(), ContinueError> {
    check_start(Prompt::Continue, &context.messages).map(|_| ())
}
