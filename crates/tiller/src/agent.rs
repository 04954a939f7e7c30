//! What outlives any one actor process of an agent: its id and name, its session's
//! id, its subscribers, its code (the settings' tools and hooks, which no store can
//! keep) and the route to its actor.
//!
//! The route is a [`Slot`]: the live actor, an actor being started (requests wait
//! there, in order), hibernation, or a stop. A request to a hibernated agent thaws
//! it from the store; a request to an actor that just failed waits for the restart.
//! Requests sent through the route are counted, and an actor hibernates only when
//! it has handled as many as were sent, so none is left in a stopping mailbox.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use ractor::{ActorId, ActorRef, MessagingErr};
use tiller_store::{Change, SessionWrite};

use crate::actor::{AgentActor, Boot, Internal, Loaded};
use crate::ask_agent::AgentPath;
use crate::compress::with_lookup;
use crate::error::AgentError;
use crate::message::AgentMsg;
use crate::runtime::Runtime;
use crate::settings::AgentSettings;
use crate::state::AgentStatus;
use crate::subscription::{AgentId, Delivered, Hub, Notice};
use crate::{AgentContext, ContextIds};

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const STOPPED: u8 = 2;
const WAITING: u8 = 3;

/// How to reach an agent's actor.
enum Slot {
    /// A live actor; `sent` counts the requests routed to it.
    Live {
        actor: ActorRef<AgentMsg>,
        sent: u64,
    },
    /// An actor is being started (a thaw or a restart); requests wait here.
    Starting(Vec<AgentMsg>),
    /// No actor: the next request thaws one from the store.
    Hibernated,
    /// Stopped for good.
    Stopped(String),
}

