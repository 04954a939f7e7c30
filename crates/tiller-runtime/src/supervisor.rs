//! [`Supervisor`]: spawns agents (new or resumed from the session store), finds
//! them from any thread, restarts them when they fail, and shuts them all down.
//!
//! The supervisor is a ractor actor and every agent's actor is its linked child.
//! When one fails (a panicking `on_message` hook, say), the supervisor restarts it
//! one-for-one from its stored session: transcript, queued messages and settings
//! intact, tool calls its lost run left open answered, handles and subscriptions
//! still valid, subscribers told with an `agent_restarted` notice. An agent failing
//! more than `max_restarts` times within `restart_window` stays down, and says why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tiller_ai::{Breakers, RateLimits};
use tiller_core::open_requests;
use tiller_core::{Budget, Spent, Tally};
use tiller_store::{
    Change, Definition, MemoryStore, SessionFilter, SessionInfo, SessionRecord, SessionStatus,
    SessionStore, StoreWriter,
};
use tokio_util::sync::CancellationToken;

use crate::AgentContext;
use crate::AgentMessage;
use crate::actor::{Failure, Loaded, PutAway, appends};
use crate::agent::Agent;
use crate::definition::AgentDefinition;
use crate::error::SpawnError;
use crate::event::{Event, EventError, EventSink};
use crate::handle::AgentHandle;
use crate::message::{AgentMsg, Internal, Signal};
use crate::runtime::{Runtime, SupervisorConfig};
use crate::settings::AgentSettings;
use crate::shards::ShardSet;
use crate::state::AgentInfo;
use crate::subscription::AgentId;

/// What an agent is spawned with.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// Its id; the session's id when resuming, else one is made up, when `None`.
    pub id: Option<String>,
    /// A unique name to find it by.
    pub name: Option<String>,
    /// Its settings, shared with other agents until one changes.
    pub settings: Arc<AgentSettings>,
    /// Its starting transcript (for a new session).
    pub messages: Vec<AgentMessage>,
    /// The session to resume, or to create under this id when the store has none;
    /// the agent's id when `None`.
    pub session: Option<String>,
    /// Who the agent works for; its tenant and user are kept with a new session,
    /// its session id is always the agent's session.
    pub context: AgentContext,
    /// When resuming, these settings as they are (and stored as the session's new
    /// definition) rather than the stored definition.
    pub own_settings: bool,
    /// The epoch to hold the session at (see [`SessionRecord::epoch`]): a
    /// cluster lease's revision, so that the store fences out whoever held the
    /// session under an older lease. `None`: one past the stored epoch (a new
    /// session: 0).
    pub epoch: Option<u64>,
    /// The number of the agent's first event: 0, or, for an agent whose events
    /// another process published before (a cluster's failover), the number after
    /// the last one it published, so that numbers keep rising.
    pub first_event: u64,
    /// Kept with a new session as its [`SessionRecord::origin`]: how a host brings
    /// the agent up again in another process.
    pub origin: Option<Definition>,
}

impl AgentSpec {
    /// An agent with these settings and an empty transcript.
    pub fn new(settings: impl Into<Arc<AgentSettings>>) -> Self {
        AgentSpec {
            id: None,
            name: None,
            settings: settings.into(),
            messages: Vec::new(),
            session: None,
            context: AgentContext::default(),
            own_settings: false,
            epoch: None,
            first_event: 0,
            origin: None,
        }
    }

    /// The same spec with an id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The same spec with a unique name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The same spec with a starting transcript.
    pub fn with_messages(mut self, messages: Vec<AgentMessage>) -> Self {
        self.messages = messages;
        self
    }

    /// The same spec resuming session `id` from the store: its transcript, queued
    /// messages and stored definition (model, instructions, options) come back;
    /// tools and hooks are this spec's. A session the store does not have is
    /// created under that id.
    pub fn with_session(mut self, id: impl Into<String>) -> Self {
        self.session = Some(id.into());
        self
    }

    /// The same spec resuming with its own settings, not the stored definition
    /// (which these replace): a command run with new options, say.
    pub fn with_own_settings(mut self) -> Self {
        self.own_settings = true;
        self
    }

