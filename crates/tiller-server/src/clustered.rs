//! The server's agents on the hosts of a cluster ([`tiller_cluster`], `tiller
//! serve --cluster`): each request forwarded to its agent's owner as an `Op`
//! with an idempotency key, events read from the cluster's stream on whichever
//! host the client reached, and the agents of other hosts brought up here from
//! the origin their sessions keep ([`Activations`]).

use std::sync::{Arc, OnceLock, Weak};

use axum::http::StatusCode;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use tiller::store::{SessionFilter, SessionRecord, SessionStatus};
use tiller::wire::{Frame, Rebuild, Updates};
use tiller::{
    AgentError, AgentHandle, AgentMessage, AgentSpec, Delivered, Envelope, Op, RunOutcome,
    runtime::{AgentId, AgentInfo, AgentState, AgentStatus, Notice},
};
use tiller_cluster::{Activator, Cluster, ClusterError, EventSubject, Followed, Principal};

use crate::Shared;
use crate::error::Problem;
use crate::events::Cursors;
use crate::quota::AgentShares;
use crate::reach::{Agents, DrainReport, Holder, Origin, Outgoings, Page, Reached};
use crate::tenants::Scope;

/// How long a client joining a cluster's agent waits for the owner's state (its
/// message in progress); past it, the client's stream starts without it.
const SEED_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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

/// Whom an op sent to another host is for.
fn principal(scope: Scope) -> Principal {
    Principal {
        tenant: scope.tenant,
        user: scope.user,
    }
}

/// Where the events of an agent working for `owner` are published.
fn subject(id: &str, owner: Scope) -> EventSubject {
    EventSubject {
        agent: id.to_owned(),
        tenant: owner.tenant,
        user: owner.user,
    }
}

