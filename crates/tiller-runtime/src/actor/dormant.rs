//! Putting an idle agent away, and the state a dormant agent keeps.
//!
//! An agent idle for [`SupervisorConfig::dormant_after`] gives up its actor but
//! keeps its state in memory ([`Dormant`], held by its route): the transcript's
//! messages stay shared with the in-memory store and the runs that carried
//! them, its settings with every agent of the same definition, and its hub, so
//! subscriptions outlive the actor. The next request starts an actor on the
//! agent's shard from that state, with no store read. An agent idle for
//! [`SupervisorConfig::hibernate_after`] leaves memory altogether: it comes back
//! from the store.
//!
//! [`SupervisorConfig::dormant_after`]: crate::SupervisorConfig::dormant_after
//! [`SupervisorConfig::hibernate_after`]: crate::SupervisorConfig::hibernate_after

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tiller_core::{AgentContext, ContextTokens, Spent};
use tokio_util::task::AbortOnDropHandle;

use super::ActorState;
use super::keys::OpKeys;
use super::session::Loaded;
use crate::AgentMessage;
use crate::agent::Agent;
use crate::message::{AgentMsg, Internal, Signal};
use crate::runtime::SupervisorConfig;
use crate::settings::AgentSettings;

/// What an agent is, beyond any one actor: what an actor starts from, and what a
/// dormant agent keeps in memory without one.
pub(crate) struct Dormant {
    pub(super) settings: Arc<AgentSettings>,
    pub(super) context: AgentContext,
    pub(super) messages: Vec<Arc<AgentMessage>>,
    pub(super) base: u64,
    pub(super) tokens: ContextTokens,
    /// What most idle agents have none of, apart so that they pay a word for
    /// it: `None` when it is all empty.
    pub(super) held: Option<Box<Held>>,
    /// What the agent spent over its runs (a budget of its own, or one a run's
    /// patch gives it, is held against it); `None` while nothing.
    pub(super) spent: Option<Box<Spent>>,
    /// The timer that hibernates the agent later, stopped with the spell.
    pub(super) hibernating: Option<AbortOnDropHandle<()>>,
}

/// An agent's queues, last error and idempotency keys.
#[derive(Default)]
pub(super) struct Held {
    pub(super) steering: VecDeque<(u64, AgentMessage)>,
    pub(super) follow_up: VecDeque<(u64, AgentMessage)>,
    /// The number of the next queued message.
    pub(super) next_queue_seq: u64,
    pub(super) error: Option<String>,
    pub(super) keys: OpKeys,
}

impl Held {
    /// `self`, unless it holds nothing: no queued message, error or key. An
    /// empty queue's next number is not kept: it starts from 0 again, as it
    /// does when the session is loaded (every write that names a queued
    /// message by its number is committed before a run ends, and an agent is
    /// put away only between runs).
    fn kept(self) -> Option<Box<Held>> {
        let empty = self.steering.is_empty()
            && self.follow_up.is_empty()
            && self.error.is_none()
            && self.keys.is_empty();
        (!empty).then(|| Box::new(self))
    }
}

/// `spent`, boxed, unless it is nothing.
fn kept_spent(spent: Spent) -> Option<Box<Spent>> {
    (!spent.is_zero()).then(|| Box::new(spent))
}

impl Dormant {
    /// The state an agent starts from with `settings`, from `loaded` (a new or
    /// stored session): its context is what it was spawned with, over what the
    /// session stored.
    pub(crate) fn loaded(agent: &Agent, settings: Arc<AgentSettings>, loaded: Loaded) -> Box<Self> {
        let held = Held {
            steering: loaded.steering,
            follow_up: loaded.follow_up,
            next_queue_seq: loaded.next_queue_seq,
            error: None,
            keys: OpKeys::loaded(loaded.op_keys),
        };
        Box::new(Dormant {
            settings,
            context: agent.spawned_context().clone().over_stored(&loaded.context),
            messages: loaded.messages,
            base: loaded.base,
            tokens: loaded.tokens,
            held: held.kept(),
            spent: kept_spent(loaded.spent),
            hibernating: None,
        })
    }

    /// The settings its next actor starts with.
    pub(crate) fn settings(&self) -> &Arc<AgentSettings> {
        &self.settings
    }

    /// Keeps the timer that hibernates the agent: it stops when this state is
    /// dropped (a wake, a stop) or replaced.
    pub(crate) fn keep_timer(&mut self, timer: AbortOnDropHandle<()>) {
        self.hibernating = Some(timer);
    }

