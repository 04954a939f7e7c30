//! The server's agents in this process's supervisor: the placement of a server
//! that is not a host of a cluster. Events are followed from the agents'
//! subscriptions, a client coming back replayed from the server's recording.

use futures::future::BoxFuture;
use tiller::wire::Updates;
use tiller::{
    AgentHandle, AgentSpec, Op, RunOutcome, Supervisor,
    runtime::{AgentInfo, AgentState},
};

use crate::Shared;
use crate::error::Problem;
use crate::events::{framed, framed_each};
use crate::quota::AgentShares;
use crate::reach::{Agents, Holder, Outgoings, Page, Reached};
use crate::tenants::Scope;

/// Agents in one supervisor.
pub(crate) struct Local {
    supervisor: Supervisor,
}

impl Local {
    /// `supervisor`'s agents.
    pub(crate) fn new(supervisor: Supervisor) -> Self {
        Local { supervisor }
    }

    fn agent(&self, id: &str) -> Result<AgentHandle, Problem> {
        self.supervisor
            .get(id)
            .ok_or_else(|| Problem::unknown_agent(id))
    }
}

impl Agents for Local {
    fn admit<'a>(
        &'a self,
        shared: &'a Shared,
        owner: &'a Scope,
        admitted: bool,
    ) -> BoxFuture<'a, Result<Option<AgentShares>, Problem>> {
        Box::pin(async move { shared.agent_shares(owner, admitted).map(Some) })
    }

    fn spawn(&self, spec: AgentSpec) -> BoxFuture<'_, Result<AgentHandle, Problem>> {
        Box::pin(async move { Ok(self.supervisor.spawn(spec).await?) })
    }

    fn owner<'a>(
        &'a self,
        shared: &'a Shared,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Option<Scope>>, Problem>> {
        let owner = self
            .supervisor
            .get(id)
            .map(|_| shared.owners.get(id).map(|owner| owner.clone()));
        Box::pin(async move { Ok(owner) })
    }

    fn submit<'a>(
        &'a self,
        agent: Reached<'a>,
        op: Op,
        key: Option<String>,
        _on_behalf: Scope,
    ) -> BoxFuture<'a, Result<(), Problem>> {
        Box::pin(async move {
            let agent = self.agent(agent.id)?;
            match key {
                None => agent.submit(op).await?,
                Some(key) => agent.submit_keyed(op, key).await?,
            }
            Ok(())
        })
    }

    fn run<'a>(
        &'a self,
        agent: Reached<'a>,
        op: Op,
        key: Option<String>,
        _on_behalf: Scope,
    ) -> BoxFuture<'a, Result<RunOutcome, Problem>> {
        Box::pin(async move {
            let agent = self.agent(agent.id)?;
            Ok(agent.run_op(op, key.map(Into::into)).await?)
        })
    }

    fn state<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(AgentState, Option<Holder>), Problem>> {
        Box::pin(async move { Ok((self.agent(id)?.state().await?, None)) })
    }

    fn stop<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, Problem>> {
        Box::pin(async move { Ok(self.supervisor.stop(id).await) })
    }

    fn follow<'a>(
        &'a self,
        shared: &'a Shared,
        agent: Reached<'a>,
        last_seen: Option<u64>,
        updates: Updates,
    ) -> BoxFuture<'a, Result<Outgoings, Problem>> {
        let followed = self.agent(agent.id).map(|agent| -> Outgoings {
            Box::pin(framed(shared.follow(&agent, last_seen), updates))
        });
        Box::pin(async move { followed })
    }

    fn follow_all(
        &self,
        shared: &Shared,
        scope: Scope,
        updates: Updates,
    ) -> Result<Outgoings, Problem> {
        let shared = shared.me.upgrade().ok_or_else(|| {
            Problem::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the server is stopping",
            )
        })?;
        let visible = {
            let shared = shared.clone();
            move |id: &str| shared.visible(&scope, id)
        };
        Ok(Box::pin(framed_each(
            crate::events::following(shared, visible),
            updates,
        )))
    }

    fn page<'a>(
        &'a self,
        shared: &'a Shared,
        scope: Scope,
        after: String,
        limit: u32,
    ) -> BoxFuture<'a, Result<Page, Problem>> {
        let mut agents = self.supervisor.list();
        agents.retain(|agent| {
            agent.id.as_str() > after.as_str() && shared.visible(&scope, agent.id.as_str())
        });
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        let full = agents.len() > limit as usize;
        agents.truncate(limit as usize);
        let next = full
            .then(|| agents.last().map(|agent| agent.id.to_string()))
            .flatten();
        Box::pin(async move { Ok((agents, next)) })
    }

    fn holder_of(&self, _shared: &Shared, id: &str) -> Option<AgentInfo> {
        self.supervisor
            .get(id)
            .filter(|agent| agent.session_id() == id)
            .map(|agent| agent.info())
    }
}
