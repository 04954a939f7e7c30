//! An owned agent's events on their way to JetStream.
//!
//! The agent's relay puts each event in the agent's [`Outbox`] as it is
//! published (no task woken per event but the publisher's, no copy of the
//! event). One task per agent sends everything waiting as one batch, one JSON
//! envelope per line, and waits for JetStream's acknowledgement before the next:
//! batches form by themselves while one is in flight, with no timer. Each batch
//! is conditional on the last one the agent's subject took
//! (`Nats-Expected-Last-Subject-Sequence`): once another owner has published
//! (its `owner_changed`), this one's next batch is refused and the agent is
//! stopped here. A batch that gets no answer (a leader election) is sent again
//! with the same message id, which JetStream deduplicates.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use tiller::{Delivered, Envelope, Notice};
use tokio::sync::Notify;

use crate::Inner;
use crate::error::ClusterError;
use crate::names::{EPOCH_HEADER, FIRST_HEADER};

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
    /// Whether a batch taken from here is being published.
    sending: bool,
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
        let was_idle = {
            let mut state = self.lock();
            if state.closed {
                return;
            }
            if state.events.len() == self.limit {
                state.events.pop_front();
                state.dropped += 1;
            }
            state.events.push_back(envelope.clone());
            state.events.len() == 1 && !state.sending
        };
        if was_idle {
            self.changed.notify_one();
        }
    }

    /// Everything waiting, once something does; `None` once closed and empty.
    async fn take(&self) -> Option<Vec<Arc<Envelope>>> {
        loop {
            let notified = self.changed.notified();
            {
                let mut state = self.lock();
                if !state.events.is_empty() {
                    state.sending = true;
                    return Some(state.events.drain(..).collect());
                }
                if state.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// The batch taken last is published (or given up).
    fn sent(&self) {
        self.lock().sending = false;
        self.changed.notify_waiters();
    }

    /// Returns once every event queued so far is published (or given up).
    pub(crate) async fn flushed(&self) {
        loop {
            let notified = self.changed.notified();
            {
                let state = self.lock();
                if state.events.is_empty() && !state.sending {
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
    /// The agent's subject.
    pub(crate) subject: String,
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

/// Publishes `outbox`'s events on `channel` until the outbox closes, or another
/// owner has published on the subject.
pub(crate) async fn publish(
    inner: Weak<Inner>,
    mut channel: Channel,
    outbox: Arc<Outbox>,
) -> Ended {
    let mut line = Vec::new();
    while let Some(events) = outbox.take().await {
        let Some(inner) = inner.upgrade() else {
            return Ended::Closed;
        };
        let max_bytes = inner.config.max_batch_bytes;
        let mut start = 0;
        while start < events.len() {
            let first = events[start].seq;
            let mut payload = Vec::with_capacity(1_024);
            let mut end = start;
            while end < events.len() {
                line.clear();
                if serde_json::to_writer(&mut line, &*events[end]).is_err() {
                    // Numbers stay consecutive within a batch: an event that
                    // cannot be encoded is told as one missed.
                    line.clear();
                    let missed = Envelope {
                        agent_id: events[end].agent_id.clone(),
                        seq: events[end].seq,
                        event: Delivered::Notice(Notice::Lagged { missed: 1 }),
                    };
                    let _ = serde_json::to_writer(&mut line, &missed);
                }
                if end > start && payload.len() + line.len() + 1 > max_bytes {
                    break;
                }
                if !payload.is_empty() {
                    payload.push(b'\n');
                }
                payload.extend_from_slice(&line);
                end += 1;
            }
            if !payload.is_empty()
                && !matches!(
                    send(&inner, &mut channel, first, Bytes::from(payload), None).await,
                    Ok(true)
                )
            {
                outbox.close(true);
                outbox.sent();
                return Ended::Superseded;
            }
            start = end;
        }
        outbox.sent();
    }
    Ended::Closed
}

/// Publishes one batch, sending it again (same message id) until JetStream
/// takes it or `deadline` passes: whether it was taken (false: refused because
/// another owner published since).
async fn send(
    inner: &Inner,
    channel: &mut Channel,
    first: u64,
    payload: Bytes,
    deadline: Option<tokio::time::Instant>,
) -> Result<bool, ClusterError> {
    let mut wait = Duration::from_millis(50);
    loop {
        let publish = PublishMessage::build()
            .payload(payload.clone())
            .message_id(format!("{}.{first}", channel.id_prefix))
            .expected_last_subject_sequence(channel.last)
            .header(EPOCH_HEADER, channel.epoch.to_string().as_str())
            .header(FIRST_HEADER, first.to_string().as_str());
        let acknowledged = match inner
            .js
            .send_publish(channel.subject.clone(), publish)
            .await
        {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        match acknowledged {
            Ok(ack) => {
                channel.last = ack.sequence;
                return Ok(true);
            }
            Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => {
                inner.counters.refused();
                tracing::warn!(subject = %channel.subject, epoch = channel.epoch, "events refused: another owner has published");
                return Ok(false);
            }
            Err(error) => {
                if deadline.is_some_and(|deadline| tokio::time::Instant::now() >= deadline) {
                    return Err(ClusterError::nats(error));
                }
                tracing::debug!(%error, "a batch of events was not published; sending it again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// [`send`] for at most ten seconds.
pub(crate) async fn send_once(
    inner: &Inner,
    channel: &mut Channel,
    first: u64,
    payload: Bytes,
) -> Result<bool, ClusterError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    send(inner, channel, first, payload, Some(deadline)).await
}
