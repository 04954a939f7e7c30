//! Where the server's agents live, behind one trait: [`Agents`]. The routes
//! reach agents only through it, so each route is the same wherever its agent
//! is. [`crate::local`] places them in this process's supervisor;
//! `crate::clustered` (the `cluster` feature, `tiller serve --cluster`) on
//! whichever host of a cluster holds each one, a request forwarded to its
//! agent's owner as an `Op` with an idempotency key (the client's
//! `Idempotency-Key`, or one made per request). A new kind of placement is one
//! more implementation of [`Agents`], chosen in [`crate::Server`]'s
//! constructors.

use std::pin::Pin;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use futures::Stream;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller::store::{Definition, SessionRecord};
use tiller::wire::{Frame, Updates};
use tiller::{
    AgentHandle, AgentMessage, AgentSpec, Op, RunOutcome,
    run::ContextIds,
    runtime::{AgentInfo, AgentState},
};

use crate::Shared;
use crate::error::Problem;
use crate::quota::AgentShares;
use crate::tenants::{Caller, Scope};

/// The longest `Idempotency-Key` a client may send, in bytes.
pub(crate) const MAX_KEY_BYTES: usize = 255;

/// A client's stream of events.
pub(crate) type Outgoings = Pin<Box<dyn Stream<Item = Frame> + Send>>;

/// A page of agents, and the id the next page starts after while there may be
/// one.
pub(crate) type Page = (Vec<AgentInfo>, Option<String>);

/// An agent a request found, and whom it works for.
pub(crate) struct Reached<'a> {
    /// Its id.
    pub(crate) id: &'a str,
    /// Whom it works for (where its events go, in a cluster).
    #[cfg_attr(
        not(feature = "cluster"),
        expect(dead_code, reason = "read by the cluster's placement")
    )]
    pub(crate) owner: Scope,
}

/// The host holding an agent, and its epoch (in a cluster).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Holder {
    /// The host's id.
    pub(crate) host: String,
    /// The revision of the lease that made it the owner.
    pub(crate) epoch: u64,
}

/// What `POST /admin/drain` answers.
#[derive(Debug, Serialize)]
pub(crate) struct DrainReport {
    /// The agents now held by other hosts.
    pub(crate) moved: Vec<String>,
    /// Those that could not be moved, and why.
    pub(crate) failed: Vec<(String, String)>,
    /// Each move's time from its turn's end to its new owner holding it, in
    /// milliseconds.
    pub(crate) took_ms: Vec<f64>,
}

/// Where agents live: every operation of the API on an agent, as a placement
/// carries it out. Each takes the server's bookkeeping ([`Shared`]: replay
/// buffers, owners, quotas) where it needs it; visibility is checked before
/// ([`Shared::reach`]).
pub(crate) trait Agents: Send + Sync {
    /// Takes a live agent's share of `owner`'s quotas, as this placement counts
    /// live agents (`admitted`: one admitted before, never refused); the shares
    /// to keep while it lives, where this placement keeps any.
    fn admit<'a>(
        &'a self,
        shared: &'a Shared,
        owner: &'a Scope,
        admitted: bool,
    ) -> BoxFuture<'a, Result<Option<AgentShares>, Problem>>;

    /// Spawns `spec`'s agent (here: on this host).
    fn spawn(&self, spec: AgentSpec) -> BoxFuture<'_, Result<AgentHandle, Problem>>;

    /// Whether there is a live agent `id`, and whom it works for: `Some(None)`
    /// for one the host spawned itself (no owner).
    fn owner<'a>(
        &'a self,
        shared: &'a Shared,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Option<Scope>>, Problem>>;

    /// Carries out `op` on `agent` for `on_behalf`, and returns once it is
    /// durable; `key` is its idempotency key.
    fn submit<'a>(
        &'a self,
        agent: Reached<'a>,
        op: Op,
        key: Option<String>,
        on_behalf: Scope,
    ) -> BoxFuture<'a, Result<(), Problem>>;

    /// Carries out `op`, one that starts a run, and waits for its outcome.
    fn run<'a>(
        &'a self,
        agent: Reached<'a>,
        op: Op,
        key: Option<String>,
        on_behalf: Scope,
    ) -> BoxFuture<'a, Result<RunOutcome, Problem>>;

    /// The agent's state, and the host that holds it where there are several.
    fn state<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(AgentState, Option<Holder>), Problem>>;

    /// Stops the agent `id` for good; whether there was one.
    fn stop<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, Problem>>;

    /// The agent's events for a client that last saw `last_seen` and asked for
    /// `updates`.
    fn follow<'a>(
        &'a self,
        shared: &'a Shared,
        agent: Reached<'a>,
        last_seen: Option<u64>,
        updates: Updates,
    ) -> BoxFuture<'a, Result<Outgoings, Problem>>;

    /// Every event of every agent `scope` may see, agents created later
    /// joining.
    fn follow_all(
        &self,
        shared: &Shared,
        scope: Scope,
        updates: Updates,
    ) -> Result<Outgoings, Problem>;

    /// A page of the agents `scope` may see, in id order from after `after`, at
    /// most `limit`; with the id the next page starts after, while there may be
    /// one.
    fn page<'a>(
        &'a self,
        shared: &'a Shared,
        scope: Scope,
        after: String,
        limit: u32,
    ) -> BoxFuture<'a, Result<Page, Problem>>;

    /// The agent holding session `id`, wherever this placement sees one.
    fn holder_of(&self, shared: &Shared, id: &str) -> Option<AgentInfo>;

    /// Hands a trigger batch's `message` to the agent of session `id` where
    /// another host holds it (a prompt, or a follow-up while it is busy);
    /// `false` when none does, for it to be started here.
    fn hand_over<'a>(
        &'a self,
        _id: &'a str,
        _message: AgentMessage,
        _key: &'a str,
        _on_behalf: Scope,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async { Ok(false) })
    }

    /// Moves this host's agents to other hosts, each between two turns, and
    /// takes no new ones; `None` where there are no other hosts.
    fn drain(&self) -> BoxFuture<'_, Option<DrainReport>> {
        Box::pin(async { None })
    }

    /// Leaves the other hosts, once the server has stopped serving.
    fn leave(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Adds the placement's own figures to `/metrics`.
    fn metrics(&self, _text: &mut String) {}
}

