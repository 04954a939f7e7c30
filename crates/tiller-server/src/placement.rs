//! Where the server's agents live: in this process's supervisor, or — with
//! `tiller serve --cluster` — on whichever host of a cluster holds each one
//! ([`tiller_cluster`]). The routes reach agents only through the methods here,
//! so each route is the same either way: in a cluster a request is forwarded to
//! its agent's owner as an `Op` with an idempotency key (the client's
//! `Idempotency-Key`, or one made per request), and events are read from the
//! cluster's stream, on whichever host the client reached.

use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};

use axum::http::{HeaderMap, StatusCode};
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller::tiller_store::{Definition, SessionFilter, SessionRecord, SessionStatus};
use tiller::wire::{Frame, Updates};
use tiller::{
    AgentContext, AgentHandle, AgentId, AgentInfo, AgentSpec, AgentState, AgentStatus, ContextIds,
    Op, RunOutcome,
};
use tiller_cluster::{Activator, ClusterError, EventSubject, Holder, Principal};

use crate::Shared;
use crate::error::Problem;
use crate::events::{Seed, framed, framed_each, published};
use crate::tenants::{Caller, Scope};

/// How long a client joining a cluster's agent waits for the owner's state (its
/// message in progress); past it, the client's stream starts without it.
const SEED_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest `Idempotency-Key` a client may send, in bytes.
pub(crate) const MAX_KEY_BYTES: usize = 255;

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
}

/// A client's stream of events.
pub(crate) type Outgoings = Pin<Box<dyn Stream<Item = Frame> + Send>>;

impl From<ClusterError> for Problem {
    fn from(error: ClusterError) -> Self {
        let detail = error.to_string();
        match error {
            ClusterError::Agent(error) => error.into(),
            ClusterError::Spawn(error) => error.into(),
            ClusterError::NoSuchAgent(agent) => Problem::unknown_agent(&agent),
            ClusterError::Forbidden { .. } => {
                Problem::new(StatusCode::FORBIDDEN, "forbidden", detail)
            }
            ClusterError::Unavailable { .. } | ClusterError::Nats(_) | ClusterError::Leaving => {
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
            }
            _ => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "failed", detail),
        }
    }
}

/// The idempotency key of a request: the client's `Idempotency-Key`, else a new
/// one (a retry of the forwarding within the request).
pub(crate) fn key_of(headers: &HeaderMap) -> Result<String, Problem> {
    match headers.get("idempotency-key") {
        None => Ok(tiller::tiller_ai::new_id()),
        Some(value) => value
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|key| !key.is_empty() && key.len() <= MAX_KEY_BYTES)
            .map(str::to_owned)
            .ok_or_else(|| {
                Problem::invalid(
                    Some("Idempotency-Key".to_owned()),
                    format!("an idempotency key is 1 to {MAX_KEY_BYTES} bytes of visible text"),
                )
            }),
    }
}

impl Shared {
    /// Who owns the agent `id` in a cluster: from what this host knows, else
    /// from its session; `None` when there is no such active agent.
    async fn cluster_owner(&self, id: &str) -> Result<Option<Scope>, Problem> {
        if let Some(owner) = self.owners.get(id) {
            return Ok(Some(owner.clone()));
        }
        let found = self
            .supervisor
            .store()
            .list(&SessionFilter::only(id))
            .await?;
        let Some(info) = found
            .into_iter()
            .find(|info| info.record.status == SessionStatus::Active)
        else {
            return Ok(None);
        };
        let owner = Scope {
            tenant: info.record.tenant_id,
            user: info.record.user_id,
        };
        self.owners.insert(AgentId::from(id), owner.clone());
        Ok(Some(owner))
    }

