//! The route to an agent's actor and the agent's status: the one place that
//! knows whether an actor is live, being started, dormant, hibernated or
//! stopped, and whether a run is active or waits for the user. It is what lets an
//! agent rest, hibernate, fail and come back without losing a request.
//!
//! A request to a dormant agent wakes it from the state the route keeps; one to a
//! hibernated agent thaws it from the store; one to an actor being started (a
//! wake, a thaw, a restart) waits here, in order. Requests sent through the route
//! are counted, and an actor is put away only when it has handled as many as
//! were sent, so none is left in a stopping mailbox. While no actor is live, the
//! route holds what the next one starts with (a dormant agent's whole state, a
//! hibernated one's settings); while one is, the actor holds it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ractor::{ActorId, ActorRef, MessagingErr};
use tokio_util::task::AbortOnDropHandle;

use crate::actor::Dormant;
use crate::error::AgentError;
use crate::message::{AgentMsg, Internal};
use crate::settings::AgentSettings;
use crate::state::AgentStatus;

/// How to reach an agent's actor, and what the agent is doing.
pub(crate) struct Route {
    inner: Mutex<Routing>,
}

struct Routing {
    slot: Slot,
    activity: Activity,
    /// Why the actor failed last (boxed: every agent carries the field).
    last_failure: Option<Box<str>>,
    /// How many times the agent went dormant: tells a dormant spell from the
    /// next one.
    rests: u64,
}

enum Slot {
    /// A live actor; `sent` counts the requests routed to it.
    Live {
        actor: ActorRef<AgentMsg>,
        sent: u64,
    },
    /// An actor is being started (a wake, a thaw or a restart); requests wait here.
    Starting(Vec<AgentMsg>),
    /// No actor, the agent's state kept here: the next request starts one from it.
    Dormant(Box<Dormant>),
    /// No actor: the next request thaws one, with these settings, from the store.
    Hibernated(Arc<AgentSettings>),
    /// Stopped for good, for this reason.
    Stopped(String),
}

/// Whether a run is active, or parked on the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activity {
    Idle,
    Running,
    Waiting,
}

