//! An agent this host owns: its actor (in the host's supervisor), its lease, the
//! task that answers its requests, and the publisher of its events.
//!
//! The agent's task is the one place its lease is written from: before an op
//! that may leave the agent with work (a prompt, a steer) is carried out, the
//! lease is marked busy — so that if this host dies, the agent is taken over at
//! once rather than on its next request — and once it has been idle for
//! `idle_after` after a run (nothing queued), it is marked idle again: one write
//! per idle spell, not two per run. Requests are carried out each in a task of
//! their own, so a long one never holds up the next; the agent's actor orders
//! them as it would in one process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_nats::jetstream::kv::UpdateErrorKind;
use bytes::Bytes;
use futures::StreamExt;
use tiller_core::AgentEvent;
use tiller_runtime::{AgentError, AgentHandle, Delivered, Notice, Relay};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;

use crate::Inner;
use crate::names::{EventSubject, op_subject, token};
use crate::publish::{Channel, Outbox};
use crate::wire::{Holder, LeaseRecord, Reply, Request, Response};

/// How long a released lease's marker stays in the bucket.
const RELEASED_MARKER: Duration = Duration::from_secs(60);

/// An agent this host owns.
pub(crate) struct Owned {
    pub(crate) handle: AgentHandle,
    /// The epoch of this host's claim.
    pub(crate) epoch: u64,
    pub(crate) outbox: Arc<Outbox>,
    commands: mpsc::UnboundedSender<Command>,
    /// Set when this host stops the agent to let another hold it (a move, a
    /// fence): its `agent_stopped` is not published, and its requests go
    /// elsewhere.
    moving: Arc<AtomicBool>,
    relay: Mutex<Option<Relay>>,
    _task: AbortOnDropHandle<()>,
}

/// What the agent's task is asked.
pub(crate) enum Command {
    /// A request from this host.
    Request(Request, oneshot::Sender<Reply>),
    /// A run ended: is the agent still busy?
    RunEnded,
    /// The agent stopped.
    Stopped,
    /// Stop answering requests (a move): answered once the task has stopped
    /// taking them, with the lease's revision.
    Close(oneshot::Sender<u64>),
}

/// The lease as its owner holds it.
pub(crate) struct Held {
    pub(crate) record: LeaseRecord,
    pub(crate) revision: u64,
}

impl Owned {
    /// Starts owning `handle`'s agent (spawned at `epoch` under the lease
    /// `held`): its events are published after the subject's message `last`,
    /// its requests answered on its subject.
    pub(crate) async fn start(
        inner: &Arc<Inner>,
        handle: AgentHandle,
        subject: EventSubject,
        epoch: u64,
        held: Held,
        last: u64,
    ) -> Result<Arc<Owned>, crate::ClusterError> {
        let agent = handle.id().to_string();
        let (commands, commanded) = mpsc::unbounded_channel();
        let name = subject.subject();
        let outbox = Arc::new(Outbox::new(
            name.clone(),
            inner.config.max_unpublished_events,
            inner.publisher.ready.clone(),
        ));
        inner
            .publisher
            .register(outbox.clone(), Channel::new(&agent, name, epoch, last));
        let moving = Arc::new(AtomicBool::new(false));
        let relay = {
            let outbox = outbox.clone();
            let commands = commands.clone();
            let moving = moving.clone();
            handle.relay(move |envelope| match &envelope.event {
                Delivered::Event(AgentEvent::AgentEnd { .. }) => {
                    outbox.push(envelope);
                    let _ = commands.send(Command::RunEnded);
                }
                Delivered::Notice(Notice::AgentStopped { .. }) => {
                    if !moving.load(Ordering::Acquire) {
                        outbox.push(envelope);
                    }
                    outbox.close(false);
                    let _ = commands.send(Command::Stopped);
                }
                _ => outbox.push(envelope),
            })
        };
        let subscription = inner
            .client
            .subscribe(op_subject(&agent))
            .await
            .map_err(crate::ClusterError::nats)?;
        let task = tokio::spawn(serve(
            Arc::downgrade(inner),
            handle.clone(),
            held,
            subscription,
            commanded,
            moving.clone(),
            epoch,
        ));
        Ok(Arc::new(Owned {
            handle,
            epoch,
            outbox,
            commands,
            moving,
            relay: Mutex::new(Some(relay)),
            _task: AbortOnDropHandle::new(task),
        }))
    }