    /// Where the agent `id` is, if `caller` may see it: the cluster's agent and
    /// its event subject, or this process's.
    pub(crate) async fn reach(&self, caller: &Caller, id: &str) -> Result<Reached, Problem> {
        match &self.cluster {
            None => self.agent(caller, id).map(Reached::Local),
            Some(_) => {
                let owner = self
                    .cluster_owner(id)
                    .await?
                    .filter(|owner| caller.scope().sees(owner))
                    .ok_or_else(|| Problem::unknown_agent(id))?;
                Ok(Reached::Cluster(EventSubject {
                    agent: id.to_owned(),
                    tenant: owner.tenant,
                    user: owner.user,
                }))
            }
        }
    }

    /// Carries out `op` on the agent `id` (found for `caller`), once it is
    /// durable.
    pub(crate) async fn submit(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        id: &str,
        op: impl FnOnce() -> Result<Op, Problem>,
    ) -> Result<(), Problem> {
        match (self.reach(caller, id).await?, &self.cluster) {
            (Reached::Local(agent), _) => {
                let op = op()?;
                match headers.get("idempotency-key") {
                    None => agent.submit(op).await?,
                    Some(_) => agent.submit_keyed(op, key_of(headers)?).await?,
                }
            }
            (Reached::Cluster(subject), Some(cluster)) => {
                let op = op()?;
                cluster
                    .submit_as(&subject.agent, op, &key_of(headers)?, caller.principal())
                    .await?;
            }
            (Reached::Cluster(_), None) => unreachable_placement(),
        }
        Ok(())
    }

    /// Carries out `op`, one that starts a run, and waits for the run's outcome.
    pub(crate) async fn run(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        id: &str,
        op: Op,
    ) -> Result<RunOutcome, Problem> {
        match (self.reach(caller, id).await?, &self.cluster) {
            (Reached::Local(agent), _) => {
                let key = headers
                    .get("idempotency-key")
                    .map(|_| key_of(headers))
                    .transpose()?;
                Ok(agent.run_op(op, key.map(Into::into)).await?)
            }
            (Reached::Cluster(subject), Some(cluster)) => Ok(cluster
                .run_as(&subject, op, &key_of(headers)?, caller.principal())
                .await?),
            (Reached::Cluster(_), None) => unreachable_placement(),
        }
    }