/// What routing a request asks of its sender.
pub(crate) enum Routed {
    /// Delivered, or waiting for the actor being started.
    Sent,
    /// The agent was hibernated: start an actor with these settings; the request
    /// waits for it.
    Thaw(Arc<AgentSettings>),
    /// The agent was dormant: start an actor from this state; the request waits
    /// for it.
    Wake(Box<Dormant>),
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Route {
    /// The route of an agent whose first actor is being started.
    pub(crate) fn starting() -> Self {
        Route {
            inner: Mutex::new(Routing {
                slot: Slot::Starting(Vec::new()),
                activity: Activity::Idle,
                last_failure: None,
                rests: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Routing> {
        lock(&self.inner)
    }

    /// Routes `message`: straight to a live actor, queued behind a start, or
    /// (for a dormant or hibernated agent) queued for the wake or thaw its sender
    /// must start.
    pub(crate) fn send(&self, message: AgentMsg) -> Result<Routed, AgentError> {
        let mut routing = self.lock();
        match &mut routing.slot {
            Slot::Live { actor, sent } => {
                match actor.send_message(AgentMsg::Internal(Internal::routed(message))) {
                    Ok(()) => {
                        *sent += 1;
                        Ok(Routed::Sent)
                    }
                    // The actor has died and its failure is on its way to the
                    // supervisor, which restarts it and delivers what waits here.
                    Err(MessagingErr::SendErr(message)) => {
                        routing.slot = Slot::Starting(vec![Internal::unrouted(message)]);
                        Ok(Routed::Sent)
                    }
                    Err(_) => Err(AgentError::Failed {
                        reason: "the agent's actor could not be reached".to_owned(),
                    }),
                }
            }
            Slot::Starting(waiting) => {
                waiting.push(message);
                Ok(Routed::Sent)
            }
            Slot::Hibernated(settings) => {
                let settings = settings.clone();
                routing.slot = Slot::Starting(vec![message]);
                Ok(Routed::Thaw(settings))
            }
            Slot::Dormant(_) => {
                let Slot::Dormant(state) =
                    std::mem::replace(&mut routing.slot, Slot::Starting(vec![message]))
                else {
                    unreachable!("the slot was dormant")
                };
                Ok(Routed::Wake(state))
            }
            Slot::Stopped(reason) => Err(AgentError::Stopped {
                reason: reason.clone(),
            }),
        }
    }

    /// The live actor, if there is one.
    pub(crate) fn live(&self) -> Option<ActorRef<AgentMsg>> {
        match &self.lock().slot {
            Slot::Live { actor, .. } => Some(actor.clone()),
            _ => None,
        }
    }

    /// Makes `actor`, just started, the live actor and delivers the requests that
    /// waited, in order; false when the agent was stopped meanwhile.
    pub(crate) fn go_live(&self, actor: &ActorRef<AgentMsg>) -> bool {
        let mut routing = self.lock();
        let Slot::Starting(waiting) = &mut routing.slot else {
            return false;
        };
        let waiting = std::mem::take(waiting);
        let sent = waiting.len() as u64;
        for message in waiting {
            let _ = actor.send_message(AgentMsg::Internal(Internal::routed(message)));
        }
        routing.slot = Slot::Live {
            actor: actor.clone(),
            sent,
        };
        true
    }

    /// Hibernates an agent whose first actor has not started, if no request waits
    /// for it (`waiting`: a request to the user is open in its transcript).
    pub(crate) fn hibernate_unstarted(&self, settings: Arc<AgentSettings>, waiting: bool) -> bool {
        let mut routing = self.lock();
        if !routing.unstarted() {
            return false;
        }
        routing.slot = Slot::Hibernated(settings);
        routing.settle(waiting);
        true
    }

    /// Makes an agent whose first actor has not started dormant with `state`, if
    /// no request waits for it; gives `state` back otherwise, to start an actor
    /// with. Returns the number of this dormant spell.
    pub(crate) fn rest_unstarted(&self, state: Box<Dormant>) -> Result<u64, Box<Dormant>> {
        let mut routing = self.lock();
        if !routing.unstarted() {
            return Err(state);
        }
        let waiting = state.is_waiting();
        routing.settle(waiting);
        Ok(routing.rest(state))
    }

    /// Called by an idle actor: makes the agent dormant with the state `take`
    /// takes from the actor, if every request routed to `actor` was handled. The
    /// actor then stops. Returns the number of this dormant spell.
    pub(crate) fn rest_if_quiet(
        &self,
        actor: ActorId,
        handled: u64,
        take: impl FnOnce() -> Box<Dormant>,
    ) -> Option<u64> {
        let mut routing = self.lock();
        routing.quiet(actor, handled).then(|| routing.rest(take()))
    }

    /// Keeps `timer` with the state of dormant spell `rest`, if it is still on
    /// (else drops it, which stops it).
    pub(crate) fn keep_timer(&self, rest: u64, timer: AbortOnDropHandle<()>) {
        if let Some(state) = self.lock().dormant_in(rest) {
            state.keep_timer(timer);
        }
    }

    /// Hibernates an agent still in dormant spell `rest`: its state leaves memory.
    pub(crate) fn hibernate_dormant(&self, rest: u64) {
        let mut routing = self.lock();
        if let Some(state) = routing.dormant_in(rest) {
            routing.slot = Slot::Hibernated(state.settings().clone());
        }
    }

    /// Called by an idle actor: hibernates the agent, keeping `settings` for its
    /// thaw, if every request routed to `actor` was handled. The actor then stops.
    pub(crate) fn hibernate_if_quiet(
        &self,
        actor: ActorId,
        handled: u64,
        settings: &Arc<AgentSettings>,
    ) -> bool {
        let mut routing = self.lock();
        let quiet = routing.quiet(actor, handled);
        if quiet {
            routing.slot = Slot::Hibernated(settings.clone());
        }
        quiet
    }

    /// The live actor `actor` is failing for `reason`: requests wait for its
    /// restart from here on. False when it was no longer the live actor (the agent
    /// was stopped meanwhile): nothing to restart.
    pub(crate) fn failing(&self, actor: ActorId, reason: &str) -> bool {
        let mut routing = self.lock();
        routing.last_failure = Some(reason.into());
        if !matches!(&routing.slot, Slot::Live { actor: live, .. } if live.get_id() == actor) {
            return false;
        }
        routing.slot = Slot::Starting(Vec::new());
        // Its run died with it; the restarted actor says whether a request waits.
        routing.settle(false);
        true
    }

    /// Whether an actor is being started (a restart the route waits for).
    pub(crate) fn is_starting(&self) -> bool {
        matches!(self.lock().slot, Slot::Starting(_))
    }

    /// Stops the route for good: requests get [`AgentError::Stopped`]. Returns the
    /// live actor, for the caller to stop, and whether it was not stopped already.
    pub(crate) fn stop(&self, reason: String) -> (Option<ActorRef<AgentMsg>>, bool) {
        let mut routing = self.lock();
        let was = std::mem::replace(&mut routing.slot, Slot::Stopped(reason));
        match was {
            Slot::Live { actor, .. } => (Some(actor), true),
            Slot::Stopped(_) => (None, false),
            _ => (None, true),
        }
    }

    /// Why the actor failed last.
    pub(crate) fn last_failure(&self) -> String {
        self.lock()
            .last_failure
            .as_deref()
            .map(str::to_owned)
            .unwrap_or_else(|| "the agent's actor stopped".to_owned())
    }

    /// The agent's status.
    pub(crate) fn status(&self) -> AgentStatus {
        let routing = self.lock();
        match (&routing.slot, routing.activity) {
            (Slot::Stopped(reason), _) => AgentStatus::Stopped {
                reason: reason.clone(),
            },
            (_, Activity::Running) => AgentStatus::Running,
            (_, Activity::Waiting) => AgentStatus::WaitingForInput,
            (Slot::Hibernated(_), Activity::Idle) => AgentStatus::Hibernated,
            (_, Activity::Idle) => AgentStatus::Idle,
        }
    }

    /// Whether a run is active.
    pub(crate) fn is_running(&self) -> bool {
        let routing = self.lock();
        routing.activity == Activity::Running && !matches!(routing.slot, Slot::Stopped(_))
    }

    /// Whether a run is parked on the user's reply.
    pub(crate) fn is_waiting(&self) -> bool {
        let routing = self.lock();
        routing.activity == Activity::Waiting && !matches!(routing.slot, Slot::Stopped(_))
    }

    /// A run started.
    pub(crate) fn mark_running(&self) {
        self.lock().activity = Activity::Running;
    }

    /// No run is active; `waiting` when a request to the user is open.
    pub(crate) fn mark_idle(&self, waiting: bool) {
        self.lock().settle(waiting);
    }
}

impl Routing {
    /// Whether the agent's first actor is being started and no request waits
    /// for it.
    fn unstarted(&self) -> bool {
        matches!(&self.slot, Slot::Starting(requests) if requests.is_empty())
    }

    /// Whether `actor` is the live actor and has handled every request routed
    /// to it (`handled`).
    fn quiet(&self, actor: ActorId, handled: u64) -> bool {
        matches!(&self.slot, Slot::Live { actor: live, sent } if live.get_id() == actor && *sent == handled)
    }

    /// The state of dormant spell `rest`, if the agent is still in it.
    fn dormant_in(&mut self, rest: u64) -> Option<&mut Box<Dormant>> {
        match &mut self.slot {
            Slot::Dormant(state) if self.rests == rest => Some(state),
            _ => None,
        }
    }

    /// Keeps `state` in the slot, for the next request to wake the agent with;
    /// the number of this dormant spell.
    fn rest(&mut self, state: Box<Dormant>) -> u64 {
        self.rests += 1;
        self.slot = Slot::Dormant(state);
        self.rests
    }

    fn settle(&mut self, waiting: bool) {
        self.activity = if waiting {
            Activity::Waiting
        } else {
            Activity::Idle
        };
    }
}
