//! An owned agent's events on their way to every host, by two paths.
//!
//! The agent's relay puts each event in the agent's [`Outbox`] as it is
//! published (no copy, no task woken but the publisher). One task per agent
//! takes everything waiting as one batch — one JSON envelope per line, the
//! batch's first number and the owner's epoch in its headers — and:
//!
//! - **live**: publishes it at once on the agent's live subject (core NATS, a
//!   few microseconds, in order), while this host's heartbeat is fresh: a host
//!   woken from a pause past its lease publishes nothing more;
//! - **durable**: adds it to what the stream will get. Batches for the stream are
//!   coalesced over [`ClusterConfig::durable_window`] (token deltas come 20 to 50
//!   a second per agent; a replicated write each would be most of the cluster's
//!   work) or until a run ends, one in flight at a time, each conditional on the subject's last
//!   message (`Nats-Expected-Last-Subject-Sequence`): once another owner has
//!   published (its `owner_changed`), this one's next batch is refused and the
//!   agent is stopped here. A batch that gets no answer (a leader election) is
//!   sent again with the same message id, which JetStream deduplicates.
//!
//! The live path never runs more than [`LIVE_LEAD`] events ahead of what the
//! stream has acknowledged; a new owner numbers its events from past that lead,
//! so numbers keep rising even over events only the live path carried.
//!
//! [`ClusterConfig::durable_window`]: crate::ClusterConfig::durable_window

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use bytes::{Bytes, BytesMut};
use tiller::{Delivered, Envelope, Notice};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::Inner;
use crate::error::ClusterError;
use crate::names::{EPOCH_HEADER, FIRST_HEADER};

/// The most events the live path runs ahead of what the stream has
/// acknowledged. A new owner numbers its first event this far past the stream's
/// last, so no number is used twice.
pub(crate) const LIVE_LEAD: u64 = 4_096;

/// Events waiting to be published, bounded: past `limit`, the oldest are
/// dropped (followers see the gap in the numbers and are told how many they
/// missed).
pub(crate) struct Outbox {
    state: Mutex<OutboxState>,
    changed: Notify,
    limit: usize,
}

#[derive(Default)]
struct OutboxState {
    events: VecDeque<Arc<Envelope>>,
    /// Whether the publisher holds events the stream has not acknowledged yet.
    unsettled: bool,
    /// No more events: the publisher ends once it has sent what waits.
    closed: bool,
    /// Events dropped for the bound, in all.
    dropped: u64,
}

impl Outbox {
    pub(crate) fn new(limit: usize) -> Self {
        Outbox {
            state: Mutex::new(OutboxState::default()),
            changed: Notify::new(),
            limit,
        }
    }

    fn lock(&self) -> MutexGuard<'_, OutboxState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues an event (the relay calls it on the publishing thread).
    pub(crate) fn push(&self, envelope: &Arc<Envelope>) {
        let was_empty = {
            let mut state = self.lock();
            if state.closed {
                return;
            }
            if state.events.len() == self.limit {
                state.events.pop_front();
                state.dropped += 1;
            }
            state.events.push_back(envelope.clone());
            state.events.len() == 1
        };
        if was_empty {
            self.changed.notify_one();
        }
    }