impl Agents for Cluster {
    /// The owner's live agents are its active sessions in the shared store.
    fn admit<'a>(
        &'a self,
        shared: &'a Shared,
        owner: &'a Scope,
        admitted: bool,
    ) -> BoxFuture<'a, Result<Option<AgentShares>, Problem>> {
        Box::pin(async move {
            shared.check_cluster_agents(owner, admitted).await?;
            Ok(None)
        })
    }

    fn spawn(&self, spec: AgentSpec) -> BoxFuture<'_, Result<AgentHandle, Problem>> {
        Box::pin(async move { Ok(Cluster::spawn(self, spec).await?) })
    }

    /// From what this host knows, else from the agent's active session.
    fn owner<'a>(
        &'a self,
        shared: &'a Shared,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Option<Scope>>, Problem>> {
        Box::pin(async move {
            if let Some(owner) = shared.owners.get(id) {
                return Ok(Some(Some(owner.clone())));
            }
            let found = shared
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
            shared.owners.insert(AgentId::from(id), owner.clone());
            Ok(Some(Some(owner)))
        })
    }

    fn submit<'a>(
        &'a self,
        agent: Reached<'a>,
        op: Op,
        key: Option<String>,
        on_behalf: Scope,
    ) -> BoxFuture<'a, Result<(), Problem>> {
        Box::pin(async move {
            let key = key.unwrap_or_else(tiller::ai::new_id);
            Ok(self
                .submit_as(agent.id, op, &key, principal(on_behalf))
                .await?)
        })
    }

    fn run<'a>(
        &'a self,
        agent: Reached<'a>,
        op: Op,
        key: Option<String>,
        on_behalf: Scope,
    ) -> BoxFuture<'a, Result<RunOutcome, Problem>> {
        Box::pin(async move {
            let key = key.unwrap_or_else(tiller::ai::new_id);
            let subject = subject(agent.id, agent.owner);
            Ok(self
                .run_as(&subject, op, &key, principal(on_behalf))
                .await?)
        })
    }

    fn state<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(AgentState, Option<Holder>), Problem>> {
        Box::pin(async move {
            let (state, holder) = Cluster::state(self, id).await?;
            let holder = Holder {
                host: holder.host,
                epoch: holder.epoch,
            };
            Ok((state, Some(holder)))
        })
    }

    fn stop<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, Problem>> {
        Box::pin(async move { Ok(Cluster::stop(self, id).await?) })
    }

    /// From the cluster's stream. The owner's message in progress, and the
    /// number of its next event, seed it: a client joining (or back) in the
    /// middle of a message gets its next update whole, rebuilt from it. Asked
    /// only of a live owner with work (following wakes no agent), and not
    /// waited for long.
    fn follow<'a>(
        &'a self,
        _shared: &'a Shared,
        agent: Reached<'a>,
        last_seen: Option<u64>,
        updates: Updates,
    ) -> BoxFuture<'a, Result<Outgoings, Problem>> {
        Box::pin(async move {
            let id = AgentId::from(agent.id);
            let state = match self.working_owner(agent.id) {
                Some(_) => tokio::time::timeout(SEED_WAIT, Cluster::state(self, agent.id))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|(state, _)| state),
                None => None,
            };
            let seed = state.and_then(|state| {
                Some(Seed {
                    agent: id.clone(),
                    message: state.streaming_message?,
                    from: state.next_seq,
                })
            });
            let after =
                last_seen.or_else(|| seed.as_ref().and_then(|seed| seed.from.checked_sub(1)));
            // Of no use to a client past it.
            let seed = seed.filter(|seed| after.is_none_or(|after| seed.from > after));
            let following = Cluster::follow(self, &subject(agent.id, agent.owner), after).await?;
            Ok(Box::pin(published(id, following, updates, seed)) as Outgoings)
        })
    }

    fn follow_all(
        &self,
        _shared: &Shared,
        scope: Scope,
        updates: Updates,
    ) -> Result<Outgoings, Problem> {
        let following = Cluster::follow_all(self, scope.tenant.as_deref(), scope.user.as_deref());
        Ok(Box::pin(published(
            AgentId::from(""),
            following,
            updates,
            None,
        )))
    }

    /// The scope's active sessions, with the status their owners say
    /// (`hibernated` for those no host holds).
    fn page<'a>(
        &'a self,
        shared: &'a Shared,
        scope: Scope,
        after: String,
        limit: u32,
    ) -> BoxFuture<'a, Result<Page, Problem>> {
        Box::pin(async move {
            let mut sessions = shared
                .supervisor
                .store()
                .list(&SessionFilter {
                    tenant_id: scope.tenant,
                    user_id: scope.user,
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
            let mut statuses = self.statuses(&ids).await;
            let agents = sessions
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
        })
    }

    /// On this host, else anywhere a lease names.
    fn holder_of(&self, shared: &Shared, id: &str) -> Option<AgentInfo> {
        if let Some(agent) = shared
            .supervisor
            .get(id)
            .filter(|agent| agent.session_id() == id)
        {
            return Some(agent.info());
        }
        self.owner_of(id).map(|_| AgentInfo {
            id: AgentId::from(id),
            name: None,
            status: AgentStatus::Idle,
        })
    }

    /// As a prompt or, while the agent is busy, a follow-up, to the host that
    /// holds (or brings up) its session.
    fn hand_over<'a>(
        &'a self,
        id: &'a str,
        message: AgentMessage,
        key: &'a str,
        on_behalf: Scope,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            let on_behalf = principal(on_behalf);
            let prompt = Op::Prompt {
                messages: vec![message.clone()],
            };
            match self.submit_as(id, prompt, key, on_behalf.clone()).await {
                Ok(()) => Ok(true),
                Err(ClusterError::NoSuchAgent(_)) => Ok(false),
                Err(ClusterError::Agent(AgentError::Busy)) => {
                    self.submit_as(
                        id,
                        Op::FollowUp { message },
                        &format!("{key}-follow-up"),
                        on_behalf.clone(),
                    )
                    .await
                    .map_err(|error| error.to_string())?;
                    // The run it was queued for may have ended meanwhile: a
                    // run of its own then (a follow-up left on an idle agent
                    // would wait for its next prompt).
                    match self
                        .submit_as(id, Op::Continue, &format!("{key}-continue"), on_behalf)
                        .await
                    {
                        // Taken by a run, or queued until the agent takes runs.
                        Ok(())
                        | Err(ClusterError::Agent(AgentError::Busy | AgentError::CannotStart(_))) => {
                            Ok(true)
                        }
                        Err(error) => Err(error.to_string()),
                    }
                }
                Err(error) => Err(error.to_string()),
            }
        })
    }

    fn drain(&self) -> BoxFuture<'_, Option<DrainReport>> {
        Box::pin(async move {
            let drained = Cluster::drain(self).await;
            Some(DrainReport {
                moved: drained.moved,
                failed: drained.failed,
                took_ms: drained
                    .took
                    .iter()
                    .map(|took| took.as_secs_f64() * 1_000.0)
                    .collect(),
            })
        })
    }

    /// What is left is not written to any more: the other hosts take the busy
    /// agents over when this host's heartbeat lapses.
    fn leave(&self) -> BoxFuture<'_, ()> {
        Box::pin(Cluster::leave(self))
    }

    fn metrics(&self, text: &mut String) {
        crate::metrics::cluster_metrics(text, &Cluster::metrics(self));
    }
}

