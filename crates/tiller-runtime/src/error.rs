//! What can go wrong when talking to an agent or a supervisor.

use tiller_core::ContinueError;

/// Why an agent refused or could not carry out a request. Serializable, so that
/// it can answer an [`Op`](crate::Op) sent from another process.
///
/// ```
/// # use tiller_runtime::AgentError;
/// let full = AgentError::QueueFull { queue: "steering".into(), max_messages: 2, max_bytes: 10 };
/// let json = serde_json::to_string(&full)?;
/// assert_eq!(serde_json::from_str::<AgentError>(&json)?, full);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentError {
    /// The run cannot start from what it was given on the transcript the agent
    /// has: an empty prompt, nothing to continue, a reply that fits no open
    /// request, a prompt while a request waits for the user's reply.
    #[error(transparent)]
    CannotStart(#[from] ContinueError),
    /// A run is active; a second one cannot start.
    #[error(
        "the agent is busy with a run: use steer() to redirect it or follow_up() to queue work for after it"
    )]
    Busy,
    /// The agent has no model to call.
    #[error("the agent has no model: set one with update_settings() first")]
    NoModel,
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
    /// A patch of the definition (a run's own settings, an update) cannot be
    /// used: an unknown model, a key variable not set; nothing changed.
    #[error("the settings cannot be used: {0}")]
    InvalidPatch(#[from] crate::patch::PatchError),
    /// The steering or follow-up queue holds as much as its
    /// [`crate::QueueLimits`] allow; the message was not queued.
    #[error(
        "the {queue} queue is full (at most {max_messages} messages and {max_bytes} bytes): wait for the run to take some"
    )]
    QueueFull {
        /// `steering` or `follow-up`.
        queue: std::borrow::Cow<'static, str>,
        /// The most messages it holds.
        max_messages: usize,
        /// The most bytes it holds.
        max_bytes: usize,
    },
    /// The agent failed while carrying out this request and has been restarted; the
    /// request may be retried.
    #[error("the agent failed while handling the request and was restarted: {reason}")]
    Failed {
        /// What failed.
        reason: String,
    },
    /// A compaction asked for ([`crate::AgentHandle::compact`]) left the
    /// transcript as it was: nothing to cut, or the summary could not be written.
    #[error("the transcript was not compacted: {reason}")]
    NotCompacted {
        /// Why.
        reason: String,
    },
    /// A fork's session id cannot name a session (see
    /// [`crate::MAX_ID_BYTES`]); nothing was written.
    #[error("the branch cannot be made: {reason}")]
    InvalidBranch {
        /// What is wrong with its id.
        reason: String,
    },
    /// An op with this idempotency key was applied already (see
    /// [`Submission::key`](crate::Submission::key)), and the run it started told
    /// its outcome to whoever sent it then: it is in the transcript.
    #[error(
        "the op with idempotency key `{key}` was applied already; its run's messages are in the transcript"
    )]
    Duplicate {
        /// The key.
        key: String,
    },
}

/// Why an agent could not be spawned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