    /// Whether a request to the user is open in its transcript.
    pub(crate) fn is_waiting(&self) -> bool {
        !tiller_core::open_requests(&self.messages).is_empty()
    }
}

/// What an idle agent does once it has been idle for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PutAway {
    /// Gives up its actor, its state kept in memory; then, when `hibernate` is
    /// given, hibernates that much later.
    Dormant { hibernate: Option<Duration> },
    /// Leaves memory.
    Hibernate,
}

impl PutAway {
    /// After how long idle an agent is put away, and how, under `config`; `None`
    /// keeps it resident.
    pub(crate) fn of(config: &SupervisorConfig) -> Option<(Duration, PutAway)> {
        match (config.dormant_after, config.hibernate_after) {
            (Some(dormant), Some(hibernate)) if dormant < hibernate => Some((
                dormant,
                PutAway::Dormant {
                    hibernate: Some(hibernate - dormant),
                },
            )),
            (_, Some(hibernate)) => Some((hibernate, PutAway::Hibernate)),
            (Some(dormant), None) => Some((dormant, PutAway::Dormant { hibernate: None })),
            (None, None) => None,
        }
    }
}

impl Agent {
    /// The agent went dormant (its `rest`-th time): when the configuration says
    /// so, it hibernates `after` later. The timer is kept with the dormant
    /// state, so a wake (or a stop) ends it.
    pub(crate) fn hibernate_later(self: &Arc<Self>, rest: u64, after: Option<Duration>) {
        let Some(after) = after else {
            return;
        };
        let agent = Arc::downgrade(self);
        let timer = self.runtime.shards.spawn(self.id.as_str(), async move {
            tokio::time::sleep(after).await;
            if let Some(agent) = agent.upgrade() {
                agent.route.hibernate_dormant(rest);
            }
        });
        self.route.keep_timer(rest, AbortOnDropHandle::new(timer));
    }
}

impl ActorState {
    /// Asks to be told, once the agent has been idle long enough, whether to put
    /// it away.
    pub(super) fn schedule_put_away(&self) {
        let Some((after, _)) = PutAway::of(&self.agent.runtime.config) else {
            return;
        };
        if self.run.is_some() {
            return;
        }
        let activity = self.activity;
        self.myself.send_after(after, move || {
            AgentMsg::Internal(Internal(Signal::PutAway(activity)))
        });
    }

    /// Idle since `activity`: puts the agent away if nothing happened since and
    /// every request routed to this actor was handled; the actor then stops.
    pub(super) fn put_away(&mut self, activity: u64) {
        let Some((_, how)) = PutAway::of(&self.agent.runtime.config) else {
            return;
        };
        if activity != self.activity || self.run.is_some() {
            return;
        }
        let (actor, handled) = (self.myself.get_id(), self.handled);
        let agent = self.agent.clone();
        let put_away = match how {
            PutAway::Hibernate => agent
                .route
                .hibernate_if_quiet(actor, handled, &self.settings),
            PutAway::Dormant { hibernate } => {
                match agent.route.rest_if_quiet(actor, handled, || self.dormant()) {
                    Some(rest) => {
                        agent.hibernate_later(rest, hibernate);
                        true
                    }
                    None => false,
                }
            }
        };
        if put_away {
            self.myself.stop(None);
        } else {
            // Not yet live, or requests on their way: they will count as activity;
            // if none does (the actor was just being started), ask again later.
            self.schedule_put_away();
        }
    }

    /// The agent's state, taken from this actor (which stops right after), in
    /// as little memory as it fits.
    fn dormant(&mut self) -> Box<Dormant> {
        let mut messages = std::mem::take(&mut self.messages);
        messages.shrink_to_fit();
        let mut steering = std::mem::take(&mut self.steering);
        steering.shrink_to_fit();
        let mut follow_up = std::mem::take(&mut self.follow_up);
        follow_up.shrink_to_fit();
        let held = Held {
            steering,
            follow_up,
            next_queue_seq: self.next_queue_seq,
            error: self.error.take(),
            keys: std::mem::take(&mut self.keys),
        };
        Box::new(Dormant {
            settings: self.settings.clone(),
            context: std::mem::take(&mut self.context),
            messages,
            base: self.base,
            tokens: self.tokens,
            held: held.kept(),
            spent: kept_spent(self.spent),
            hibernating: None,
        })
    }
}
