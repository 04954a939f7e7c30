//! What outlives any one actor process of an agent: its id and name, its session's
//! id and claim on it, its subscribers, who it works for, and the [`Route`] to its
//! actor. Starting an actor (a thaw, a restart) is the actor module's
//! (`actor/start.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ractor::ActorRef;
use tiller_store::{Change, SessionWrite};

use crate::error::AgentError;
use crate::message::{AgentMsg, Internal, Signal};
use crate::route::{Route, Routed};
use crate::runtime::Runtime;
use crate::subscription::{AgentId, Delivered, Hub, Notice};
use crate::{AgentContext, ContextIds};

pub(crate) struct Agent {
    pub(crate) id: AgentId,
    pub(crate) name: Option<Arc<str>>,
    /// The session the store keeps this agent in.
    pub(crate) session: Arc<str>,
    pub(crate) hub: Hub,
    /// How to reach its actor, and its status.
    pub(crate) route: Route,
    /// Who it was spawned to work for (its actor keeps the context as it grows:
    /// this over what the session stored, and the state its tools set).
    context: AgentContext,
    pub(crate) runtime: Arc<Runtime>,
    /// The epoch of this agent's claim on its session, set once when it is spawned
    /// (see [`tiller_store::SessionRecord::epoch`]): every write of the session
    /// carries it, and a thaw or restart finding another in the store stops.
    epoch: AtomicU64,
}

impl Agent {
    pub(crate) fn new(
        id: AgentId,
        name: Option<Arc<str>>,
        session: Arc<str>,
        context: AgentContext,
        runtime: Arc<Runtime>,
        first_event: u64,
    ) -> Self {
        Agent {
            id,
            name,
            session,
            hub: Hub::starting_at(first_event),
            route: Route::starting(),
            context,
            runtime,
            epoch: AtomicU64::new(0),
        }
    }

    /// The epoch of the agent's claim on its session.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Records the epoch the agent's spawn claimed its session at.
    pub(crate) fn claimed(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Release);
    }

    /// `change` to the agent's session, under its claim.
    pub(crate) fn write(&self, change: Change) -> SessionWrite {
        SessionWrite::new(self.session.clone(), change).at_epoch(self.epoch())
    }

    /// Who it was spawned to work for.
    pub(crate) fn spawned_context(&self) -> &AgentContext {
        &self.context
    }

    /// The ids of who the agent works for (`context`), in its session.
    pub(crate) fn context_ids(&self, context: &AgentContext) -> ContextIds {
        let mut ids = context.ids().clone();
        ids.session_id = Some(self.session.to_string());
        ids
    }

    /// Who a run works for: the agent's `context` in its session, working
    /// through this agent when no other agent asked it (made here, per run,
    /// rather than kept by every idle agent).
    pub(crate) fn run_context(&self, context: &AgentContext) -> AgentContext {
        let mut context = context.clone();
        if context.session_id() != Some(&*self.session) {
            context = context.with_session_id(&*self.session);
        }
        if context.agents().is_empty() {
            context = context.through(self.name.as_deref().unwrap_or(self.id.as_str()));
        }
        context
    }

    /// Routes `message` to the agent's actor: straight to a live one, queued behind
    /// a start, or waking a dormant agent or thawing a hibernated one. Never waits.
    pub(crate) fn send(self: &Arc<Self>, message: AgentMsg) -> Result<(), AgentError> {
        match self.route.send(message)? {
            Routed::Sent => {}
            Routed::Wake(state) => self.wake(state),
            Routed::Thaw(settings) => self.thaw(settings),
        }
        Ok(())
    }

    /// Aborts the live actor's run, if any, leaving a request waiting for the user
    /// open (a stop, a shutdown). An agent without a live actor has no run: it is
    /// neither thawed nor waited for.
    pub(crate) fn halt_run(&self) {
        if let Some(actor) = self.route.live() {
            let _ = actor.send_message(AgentMsg::Internal(Internal::halt()));
        }
    }

    /// The live actor, thawing or waiting for a restart as needed.
    pub(crate) async fn actor(self: &Arc<Self>) -> Result<ActorRef<AgentMsg>, AgentError> {
        loop {
            if let Some(actor) = self.route.live() {
                return Ok(actor);
            }
            // A state request goes through the route and returns once an actor runs.
            let (reply, answered) = tokio::sync::oneshot::channel();
            self.send(AgentMsg::State(reply.into()))?;
            let _ = answered.await;
        }
    }

    /// Stops the agent for good: requests get [`AgentError::Stopped`], and
    /// subscribers are told why.
    pub(crate) fn stop(&self, reason: String) {
        let (live, stopping) = self.route.stop(reason.clone());
        if let Some(actor) = live {
            actor.stop(None);
        }
        if stopping {
            self.hub
                .publish(&self.id, Delivered::Notice(Notice::AgentStopped { reason }));
        }
    }

    /// Stops the agent for good at once, writing nothing more for it (see
    /// [`crate::Supervisor::evict`]).
    pub(crate) fn evict(&self, reason: String) {
        let (live, stopping) = self.route.stop(reason.clone());
        if let Some(actor) = live {
            let _ = actor.send_message(AgentMsg::Internal(Internal(Signal::Evict)));
        }
        if stopping {
            self.hub
                .publish(&self.id, Delivered::Notice(Notice::AgentStopped { reason }));
        }
    }

    /// Records the session as closed (a stop on purpose, not a crash or shutdown).
    pub(crate) async fn close_session(&self) {
        let closed = self.write(Change::SetStatus(tiller_store::SessionStatus::Closed));
        if let Err(error) = self.runtime.writer.write(vec![closed]).await {
            tracing::warn!(agent = %self.id, %error, "could not mark the session closed");
        }
    }
}