    /// The same spec owned by a tenant and a user (kept with a new session).
    pub fn with_owner(mut self, tenant_id: Option<String>, user_id: Option<String>) -> Self {
        let mut ids = self.context.ids().clone();
        ids.tenant_id = tenant_id;
        ids.user_id = user_id;
        self.context = self.context.with_ids(ids);
        self
    }

    /// The same spec working for `context` (tools, hooks and
    /// [`AgentSettings::with_system_prompt_fn`] see it).
    pub fn with_context(mut self, context: AgentContext) -> Self {
        self.context = context;
        self
    }

    /// The same spec holding its session at `epoch` (see [`AgentSpec::epoch`]).
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// The same spec numbering its events from `first` (see
    /// [`AgentSpec::first_event`]).
    pub fn with_first_event(mut self, first: u64) -> Self {
        self.first_event = first;
        self
    }

    /// The same spec keeping `origin` with a new session (see
    /// [`AgentSpec::origin`]).
    pub fn with_origin(mut self, origin: Definition) -> Self {
        self.origin = Some(origin);
        self
    }
}

/// Spawns and looks after agents. Cheap to clone; clones share the agents.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Arc<Runtime>,
    actor: ActorRef<()>,
    agents: DashMap<AgentId, Arc<Agent>>,
    names: DashMap<Arc<str>, AgentId>,
    shut_down: AtomicBool,
    /// What takes the events published through the supervisor.
    events: crate::event::Sink,
}

/// The supervisor actor's state: the restart budgets, as the times each agent
/// failed within the restart window.
struct Budgets {
    config: SupervisorConfig,
    failures: HashMap<AgentId, Vec<Instant>>,
}

impl Budgets {
    /// Counts a failure of `agent` now; whether it is within the budget.
    fn allow(&mut self, agent: &AgentId) -> bool {
        let now = Instant::now();
        let window = self.config.restart_window;
        self.failures.retain(|_, times| {
            times.retain(|at| now.duration_since(*at) < window);
            !times.is_empty()
        });
        let times = self.failures.entry(agent.clone()).or_default();
        times.push(now);
        let allowed = times.len() <= self.config.max_restarts as usize;
        if !allowed {
            self.failures.remove(agent);
        }
        allowed
    }
}

struct SupervisorActor;

