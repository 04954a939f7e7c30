//! [`Supervisor`]: spawns agents, finds them from any thread, restarts them when
//! they fail, and shuts them all down.
//!
//! The supervisor is a ractor actor; every agent actor is linked to it. When one
//! fails (a panicking `on_message` hook, say), the agent restarts from its last
//! finished message: transcript, settings and queued messages intact, handles and
//! subscriptions still valid, subscribers told with an `agent_restarted` notice. An
//! agent failing more than `max_restarts` times within `restart_window` stays down,
//! and says why.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio_util::sync::CancellationToken;

use crate::AgentMessage;
use crate::cell::AgentCell;
use crate::error::SpawnError;
use crate::handle::AgentHandle;
use crate::runtime::Runtime;
use crate::settings::AgentSettings;
use crate::state::AgentInfo;
use crate::subscription::AgentId;

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
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            max_restarts: 3,
            restart_window: Duration::from_secs(60),
            subscriber_buffer: 1024,
        }
    }
}

/// What an agent is spawned with.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// Its id; one is made up when `None`.
    pub id: Option<String>,
    /// A unique name to find it by.
    pub name: Option<String>,
    /// Its settings, shared with other agents until one changes.
    pub settings: Arc<AgentSettings>,
    /// Its starting transcript.
    pub messages: Vec<AgentMessage>,
}

impl AgentSpec {
    /// An agent with these settings and an empty transcript.
    pub fn new(settings: impl Into<Arc<AgentSettings>>) -> Self {
        AgentSpec {
            id: None,
            name: None,
            settings: settings.into(),
            messages: Vec::new(),
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
}

/// Spawns and looks after agents. Cheap to clone; clones share the agents.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Arc<Runtime>,
    actor: ActorRef<()>,
    agents: DashMap<AgentId, Arc<AgentCell>>,
    names: DashMap<Arc<str>, AgentId>,
    next_id: AtomicU64,
    shut_down: AtomicBool,
}

struct SupervisorActor;

impl Actor for SupervisorActor {
    type Msg = ();
    type State = Arc<DashMap<ractor::ActorId, std::sync::Weak<AgentCell>>>;
    type Arguments = Self::State;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        actors: Self::State,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(actors)
    }

    async fn handle(
        &self,
        _myself: ActorRef<()>,
        _message: (),
        _actors: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    /// Never stops the supervisor: an agent's exit is the agent's affair.
    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        actors: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(actor, error) => {
                let id = actor.get_id();
                if let Some(cell) = actors.remove(&id).and_then(|(_, cell)| cell.upgrade()) {
                    cell.failed(id, error.to_string());
                }
            }
            SupervisionEvent::ActorTerminated(actor, _, _) => {
                actors.remove(&actor.get_id());
            }
            _ => {}
        }
        Ok(())
    }
}

impl Supervisor {
    /// Starts a supervisor with the default configuration.
    pub async fn start() -> Result<Self, SpawnError> {
        Self::with_config(SupervisorConfig::default()).await
    }

    /// Starts a supervisor.
    pub async fn with_config(config: SupervisorConfig) -> Result<Self, SpawnError> {
        let actors = Arc::new(DashMap::new());
        let (actor, _) = Actor::spawn(None, SupervisorActor, actors.clone())
            .await
            .map_err(|error| SpawnError::Runtime(error.to_string()))?;
        let runtime = Arc::new(Runtime {
            supervisor: actor.get_cell(),
            root: CancellationToken::new(),
            config,
            actors,
        });
        Ok(Supervisor {
            inner: Arc::new(Inner {
                runtime,
                actor,
                agents: DashMap::new(),
                names: DashMap::new(),
                next_id: AtomicU64::new(0),
                shut_down: AtomicBool::new(false),
            }),
        })
    }

    /// Spawns an agent. It costs its state and nothing more until it has work.
    pub fn spawn(&self, spec: AgentSpec) -> Result<AgentHandle, SpawnError> {
        let inner = &self.inner;
        if inner.shut_down.load(Ordering::Acquire) {
            return Err(SpawnError::ShutDown);
        }
        let id = AgentId::from(spec.id.unwrap_or_else(|| {
            format!(
                "agent-{}",
                inner.next_id.fetch_add(1, Ordering::Relaxed) + 1
            )
        }));
        let name: Option<Arc<str>> = spec.name.map(Into::into);
        if let Some(name) = &name {
            match inner.names.entry(name.clone()) {
                Entry::Occupied(_) => return Err(SpawnError::NameTaken(name.to_string())),
                Entry::Vacant(entry) => {
                    entry.insert(id.clone());
                }
            }
        }
        let cell = match inner.agents.entry(id.clone()) {
            Entry::Occupied(_) => {
                if let Some(name) = &name {
                    inner.names.remove(name);
                }
                return Err(SpawnError::IdTaken(id.to_string()));
            }
            Entry::Vacant(entry) => {
                let cell = Arc::new(AgentCell::new(
                    id,
                    name,
                    spec.settings,
                    spec.messages,
                    inner.runtime.clone(),
                ));
                entry.insert(cell.clone());
                cell
            }
        };
        Ok(AgentHandle::new(cell))
    }

    /// The agent with this id.
    pub fn get(&self, id: &str) -> Option<AgentHandle> {
        self.inner
            .agents
            .get(id)
            .map(|cell| AgentHandle::new(cell.clone()))
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
            .map(|entry| {
                let cell = entry.value();
                AgentInfo {
                    id: cell.id.clone(),
                    name: cell.name.as_deref().map(str::to_owned),
                    status: cell.status(),
                }
            })
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

    /// Stops one agent: aborts its run, waits for it to end, and removes it. Its
    /// handles then answer [`crate::AgentError::Stopped`]. Returns whether it existed.
    pub async fn stop(&self, id: &str) -> bool {
        let Some((_, cell)) = self.inner.agents.remove(id) else {
            return false;
        };
        if let Some(name) = &cell.name {
            self.inner.names.remove(name);
        }
        halt(&cell, "stopped by its supervisor").await;
        true
    }

    /// Shuts every agent down gracefully (aborting runs and waiting for them to end),
    /// then the supervisor. Spawning afterwards fails.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shut_down.store(true, Ordering::Release);
        inner.runtime.root.cancel();
        let cells: Vec<Arc<AgentCell>> = inner
            .agents
            .iter()
            .map(|entry| entry.value().clone())
            .collect();
        futures::future::join_all(
            cells
                .iter()
                .map(|cell| halt(cell, "the supervisor shut down")),
        )
        .await;
        inner.agents.clear();
        inner.names.clear();
        inner.actor.stop(None);
    }
}

/// Aborts an agent's run, waits for it to end, and stops the agent.
async fn halt(cell: &AgentCell, reason: &str) {
    if let Some((_, token)) = crate::cell::lock(&cell.run_cancel).as_ref() {
        token.cancel();
    }
    cell.wait_for_idle().await;
    cell.stop(reason.to_owned());
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("agents", &self.inner.agents.len())
            .field("shut_down", &self.inner.shut_down.load(Ordering::Acquire))
            .finish()
    }
}