pub(crate) struct Agent {
    pub(crate) id: AgentId,
    pub(crate) name: Option<Arc<str>>,
    /// The session the store keeps this agent in.
    pub(crate) session: Arc<str>,
    pub(crate) hub: Hub,
    slot: Mutex<Slot>,
    /// Who it works for (its session id is added for each run).
    context: AgentContext,
    /// The latest settings, kept for restarts and thaws (tools and hooks are code).
    settings: Mutex<Arc<AgentSettings>>,
    status: AtomicU8,
    pub(crate) runtime: Arc<Runtime>,
    /// When the actor failed lately, and why it failed last.
    failures: Mutex<(Vec<Instant>, Option<String>)>,
    /// The epoch of this agent's claim on its session, set once when it is spawned
    /// (see [`tiller_store::SessionRecord::epoch`]): every write of the session
    /// carries it, and a thaw or restart finding another in the store stops.
    epoch: AtomicU64,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
        settings: Arc<AgentSettings>,
        context: AgentContext,
        runtime: Arc<Runtime>,
    ) -> Self {
        Agent {
            id,
            name,
            session,
            hub: Hub::new(),
            slot: Mutex::new(Slot::Starting(Vec::new())),
            context,
            settings: Mutex::new(settings),
            status: AtomicU8::new(IDLE),
            runtime,
            failures: Mutex::new((Vec::new(), None)),
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
        let mut slot = lock(&self.slot);
        match &mut *slot {
            Slot::Live { actor, sent } => {
                match actor.send_message(AgentMsg::Internal(Internal::routed(message))) {
                    Ok(()) => {
                        *sent += 1;
                        Ok(())
                    }
                    // The actor has died and its failure is on its way to the
                    // supervisor, which restarts it and delivers what waits here.
                    Err(MessagingErr::SendErr(message)) => {
                        *slot = Slot::Starting(vec![Internal::unrouted(message)]);
                        Ok(())
                    }
                    Err(_) => Err(AgentError::Failed {
                        reason: "the agent's actor could not be reached".to_owned(),
                    }),
                }
            }
            Slot::Starting(waiting) => {
                waiting.push(message);
                Ok(())
            }
            Slot::Hibernated => {
                *slot = Slot::Starting(vec![message]);
                drop(slot);
                self.start(Start::Thaw);
                Ok(())
            }
            Slot::Stopped(reason) => Err(AgentError::Stopped {
                reason: reason.clone(),
            }),
        }
    }

    /// Aborts the live actor's run, if any, leaving a request waiting for the user
    /// open (a stop, a shutdown). An agent without a live actor has no run: it is
    /// neither thawed nor waited for.
    pub(crate) fn halt_run(&self) {
        if let Slot::Live { actor, .. } = &*lock(&self.slot) {
            let _ = actor.send_message(AgentMsg::Internal(Internal::halt()));
        }
    }

    /// The live actor, thawing or waiting for a restart as needed.
    pub(crate) async fn actor(self: &Arc<Self>) -> Result<ActorRef<AgentMsg>, AgentError> {
        loop {
            if let Slot::Live { actor, .. } = &*lock(&self.slot) {
                return Ok(actor.clone());
            }
            // A state request goes through the route and returns once an actor runs.
            let (reply, answered) = tokio::sync::oneshot::channel();
            self.send(AgentMsg::State(reply.into()))?;
            let _ = answered.await;
        }
    }

    /// Starts an actor for this agent in a task: its state is loaded from the store
    /// (after every write submitted so far is committed), then the requests waiting
    /// in the route are delivered in order.
    pub(crate) fn start(self: &Arc<Self>, why: Start) {
        let agent = self.clone();
        tokio::spawn(async move {
            match agent.boot().await {
                Ok(actor) => {
                    if !agent.go_live(&actor) {
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
    async fn boot(self: &Arc<Self>) -> Result<ActorRef<AgentMsg>, String> {
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
        let loaded = Loaded::from_store(self, stored);
        self.spawn_actor(loaded).await
    }

    /// Spawns an actor holding `loaded`, linked to the supervisor.
    pub(crate) async fn spawn_actor(
        self: &Arc<Self>,
        loaded: Loaded,
    ) -> Result<ActorRef<AgentMsg>, String> {
        let settings = self.settings();
        let settings = match settings.compression {
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

    /// Makes `actor`, just started, the agent's live actor and delivers the
    /// requests that waited, in order; false when the agent was stopped meanwhile.
    pub(crate) fn go_live(&self, actor: &ActorRef<AgentMsg>) -> bool {
        let mut slot = lock(&self.slot);
        let Slot::Starting(waiting) = &mut *slot else {
            return false;
        };
        let waiting = std::mem::take(waiting);
        let sent = waiting.len() as u64;
        for message in waiting {
            let _ = actor.send_message(AgentMsg::Internal(Internal::routed(message)));
        }
        *slot = Slot::Live {
            actor: actor.clone(),
            sent,
        };
        true
    }

    /// Hibernates an agent whose first actor has not started, if no request waits
    /// for it (`waiting`: a request to the user is open in its transcript).
    pub(crate) fn hibernate_unstarted(&self, waiting: bool) -> bool {
        let mut slot = lock(&self.slot);
        if !matches!(&*slot, Slot::Starting(requests) if requests.is_empty()) {
            return false;
        }
        *slot = Slot::Hibernated;
        self.mark_idle(waiting);
        true
    }

    /// Called by an idle actor: hibernates the agent if every request routed to
    /// `actor` was handled. The actor then stops.
    pub(crate) fn hibernate_if_quiet(&self, actor: ActorId, handled: u64) -> bool {
        let mut slot = lock(&self.slot);
        let quiet = matches!(&*slot, Slot::Live { actor: live, sent } if live.get_id() == actor && *sent == handled);
        if quiet {
            *slot = Slot::Hibernated;
        }
        quiet
    }

    /// The actor `actor` failed: count it against the restart budget, then restart
    /// it from the store (or stop the agent when over budget).
    pub(crate) fn failed(self: &Arc<Self>, actor: ActorId, reason: String) {
        let now = Instant::now();
        let config = &self.runtime.config;
        let exceeded = {
            let mut failures = lock(&self.failures);
            failures
                .0
                .retain(|at| now.duration_since(*at) < config.restart_window);
            failures.0.push(now);
            failures.1 = Some(reason.clone());
            failures.0.len() > config.max_restarts as usize
        };
        {
            let mut slot = lock(&self.slot);
            match &*slot {
                Slot::Live { actor: live, .. } if live.get_id() == actor => {
                    *slot = Slot::Starting(Vec::new());
                }
                // Requests sent since the failure wait for the restart.
                Slot::Starting(_) => {}
                // Hibernated or stopped meanwhile: nothing to restart.
                _ => return,
            }
        }
        // The failed actor's run died with it; the restarted actor says whether a
        // request waits.
        self.mark_idle(false);
        if exceeded {
            let reason = format!(
                "it failed {} times within {:?}, more than its restart budget of {}; last failure: {reason}",
                config.max_restarts + 1,
                config.restart_window,
                config.max_restarts
            );
            tracing::error!(agent = %self.id, %reason, "agent stopped");
            self.stop(reason);
            return;
        }
        tracing::warn!(agent = %self.id, %reason, "agent failed; restarting from its stored session");
        self.start(Start::Restart(reason));
    }

    /// Why the actor failed last.
    pub(crate) fn last_failure(&self) -> String {
        lock(&self.failures)
            .1
            .clone()
            .unwrap_or_else(|| "the agent's actor stopped".to_owned())
    }

    /// Stops the agent for good: requests get [`AgentError::Stopped`].
    pub(crate) fn stop(&self, reason: String) {
        let live = match std::mem::replace(&mut *lock(&self.slot), Slot::Stopped(reason.clone())) {
            Slot::Live { actor, .. } => Some(actor),
            _ => None,
        };
        if let Some(actor) = live {
            actor.stop(None);
        }
        self.mark_stopped(reason);
    }

    fn mark_stopped(&self, reason: String) {
        self.status.store(STOPPED, Ordering::Release);
        self.hub
            .publish(&self.id, Delivered::Notice(Notice::AgentStopped { reason }));
    }

    /// Records the session as closed (a stop on purpose, not a crash or shutdown).
    pub(crate) async fn close_session(&self) {
        let closed = self.write(Change::SetStatus(tiller_store::SessionStatus::Closed));
        if let Err(error) = self.runtime.writer.write(vec![closed]).await {
            tracing::warn!(agent = %self.id, %error, "could not mark the session closed");
        }
    }

    pub(crate) fn status(&self) -> AgentStatus {
        match self.status.load(Ordering::Acquire) {
            RUNNING => AgentStatus::Running,
            WAITING => AgentStatus::WaitingForInput,
            STOPPED => AgentStatus::Stopped {
                reason: match &*lock(&self.slot) {
                    Slot::Stopped(reason) => reason.clone(),
                    _ => "stopped".to_owned(),
                },
            },
            _ if matches!(&*lock(&self.slot), Slot::Hibernated) => AgentStatus::Hibernated,
            _ => AgentStatus::Idle,
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.status.load(Ordering::Acquire) == RUNNING
    }

    /// Whether a run is parked on the user's reply.
    pub(crate) fn is_waiting(&self) -> bool {
        self.status.load(Ordering::Acquire) == WAITING
    }

    pub(crate) fn mark_running(&self) {
        let _ = self
            .status
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |status| {
                matches!(status, IDLE | WAITING).then_some(RUNNING)
            });
    }

    /// Marks the agent idle, or waiting for the user's reply, unless stopped.
    pub(crate) fn mark_idle(&self, waiting: bool) {
        let next = if waiting { WAITING } else { IDLE };
        let _ = self
            .status
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |status| {
                matches!(status, IDLE | RUNNING | WAITING).then_some(next)
            });
    }

    /// The latest settings.
    pub(crate) fn settings(&self) -> Arc<AgentSettings> {
        lock(&self.settings).clone()
    }

    /// Keeps `settings` for restarts and thaws.
    pub(crate) fn keep_settings(&self, settings: Arc<AgentSettings>) {
        *lock(&self.settings) = settings;
    }
}