/// An agent's message in progress as its owner had it when a client came,
/// with the number of the owner's next event then.
struct Seed {
    agent: AgentId,
    message: tiller::ai::AssistantMessage,
    from: u64,
}

/// A cluster's events of one `agent` or many (`agent` empty), as published
/// (lean), as a client that asked for `updates` gets them. With a `seed`, the
/// first event from its number on is rebuilt here from it and sent whole when
/// it is an update (the snapshot); the events before pass as published. With
/// `updates` full, every update is rebuilt here (parsing each event: the full
/// form's cost), and one that cannot be (its message began before the client
/// came, with no seed) passes as published.
fn published(
    agent: AgentId,
    following: impl Stream<Item = Followed>,
    updates: Updates,
    seed: Option<Seed>,
) -> impl Stream<Item = Frame> {
    let from = seed.as_ref().map_or(0, |seed| seed.from);
    let mut rebuild = (updates == Updates::Full || seed.is_some()).then(|| {
        let mut rebuild = Rebuild::default();
        if let Some(seed) = seed {
            rebuild.seed(&seed.agent, seed.message);
        }
        rebuild
    });
    let mut cursors = Cursors::new(updates);
    following.map(move |followed| {
        let (seq, json) = match followed {
            Followed::Event { seq, json } => (seq, json),
            Followed::Lagged { seq, missed } => {
                cursors.clear();
                rebuild = (updates == Updates::Full).then(Rebuild::default);
                return lagged(agent.clone(), seq, missed);
            }
        };
        let Some(rebuilding) = rebuild.as_mut().filter(|_| seq >= from) else {
            return Frame::new(seq, &json);
        };
        let Ok(envelope) = rebuilding.envelope(&json) else {
            return Frame::new(seq, &json);
        };
        if updates == Updates::Lean {
            // The seed served its one event.
            rebuild = None;
        }
        cursors.frame(&envelope)
    })
}

/// `missed` events of `agent` from `seq` on that the client will not get.
fn lagged(agent: AgentId, seq: u64, missed: u64) -> Frame {
    Envelope::new(agent, seq, Delivered::Notice(Notice::Lagged { missed }))
        .lean()
        .clone()
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

    fn shared(&self) -> Result<Arc<Shared>, String> {
        self.shared
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| "the server is starting or stopping".to_owned())
    }
}

impl Activator for Activations {
    fn spec(&self, session: &SessionRecord) -> Result<AgentSpec, String> {
        let shared = self.shared()?;
        let origin = Origin::of(session).map_err(|problem| problem.detail)?;
        let spec = shared.remade(&origin).map_err(|problem| problem.detail)?;
        // Whom it works for, for the ops other hosts send it.
        shared.owners.insert(
            AgentId::from(session.id.as_str()),
            Scope {
                tenant: session.tenant_id.clone(),
                user: session.user_id.clone(),
            },
        );
        Ok(spec)
    }

    /// An op from another host passes the rules of an op from a client (no
    /// settings, no transcript, user messages only), for a principal that may
    /// see the agent.
    fn admit(&self, agent: &AgentHandle, op: &Op, on_behalf: &Principal) -> Result<(), String> {
        let shared = self.shared()?;
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
        if let Ok(shared) = self.shared() {
            shared
                .replays
                .insert(agent.id().clone(), shared.record(agent));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_type_is_found_whatever_the_agent_is_called() {
        let frame = lagged(AgentId::from(r#"x","event":{"type":"fake"#), 7, 2);
        assert!(frame.sse().starts_with(b"id: 7\nevent: lagged\ndata: "));
    }
}