impl Actor for SupervisorActor {
    type Msg = ();
    type State = Budgets;
    type Arguments = SupervisorConfig;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        config: SupervisorConfig,
    ) -> Result<Budgets, ActorProcessingErr> {
        Ok(Budgets {
            config,
            failures: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<()>,
        _message: (),
        _budgets: &mut Budgets,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    /// One-for-one: a failed agent is restarted alone, within its budget. Never
    /// stops the supervisor.
    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        budgets: &mut Budgets,
    ) -> Result<(), ActorProcessingErr> {
        let SupervisionEvent::ActorFailed(_, error) = event else {
            return Ok(());
        };
        let failure = match error.downcast::<Failure>() {
            Ok(failure) => failure,
            Err(error) => {
                // Every agent actor's handler catches its panics into a `Failure`.
                tracing::error!(%error, "an actor failed outside its handler");
                return Ok(());
            }
        };
        let Failure {
            agent,
            settings,
            reason,
        } = *failure;
        if budgets.allow(&agent.id) {
            agent.restart(settings, reason);
        } else {
            let config = &budgets.config;
            let reason = format!(
                "it failed {} times within {:?}, more than its restart budget of {}; last failure: {reason}",
                config.max_restarts + 1,
                config.restart_window,
                config.max_restarts
            );
            tracing::error!(agent = %agent.id, %reason, "agent stopped");
            agent.stop(reason);
        }
        Ok(())
    }
}

/// Refuses to bring up a stored session for another tenant or user than the one
/// `record` says owns it.
fn check_owner(
    record: &SessionRecord,
    owner: (Option<&str>, Option<&str>),
) -> Result<(), SpawnError> {
    if (record.tenant_id.as_deref(), record.user_id.as_deref()) == owner {
        return Ok(());
    }
    Err(SpawnError::NotOwner {
        session: record.id.clone(),
    })
}

/// The definition `record` keeps, if it keeps one; one that cannot be read is
/// reported and left (the spawn's settings stand).
fn stored_definition(record: &SessionRecord) -> Option<AgentDefinition> {
    let json = record.definition.as_json();
    if json == "null" {
        return None;
    }
    AgentDefinition::from_stored(json)
        .inspect_err(|error| {
            tracing::warn!(session = %record.id, %error, "the stored definition cannot be read; the spawn's settings stand");
        })
        .ok()
}

/// The longest id, session id or agent name a spec may give, in bytes.
pub const MAX_ID_BYTES: usize = 1_024;

/// Refuses an id, session id or name (`field`) that is empty, longer than
/// [`MAX_ID_BYTES`], or holds control characters.
pub fn check_id(field: &'static str, value: &str) -> Result<(), SpawnError> {
    let reason = if value.trim().is_empty() {
        "it is empty"
    } else if value.len() > MAX_ID_BYTES {
        "it is longer than 1,024 bytes"
    } else if value.chars().any(char::is_control) {
        "it holds control characters"
    } else {
        return Ok(());
    };
    Err(SpawnError::InvalidId {
        field,
        value: value.to_owned(),
        reason,
    })
}

impl Supervisor {
    /// Starts a supervisor with the default configuration, keeping sessions in memory.
    pub async fn start() -> Result<Self, SpawnError> {
        Self::with_config(SupervisorConfig::default()).await
    }

    /// Starts a supervisor keeping sessions in memory.
    pub async fn with_config(config: SupervisorConfig) -> Result<Self, SpawnError> {
        Self::with_store(config, Arc::new(MemoryStore::new())).await
    }

    /// Starts a supervisor keeping sessions in `store` (see [`tiller_store::open`]).
    pub async fn with_store(
        config: SupervisorConfig,
        store: Arc<dyn SessionStore>,
    ) -> Result<Self, SpawnError> {
        let (actor, _) = Actor::spawn(None, SupervisorActor, config.clone())
            .await
            .map_err(|error| SpawnError::Runtime(error.to_string()))?;
        let shards = ShardSet::start(config.shards, config.delivery_window).map_err(|error| {
            SpawnError::Runtime(format!("the shards' threads could not start: {error}"))
        })?;
        let breakers = Breakers::new(config.breakers);
        let rate_limits = config.share_rate_limits.then(RateLimits::new);
        let runtime = Arc::new(Runtime {
            supervisor: actor.get_cell(),
            root: CancellationToken::new(),
            config,
            // The writer's task on a shard too: an agent's write-ahead then
            // wakes no thread of the host's runtime.
            writer: shards.on_first(|| StoreWriter::for_store(store)),
            last_definition: Mutex::new(None),
            shards,
            rate_limits,
            breakers,
            tallies: DashMap::new(),
        });
        Ok(Supervisor {
            inner: Arc::new(Inner {
                runtime,
                actor,
                agents: DashMap::new(),
                names: DashMap::new(),
                shut_down: AtomicBool::new(false),
                events: crate::event::Sink::new(),
            }),
        })
    }

    /// Installs what takes the events published through this supervisor (the
    /// agents' triggers, `tiller_agents::Triggers`); only the first one counts:
    /// whether it was installed.
    pub fn set_event_sink(&self, sink: Arc<dyn EventSink>) -> bool {
        self.inner.events.set(sink).is_ok()
    }

    /// Publishes `event` to the agents whose triggers it matches, spawning or
    /// thawing them (see `tiller_agents::Triggers`): how many triggers it matched
    /// (none when nothing listens).
    pub fn publish(&self, event: Event) -> Result<usize, EventError> {
        event.check()?;
        match self.inner.events.get() {
            Some(sink) => sink.publish(event),
            None => Ok(0),
        }
    }

    /// The session store.
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        self.inner.runtime.writer.store()
    }

    /// How long a shutdown waits for a session store that stays unavailable.
    pub const SHUTDOWN_STORE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

    /// Whether the session store takes writes now (see
    /// [`StoreWriter`](tiller_store::StoreWriter)): while it does not, writes wait
    /// and runs park at their next one.
    pub fn store_health(&self) -> &tiller_store::StoreHealth {
        self.inner.runtime.writer.health()
    }

    /// The rate limits the agents share, one pace per provider account (see
    /// [`tiller_ai::ratelimit`]): their figures for `/metrics`. `None` when
    /// [`SupervisorConfig::share_rate_limits`] is off.
    pub fn rate_limits(&self) -> Option<&RateLimits> {
        self.inner.runtime.rate_limits.as_ref()
    }

    /// The circuit breakers the agents share, one per provider endpoint.
    pub fn breakers(&self) -> &Breakers {
        &self.inner.runtime.breakers
    }

    /// Bounds what `tenant`'s agents spend together, from their next run on:
    /// what the store counted for the tenant so far is read first, and every
    /// run of the process adds to it (see [`tiller_core::budget`]); on a store
    /// every process shares (PostgreSQL, [`SessionStore::ledger`]), each model
    /// call is held in the store itself, so that no process overspends. An
    /// unbounded budget lifts the bound.
    pub async fn set_tenant_budget(
        &self,
        tenant: &str,
        budget: Budget,
    ) -> Result<(), tiller_store::StoreError> {
        let tallies = &self.inner.runtime.tallies;
        if budget.is_unbounded() {
            tallies.remove(tenant);
            return Ok(());
        }
        if let Some(tally) = tallies.get(tenant) {
            tally.set_budget(budget);
            return Ok(());
        }
        let scope = tiller_store::SpendScope::Tenant(tenant.to_owned());
        let spent = self.store().spent(&scope).await?;
        // A store other processes share (PostgreSQL) holds and counts every
        // call of the tenant's, so that together they keep to its budget.
        let ledger = self.store().clone().ledger();
        tallies
            .entry(tenant.to_owned())
            .or_insert_with(|| {
                Arc::new(match ledger {
                    Some(ledger) => Tally::shared(budget, spent, tenant, ledger),
                    None => Tally::new(budget, spent),
                })
            })
            .set_budget(budget);
        Ok(())
    }

    /// The tally of `tenant`'s spending, when it has a budget: what a model call
    /// made for the tenant outside its agents (the pi proxy) reserves against
    /// and settles to (see [`Tally::reserve`]).
    pub fn tenant_tally(&self, tenant: &str) -> Option<Arc<Tally>> {
        self.inner
            .runtime
            .tallies
            .get(tenant)
            .map(|tally| tally.clone())
    }

    /// Each tenant with a budget: its budget and what it spent, sorted by tenant.
    pub fn tenant_budgets(&self) -> Vec<(String, Budget, Spent)> {
        let mut budgets: Vec<_> = self
            .inner
            .runtime
            .tallies
            .iter()
            .map(|tally| (tally.key().clone(), tally.budget(), tally.spent()))
            .collect();
        budgets.sort_by(|a, b| a.0.cmp(&b.0));
        budgets
    }

    /// Spawns an agent: a new session (written to the store before this returns),
    /// or the stored one [`AgentSpec::with_session`] names.
    pub async fn spawn(&self, spec: AgentSpec) -> Result<AgentHandle, SpawnError> {
        let inner = &self.inner;
        if inner.shut_down.load(Ordering::Acquire) {
            return Err(SpawnError::ShutDown);
        }
        for (field, value) in [
            ("id", &spec.id),
            ("session", &spec.session),
            ("name", &spec.name),
        ] {
            if let Some(value) = value {
                check_id(field, value)?;
            }
        }
        let id = AgentId::from(
            spec.id
                .clone()
                .or_else(|| spec.session.clone())
                .unwrap_or_else(tiller_ai::new_id),
        );
        let name: Option<Arc<str>> = spec.name.as_deref().map(Into::into);
        let session = match &spec.session {
            Some(session) if session != id.as_str() => Arc::from(session.as_str()),
            _ => id.shared(),
        };
        let agent = Arc::new(Agent::new(
            id.clone(),
            name.clone(),
            session,
            spec.context.clone(),
            inner.runtime.clone(),
            spec.first_event,
        ));
        self.reserve(&agent)?;
        match self.bring_up(&agent, spec).await {
            Ok(()) => Ok(AgentHandle::new(agent)),
            Err(error) => {
                inner.agents.remove(&id);
                if let Some(name) = &name {
                    inner.names.remove(name);
                }
                agent.stop(format!("it could not be spawned: {error}"));
                Err(error)
            }
        }
    }

    /// Claims the agent's id and name.
    fn reserve(&self, agent: &Arc<Agent>) -> Result<(), SpawnError> {
        let inner = &self.inner;
        if let Some(name) = &agent.name {
            match inner.names.entry(name.clone()) {
                Entry::Occupied(_) => return Err(SpawnError::NameTaken(name.to_string())),
                Entry::Vacant(entry) => {
                    entry.insert(agent.id.clone());
                }
            }
        }
        match inner.agents.entry(agent.id.clone()) {
            Entry::Occupied(_) => {
                if let Some(name) = &agent.name {
                    inner.names.remove(name);
                }
                Err(SpawnError::IdTaken(agent.id.to_string()))
            }
            Entry::Vacant(entry) => {
                entry.insert(agent.clone());
                Ok(())
            }
        }
    }

    /// Claims (taking it over from whoever held it) or creates the agent's session,
    /// then starts its actor.
    async fn bring_up(&self, agent: &Arc<Agent>, spec: AgentSpec) -> Result<(), SpawnError> {
        let writer = &self.inner.runtime.writer;
        let session = agent.session.clone();
        let owner = (spec.context.tenant_id(), spec.context.user_id());
        let stored = match &spec.session {
            Some(session) => {
                // Checked before the claim, which would fence out the holder.
                let found = writer
                    .store()
                    .list(&SessionFilter::only(session.as_str()))
                    .await?;
                if let Some(info) = found.first() {
                    check_owner(&info.record, owner)?;
                }
                let stored = writer.store().claim(session, spec.epoch).await?;
                if let Some(stored) = &stored {
                    check_owner(&stored.record, owner)?;
                }
                stored
            }
            None => None,
        };
        let mut settings = spec.settings.clone();
        let loaded = match stored {
            Some(stored) => {
                agent.claimed(stored.record.epoch);
                let mut writes = vec![agent.write(Change::SetStatus(SessionStatus::Active))];
                if spec.own_settings {
                    writes.push(agent.write(Change::SetDefinition(
                        self.inner.runtime.definition_of(&spec.settings),
                    )));
                } else if let Some(definition) = stored_definition(&stored.record) {
                    let resumed =
                        definition
                            .resumed_by(&spec.settings.definition)
                            .map_err(|missing| SpawnError::MissingTools {
                                session: session.to_string(),
                                missing,
                            })?;
                    settings = Arc::new(AgentSettings {
                        definition: resumed,
                        code: spec.settings.code.clone(),
                    });
                }
                let loaded = Loaded::from_store(agent, &settings, stored);
                writer.write(writes).await?;
                loaded
            }
            None => {
                agent.claimed(spec.epoch.unwrap_or(0));
                let context = crate::actor::stored_context(&spec.context);
                let record = SessionRecord {
                    tenant_id: spec.context.tenant_id().map(str::to_owned),
                    user_id: spec.context.user_id().map(str::to_owned),
                    name: spec.name,
                    definition: self.inner.runtime.definition_of(&spec.settings),
                    origin: spec.origin.unwrap_or_default(),
                    first_context: context.clone(),
                    context,
                    ..SessionRecord::new(&*session)
                };
                let messages: Vec<Arc<AgentMessage>> =
                    spec.messages.into_iter().map(Arc::new).collect();
                let mut writes = vec![agent.write(Change::Create(record))];
                writes.extend(appends(agent, 0, &messages));
                writer.write(writes).await?;
                Loaded::new(messages)
            }
        };
        // Idle agents put away at once start so: the first request wakes a
        // dormant one, thaws a hibernated one.
        let at_once = PutAway::of(&self.inner.runtime.config)
            .filter(|(after, _)| after.is_zero())
            .map(|(_, how)| how);
        if at_once == Some(PutAway::Hibernate)
            && agent.route.hibernate_unstarted(
                settings.clone(),
                !open_requests(&loaded.messages).is_empty(),
            )
        {
            return Ok(());
        }
        let mut state = agent
            .state_of(settings, loaded)
            .await
            .map_err(SpawnError::Runtime)?;
        if let Some(PutAway::Dormant { hibernate }) = at_once {
            match agent.route.rest_unstarted(state) {
                Ok(rest) => {
                    agent.hibernate_later(rest, hibernate);
                    return Ok(());
                }
                Err(given_back) => state = given_back,
            }
        }
        let actor = agent
            .spawn_actor(state)
            .await
            .map_err(SpawnError::Runtime)?;
        if !agent.route.go_live(&actor) {
            actor.stop(None);
            return Err(SpawnError::ShutDown);
        }
        Ok(())
    }

    /// Brings back every session the store has as active (those whose agents were
    /// running when their process ended), each with the settings `settings_for`
    /// gives it (tools and hooks; `None` skips the session). Sessions already
    /// resident are left as they are; one that cannot be brought up (an id no
    /// longer valid, tools the settings lack) is skipped with a warning; a store
    /// that fails, or a shut-down supervisor, fails the whole.
    pub async fn resume(
        &self,
        settings_for: impl Fn(&SessionInfo) -> Option<AgentSettings>,
    ) -> Result<Vec<AgentHandle>, SpawnError> {
        let active = self
            .store()
            .list(&SessionFilter {
                status: Some(SessionStatus::Active),
                ..SessionFilter::default()
            })
            .await?;
        let mut resumed = Vec::new();
        for info in active {
            if self.inner.agents.contains_key(info.record.id.as_str()) {
                continue;
            }
            let Some(settings) = settings_for(&info) else {
                continue;
            };
            let mut spec = AgentSpec::new(settings)
                .with_session(info.record.id.clone())
                .with_owner(info.record.tenant_id.clone(), info.record.user_id.clone());
            spec.name = info.record.name.clone();
            match self.spawn(spec).await {
                Ok(agent) => resumed.push(agent),
                // One session that cannot be brought up keeps no other down.
                Err(
                    error @ (SpawnError::InvalidId { .. }
                    | SpawnError::NotOwner { .. }
                    | SpawnError::MissingTools { .. }),
                ) => {
                    tracing::warn!(session = %info.record.id, %error, "a session was not resumed");
                }
                Err(error) => return Err(error),
            }
        }
        Ok(resumed)
    }

    /// How many shard threads the agents run on; zero when they run on the
    /// runtime that started the supervisor ([`SupervisorConfig::shards`]).
    pub fn shard_count(&self) -> usize {
        self.inner.runtime.shards.count()
    }

    /// Runs `future` on shard `n` modulo [`Supervisor::shard_count`] (on the
    /// current runtime when there are none): a server spreads its connections
    /// over the shards so that their work, too, runs where no second thread is
    /// woken for it.
    pub fn spawn_on_shard<F>(&self, n: usize, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner.runtime.shards.spawn_at(n, future)
    }

    /// The shard the agent `id` lives on, or would live on once spawned
    /// (0 when there are none): a server serves a client of that agent there.
    pub fn shard_of(&self, id: &str) -> usize {
        self.inner.runtime.shards.shard_of(id)
    }

    /// The agent with this id.
    pub fn get(&self, id: &str) -> Option<AgentHandle> {
        self.inner
            .agents
            .get(id)
            .map(|agent| AgentHandle::new(agent.clone()))
    }

    /// The agent with this name.
    pub fn find(&self, name: &str) -> Option<AgentHandle> {
        let id = self.inner.names.get(name)?.clone();
        self.get(id.as_str())
    }

    /// Every agent with its status, sorted by id.
    pub fn list(&self) -> Vec<AgentInfo> {
        let mut agents: Vec<AgentInfo> = self
            .inner
            .agents
            .iter()
            .map(|entry| AgentHandle::new(entry.value().clone()).info())
            .collect();
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        agents
    }

    /// How many agents there are.
    pub fn len(&self) -> usize {
        self.inner.agents.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.inner.agents.is_empty()
    }

    /// Stops one agent: aborts its run, waits for it to end, marks its session
    /// closed, and removes it. Its handles then answer
    /// [`crate::AgentError::Stopped`]. Returns whether it existed.
    pub async fn stop(&self, id: &str) -> bool {
        let Some((_, agent)) = self.inner.agents.remove(id) else {
            return false;
        };
        self.halt_and_close(&agent).await;
        // Sub-agents working under its session (`{session}/…`) go with it.
        let within: Vec<AgentId> = self
            .inner
            .agents
            .iter()
            .filter(|entry| {
                let session = &*entry.value().session;
                session != &*agent.session && tiller_store::is_within(session, &agent.session)
            })
            .map(|entry| entry.key().clone())
            .collect();
        for id in within {
            if let Some((_, sub)) = self.inner.agents.remove(&id) {
                self.halt_and_close(&sub).await;
            }
        }
        true
    }

    /// Stops one agent at once and writes nothing more for it: its run is dropped
    /// where it stands (no aborted message, no result for a call in progress),
    /// its subscribers get `agent_stopped` with `reason`, and its session stays
    /// active for whoever holds it next. For a host that lost its claim on the
    /// session (a cluster host that fenced itself): what it would write now
    /// belongs to the next holder. Returns whether the agent existed.
    pub fn evict(&self, id: &str, reason: &str) -> bool {
        let Some((_, agent)) = self.inner.agents.remove(id) else {
            return false;
        };
        if let Some(name) = &agent.name {
            self.inner.names.remove(name);
        }
        agent.evict(reason.to_owned());
        true
    }

    /// Asks the agent's run, if any, to end where its next turn would start
    /// (`RunEnd::Paused`, everything it did stored), without waiting for it; see
    /// [`Supervisor::hand_off`]. Returns whether the agent exists.
    pub fn pause(&self, id: &str) -> bool {
        let Some(agent) = self.inner.agents.get(id).map(|entry| entry.value().clone()) else {
            return false;
        };
        if let Some(actor) = agent.route.live() {
            let _ = actor.send_message(AgentMsg::Internal(Internal(Signal::Pause)));
        }
        true
    }

    /// Hands one agent over to another process at a turn boundary: its run, if
    /// any, ends where its next turn would start ([`Supervisor::pause`]), then
    /// the agent is evicted ([`Supervisor::evict`]), its session left active for
    /// the next holder to go on with `Op::Continue`. Returns whether the agent
    /// existed.
    pub async fn hand_off(&self, id: &str, reason: &str) -> bool {
        if !self.pause(id) {
            return false;
        }
        if let Some(agent) = self.get(id) {
            agent.wait_for_idle().await;
        }
        self.evict(id, reason)
    }

    /// Halts `agent` (removed from the map already) and closes its session.
    async fn halt_and_close(&self, agent: &Arc<Agent>) {
        if let Some(name) = &agent.name {
            self.inner.names.remove(name);
        }
        halt(agent, "stopped by its supervisor").await;
        agent.close_session().await;
    }

    /// Shuts every agent down gracefully (aborting runs and waiting for them to end,
    /// every write committed), then the supervisor. Sessions stay active in the
    /// store, for [`Supervisor::resume`]. Spawning afterwards fails. A store that
    /// stays unavailable for [`Supervisor::SHUTDOWN_STORE_WAIT`] is given up on:
    /// the writes still waiting are not made (and were never acknowledged).
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shut_down.store(true, Ordering::Release);
        inner.runtime.root.cancel();
        let agents: Vec<Arc<Agent>> = inner
            .agents
            .iter()
            .map(|entry| entry.value().clone())
            .collect();
        let halting = async {
            futures::future::join_all(
                agents
                    .iter()
                    .map(|agent| halt(agent, "the supervisor shut down")),
            )
            .await;
            if let Err(error) = inner.runtime.writer.flush().await {
                tracing::warn!(%error, "the session store failed while shutting down");
            }
        };
        let down = stays_unavailable(self.store_health(), Supervisor::SHUTDOWN_STORE_WAIT);
        let (halting, down) = (std::pin::pin!(halting), std::pin::pin!(down));
        if let futures::future::Either::Right(_) = futures::future::select(halting, down).await {
            tracing::error!(
                "the session store is still unavailable: shutting down without the writes that wait for it (none was acknowledged)"
            );
        }
        inner.agents.clear();
        inner.names.clear();
        inner.actor.stop(None);
    }
}

/// Resolves once `health` has said the store is unavailable for `wait` without
/// a break.
async fn stays_unavailable(health: &tiller_store::StoreHealth, wait: std::time::Duration) {
    let mut since = None;
    loop {
        if health.is_unavailable() {
            let since = *since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() >= wait {
                return;
            }
        } else {
            since = None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Aborts an agent's run, waits for it to end, and stops the agent. A request
/// waiting for the user stays open in its session.
async fn halt(agent: &Arc<Agent>, reason: &str) {
    agent.halt_run();
    AgentHandle::new(agent.clone()).wait_for_idle().await;
    agent.stop(reason.to_owned());
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("agents", &self.inner.agents.len())
            .field("shut_down", &self.inner.shut_down.load(Ordering::Acquire))
            .finish()
    }
}
