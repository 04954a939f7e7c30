//! What outlives any one actor process of an agent: its id and name, its session's
//! id and claim on it, its subscribers, who it works for, and the [`Route`] to its
//! actor. Starting an actor (the first, a thaw, a restart) happens here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ractor::ActorRef;
use tiller_store::{Change, SessionWrite};

use crate::actor::{AgentActor, Boot, Loaded};
use crate::ask_agent::AgentPath;
use crate::compress::with_lookup;
use crate::error::AgentError;
use crate::message::AgentMsg;
use crate::route::{Route, Routed};
use crate::runtime::Runtime;
use crate::settings::AgentSettings;
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
    /// Who it works for (its session id is added for each run).
    context: AgentContext,
    pub(crate) runtime: Arc<Runtime>,
    /// The epoch of this agent's claim on its session, set once when it is spawned
    /// (see [`tiller_store::SessionRecord::epoch`]): every write of the session
    /// carries it, and a thaw or restart finding another in the store stops.
    epoch: AtomicU64,
}

/// Why an actor is being started.
pub(crate) enum Start {
    /// After hibernation.
    Thaw,
    /// After a failure.
    Restart(String),
}

impl Agent {
    pub(crate) fn new(
        id: AgentId,
        name: Option<Arc<str>>,
        session: Arc<str>,
        context: AgentContext,
        runtime: Arc<Runtime>,
    ) -> Self {
        Agent {
            id,
            name,
            session,
            hub: Hub::new(),
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

    /// The ids of who the agent works for, in its session.
    pub(crate) fn context_ids(&self) -> ContextIds {
        let mut ids = self.context.ids().clone();
        ids.session_id = Some(self.session.to_string());
        ids
    }

    /// Who a run works for: the agent's context in its session, with the path of
    /// agents it works through (`ask_agent`; made here, per run, rather than kept
    /// by every idle agent).
    pub(crate) fn run_context(&self) -> AgentContext {
        let mut context = self.context.clone();
        if context.session_id() != Some(&*self.session) {
            context = context.with_session_id(&*self.session);
        }
        if context.extension::<AgentPath>().is_none() {
            let root = self.name.as_deref().unwrap_or(self.id.as_str());
            context = context.with_extension(AgentPath::root(root));
        }
        context
    }

    /// Routes `message` to the agent's actor: straight to a live one, queued behind
    /// a start, or thawing a hibernated agent. Never waits.
    pub(crate) fn send(self: &Arc<Self>, message: AgentMsg) -> Result<(), AgentError> {
        if let Routed::Thaw(settings) = self.route.send(message)? {
            self.start(settings, Start::Thaw);
        }
        Ok(())
    }

    /// Aborts the live actor's run, if any, leaving a request waiting for the user
    /// open (a stop, a shutdown). An agent without a live actor has no run: it is
    /// neither thawed nor waited for.
    pub(crate) fn halt_run(&self) {
        if let Some(actor) = self.route.live() {
            let _ = actor.send_message(AgentMsg::Internal(crate::actor::Internal::halt()));
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

    /// Starts an actor with `settings` for this agent in a task: its state is
    /// loaded from the store (after every write submitted so far is committed),
    /// then the requests waiting in the route are delivered in order.
    pub(crate) fn start(self: &Arc<Self>, settings: Arc<AgentSettings>, why: Start) {
        let agent = self.clone();
        tokio::spawn(async move {
            match agent.boot(settings).await {
                Ok(actor) => {
                    if !agent.route.go_live(&actor) {
                        // Stopped meanwhile.
                        actor.stop(None);
                        return;
                    }
                    if let Start::Restart(reason) = why {
                        agent.hub.publish(
                            &agent.id,
                            Delivered::Notice(Notice::AgentRestarted { reason }),
                        );
                    }
                }
                Err(reason) => {
                    tracing::error!(agent = %agent.id, %reason, "agent could not be started");
                    agent.stop(reason);
                }
            }
        });
    }

    /// Loads the session and spawns an actor linked to the supervisor.
    async fn boot(
        self: &Arc<Self>,
        settings: Arc<AgentSettings>,
    ) -> Result<ActorRef<AgentMsg>, String> {
        let writer = &self.runtime.writer;
        writer
            .flush()
            .await
            .map_err(|error| format!("the session store failed: {error}"))?;
        let stored = writer
            .store()
            .load(&self.session)
            .await
            .map_err(|error| format!("the session store failed: {error}"))?
            .ok_or_else(|| format!("its session `{}` is gone from the store", self.session))?;
        if stored.record.epoch != self.epoch() {
            return Err(tiller_store::StoreError::TakenOver {
                session: self.session.to_string(),
                epoch: self.epoch(),
                current: stored.record.epoch,
            }
            .to_string());
        }
        let loaded = Loaded::from_store(self, &settings, stored);
        self.spawn_actor(settings, loaded).await
    }

    /// Spawns an actor with `settings` holding `loaded`, linked to the supervisor.
    pub(crate) async fn spawn_actor(
        self: &Arc<Self>,
        settings: Arc<AgentSettings>,
        loaded: Loaded,
    ) -> Result<ActorRef<AgentMsg>, String> {
        let settings = match settings.code.compression {
            Some(_) => Arc::new(with_lookup(
                &settings,
                self.runtime.writer.store().clone(),
                self.session.clone(),
            )),
            None => settings,
        };
        let boot = Boot {
            agent: self.clone(),
            settings,
            loaded,
        };
        AgentActor::spawn(boot, self.runtime.supervisor.clone())
            .await
            .map_err(|error| format!("the actor runtime could not start an actor: {error}"))
    }

    /// The actor failed and the supervisor's restart budget allows another:
    /// restart it with `settings`, unless the agent was stopped meanwhile.
    pub(crate) fn restart(self: &Arc<Self>, settings: Arc<AgentSettings>, reason: String) {
        if !self.route.is_starting() {
            return;
        }
        tracing::warn!(agent = %self.id, %reason, "agent failed; restarting from its stored session");
        self.start(settings, Start::Restart(reason));
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

    /// Records the session as closed (a stop on purpose, not a crash or shutdown).
    pub(crate) async fn close_session(&self) {
        let closed = self.write(Change::SetStatus(tiller_store::SessionStatus::Closed));
        if let Err(error) = self.runtime.writer.write(vec![closed]).await {
            tracing::warn!(agent = %self.id, %error, "could not mark the session closed");
        }
    }
}