    /// The agent's state, and in a cluster the host that holds it.
    pub(crate) async fn state(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(AgentState, Option<Holder>), Problem> {
        match (self.reach(caller, id).await?, &self.cluster) {
            (Reached::Local(agent), _) => Ok((agent.state().await?, None)),
            (Reached::Cluster(subject), Some(cluster)) => {
                let (state, holder) = cluster.state(&subject.agent).await?;
                Ok((state, Some(holder)))
            }
            (Reached::Cluster(_), None) => unreachable_placement(),
        }
    }

    /// Stops the agent `id` for good and forgets what the server kept of it;
    /// whether there was one.
    pub(crate) async fn stop(&self, id: &str) -> Result<bool, Problem> {
        let stopped = match &self.cluster {
            None => self.supervisor.stop(id).await,
            Some(cluster) => cluster.stop(id).await?,
        };
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
        match (self.reach(caller, id).await?, &self.cluster) {
            (Reached::Local(agent), _) => {
                Ok(Box::pin(framed(self.follow(&agent, last_seen), updates)))
            }
            (Reached::Cluster(subject), Some(cluster)) => {
                let agent = AgentId::from(id);
                // The owner's message in progress, and the number of its next
                // event: a client joining (or back) in the middle of a message
                // gets its next update whole, rebuilt from it. Asked only of a
                // live owner with work (following wakes no agent), and not
                // waited for long.
                let state = match cluster.working_owner(id) {
                    Some(_) => tokio::time::timeout(SEED_WAIT, cluster.state(id))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .map(|(state, _)| state),
                    None => None,
                };
                let seed = state.and_then(|state| {
                    Some(Seed {
                        agent: agent.clone(),
                        message: state.streaming_message?,
                        from: state.next_seq,
                    })
                });
                let after =
                    last_seen.or_else(|| seed.as_ref().and_then(|seed| seed.from.checked_sub(1)));
                // Of no use to a client past it.
                let seed = seed.filter(|seed| after.is_none_or(|after| seed.from > after));
                let following = cluster.follow(&subject, after).await?;
                Ok(Box::pin(published(agent, following, updates, seed)))
            }
            (Reached::Cluster(_), None) => unreachable_placement(),
        }
    }

    /// Every event of every agent `caller` may see, agents created later
    /// joining, with `updates` as asked.
    pub(crate) async fn all_events_of(
        &self,
        caller: &Caller,
        updates: Updates,
    ) -> Result<Outgoings, Problem> {
        let scope = caller.scope();
        match &self.cluster {
            None => {
                let shared = self.me.upgrade().ok_or_else(|| {
                    Problem::new(
                        StatusCode::SERVICE_UNAVAILABLE,
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
            Some(cluster) => {
                let following = cluster.follow_all(scope.tenant.as_deref(), scope.user.as_deref());
                Ok(Box::pin(published(
                    AgentId::from(""),
                    following,
                    updates,
                    None,
                )))
            }
        }
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
        let shares = match &self.cluster {
            None => Some(self.agent_shares(&owner, admitted)?),
            Some(_) => {
                self.check_cluster_agents(&owner, admitted).await?;
                None
            }
        };
        if !admitted {
            self.check_sessions(&owner, spec.session.as_deref()).await?;
        }
        let spec = spec.with_origin(origin.stored());
        let agent = match &self.cluster {
            None => self.supervisor.spawn(spec).await?,
            Some(cluster) => cluster.spawn(spec).await?,
        };
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
    /// at most `limit`: this process's, or, in a cluster, the caller's active
    /// sessions with the status their owners say (`hibernated` for those no
    /// host holds); with the id the next page starts after, while there may be
    /// one.
    pub(crate) async fn agents_of(
        &self,
        caller: &Caller,
        after: String,
        limit: u32,
    ) -> Result<(Vec<AgentInfo>, Option<String>), Problem> {
        let Some(cluster) = &self.cluster else {
            let mut agents = self.supervisor.list();
            agents.retain(|agent| {
                agent.id.as_str() > after.as_str()
                    && self.visible(&caller.scope(), agent.id.as_str())
            });
            agents.sort_by(|a, b| a.id.cmp(&b.id));
            let full = agents.len() > limit as usize;
            agents.truncate(limit as usize);
            let next = full
                .then(|| agents.last().map(|agent| agent.id.to_string()))
                .flatten();
            return Ok((agents, next));
        };
        let scope = caller.scope();
        let mut sessions = self
            .supervisor
            .store()
            .list(&SessionFilter {
                tenant_id: scope.tenant.clone(),
                user_id: scope.user.clone(),
                status: Some(SessionStatus::Active),
                after: Some(after),
                limit: Some(limit),
                ..SessionFilter::default()
            })
            .await?;
        let next = (sessions.len() == limit as usize)
            .then(|| sessions.last().map(|info| info.record.id.clone()))
            .flatten();
        sessions.retain(|info| !info.record.id.contains('/'));
        let ids: Vec<String> = sessions.iter().map(|info| info.record.id.clone()).collect();
        let mut statuses = cluster.statuses(&ids).await;
        let agents: Vec<AgentInfo> = sessions
            .into_iter()
            .map(|info| AgentInfo {
                status: statuses
                    .remove(&info.record.id)
                    .unwrap_or(AgentStatus::Hibernated),
                id: AgentId::from(info.record.id),
                name: info.record.name,
            })
            .collect();
        Ok((agents, next))
    }

    /// The agent holding session `id` on this host or, in a cluster, anywhere.
    pub(crate) fn holder_info(&self, id: &str) -> Option<AgentInfo> {
        if let Some(agent) = self
            .supervisor
            .get(id)
            .filter(|agent| agent.session_id() == id)
        {
            return Some(agent.info());
        }
        let cluster = self.cluster.as_ref()?;
        cluster.owner_of(id).map(|_| AgentInfo {
            id: AgentId::from(id),
            name: None,
            status: AgentStatus::Idle,
        })
    }
}

/// Where a request found its agent.
pub(crate) enum Reached {
    /// In this process.
    Local(AgentHandle),
    /// Somewhere in the cluster, its events on this subject.
    Cluster(EventSubject),
}

/// A cluster's agent when the server has no cluster: [`Shared::reach`] never
/// answers so.
fn unreachable_placement() -> ! {
    unreachable!("an agent is reached in a cluster only when the server has one")
}

/// Brings up, on this host, the agents of other hosts of the cluster: from the
/// origin their sessions keep, as the server made them.
#[derive(Default)]
pub(crate) struct Activations {
    shared: OnceLock<Weak<Shared>>,
}

impl Activations {
    /// From now on, agents are made by `shared`.
    pub(crate) fn serve(&self, shared: &Arc<Shared>) {
        let _ = self.shared.set(Arc::downgrade(shared));
    }
}

impl Activator for Activations {
    fn spec(&self, session: &SessionRecord) -> Result<AgentSpec, String> {
        let shared = self
            .shared
            .get()
            .and_then(Weak::upgrade)
            .ok_or("the server is starting or stopping")?;
        let origin: Origin = match session.origin.as_json() {
            "null" => {
                return Err(
                    "it was not made through the server's API: resume its session with a definition"
                        .to_owned(),
                );
            }
            _ => session
                .origin
                .decode()
                .map_err(|error| format!("its origin cannot be read: {error}"))?,
        };
        let spec = shared
            .spec(
                origin.definition.as_deref(),
                origin.version.as_deref(),
                origin.inline.as_ref(),
            )
            .map_err(|problem| problem.detail)?;
        // Whom it works for, for the ops other hosts send it.
        shared.owners.insert(
            AgentId::from(session.id.as_str()),
            Scope {
                tenant: session.tenant_id.clone(),
                user: session.user_id.clone(),
            },
        );
        Ok(spec.with_context(AgentContext::from_ids(origin.context)))
    }

    /// An op from another host passes the rules of an op from a client (no
    /// settings, no transcript, user messages only), for a principal that may
    /// see the agent.
    fn admit(&self, agent: &AgentHandle, op: &Op, on_behalf: &Principal) -> Result<(), String> {
        let shared = self
            .shared
            .get()
            .and_then(Weak::upgrade)
            .ok_or("the server is starting or stopping")?;
        crate::agents::from_client(op).map_err(|problem| problem.detail)?;
        let owner = shared
            .owners
            .get(agent.id().as_str())
            .map(|owner| owner.clone())
            .ok_or("this host does not know whom the agent works for")?;
        let caller = Scope {
            tenant: on_behalf.tenant.clone(),
            user: on_behalf.user.clone(),
        };
        if caller.sees(&owner) {
            Ok(())
        } else {
            Err("the op was sent for a tenant or user the agent does not work for".to_owned())
        }
    }

    fn held(&self, agent: &AgentHandle) {
        if let Some(shared) = self.shared.get().and_then(Weak::upgrade) {
            shared
                .replays
                .insert(agent.id().clone(), shared.record(agent));
        }
    }
}

/// What `POST /admin/drain` answers.
#[derive(Debug, Serialize)]
pub(crate) struct DrainReport {
    /// The agents now held by other hosts.
    moved: Vec<String>,
    /// Those that could not be moved, and why.
    failed: Vec<(String, String)>,
    /// Each move's time from its turn's end to its new owner holding it, in
    /// milliseconds.
    took_ms: Vec<f64>,
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
    let Some(cluster) = &shared.cluster else {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "not-clustered",
            "this server is not a host of a cluster (`tiller serve --cluster`)",
        ));
    };
    let drained = cluster.drain().await;
    Ok(axum::Json(DrainReport {
        moved: drained.moved,
        failed: drained.failed,
        took_ms: drained
            .took
            .iter()
            .map(|took| took.as_secs_f64() * 1_000.0)
            .collect(),
    }))
}