/// How the server made an agent, kept with its session so that another host
/// can make it again: the definition's name and version, or the agent file sent
/// inline, and who it works for.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Origin {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) definition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) inline: Option<Value>,
    #[serde(default)]
    pub(crate) context: ContextIds,
}

impl Origin {
    /// The origin as a session keeps it.
    pub(crate) fn stored(&self) -> Definition {
        Definition::new(self).unwrap_or_default()
    }

    /// The origin the session `record` keeps: what brings its agent up again.
    pub(crate) fn of(record: &SessionRecord) -> Result<Origin, Problem> {
        let unusable = |why: String| {
            Problem::new(
                StatusCode::CONFLICT,
                "session-not-resumable",
                format!("the session `{}` cannot be brought up: {why}", record.id),
            )
        };
        match record.origin.as_json() {
            "null" => Err(unusable(
                "it was not made through the server's API: resume it with a definition (`POST /sessions/{id}/resume`)".to_owned(),
            )),
            _ => record
                .origin
                .decode()
                .map_err(|error| unusable(format!("its origin cannot be read: {error}"))),
        }
    }
}

/// The idempotency key a client sent in `Idempotency-Key`, if any.
pub(crate) fn key_of(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|key| !key.is_empty() && key.len() <= MAX_KEY_BYTES)
        .map(|key| Some(key.to_owned()))
        .ok_or_else(|| {
            Problem::invalid(
                Some("Idempotency-Key".to_owned()),
                format!("an idempotency key is 1 to {MAX_KEY_BYTES} bytes of visible text"),
            )
        })
}

