//! The messages an agent's actor takes. [`crate::AgentHandle`] is sugar over them;
//! a host's own ractor actors can send them straight to [`crate::AgentHandle::actor`]:
//!
//! ```
//! # use tiller::{AgentMsg, AgentSettings, AgentSpec, Supervisor};
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let faux = tiller::faux::FauxProvider::new();
//! # let supervisor = Supervisor::start().await?;
//! # let agent = supervisor.spawn(AgentSpec::new(AgentSettings::new(faux.model()))).await?;
//! let actor = agent.actor().await?;
//! actor.cast(AgentMsg::Abort)?;
//! let state = ractor::call_t!(actor, AgentMsg::State, 1000)?;
//! assert!(state.messages.is_empty());
//! # supervisor.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::fmt;

use ractor::RpcReplyPort;
use tiller_core::Prompt;
use tokio::sync::oneshot;

use crate::AgentMessage;
use crate::actor::Internal;
use crate::error::AgentError;
use crate::overrides::RunOverrides;
use crate::settings::AgentSettings;
use crate::state::{AgentState, RunOutcome};
use crate::subscription::Subscription;

/// One of the agent's two queues, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Queues {
    /// Steering messages.
    Steering,
    /// Follow-up messages.
    FollowUp,
    /// Both.
    Both,
}

/// A change to an agent's settings, applied by its actor.
pub type SettingsChange = Box<dyn FnOnce(&mut AgentSettings) + Send>;

/// A request to an agent's actor. Requests that change durable state (queueing,
/// clearing, reset, settings, the transcript) are answered once the change is in
/// the session store.
#[non_exhaustive]
pub enum AgentMsg {
    /// Start a run; answered with `Ok` once accepted, or why not ([`AgentError::Busy`]
    /// while a run is active). `finished` hears the run's outcome.
    Start {
        /// What the run starts from.
        prompt: Prompt,
        /// Whether the run was accepted.
        reply: RpcReplyPort<Result<(), AgentError>>,
        /// The outcome, once the run ended and its messages are stored.
        finished: Option<oneshot::Sender<RunOutcome>>,
        /// Settings for this run only.
        overrides: Option<Box<RunOverrides>>,
        /// The span the run's own `run` span (agent, session, run number) goes
        /// under: the caller's, such as an HTTP request's.
        span: tracing::Span,
    },
    /// Queue a steering message.
    Steer(AgentMessage, Option<RpcReplyPort<Result<(), AgentError>>>),
    /// Queue a follow-up message.
    FollowUp(AgentMessage, Option<RpcReplyPort<Result<(), AgentError>>>),
    /// Drop queued messages.
    ClearQueues(Queues, Option<RpcReplyPort<Result<(), AgentError>>>),
    /// Abort the active run, if any.
    Abort,
    /// Abort any run, then clear the transcript, both queues and the error.
    Reset(RpcReplyPort<Result<(), AgentError>>),
    /// Replace the transcript (refused with [`AgentError::Busy`] during a run).
    SetMessages(Vec<AgentMessage>, RpcReplyPort<Result<(), AgentError>>),
    /// Change settings; runs already started keep theirs.
    UpdateSettings(SettingsChange, RpcReplyPort<Result<(), AgentError>>),
    /// A snapshot of the state.
    State(RpcReplyPort<AgentState>),
    /// Answered once no run is active.
    WaitForIdle(RpcReplyPort<()>),
    /// A new subscription holding up to this many unread events.
    Subscribe(usize, RpcReplyPort<Subscription>),
    /// The runtime's own traffic (runs reporting back, timers).
    #[doc(hidden)]
    Internal(Internal),
}

impl fmt::Debug for AgentMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            AgentMsg::Start { .. } => "Start",
            AgentMsg::Steer(..) => "Steer",
            AgentMsg::FollowUp(..) => "FollowUp",
            AgentMsg::ClearQueues(..) => "ClearQueues",
            AgentMsg::Abort => "Abort",
            AgentMsg::Reset(_) => "Reset",
            AgentMsg::SetMessages(..) => "SetMessages",
            AgentMsg::UpdateSettings(..) => "UpdateSettings",
            AgentMsg::State(_) => "State",
            AgentMsg::WaitForIdle(_) => "WaitForIdle",
            AgentMsg::Subscribe(..) => "Subscribe",
            AgentMsg::Internal(_) => "Internal",
        };
        f.write_str(name)
    }
}
