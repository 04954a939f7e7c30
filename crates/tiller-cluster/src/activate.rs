//! Bringing an agent up on this host: a new one ([`spawn`]), or one no live host
//! holds ([`activate`]: after a request found no owner, a failover, a hand-off).
//!
//! The order is what fences the previous owner out of each place it writes to:
//!
//! 1. the lease, by compare-and-set (its revision is the new epoch);
//! 2. the event stream: `owner_changed`, published conditional on the stream's
//!    last message, so no batch of the previous owner's is taken after it;
//! 3. the store: the session claimed at the new epoch, so none of the previous
//!    owner's writes is taken after it;
//! 4. then the agent's subject: requests reach the new owner.
//!
//! An agent that had work left goes on: after a failover the turn in progress
//! is run again (`turn_restarted` first, so clients drop its partial output);
//! after a hand-off the paused run goes on as if nothing had stopped.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::{CreateErrorKind, Operation, UpdateErrorKind};
use futures::StreamExt;
use tiller_runtime::{AgentHandle, AgentId, AgentSpec, Delivered, Envelope, Notice, Op};
use tiller_store::{SessionFilter, SessionStatus};

use crate::error::ClusterError;
use crate::names::{EventSubject, FIRST_HEADER, host_subject, token};
use crate::owned::{Held, Owned, release};
use crate::publish::{Channel, LIVE_LEAD};
use crate::wire::{Activated, HostRequest, LeaseRecord, Reason, Reply, Request};
use crate::{Inner, membership};

/// How many times a claim is tried while other hosts race for the same lease.
const CLAIM_ATTEMPTS: usize = 8;

/// The incarnation this host claims agents under, or why it takes none now.
fn claiming(inner: &Inner) -> Result<String, ClusterError> {
    if inner.leaving.load(std::sync::atomic::Ordering::Acquire) {
        return Err(ClusterError::Leaving);
    }
    inner
        .life
        .claiming()
        .ok_or_else(|| ClusterError::Unavailable {
            agent: String::new(),
            reason: "this host is not taking agents now (fenced, or draining)".to_owned(),
        })
}

/// A lease naming this host's current life.
fn lease_record(inner: &Inner, incarnation: String, busy: bool) -> LeaseRecord {
    LeaseRecord {
        host: inner.me().to_owned(),
        incarnation,
        busy,
    }
}

fn value(record: &LeaseRecord) -> bytes::Bytes {
    serde_json::to_vec(record).unwrap_or_default().into()
}

/// Spawns a new agent here under a new lease; a lease an orphan holds (the
/// session of a host that died, resumed) is taken over.
pub(crate) async fn spawn(
    inner: &Arc<Inner>,
    spec: AgentSpec,
) -> Result<AgentHandle, ClusterError> {
    let incarnation = claiming(inner)?;
    let id = spec
        .id
        .clone()
        .or_else(|| spec.session.clone())
        .unwrap_or_else(tiller_ai::new_id);
    let spec = spec.with_id(id.clone());
    let subject = EventSubject {
        agent: id.clone(),
        tenant: spec.context.tenant_id().map(str::to_owned),
        user: spec.context.user_id().map(str::to_owned),
    };
    let record = lease_record(inner, incarnation, false);
    let (epoch, taken_over) = claim(inner, &id, &record)
        .await?
        .ok_or_else(|| ClusterError::Spawn(tiller_runtime::SpawnError::IdTaken(id.clone())))?;
    let reason = taken_over.then_some(Reason::Request);
    let owned = bring_up(inner, spec, subject, epoch, record, reason).await?;
    Ok(owned.handle.clone())
}