    /// What waits, at most `max` events, once something does; `None` once
    /// closed and empty.
    async fn take(&self, max: usize) -> Option<Vec<Arc<Envelope>>> {
        loop {
            let notified = self.changed.notified();
            {
                let mut state = self.lock();
                if !state.events.is_empty() {
                    state.unsettled = true;
                    let count = state.events.len().min(max);
                    return Some(state.events.drain(..count).collect());
                }
                if state.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Everything taken so far is acknowledged by the stream (or given up).
    fn settled(&self) {
        let settled = {
            let mut state = self.lock();
            state.unsettled = false;
            state.events.is_empty()
        };
        if settled {
            self.changed.notify_waiters();
        }
    }

    /// Returns once every event queued so far is in the stream (or given up).
    pub(crate) async fn flushed(&self) {
        loop {
            let notified = self.changed.notified();
            {
                let state = self.lock();
                if state.events.is_empty() && !state.unsettled {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Takes no more events; what waits is still sent, unless `discard`.
    pub(crate) fn close(&self, discard: bool) {
        {
            let mut state = self.lock();
            state.closed = true;
            if discard {
                state.events.clear();
            }
        }
        self.changed.notify_waiters();
        self.changed.notify_one();
    }

    /// Events dropped for the bound.
    pub(crate) fn dropped(&self) -> u64 {
        self.lock().dropped
    }
}

/// Where one agent publishes.
pub(crate) struct Channel {
    /// The agent's stream subject.
    pub(crate) subject: String,
    /// The agent's live subject.
    pub(crate) live: String,
    /// The message id prefix: the agent's token and the owner's epoch.
    pub(crate) id_prefix: String,
    pub(crate) epoch: u64,
    /// The stream sequence of the subject's last message (0: none).
    pub(crate) last: u64,
}

/// Why a publisher ended.
pub(crate) enum Ended {
    /// The outbox closed and everything in it was sent.
    Closed,
    /// JetStream refused a batch: another owner published since.
    Superseded,
}

/// What the stream is to get: batches joined, from event `first` on.
#[derive(Default)]
struct Pending {
    payload: BytesMut,
    first: u64,
    events: u64,
    /// When the oldest of them was taken.
    since: Option<Instant>,
}

/// A batch on its way to the stream.
struct InFlight {
    ack: Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>,
    first: u64,
    events: u64,
    payload: Bytes,
}

/// The headers of a batch.
fn headers(epoch: u64, first: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(EPOCH_HEADER, epoch.to_string().as_str());
    headers.insert(FIRST_HEADER, first.to_string().as_str());
    headers
}

/// `events` as lines of JSON: an event that cannot be encoded is told as one
/// missed, so that numbers stay consecutive within a batch.
fn lines(events: &[Arc<Envelope>]) -> Bytes {
    let mut payload = Vec::with_capacity(events.len() * 256);
    for (n, event) in events.iter().enumerate() {
        if n > 0 {
            payload.push(b'\n');
        }
        let start = payload.len();
        if serde_json::to_writer(&mut payload, &**event).is_err() {
            payload.truncate(start);
            let missed = Envelope {
                agent_id: event.agent_id.clone(),
                seq: event.seq,
                event: Delivered::Notice(Notice::Lagged { missed: 1 }),
            };
            let _ = serde_json::to_writer(&mut payload, &missed);
        }
    }
    payload.into()
}

/// Publishes `outbox`'s events on `channel`, live and to the stream, until the
/// outbox closes (and everything is in the stream) or another owner has
/// published on the subject.
pub(crate) async fn publish(
    inner: Weak<Inner>,
    mut channel: Channel,
    outbox: Arc<Outbox>,
) -> Ended {
    let Some((window, max_bytes, fence_after)) = inner.upgrade().map(|inner| {
        (
            inner.config.durable_window,
            inner.config.max_batch_bytes,
            inner.config.fence_after(),
        )
    }) else {
        return Ended::Closed;
    };
    let mut pending = Pending::default();
    // Whether what waits holds a run's end: sent to the stream at once, so a
    // client resuming right after a run reads it whole.
    let mut ends_run = false;
    let mut in_flight: Option<InFlight> = None;
    let mut retry_at: Option<Instant> = None;
    let mut wait = Duration::from_millis(50);
    // Events the live path has carried that the stream has not acknowledged.
    let mut lead = 0u64;
    let mut open = true;
    loop {
        let Some(inner) = inner.upgrade() else {
            return Ended::Closed;
        };
        let flush_at = pending.since.map(|since| since + window);
        tokio::select! {
            taken = outbox.take((LIVE_LEAD - lead) as usize), if open && lead < LIVE_LEAD => match taken {
                Some(events) => {
                    let first = events[0].seq;
                    ends_run |= events.iter().any(|event| {
                        matches!(event.event, Delivered::Event(tiller::AgentEvent::AgentEnd { .. }))
                    });
                    let payload = lines(&events);
                    if inner.life.fresh(fence_after) {
                        inner.counters.live_batch();
                        if let Err(error) = inner
                            .client
                            .publish_with_headers(channel.live.clone(), headers(channel.epoch, first), payload.clone())
                            .await
                        {
                            tracing::debug!(%error, "a batch was not published live");
                        }
                    }
                    if pending.events == 0 {
                        pending.first = first;
                        pending.since = Some(Instant::now());
                    } else {
                        pending.payload.extend_from_slice(b"\n");
                    }
                    pending.payload.extend_from_slice(&payload);
                    pending.events += events.len() as u64;
                    lead += events.len() as u64;
                }
                None => open = false,
            },
            acknowledged = async { in_flight.as_mut().map(|sent| sent.ack.as_mut()).unwrap().await }, if in_flight.is_some() => {
                let sent = in_flight.take().map(|sent| (sent.first, sent.events, sent.payload));
                match acknowledged {
                    Ok(ack) => {
                        channel.last = ack.sequence;
                        lead = lead.saturating_sub(sent.map_or(0, |(_, events, _)| events));
                        wait = Duration::from_millis(50);
                        if pending.events == 0 {
                            outbox.settled();
                        }
                    }
                    Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => {
                        inner.counters.refused();
                        tracing::warn!(subject = %channel.subject, epoch = channel.epoch, "events refused: another owner has published");
                        outbox.close(true);
                        outbox.settled();
                        return Ended::Superseded;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "a batch of events was not stored; sending it again");
                        // Sent again, with its message id (and what came since), after a wait.
                        if let Some((first, events, payload)) = sent {
                            let mut again = BytesMut::from(&payload[..]);
                            if pending.events > 0 {
                                again.extend_from_slice(b"\n");
                                again.extend_from_slice(&pending.payload);
                            }
                            pending = Pending {
                                payload: again,
                                first,
                                events: events + pending.events,
                                since: pending.since.or(Some(Instant::now())),
                            };
                        }
                        retry_at = Some(Instant::now() + wait);
                        wait = (wait * 2).min(Duration::from_secs(1));
                    }
                }
            },
            _ = sleep_until(retry_at.max(flush_at)), if in_flight.is_none() && pending.events > 0 => {}
        }
        let now = Instant::now();
        let due = pending.since.is_some_and(|since| since + window <= now)
            && retry_at.is_none_or(|at| at <= now);
        let full = pending.payload.len() >= max_bytes;
        if in_flight.is_none() && pending.events > 0 && (due || full || ends_run || !open) {
            ends_run = false;
            let batch = std::mem::take(&mut pending);
            let payload = batch.payload.freeze();
            let message = PublishMessage::build()
                .payload(payload.clone())
                .message_id(format!("{}.{}", channel.id_prefix, batch.first))
                .expected_last_subject_sequence(channel.last)
                .header(EPOCH_HEADER, channel.epoch.to_string().as_str())
                .header(FIRST_HEADER, batch.first.to_string().as_str());
            inner.counters.stream_batch();
            match inner
                .js
                .send_publish(channel.subject.clone(), message)
                .await
            {
                Ok(ack) => {
                    in_flight = Some(InFlight {
                        ack: Box::pin(ack.into_future()),
                        first: batch.first,
                        events: batch.events,
                        payload,
                    });
                }
                Err(error) => {
                    tracing::debug!(%error, "a batch of events could not be sent; sending it again");
                    pending = Pending {
                        payload: BytesMut::from(&payload[..]),
                        ..batch
                    };
                    retry_at = Some(Instant::now() + wait);
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
            }
        }
        if !open && pending.events == 0 && in_flight.is_none() {
            outbox.settled();
            return Ended::Closed;
        }
    }
}

/// Sleeps until `at`, or forever when there is none.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Publishes one batch to the stream alone (a new owner's `owner_changed`),
/// sending it again (same message id) for at most ten seconds: whether it was
/// taken (false: another owner published since the subject's last message).
pub(crate) async fn send_once(
    inner: &Inner,
    channel: &mut Channel,
    first: u64,
    payload: Bytes,
) -> Result<bool, ClusterError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wait = Duration::from_millis(50);
    loop {
        let message = PublishMessage::build()
            .payload(payload.clone())
            .message_id(format!("{}.{first}", channel.id_prefix))
            .expected_last_subject_sequence(channel.last)
            .header(EPOCH_HEADER, channel.epoch.to_string().as_str())
            .header(FIRST_HEADER, first.to_string().as_str());
        let acknowledged = match inner
            .js
            .send_publish(channel.subject.clone(), message)
            .await
        {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        match acknowledged {
            Ok(ack) => {
                channel.last = ack.sequence;
                // Followers on the live path learn of the new owner at once.
                let _ = inner
                    .client
                    .publish_with_headers(
                        channel.live.clone(),
                        headers(channel.epoch, first),
                        payload,
                    )
                    .await;
                return Ok(true);
            }
            Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => return Ok(false),
            Err(error) if Instant::now() >= deadline => return Err(ClusterError::nats(error)),
            Err(error) => {
                tracing::debug!(%error, "owner_changed was not published; sending it again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
    }
}
