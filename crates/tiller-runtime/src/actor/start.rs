//! Starting an agent's actor: the first (the supervisor's spawn), after a
//! dormant spell (a wake), after hibernation (a thaw) and after a failure (a
//! restart). A woken actor starts from the state its dormant agent kept; the
//! others from the store, after every write submitted so far is committed. The
//! requests that waited in the route are delivered to it in order.

use std::sync::Arc;

use ractor::ActorRef;

use super::{AgentActor, Boot, Dormant, Loaded};
use crate::agent::Agent;
use crate::message::AgentMsg;
use crate::settings::AgentSettings;
use crate::subscription::{Delivered, Notice};

/// Why an actor is being started.
enum Start {
    /// After a dormant spell, from the state the agent kept.
    Wake(Box<Dormant>),
    /// After hibernation, with these settings.
    Thaw(Arc<AgentSettings>),
    /// After a failure, with these settings.
    Restart(Arc<AgentSettings>, String),
}

impl Agent {
    /// Brings a dormant agent back from the state it kept.
    pub(crate) fn wake(self: &Arc<Self>, state: Box<Dormant>) {
        self.start(Start::Wake(state));
    }

    /// Brings a hibernated agent back with `settings`.
    pub(crate) fn thaw(self: &Arc<Self>, settings: Arc<AgentSettings>) {
        self.start(Start::Thaw(settings));
    }

    /// Starts an actor for this agent in a task on its shard, then delivers the
    /// requests waiting in the route in order.
    fn start(self: &Arc<Self>, why: Start) {
        let agent = self.clone();
        self.runtime.shards.spawn(self.id.as_str(), async move {
            let (started, restarted) = match why {
                Start::Wake(state) => (agent.spawn_actor(state).await, None),
                Start::Thaw(settings) => (agent.boot(settings).await, None),
                Start::Restart(settings, reason) => (agent.boot(settings).await, Some(reason)),
            };
            match started {
                Ok(actor) => {
                    if !agent.route.go_live(&actor) {
                        // Stopped meanwhile.
                        actor.stop(None);
                        return;
                    }
                    if let Some(reason) = restarted {
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
        let state = self.state_of(settings, loaded).await?;
        self.spawn_actor(state).await
    }

    /// The state an actor of this agent starts from with `settings`, from
    /// `loaded`. An agent with a budget of its own learns first what its session
    /// spent.
    pub(crate) async fn state_of(
        self: &Arc<Self>,
        settings: Arc<AgentSettings>,
        mut loaded: Loaded,
    ) -> Result<Box<Dormant>, String> {
        if !settings.definition.run.budget.agent.is_unbounded() {
            let scope = tiller_store::SpendScope::Session(self.session.to_string());
            loaded.spent = self
                .runtime
                .writer
                .store()
                .spent(&scope)
                .await
                .map_err(|error| format!("the session store failed: {error}"))?;
        }
        Ok(Dormant::loaded(self, settings, loaded))
    }

    /// Spawns an actor holding `state`, linked to the supervisor.
    pub(crate) async fn spawn_actor(
        self: &Arc<Self>,
        state: Box<Dormant>,
    ) -> Result<ActorRef<AgentMsg>, String> {
        let boot = Boot {
            agent: self.clone(),
            state,
        };
        let spawning = AgentActor::spawn(boot, self.runtime.supervisor.clone());
        self.runtime
            .shards
            .run(self.id.as_str(), spawning)
            .await
            .map_err(|error| format!("the agent's shard could not start it: {error}"))?
            .map_err(|error| format!("the actor runtime could not start an actor: {error}"))
    }

    /// The actor failed and the supervisor's restart budget allows another:
    /// restart it with `settings`, unless the agent was stopped meanwhile.
    pub(crate) fn restart(self: &Arc<Self>, settings: Arc<AgentSettings>, reason: String) {
        if !self.route.is_starting() {
            return;
        }
        tracing::warn!(agent = %self.id, %reason, "agent failed; restarting from its stored session");
        self.start(Start::Restart(settings, reason));
    }
}
