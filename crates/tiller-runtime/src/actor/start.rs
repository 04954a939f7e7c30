//! Starting an agent's actor: the first (the supervisor's spawn), after
//! hibernation (a thaw) and after a failure (a restart). Its state comes from the
//! store, after every write submitted so far is committed; the requests that
//! waited in the route are delivered to it in order.

use std::sync::Arc;

use ractor::ActorRef;

use super::{AgentActor, Boot, Loaded};
use crate::agent::Agent;
use crate::message::AgentMsg;
use crate::settings::AgentSettings;
use crate::subscription::{Delivered, Notice};

/// Why an actor is being started.
enum Start {
    /// After hibernation.
    Thaw,
    /// After a failure.
    Restart(String),
}

impl Agent {
    /// Brings a hibernated agent back with `settings`.
    pub(crate) fn thaw(self: &Arc<Self>, settings: Arc<AgentSettings>) {
        self.start(settings, Start::Thaw);
    }

    /// Starts an actor with `settings` for this agent in a task: its state is
    /// loaded from the store (after every write submitted so far is committed),
    /// then the requests waiting in the route are delivered in order.
    fn start(self: &Arc<Self>, settings: Arc<AgentSettings>, why: Start) {
        let agent = self.clone();
        self.runtime.shards.spawn(self.id.as_str(), async move {
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
    /// An agent with a budget of its own learns first what its session spent.
    pub(crate) async fn spawn_actor(
        self: &Arc<Self>,
        settings: Arc<AgentSettings>,
        mut loaded: Loaded,
    ) -> Result<ActorRef<AgentMsg>, String> {
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
        let boot = Boot {
            agent: self.clone(),
            settings,
            loaded,
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
        self.start(settings, Start::Restart(reason));
    }
}