impl Shared {
    /// The agent `id`, if `caller` may see it.
    pub(crate) async fn reach<'a>(
        &self,
        caller: &Caller,
        id: &'a str,
    ) -> Result<Reached<'a>, Problem> {
        let scope = caller.scope();
        let owner = match self.agents.owner(self, id).await? {
            Some(Some(owner)) if scope.sees(&owner) => owner,
            // One the host spawned: seen on an open server.
            Some(None) if scope.tenant.is_none() => Scope::default(),
            _ => return Err(Problem::unknown_agent(id)),
        };
        Ok(Reached { id, owner })
    }

    /// Carries out `op` on the agent `id` (found for `caller`), once it is
    /// durable.
    pub(crate) async fn submit(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        id: &str,
        op: impl AsyncFnOnce() -> Result<Op, Problem>,
    ) -> Result<(), Problem> {
        let agent = self.reach(caller, id).await?;
        let op = op().await?;
        let key = key_of(headers)?;
        self.agents.submit(agent, op, key, caller.scope()).await
    }

    /// Carries out `op`, one that starts a run, and waits for the run's outcome.
    pub(crate) async fn run(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        id: &str,
        op: Op,
    ) -> Result<RunOutcome, Problem> {
        let agent = self.reach(caller, id).await?;
        let key = key_of(headers)?;
        self.agents.run(agent, op, key, caller.scope()).await
    }

    /// The agent's state, and in a cluster the host that holds it.
    pub(crate) async fn state(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(AgentState, Option<Holder>), Problem> {
        self.reach(caller, id).await?;
        self.agents.state(id).await
    }

    /// Stops the agent `id` for good and forgets what the server kept of it;
    /// whether there was one.
    pub(crate) async fn stop(&self, id: &str) -> Result<bool, Problem> {
        let stopped = self.agents.stop(id).await?;
        self.replays.remove(id);
        self.owners.remove(id);
        self.agents_held.by_agent.remove(id);
        Ok(stopped)
    }

    /// The agent's events for a client that last saw `last_seen` and asked
    /// for `updates`.
    pub(crate) async fn events_of(
        &self,
        caller: &Caller,
        id: &str,
        last_seen: Option<u64>,
        updates: Updates,
    ) -> Result<Outgoings, Problem> {
        let agent = self.reach(caller, id).await?;
        self.agents.follow(self, agent, last_seen, updates).await
    }

    /// Every event of every agent `caller` may see, agents created later
    /// joining, with `updates` as asked.
    pub(crate) fn all_events_of(
        &self,
        caller: &Caller,
        updates: Updates,
    ) -> Result<Outgoings, Problem> {
        self.agents.follow_all(self, caller.scope(), updates)
    }

    /// Spawns the agent `spec` says for `owner`, made as `origin` says (kept with
    /// its session), and starts recording its events and announcing it to those
    /// following every agent.
    pub(crate) async fn spawn(
        &self,
        spec: AgentSpec,
        owner: Scope,
        origin: &Origin,
    ) -> Result<AgentInfo, Problem> {
        self.spawn_with(spec, owner, origin, false).await
    }

    /// [`Shared::spawn`] for an agent admitted before (a trigger's, when its
    /// event was taken): counted in its owner's live agents, never refused.
    pub(crate) async fn spawn_admitted(
        &self,
        spec: AgentSpec,
        owner: Scope,
        origin: &Origin,
    ) -> Result<AgentInfo, Problem> {
        self.spawn_with(spec, owner, origin, true).await
    }

    async fn spawn_with(
        &self,
        spec: AgentSpec,
        owner: Scope,
        origin: &Origin,
        admitted: bool,
    ) -> Result<AgentInfo, Problem> {
        // Within the owner's quotas: a live agent more, and a session more for
        // a new one (one admitted before, when its event was taken, is not
        // refused now).
        let shares = self.agents.admit(self, &owner, admitted).await?;
        if !admitted {
            self.check_sessions(&owner, spec.session.as_deref()).await?;
        }
        let agent = self.agents.spawn(spec.with_origin(origin.stored())).await?;
        if let Some(shares) = shares {
            self.agents_held.by_agent.insert(agent.id().clone(), shares);
        }
        self.owners.insert(agent.id().clone(), owner);
        // No one following every agent is no error.
        let _ = self.created.send(agent.id().clone());
        self.replays.insert(agent.id().clone(), self.record(&agent));
        Ok(agent.info())
    }

    /// A page of the agents `caller` may see, in id order from after `after`,
    /// at most `limit`, with the id the next page starts after, while there may
    /// be one.
    pub(crate) async fn agents_of(
        &self,
        caller: &Caller,
        after: String,
        limit: u32,
    ) -> Result<Page, Problem> {
        self.agents.page(self, caller.scope(), after, limit).await
    }

    /// The agent holding session `id`, wherever it is.
    pub(crate) fn holder_info(&self, id: &str) -> Option<AgentInfo> {
        self.agents.holder_of(self, id)
    }
}

/// `POST /admin/drain`: moves this host's agents to the other hosts of its
/// cluster, each between two turns, and takes no new ones (an operator's
/// request: a token marked `admin: true`).
pub(crate) async fn drain(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<axum::Json<DrainReport>, Problem> {
    let caller = shared.caller(&headers)?;
    if !caller.admin {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a drain is an operator's: it needs a token marked `admin: true`",
        ));
    }
    shared.agents.drain().await.map(axum::Json).ok_or_else(|| {
        Problem::new(
            StatusCode::CONFLICT,
            "not-clustered",
            "this server is not a host of a cluster (`tiller serve --cluster`)",
        )
    })
}
