//! What can go wrong when talking to an agent or a supervisor.

use tiller_core::{ContinueError, UserRequest};

/// Why an agent refused or could not carry out a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// A prompt without messages.
    #[error("a prompt needs at least one message")]
    EmptyPrompt,
    /// A run is active; a second one cannot start.
    #[error(
        "the agent is busy with a run: use steer() to redirect it or follow_up() to queue work for after it"
    )]
    Busy,
    /// The agent has no model to call.
    #[error("the agent has no model: set one with update_settings() first")]
    NoModel,
    /// There is no message to continue from.
    #[error("nothing to continue: the transcript is empty")]
    NothingToContinue,
    /// The transcript ends with the model's answer and no message is queued.
    #[error(
        "cannot continue from an assistant message: prompt, or queue a steering or follow-up message first"
    )]
    CannotContinueFromAssistant,
    /// The agent was stopped (by its supervisor, by shutdown, or for failing too often).
    #[error("the agent is stopped: {reason}")]
    Stopped {
        /// Why.
        reason: String,
    },
    /// The session store could not keep the change; the agent's state in memory may
    /// be ahead of the store until the next successful write.
    #[error(transparent)]
    Store(#[from] tiller_store::StoreError),
    /// A run's overrides cannot be used (an unknown model, a key variable not set).
    #[error("the run's overrides cannot be used: {0}")]
    InvalidOverrides(String),
    /// A tool call waits for the user's reply (see [`tiller_core::request`]):
    /// answer, approve or deny it first, or abort to give it up.
    #[error(
        "a tool call waits for the user's reply ({}): answer, approve or deny it first, or abort to give it up",
        describe(waiting)
    )]
    WaitingForReply {
        /// The oldest open request.
        waiting: Box<UserRequest>,
    },
    /// The steering or follow-up queue holds as much as its
    /// [`crate::QueueLimits`] allow; the message was not queued.
    #[error(
        "the {queue} queue is full (at most {max_messages} messages and {max_bytes} bytes): wait for the run to take some"
    )]
    QueueFull {
        /// `steering` or `follow-up`.
        queue: &'static str,
        /// The most messages it holds.
        max_messages: usize,
        /// The most bytes it holds.
        max_bytes: usize,
    },
    /// A reply was given, but no tool call waits for one.
    #[error("no tool call waits for a reply")]
    NothingToReply,
    /// A reply names a request that is not open.
    #[error("no open request has the id `{request_id}`; the open ones are {}", open.join(", "))]
    NoSuchRequest {
        /// The id the reply gave.
        request_id: String,
        /// The ids of the open requests, oldest first.
        open: Vec<String>,
    },
    /// The request the reply names wants another kind of reply: an answer for a
    /// question, approve or deny for an approval.
    #[error("the reply does not fit the waiting request ({})", describe(waiting))]
    ReplyDoesNotFit {
        /// The oldest open request.
        waiting: Box<UserRequest>,
    },
    /// The agent failed while carrying out this request and has been restarted; the
    /// request may be retried.
    #[error("the agent failed while handling the request and was restarted: {reason}")]
    Failed {
        /// What failed.
        reason: String,
    },
}

/// A request in brief, for error messages.
fn describe(request: &UserRequest) -> String {
    match request {
        UserRequest::Input {
            tool_name,
            question,
            ..
        } => format!("`{tool_name}` asks: {question}"),
        UserRequest::Approval { tool_name, .. } => format!("`{tool_name}` needs approval"),
    }
}

impl From<ContinueError> for AgentError {
    fn from(error: ContinueError) -> Self {
        match error {
            ContinueError::EmptyContext => AgentError::NothingToContinue,
            ContinueError::EndsWithAssistant => AgentError::CannotContinueFromAssistant,
            ContinueError::NothingToReply => AgentError::NothingToReply,
            ContinueError::NoSuchRequest { request_id, open } => {
                AgentError::NoSuchRequest { request_id, open }
            }
            ContinueError::ReplyDoesNotFit { waiting } => AgentError::ReplyDoesNotFit { waiting },
            ContinueError::WaitingForReply { waiting } => AgentError::WaitingForReply { waiting },
        }
    }
}

/// Why an agent could not be spawned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnError {
    /// Another agent has this id.
    #[error("an agent with id `{0}` already exists")]
    IdTaken(String),
    /// Another agent has this name.
    #[error("an agent named `{0}` already exists")]
    NameTaken(String),
    /// An id, session id or name the spec gives is not one (see
    /// [`crate::MAX_ID_BYTES`]).
    #[error("the {field} `{shown}` cannot be used: {reason}", shown = .value.escape_debug().to_string().chars().take(64).collect::<String>())]
    InvalidId {
        /// Which: `id`, `session` or `name`.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The stored session belongs to another tenant or user than the spec's
    /// context: it is not brought up.
    #[error("session `{session}` belongs to another tenant or user")]
    NotOwner {
        /// The session.
        session: String,
    },
    /// The supervisor is shut down.
    #[error("the supervisor is shut down")]
    ShutDown,
    /// The session store failed, or the session to create exists already.
    #[error(transparent)]
    Store(#[from] tiller_store::StoreError),
    /// A resumed session names tools the spec does not have.
    #[error("session `{session}` uses tools this agent lacks: {}", missing.join(", "))]
    MissingTools {
        /// The session.
        session: String,
        /// The stored tool names the spec's settings lack.
        missing: Vec<String>,
    },
    /// The actor runtime refused to start an actor.
    #[error("the actor runtime could not start an actor: {0}")]
    Runtime(String),
}