/// Claims `agent`'s lease for `record`: creates it, or takes it over from an
/// owner whose life has ended. The epoch and whether it was taken over; `None`
/// when a live host holds it.
async fn claim(
    inner: &Inner,
    agent: &str,
    record: &LeaseRecord,
) -> Result<Option<(u64, bool)>, ClusterError> {
    let key = token(agent);
    for _ in 0..CLAIM_ATTEMPTS {
        let entry = inner.leases.entry(&key).await.map_err(ClusterError::nats)?;
        let current = match entry {
            Some(entry) if entry.operation == Operation::Put => entry,
            // No lease, or a released one.
            _ => match inner.leases.create(&key, value(record)).await {
                Ok(epoch) => return Ok(Some((epoch, false))),
                Err(error) if error.kind() == CreateErrorKind::AlreadyExists => continue,
                Err(error) => return Err(ClusterError::nats(error)),
            },
        };
        let held: Option<LeaseRecord> = serde_json::from_slice(&current.value).ok();
        if let Some(held) = &held
            && !(held.host == record.host && held.incarnation == record.incarnation)
            && alive(inner, held).await?
        {
            return Ok(None);
        }
        match inner
            .leases
            .update(&key, value(record), current.revision)
            .await
        {
            Ok(epoch) => return Ok(Some((epoch, true))),
            Err(error) if error.kind() == UpdateErrorKind::WrongLastRevision => continue,
            Err(error) => return Err(ClusterError::nats(error)),
        }
    }
    Err(ClusterError::Unavailable {
        agent: agent.to_owned(),
        reason: "other hosts kept claiming its lease".to_owned(),
    })
}

/// Whether `lease`'s owner is alive in the life that took it, read from the
/// hosts bucket itself (the view may lag).
async fn alive(inner: &Inner, lease: &LeaseRecord) -> Result<bool, ClusterError> {
    let entry = inner
        .hosts
        .entry(token(&lease.host))
        .await
        .map_err(ClusterError::nats)?;
    Ok(entry.is_some_and(|entry| {
        entry.operation == Operation::Put
            && serde_json::from_slice::<crate::wire::HostRecord>(&entry.value)
                .is_ok_and(|host| host.incarnation == lease.incarnation)
    }))
}

/// Where the subject's stream stands: the sequence of its last message (0:
/// none) and the number of the last event in it.
async fn last_event(inner: &Inner, subject: &str) -> Result<(u64, Option<u64>), ClusterError> {
    let Some(message) = crate::last_message(&inner.events, subject)
        .await
        .map_err(ClusterError::nats)?
    else {
        return Ok((0, None));
    };
    let first: Option<u64> = message
        .headers
        .get(FIRST_HEADER)
        .and_then(|value| value.as_str().parse().ok());
    let lines = message
        .payload
        .iter()
        .filter(|byte| **byte == b'\n')
        .count() as u64;
    Ok((message.sequence, first.map(|first| first + lines)))
}

/// Says `owner_changed` on `subject`'s stream, conditional on its last message:
/// from then on the previous owner's batches are refused. Where the stream
/// stands after it, and the number of the next event.
async fn announce(
    inner: &Inner,
    subject: &EventSubject,
    epoch: u64,
) -> Result<(u64, u64), ClusterError> {
    let name = subject.subject();
    for _ in 0..CLAIM_ATTEMPTS {
        let (last, last_event) = last_event(inner, &name).await?;
        // Past what the previous owner may have published live only (all of
        // its events, when the stream has none yet).
        let seq = last_event.map_or(LIVE_LEAD, |seq| seq + 1 + LIVE_LEAD);
        let envelope = Envelope::new(
            AgentId::from(subject.agent.as_str()),
            seq,
            Delivered::Notice(Notice::OwnerChanged {
                host: inner.me().to_owned(),
                epoch,
            }),
        );
        let payload = envelope.lean().json();
        let mut channel = Channel::new(&subject.agent, name.clone(), epoch, last);
        // Refused only when the previous owner published meanwhile: read again.
        if crate::publish::send_once(inner, &mut channel, seq, payload).await? {
            return Ok((channel.last, seq + 1));
        }
    }
    Err(ClusterError::Unavailable {
        agent: subject.agent.clone(),
        reason: "its previous owner kept publishing".to_owned(),
    })
}

