//! The messages an agent's actor takes: an [`Op`] to carry out, plus the few
//! requests that cannot be serialized (a snapshot, a subscription, code for the
//! settings). [`crate::AgentHandle`] is sugar over them; a host's own ractor actors
//! can send them straight to [`crate::AgentHandle::actor`]:
//!
//! ```
//! # use tiller::{AgentSettings, AgentSpec, Op, Supervisor, runtime::AgentMsg};
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let faux = tiller::faux::FauxProvider::new();
//! # let supervisor = Supervisor::start().await?;
//! # let agent = supervisor.spawn(AgentSpec::new(AgentSettings::new(faux.model()))).await?;
//! let actor = agent.actor().await?;
//! actor.cast(AgentMsg::from(Op::Abort))?;
//! let state = ractor::call_t!(actor, AgentMsg::State, 1000)?;
//! assert!(state.messages.is_empty());
//! # supervisor.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;

use ractor::RpcReplyPort;
use tiller_core::RunHooks;
use tiller_store::{QueueKind, StoreError};
use tokio::sync::oneshot;

use crate::AgentMessage;
use crate::error::AgentError;
use crate::op::Op;
use crate::patch::DefinitionPatch;
use crate::settings::AgentSettings;
use crate::state::{AgentState, RunOutcome, Workload};
use crate::subscription::Subscription;

/// A change to an agent's settings, applied by its actor.
pub type SettingsChange = Box<dyn FnOnce(&mut AgentSettings) + Send>;

/// An [`Op`] on its way to an agent's actor, with what travels beside it in
/// process: where the acknowledgement goes, and for an op that starts a run, its
/// own settings (a serializable patch, and hooks), who hears its outcome and the
/// caller's span.
pub struct Submission {
    /// What to do.
    pub op: Op,
    /// Hears once the op is carried out (and its change is in the session store),
    /// or why it was refused.
    pub reply: Option<RpcReplyPort<Result<(), AgentError>>>,
    /// The run's outcome, once the run ended and its messages are stored.
    pub finished: Option<oneshot::Sender<RunOutcome>>,
    /// Changes to the definition for this run only (for an op that starts one).
    pub patch: Option<Box<DefinitionPatch>>,
    /// Hooks for this run only, each in place of the agent's.
    pub hooks: Option<Box<RunHooks>>,
    /// The span the run's own `run` span (agent, session, run number) goes
    /// under: the caller's, such as an HTTP request's.
    pub span: tracing::Span,
    /// The op's idempotency key: an op whose key the agent has seen applied (in
    /// this process or, through its session, in another) is acknowledged without
    /// being applied again. The key is written with the op's change, in one
    /// transaction, and remembered for the session's newest
    /// [`tiller_store::MAX_OP_KEYS`] ops.
    pub key: Option<Arc<str>>,
}

impl Submission {
    /// `op`, acknowledged to `reply`, from the current span.
    pub fn new(op: Op, reply: Option<RpcReplyPort<Result<(), AgentError>>>) -> Self {
        Submission {
            op,
            reply,
            finished: None,
            patch: None,
            hooks: None,
            span: tracing::Span::current(),
            key: None,
        }
    }

    /// The same submission carrying the idempotency key `key`.
    pub fn with_key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// A request to an agent's actor.
#[non_exhaustive]
pub enum AgentMsg {
    /// Carry out an op.
    Submit(Box<Submission>),
    /// Change settings with code (tools, hooks); runs already started keep theirs.
    UpdateSettings(SettingsChange, RpcReplyPort<Result<(), AgentError>>),
    /// A snapshot of the state.
    State(RpcReplyPort<AgentState>),
    /// Answered once no run is active.
    WaitForIdle(RpcReplyPort<()>),
    /// A new subscription holding up to this many unread events.
    Subscribe(usize, RpcReplyPort<Subscription>),
    /// What the agent has to do, in brief.
    Workload(RpcReplyPort<Workload>),
    /// The runtime's own traffic (runs reporting back, timers).
    #[doc(hidden)]
    Internal(Internal),
}

impl AgentMsg {
    /// `op`, acknowledged to `reply` (for `ractor::call!`).
    pub fn submit(op: Op, reply: RpcReplyPort<Result<(), AgentError>>) -> Self {
        AgentMsg::Submit(Box::new(Submission::new(op, Some(reply))))
    }
}

impl From<Op> for AgentMsg {
    /// The op, unacknowledged.
    fn from(op: Op) -> Self {
        AgentMsg::Submit(Box::new(Submission::new(op, None)))
    }
}

impl fmt::Debug for AgentMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            AgentMsg::Submit(_) => "Submit",
            AgentMsg::UpdateSettings(..) => "UpdateSettings",
            AgentMsg::State(_) => "State",
            AgentMsg::WaitForIdle(_) => "WaitForIdle",
            AgentMsg::Subscribe(..) => "Subscribe",
            AgentMsg::Workload(_) => "Workload",
            AgentMsg::Internal(_) => "Internal",
        };
        f.write_str(name)
    }
}

/// The runtime's own messages to an agent's actor.
pub struct Internal(pub(crate) Signal);

pub(crate) enum Signal {
    /// A request routed through the agent's slot (counted, for hibernation).
    Routed(Box<AgentMsg>),
    /// The run has queued events.
    Events,
    /// The run `run` asks for what one delivery of a queue takes.
    Take {
        run: u64,
        queue: QueueKind,
        reply: oneshot::Sender<Vec<AgentMessage>>,
    },
    /// Everything the run `run` wrote is committed.
    Committed(u64),
    /// The op with this idempotency key is applied and stored (a fork, made
    /// off the actor): remembered from now on.
    Applied(Arc<str>),
    /// A write of the actor's was refused: its session was taken over.
    TakenOver(StoreError),
    /// Idle since activity number `activity`: time to put the agent away
    /// (dormant or hibernated) if nothing happened since.
    PutAway(u64),
    /// Abort the active run, if any, for a stop or a shutdown: unlike
    /// [`Op::Abort`](crate::Op::Abort), a request waiting for the user stays open, for whoever
    /// resumes the session.
    Halt,
    /// End the active run, if any, where its next turn would start
    /// ([`tiller_core::RunEnd::Paused`]), for a hand-off to another process.
    Pause,
    /// Stop at once, writing nothing more: the run is cancelled and dropped
    /// with whatever it had not handed over yet.
    Evict,
}

impl Internal {
    pub(crate) fn routed(message: AgentMsg) -> Self {
        Internal(Signal::Routed(Box::new(message)))
    }

    /// See [`Signal::Halt`].
    pub(crate) fn halt() -> Self {
        Internal(Signal::Halt)
    }

    /// The request a routed message carries.
    pub(crate) fn unrouted(message: AgentMsg) -> AgentMsg {
        match message {
            AgentMsg::Internal(Internal(Signal::Routed(message))) => *message,
            other => other,
        }
    }
}