    /// Carries out `request` through the agent's task; `None` when the task
    /// is gone (the agent moved or stopped meanwhile).
    pub(crate) async fn call(&self, request: Request) -> Option<Reply> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Request(request, reply)).ok()?;
        answer.await.ok()
    }

    /// Stops taking requests, for a move; the lease's revision.
    pub(crate) async fn close(&self) -> Option<u64> {
        self.moving.store(true, Ordering::Release);
        let (done, closed) = oneshot::channel();
        self.commands.send(Command::Close(done)).ok()?;
        closed.await.ok()
    }

    /// Marks the agent as leaving this host (its stop is not published).
    pub(crate) fn leaving(&self) {
        self.moving.store(true, Ordering::Release);
    }

    /// Stops relaying the agent's events.
    pub(crate) fn unrelay(&self) {
        self.relay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// Stops every agent this host owns at once, writing nothing more (the host
/// fenced itself, or leaves without a drain).
pub(crate) fn evict_all(inner: &Inner, reason: &str) {
    let agents: Vec<(String, Arc<Owned>)> = inner
        .owned
        .iter()
        .map(|entry| (entry.key().clone(), entry.value().clone()))
        .collect();
    for (agent, owned) in agents {
        owned.leaving();
        owned.outbox.close(true);
        inner
            .owned
            .remove_if(&agent, |_, held| Arc::ptr_eq(held, &owned));
        inner.supervisor.evict(&agent, reason);
        owned.unrelay();
    }
}

/// Sends `reply` where it is awaited: on NATS, or to a caller on this host.
enum Replier {
    Nats(async_nats::Client, async_nats::Subject),
    Local(oneshot::Sender<Reply>),
    Nobody,
}

impl Replier {
    async fn send(self, reply: Reply) {
        match self {
            Replier::Nats(client, subject) => {
                let payload = serde_json::to_vec(&reply).unwrap_or_default();
                if let Err(error) = client.publish(subject, Bytes::from(payload)).await {
                    tracing::debug!(%error, "a reply could not be sent");
                }
            }
            Replier::Local(reply_to) => {
                let _ = reply_to.send(reply);
            }
            Replier::Nobody => {}
        }
    }
}

/// The agent's task: answers its requests (from NATS and from this host) and
/// keeps its lease, until the agent stops or moves.
async fn serve(
    inner: Weak<Inner>,
    handle: AgentHandle,
    mut held: Held,
    mut subscription: async_nats::Subscriber,
    mut commands: mpsc::UnboundedReceiver<Command>,
    moving: Arc<AtomicBool>,
    epoch: u64,
) {
    let agent = handle.id().to_string();
    let mut running = JoinSet::new();
    // When to see whether the agent, idle since its last run, can be marked so.
    let mut settle_at: Option<tokio::time::Instant> = None;
    loop {
        let (request, replier) = tokio::select! {
            Some(message) = subscription.next() => {
                let Some(inner) = inner.upgrade() else { return };
                match read_request(&inner, message).await {
                    Some(read) => read,
                    None => continue,
                }
            }
            command = commands.recv() => match command {
                Some(Command::Request(request, reply)) => (request, Replier::Local(reply)),
                Some(Command::RunEnded) => {
                    if held.record.busy
                        && let Some(inner) = inner.upgrade()
                    {
                        settle_at = Some(tokio::time::Instant::now() + inner.config.idle_after);
                    }
                    continue;
                }
                Some(Command::Close(done)) => {
                    let _ = done.send(held.revision);
                    break;
                }
                Some(Command::Stopped) | None => break,
            },
            Some(_) = running.join_next(), if !running.is_empty() => continue,
            () = crate::sleep_until(settle_at), if settle_at.is_some() => {
                settle_at = None;
                if let Some(inner) = inner.upgrade() {
                    settle(&inner, &handle, &mut held).await;
                }
                continue;
            }
        };
        let Some(inner) = inner.upgrade() else { return };
        if matches!(request, Request::Stop) {
            stop(&inner, &handle, &held, &moving).await;
            replier.send(Reply::Ok(Response::Stopped)).await;
            break;
        }
        if moving.load(Ordering::Acquire) {
            replier.send(Reply::NotHere).await;
            continue;
        }
        if let Err(reason) = admitted(&inner, &handle, &request, &replier) {
            inner.counters.refused_op();
            replier.send(Reply::Forbidden(reason)).await;
            continue;
        }
        if request.makes_work() && !held.record.busy {
            match mark(&inner, &agent, &mut held, true).await {
                Ok(()) => {}
                Err(Lost::Lease) => {
                    lost_lease(&inner, &handle, &moving, epoch);
                    replier.send(Reply::NotHere).await;
                    break;
                }
                Err(Lost::Nats(reason)) => {
                    replier.send(Reply::Unavailable(reason)).await;
                    continue;
                }
            }
        }
        let handle = handle.clone();
        let moving = moving.clone();
        let holder = Holder {
            host: inner.me().to_owned(),
            epoch,
        };
        running.spawn(async move {
            let reply = apply(&handle, request, &moving, holder).await;
            replier.send(reply).await;
        });
    }
    // Requests in progress finish (their replies are sent); new ones find no
    // responder and are routed again.
    drop(subscription);
    while running.join_next().await.is_some() {}
    if let Some(inner) = inner.upgrade() {
        inner
            .owned
            .remove_if(&agent, |_, owned| owned.epoch == epoch);
    }
}

/// Whether a request may be carried out: an op from another host (over the
/// bus) passes the rules of an op from a client; this host's own were checked
/// where they were taken.
fn admitted(
    inner: &Inner,
    handle: &AgentHandle,
    request: &Request,
    replier: &Replier,
) -> Result<(), String> {
    match request {
        Request::Submit { op, on_behalf, .. } if !matches!(replier, Replier::Local(_)) => {
            inner.activator.admit(handle, op, on_behalf)
        }
        _ => Ok(()),
    }
}

/// A request from NATS and whom to answer; one that cannot be read is
/// refused here (`None`).
async fn read_request(inner: &Inner, message: async_nats::Message) -> Option<(Request, Replier)> {
    let replier = match message.reply {
        Some(subject) => Replier::Nats(inner.client.clone(), subject),
        None => Replier::Nobody,
    };
    match serde_json::from_slice::<Request>(&message.payload) {
        Ok(request) => Some((request, replier)),
        Err(error) => {
            let reason = format!("the request could not be read: {error}");
            let refused = AgentError::Failed { reason };
            replier.send(Reply::Refused(refused)).await;
            None
        }
    }
}

/// The agent's lease, taken by another host while this one held it: the agent
/// moves (its requests are answered "not here"), and leaves this host.
fn lost_lease(inner: &Inner, handle: &AgentHandle, moving: &AtomicBool, epoch: u64) {
    let agent = handle.id().to_string();
    moving.store(true, Ordering::Release);
    inner
        .owned
        .remove_if(&agent, |_, owned| owned.epoch == epoch);
    inner
        .supervisor
        .evict(&agent, "its lease was taken by another host");
}

/// Carries out a request on the agent.
async fn apply(
    handle: &AgentHandle,
    request: Request,
    moving: &AtomicBool,
    holder: Holder,
) -> Reply {
    let result = match request {
        Request::Submit { op, key, .. } => {
            handle.submit_keyed(op, key).await.map(|()| Response::Done)
        }
        Request::State => handle.state().await.map(|state| Response::State {
            state: Box::new(state),
            holder,
        }),
        Request::Stop => return Reply::NotHere,
    };
    match result {
        Ok(response) => Reply::Ok(response),
        // Stopped to move: the sender finds the new owner (a keyed op is not
        // applied twice).
        Err(AgentError::Stopped { .. } | AgentError::Failed { .. })
            if moving.load(Ordering::Acquire) =>
        {
            Reply::NotHere
        }
        Err(error) => Reply::Refused(error),
    }
}

/// Why a lease could not be written.
enum Lost {
    /// Another host holds it now.
    Lease,
    /// NATS did not answer.
    Nats(String),
}

/// Writes the lease with `busy`.
async fn mark(inner: &Inner, agent: &str, held: &mut Held, busy: bool) -> Result<(), Lost> {
    let record = LeaseRecord {
        busy,
        ..held.record.clone()
    };
    let value = serde_json::to_vec(&record).map_err(|error| Lost::Nats(error.to_string()))?;
    inner.counters.lease_write();
    match inner
        .leases
        .update(token(agent), value.into(), held.revision)
        .await
    {
        Ok(revision) => {
            held.revision = revision;
            held.record = record;
            Ok(())
        }
        Err(error) if error.kind() == UpdateErrorKind::WrongLastRevision => {
            inner.counters.refused();
            Err(Lost::Lease)
        }
        Err(error) => Err(Lost::Nats(error.to_string())),
    }
}

/// After a run: marks the lease idle when nothing is left to do.
async fn settle(inner: &Inner, handle: &AgentHandle, held: &mut Held) {
    if !held.record.busy {
        return;
    }
    if let Ok(workload) = handle.workload().await
        && !workload.is_busy()
        && let Err(Lost::Nats(reason)) = mark(inner, handle.id().as_str(), held, false).await
    {
        tracing::debug!(agent = %handle.id(), %reason, "the lease stays marked busy");
    }
}

/// Stops the agent for good (its session closed), publishes its end, and gives
/// the lease up.
async fn stop(inner: &Inner, handle: &AgentHandle, held: &Held, moving: &AtomicBool) {
    let agent = handle.id().to_string();
    moving.store(false, Ordering::Release);
    inner.supervisor.stop(&agent).await;
    if let Some(owned) = inner.owned.get(&agent).map(|owned| owned.clone()) {
        owned.outbox.flushed().await;
    }
    release(inner, &agent, held.revision).await;
}

/// Gives up the lease this host holds at `revision` (a marker that expires is
/// left); a lease taken meanwhile is left alone.
pub(crate) async fn release(inner: &Inner, agent: &str, revision: u64) {
    if let Err(error) = inner
        .leases
        .purge_expect_revision_with_ttl(token(agent), revision, RELEASED_MARKER)
        .await
    {
        tracing::debug!(%agent, %error, "a lease was not released");
    }
}