/// Brings the agent of `spec` up here at `epoch` (its lease `record` claimed at
/// that revision). `reason` is why an existing agent comes here; `None` for a
/// new one.
async fn bring_up(
    inner: &Arc<Inner>,
    spec: AgentSpec,
    subject: EventSubject,
    epoch: u64,
    record: LeaseRecord,
    reason: Option<Reason>,
) -> Result<Arc<Owned>, ClusterError> {
    let agent = subject.agent.clone();
    let placed = async {
        let (last, first_event) = match reason {
            Some(_) => announce(inner, &subject, epoch).await?,
            // A new agent: no owner before (an id used before keeps rising).
            None => {
                let (last, last_event) = last_event(inner, &subject.subject()).await?;
                (last, last_event.map_or(0, |seq| seq + 1 + LIVE_LEAD))
            }
        };
        let spec = spec.with_epoch(epoch).with_first_event(first_event);
        let handle = inner.supervisor.spawn(spec).await?;
        let held = Held {
            record,
            revision: epoch,
        };
        Owned::start(inner, handle, subject.clone(), epoch, held, last).await
    }
    .await;
    let owned = match placed {
        Ok(owned) => owned,
        Err(error) => {
            release(inner, &agent, epoch).await;
            return Err(error);
        }
    };
    inner.owned.insert(agent.clone(), owned.clone());
    inner.counters.activated();
    if reason.is_some() {
        inner.activator.held(&owned.handle);
    }
    tracing::info!(%agent, epoch, reason = ?reason, "agent held here");
    if reason.is_some() {
        go_on(&owned, reason == Some(Reason::HandOff)).await;
    }
    Ok(owned)
}

/// Goes on with an agent that had work left: the run its previous owner had in
/// progress (run again from its turn's start, said with `turn_restarted`,
/// unless it was paused for a hand-off) or its queued messages.
async fn go_on(owned: &Owned, handed_off: bool) {
    let Ok(state) = owned.handle.state().await else {
        return;
    };
    let ends_unanswered = state
        .messages
        .last()
        .is_some_and(|message| message.as_assistant().is_none());
    let queued = !state.steering_queue.is_empty() || !state.follow_up_queue.is_empty();
    if !state.waiting.is_empty() || !(ends_unanswered || queued) {
        return;
    }
    if !handed_off {
        owned.handle.notify(Notice::TurnRestarted);
    }
    let key = format!("tiller-go-on-{}", owned.epoch);
    let request = Request::Submit {
        op: Op::Continue,
        key,
        on_behalf: crate::Principal::default(),
    };
    match owned.call(request).await {
        Some(Reply::Ok(_)) => {}
        other => {
            tracing::warn!(agent = %owned.handle.id(), reply = ?other, "the agent's work did not go on")
        }
    }
}

/// Brings `agent` up here for `reason`, unless a live host holds it.
pub(crate) async fn activate(inner: &Arc<Inner>, agent: &str, reason: Reason) -> Activated {
    let lock = inner
        .activating
        .entry(agent.to_owned())
        .or_default()
        .clone();
    let activated = {
        let _one_at_a_time = lock.lock().await;
        activate_now(inner, agent, reason).await
    };
    inner
        .activating
        .remove_if(agent, |_, held| Arc::strong_count(held) <= 2);
    activated
}

async fn activate_now(inner: &Arc<Inner>, agent: &str, reason: Reason) -> Activated {
    if let Some(owned) = inner.owned.get(agent) {
        return Activated::Here { epoch: owned.epoch };
    }
    let failed = |error: ClusterError| Activated::Failed {
        retry: error.is_retryable() || matches!(error, ClusterError::Leaving),
        reason: error.to_string(),
    };
    let incarnation = match claiming(inner) {
        Ok(incarnation) => incarnation,
        Err(error) => return failed(error),
    };
    let session = match inner
        .supervisor
        .store()
        .list(&SessionFilter::only(agent))
        .await
    {
        Ok(mut found) => match found.pop() {
            Some(info) if info.record.status == SessionStatus::Active => info.record,
            // A stopped agent comes back only when its session is resumed.
            _ => return Activated::NoSuchAgent,
        },
        Err(error) => {
            return failed(ClusterError::Unavailable {
                agent: agent.to_owned(),
                reason: error.to_string(),
            });
        }
    };
    let record = lease_record(inner, incarnation, reason != Reason::Request);
    let epoch = match claim(inner, agent, &record).await {
        Ok(Some((epoch, _))) => epoch,
        Ok(None) => {
            return match inner.view.owner_of(agent) {
                Some(host) => Activated::OwnedBy { host },
                None => Activated::Failed {
                    reason: "another host holds it".to_owned(),
                    retry: true,
                },
            };
        }
        Err(error) => return failed(error),
    };
    if reason == Reason::Failover {
        inner.counters.failed_over();
    }
    let spec = match inner.activator.spec(&session) {
        Ok(spec) => spec,
        Err(why) => {
            release(inner, agent, epoch).await;
            return Activated::Failed {
                reason: why,
                retry: false,
            };
        }
    };
    let mut spec = spec
        .with_id(agent)
        .with_session(agent)
        .with_owner(session.tenant_id.clone(), session.user_id.clone());
    spec.name = session.name.clone();
    let subject = EventSubject {
        agent: agent.to_owned(),
        tenant: session.tenant_id.clone(),
        user: session.user_id.clone(),
    };
    match bring_up(inner, spec, subject, epoch, record, Some(reason)).await {
        Ok(owned) => Activated::Here { epoch: owned.epoch },
        Err(error) => failed(error),
    }
}

