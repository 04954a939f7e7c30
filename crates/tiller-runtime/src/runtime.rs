//! What a supervisor's agents share: the supervisor actor they link to, the root of
//! their cancellation tree, the configuration, the session store's writer, the
//! stored form of the settings they were last spawned with, and the shards they
//! run on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use ractor::ActorCell;
use tiller_ai::{BreakerPolicy, Breakers, RateLimits};
use tiller_core::Tally;
use tiller_store::{Definition, StoreWriter};
use tokio_util::sync::CancellationToken;

use crate::route::lock;
use crate::settings::AgentSettings;
use crate::shards::{ShardSet, Shards};

/// How a supervisor looks after its agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorConfig {
    /// Failures an agent may have within `restart_window` and still be restarted.
    pub max_restarts: u32,
    /// The window failures are counted in.
    pub restart_window: Duration,
    /// Events a subscriber may leave unread before the oldest are dropped (and it is
    /// told it lagged), unless it asks for another bound.
    pub subscriber_buffer: usize,
    /// How long an agent stays idle before it hibernates: its actor stops and its
    /// state leaves memory, to come back from the store on the next request. `None`
    /// (the default) keeps agents resident; zero also spawns agents hibernated.
    pub hibernate_after: Option<Duration>,
    /// How long an agent stays idle before it gives up its actor but keeps its
    /// state in memory (dormant): the next request starts an actor on its shard
    /// from that state, with no store read, and its subscriptions carry on. A
    /// dormant agent is still listed idle (or waiting for input). `None` (the
    /// default) keeps the actor; zero also spawns agents dormant. With
    /// `hibernate_after` longer than this, a dormant agent hibernates once it has
    /// been idle that long; with `hibernate_after` no longer, agents hibernate
    /// without a dormant spell.
    pub dormant_after: Option<Duration>,
    /// Current-thread runtimes, each on a thread of its own, that the agents
    /// live on (placed by a hash of their id): an agent's actor, run, tools and
    /// model connections share one thread. By default one per core under a
    /// multi-thread runtime. See `docs/runtime-semantics.md`, "Shards".
    pub shards: Shards,
    /// How long a shard holds its wakes of subscribers off the shards (tasks of
    /// the host's runtime), to wake each once for everything delivered
    /// meanwhile: the most an event waits for such a reader. A subscriber on a
    /// shard is woken at once. 1 ms by default; zero wakes every reader at once.
    pub delivery_window: Duration,
    /// When an endpoint's circuit breaker opens, and for how long (see
    /// [`tiller_ai::Breakers`]).
    pub breakers: BreakerPolicy,
    /// Whether the agents share one pace per provider account (see
    /// [`tiller_ai::ratelimit`]): on by default; off, each request meets the
    /// provider's limits alone.
    pub share_rate_limits: bool,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            max_restarts: 3,
            restart_window: Duration::from_secs(60),
            subscriber_buffer: 1024,
            hibernate_after: None,
            dormant_after: None,
            shards: Shards::Auto,
            delivery_window: Duration::from_millis(1),
            breakers: BreakerPolicy::default(),
            share_rate_limits: true,
        }
    }
}

pub(crate) struct Runtime {
    /// The supervisor actor; agent actors are linked to it.
    pub(crate) supervisor: ActorCell,
    /// Every run's token descends from this one.
    pub(crate) root: CancellationToken,
    pub(crate) config: SupervisorConfig,
    /// Where agents' sessions are written, grouped into shared transactions.
    pub(crate) writer: StoreWriter,
    /// The settings a definition was last made for, and that definition: agents
    /// spawned from one shared `Arc<AgentSettings>` encode it once.
    pub(crate) last_definition: Mutex<Option<(Arc<AgentSettings>, Definition)>>,
    /// Where the agents run.
    pub(crate) shards: ShardSet,
    /// What the agents share of their providers: each account's pace, each
    /// endpoint's circuit breaker.
    pub(crate) rate_limits: Option<RateLimits>,
    pub(crate) breakers: Breakers,
    /// The tallies of the tenants with a budget, by tenant.
    pub(crate) tallies: DashMap<String, Arc<Tally>>,
}

impl Runtime {
    /// The stored form of `settings`.
    pub(crate) fn definition_of(&self, settings: &Arc<AgentSettings>) -> Definition {
        let mut last = lock(&self.last_definition);
        if let Some((made_for, definition)) = &*last
            && Arc::ptr_eq(made_for, settings)
        {
            return definition.clone();
        }
        let definition = Definition::new(&settings.definition.stored()).unwrap_or_default();
        *last = Some((settings.clone(), definition.clone()));
        definition
    }
}