/// Answers what other hosts ask of this one: activations, statuses.
pub(crate) async fn serve(inner: &Arc<Inner>) -> Result<(), ClusterError> {
    let mut asked = inner
        .client
        .subscribe(host_subject(inner.me()))
        .await
        .map_err(ClusterError::nats)?;
    let weak = Arc::downgrade(inner);
    inner.keep(tokio::spawn(async move {
        while let Some(message) = asked.next().await {
            let Some(inner) = weak.upgrade() else { return };
            let Some(reply) = message.reply else { continue };
            tokio::spawn(async move {
                let answer = match serde_json::from_slice::<HostRequest>(&message.payload) {
                    Ok(HostRequest::Activate { agent, reason }) => {
                        serde_json::to_vec(&activate(&inner, &agent, reason).await)
                    }
                    Ok(HostRequest::Statuses { agents }) => {
                        serde_json::to_vec(&crate::statuses_here(&inner, &agents))
                    }
                    Err(error) => serde_json::to_vec(&Activated::Failed {
                        reason: format!("the request could not be read: {error}"),
                        retry: false,
                    }),
                };
                let _ = inner
                    .client
                    .publish(reply, answer.unwrap_or_default().into())
                    .await;
            });
        }
    }));
    Ok(())
}

/// Asks the host rendezvous hashing prefers (then the next, while one does not
/// answer) to bring `agent` up.
pub(crate) async fn place(inner: &Arc<Inner>, agent: &str, reason: Reason) -> Activated {
    let mut hosts = inner.view.placing();
    // A host that takes no agent (draining, fenced) is passed by, whatever its
    // view says of itself yet.
    if claiming(inner).is_err() {
        hosts.retain(|host| host != inner.me());
    }
    let ranked = crate::names::preferred(agent, hosts.iter().map(String::as_str));
    if ranked.is_empty() {
        return Activated::Failed {
            reason: "no live host takes agents".to_owned(),
            retry: true,
        };
    }
    for host in ranked {
        if host == inner.me() {
            return activate(inner, agent, reason).await;
        }
        let asked = serde_json::to_vec(&HostRequest::Activate {
            agent: agent.to_owned(),
            reason,
        })
        .unwrap_or_default();
        let request = async_nats::Request::new()
            .payload(asked.into())
            .timeout(Some(Duration::from_secs(10)));
        match inner.client.send_request(host_subject(host), request).await {
            Ok(message) => {
                return serde_json::from_slice(&message.payload).unwrap_or(Activated::Failed {
                    reason: "the activation's answer could not be read".to_owned(),
                    retry: true,
                });
            }
            // That host is gone: the next one.
            Err(error) => {
                tracing::debug!(%host, %error, "a host did not answer an activation");
            }
        }
    }
    Activated::Failed {
        reason: "no host answered".to_owned(),
        retry: true,
    }
}

/// Marks the host as draining before its agents move (best effort: the next
/// renewal writes it too).
pub(crate) async fn stop_taking(inner: &Inner) {
    inner.life.drain();
    if let Err(error) = membership::announce(inner).await {
        tracing::debug!(%error, "the drain mark waits for the next renewal");
    }
}
