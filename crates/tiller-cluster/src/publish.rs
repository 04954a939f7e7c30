//! The host's agents' events on their way to every host, by two paths, from one
//! task per host.
//!
//! Each owned agent's relay puts each event in the agent's [`Outbox`] as it is
//! published (no copy, no task of the agent's woken); the first event that
//! finds the outbox empty lists the outbox as ready for the host's publisher.
//! The publisher takes everything the ready outboxes hold and:
//!
//! - **live**: sends it as one message on this host's bus subject (core NATS) —
//!   at once after a quiet spell, otherwise
//!   [`ClusterConfig::live_interval`](crate::ClusterConfig::live_interval)
//!   after the last one — a section per agent — the agent's stream subject, the owner's epoch,
//!   the first event's number and the events, one JSON envelope per line — while
//!   this host's heartbeat is fresh: a host woken from a pause past its lease
//!   publishes nothing more. Every host's listener reads every bus (see
//!   `follow.rs`). So a busy host sends one NATS message for many agents' events,
//!   not one per event;
//! - **durable**: adds each agent's events to what its stream subject will get.
//!   Batches for the stream are coalesced over
//!   [`ClusterConfig::durable_window`](crate::ClusterConfig::durable_window) or
//!   until a run ends, one in flight per agent, each conditional on the subject's
//!   last message (`Nats-Expected-Last-Subject-Sequence`): once another owner has
//!   published (its `owner_changed`), this one's next batch is refused and the
//!   agent is stopped here. A batch that gets no answer (a leader election) is
//!   sent again with the same message id, which JetStream deduplicates.
//!
//! The live path never runs more than [`LIVE_LEAD`] events of an agent ahead of
//! what its stream has acknowledged; a new owner numbers its events from past
//! that lead, so numbers keep rising even over events only the live path
//! carried.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tiller_core::AgentEvent;
use tiller_runtime::{Delivered, Envelope};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::Inner;
use crate::error::ClusterError;
use crate::names::{EPOCH_HEADER, FIRST_HEADER, bus_subject, token};

/// The most events the live path runs ahead of what an agent's stream has
/// acknowledged. A new owner numbers its first event this far past the stream's
/// last, so no number is used twice.
pub(crate) const LIVE_LEAD: u64 = 4_096;

/// The outboxes with events for the publisher.
#[derive(Default)]
pub(crate) struct Ready {
    outboxes: Mutex<Vec<Arc<Outbox>>>,
    notify: Notify,
}

impl Ready {
    fn push(&self, outbox: Arc<Outbox>) {
        lock(&self.outboxes).push(outbox);
        self.notify.notify_one();
    }

    fn take(&self) -> Vec<Arc<Outbox>> {
        std::mem::take(&mut *lock(&self.outboxes))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One agent's events waiting to be published, bounded: past `limit`, the
/// oldest are dropped (followers see the gap in the numbers and are told how
/// many they missed).
pub(crate) struct Outbox {
    /// The agent's stream subject: who the events are for.
    subject: String,
    state: Mutex<OutboxState>,
    /// Told when the publisher settles the outbox (see [`Outbox::flushed`]).
    changed: Notify,
    limit: usize,
    ready: Arc<Ready>,
}

#[derive(Default)]
struct OutboxState {
    events: VecDeque<Arc<Envelope>>,
    /// Whether it is on the publisher's ready list.
    listed: bool,
    /// Whether the publisher holds events the stream has not acknowledged yet.
    unsettled: bool,
    /// No more events: the publisher sends what waits, then lets the agent go.
    closed: bool,
    /// Events dropped for the bound, in all.
    dropped: u64,
}

impl Outbox {
    pub(crate) fn new(subject: String, limit: usize, ready: Arc<Ready>) -> Self {
        Outbox {
            subject,
            state: Mutex::new(OutboxState::default()),
            changed: Notify::new(),
            limit,
            ready,
        }
    }

    /// Lists the outbox as ready, unless it is.
    fn list(self: &Arc<Self>, state: &mut OutboxState) {
        if !state.listed {
            state.listed = true;
            self.ready.push(self.clone());
        }
    }

    /// Queues an event (the relay calls it on the publishing thread).
    pub(crate) fn push(self: &Arc<Self>, envelope: &Arc<Envelope>) {
        let mut state = lock(&self.state);
        if state.closed {
            return;
        }
        if state.events.len() == self.limit {
            state.events.pop_front();
            state.dropped += 1;
        }
        state.events.push_back(envelope.clone());
        state.unsettled = true;
        self.list(&mut state);
    }

    /// At most `max` of the events waiting; whether it is closed (and empty).
    fn take(&self, max: usize) -> (Vec<Arc<Envelope>>, bool) {
        let mut state = lock(&self.state);
        state.listed = false;
        let count = state.events.len().min(max);
        let events: Vec<Arc<Envelope>> = state.events.drain(..count).collect();
        (events, state.closed && state.events.is_empty())
    }

    /// Whether events wait.
    fn waiting(&self) -> bool {
        !lock(&self.state).events.is_empty()
    }

    /// Everything taken so far is acknowledged by the stream (or given up).
    fn settled(&self) {
        let settled = {
            let mut state = lock(&self.state);
            if state.events.is_empty() {
                state.unsettled = false;
            }
            !state.unsettled
        };
        if settled {
            self.changed.notify_waiters();
        }
    }

    /// Returns once every event queued so far is in the stream (or given up).
    pub(crate) async fn flushed(&self) {
        loop {
            let notified = self.changed.notified();
            if !lock(&self.state).unsettled {
                return;
            }
            notified.await;
        }
    }

    /// Takes no more events; what waits is still sent, unless `discard`.
    pub(crate) fn close(self: &Arc<Self>, discard: bool) {
        let mut state = lock(&self.state);
        state.closed = true;
        if discard {
            state.events.clear();
        }
        self.list(&mut state);
    }

    /// Events dropped for the bound.
    pub(crate) fn dropped(&self) -> u64 {
        lock(&self.state).dropped
    }
}

/// Where one agent's events go in the stream.
pub(crate) struct Channel {
    /// The agent.
    pub(crate) agent: String,
    /// The agent's stream subject.
    pub(crate) subject: String,
    /// The message id prefix: the agent's token and the owner's epoch.
    pub(crate) id_prefix: String,
    pub(crate) epoch: u64,
    /// The stream sequence of the subject's last message (0: none).
    pub(crate) last: u64,
}

impl Channel {
    /// The channel of `agent`'s stream subject `subject` under the owner's
    /// `epoch`, the subject's last message being `last`.
    pub(crate) fn new(agent: &str, subject: String, epoch: u64, last: u64) -> Self {
        Channel {
            agent: agent.to_owned(),
            subject,
            id_prefix: format!("{}.{epoch}", token(agent)),
            epoch,
            last,
        }
    }

    /// The stream's message for a batch from event `first` on: deduplicated by
    /// its id, and refused unless the subject's last message is still `last`.
    fn batch(&self, first: u64, payload: Bytes) -> PublishMessage {
        PublishMessage::build()
            .payload(payload)
            .message_id(format!("{}.{first}", self.id_prefix))
            .expected_last_subject_sequence(self.last)
            .header(EPOCH_HEADER, self.epoch.to_string().as_str())
            .header(FIRST_HEADER, first.to_string().as_str())
    }
}

/// `events` as lines of lean JSON (see [`tiller_runtime::wire`]), each made once for
/// the bus, the stream and this host's readers.
fn lines(events: &[Arc<Envelope>], into: &mut BytesMut) {
    for (n, event) in events.iter().enumerate() {
        if n > 0 {
            into.extend_from_slice(b"\n");
        }
        into.extend_from_slice(&event.lean().json());
    }
}

/// Appends one section to a bus message: `SUBJECT EPOCH FIRST LENGTH\n` then
/// `LENGTH` bytes of lines.
pub(crate) fn section(bus: &mut BytesMut, subject: &str, epoch: u64, first: u64, payload: &[u8]) {
    let _ = writeln!(bus, "{subject} {epoch} {first} {}", payload.len());
    bus.extend_from_slice(payload);
}

/// What one agent's stream is to get, and how far it has got.
struct Durable {
    outbox: Arc<Outbox>,
    channel: Channel,
    /// Batches joined, from event `first` on.
    pending: BytesMut,
    first: u64,
    events: u64,
    /// When the oldest pending event was taken.
    since: Option<Instant>,
    /// Whether what is pending holds a run's end: sent at once.
    ends_run: bool,
    /// Whether a batch is on its way to the stream.
    in_flight: bool,
    /// Not before then (after a failed send).
    retry_at: Option<Instant>,
    /// Events the live path carried that the stream has not acknowledged.
    lead: u64,
    /// The outbox closed: done once everything is in the stream.
    closed: bool,
}

/// The answer to one batch sent to the stream.
struct Sent {
    subject: String,
    first: u64,
    events: u64,
    payload: Bytes,
    acknowledged: Result<PublishAck, PublishError>,
}

/// The host's publisher: the outboxes' ready list, and the way to register an
/// agent's outbox with it.
pub(crate) struct Publisher {
    pub(crate) ready: Arc<Ready>,
    register: mpsc::UnboundedSender<(Arc<Outbox>, Channel)>,
}

impl Publisher {
    /// Starts the host's publisher while `inner` is still being made: the task
    /// upgrades it only once told of an agent, so the bus interval comes apart.
    pub(crate) fn start(
        inner: Weak<Inner>,
        interval: Duration,
    ) -> (Publisher, tokio::task::JoinHandle<()>) {
        let ready = Arc::new(Ready::default());
        let (register, registered) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(inner, interval, ready.clone(), registered));
        (Publisher { ready, register }, task)
    }

    /// Publishes `outbox`'s events on `channel` from now on, until it closes.
    pub(crate) fn register(&self, outbox: Arc<Outbox>, channel: Channel) {
        let _ = self.register.send((outbox, channel));
    }
}

/// The publisher's task.
async fn run(
    inner: Weak<Inner>,
    interval: Duration,
    ready: Arc<Ready>,
    mut registered: mpsc::UnboundedReceiver<(Arc<Outbox>, Channel)>,
) {
    let mut agents: HashMap<String, Durable> = HashMap::new();
    let mut in_flight: FuturesUnordered<BoxFuture<'static, Sent>> = FuturesUnordered::new();
    // When agents' pending events fall due (stale entries are skipped).
    let mut dues: BinaryHeap<Reverse<(Instant, String)>> = BinaryHeap::new();
    // Whether outboxes are ready, and when the bus may carry them.
    let mut ready_waiting = false;
    let mut bus_at = Instant::now();
    loop {
        let next_due = dues.peek().map(|Reverse((at, _))| *at);
        // What to look at after this wait.
        let mut touched: Vec<String> = Vec::new();
        tokio::select! {
            // An outbox is registered before its first event is pushed.
            biased;
            registration = registered.recv() => match registration {
                Some((outbox, channel)) => {
                    touched.push(outbox.subject.clone());
                    if outbox.waiting() {
                        let mut state = lock(&outbox.state);
                        state.listed = false;
                        outbox.list(&mut state);
                    }
                    agents.insert(outbox.subject.clone(), Durable {
                        outbox,
                        channel,
                        pending: BytesMut::new(),
                        first: 0,
                        events: 0,
                        since: None,
                        ends_run: false,
                        in_flight: false,
                        retry_at: None,
                        lead: 0,
                        closed: false,
                    });
                }
                None => return,
            },
            () = ready.notify.notified(), if !ready_waiting => ready_waiting = true,
            () = tokio::time::sleep_until(bus_at), if ready_waiting => {}
            Some(sent) = in_flight.next(), if !in_flight.is_empty() => {
                let Some(inner) = inner.upgrade() else { return };
                touched.push(sent.subject.clone());
                acknowledged(&inner, &mut agents, &mut dues, sent);
            }
            () = crate::sleep_until(next_due), if next_due.is_some() => {
                let now = Instant::now();
                while let Some(Reverse((at, _))) = dues.peek() {
                    if *at > now {
                        break;
                    }
                    if let Some(Reverse((_, subject))) = dues.pop() {
                        touched.push(subject);
                    }
                }
            }
        }
        let Some(inner) = inner.upgrade() else { return };
        let now = Instant::now();
        if ready_waiting && now >= bus_at {
            ready_waiting = false;
            if take_ready(&inner, &ready, &mut agents, &mut dues, &mut touched).await {
                bus_at = now + interval;
            }
        }
        for subject in touched {
            let Some(durable) = agents.get_mut(&subject) else {
                continue;
            };
            if let Some(sending) = send_due(&inner, durable).await {
                in_flight.push(sending);
            }
            if durable.events == 0 && !durable.in_flight {
                durable.outbox.settled();
                if durable.closed {
                    agents.remove(&subject);
                }
            }
        }
    }
}

/// Takes what the ready outboxes hold: one bus message for all of it, and each
/// agent's share added to what its stream is to get. Whether the bus carried
/// anything.
async fn take_ready(
    inner: &Inner,
    ready: &Ready,
    agents: &mut HashMap<String, Durable>,
    dues: &mut BinaryHeap<Reverse<(Instant, String)>>,
    touched: &mut Vec<String>,
) -> bool {
    let outboxes = ready.take();
    if outboxes.is_empty() {
        return false;
    }
    let window = inner.config.durable_window;
    let fresh = inner.life.fresh(inner.config.fence_after());
    let mut bus = BytesMut::new();
    let mut sent_early = false;
    let mut payload = BytesMut::new();
    for outbox in outboxes {
        let Some(durable) = agents.get_mut(&outbox.subject) else {
            // Gone (its events refused): nothing more of it is sent.
            outbox.take(0);
            continue;
        };
        // Held back while the stream is behind (the lead used up, a batch's
        // worth waiting): listed again once a batch is acknowledged.
        let room = if durable.pending.len() >= inner.config.max_batch_bytes {
            0
        } else {
            LIVE_LEAD.saturating_sub(durable.lead) as usize
        };
        let (events, closed) = outbox.take(room);
        durable.closed |= closed;
        touched.push(outbox.subject.clone());
        if events.is_empty() {
            continue;
        }
        let first = events[0].seq;
        payload.clear();
        lines(&events, &mut payload);
        if fresh {
            section(
                &mut bus,
                &outbox.subject,
                durable.channel.epoch,
                first,
                &payload,
            );
            if bus.len() >= inner.config.max_batch_bytes {
                publish_bus(inner, std::mem::take(&mut bus)).await;
                sent_early = true;
            }
        }
        if durable.events == 0 {
            durable.first = first;
            let since = Instant::now();
            durable.since = Some(since);
            dues.push(Reverse((since + window, outbox.subject.clone())));
        } else {
            durable.pending.extend_from_slice(b"\n");
        }
        durable.pending.extend_from_slice(&payload);
        durable.events += events.len() as u64;
        durable.lead += events.len() as u64;
        durable.ends_run |= events
            .iter()
            .any(|event| matches!(event.event, Delivered::Event(AgentEvent::AgentEnd { .. })));
    }
    let sent = !bus.is_empty() || sent_early;
    if !bus.is_empty() {
        publish_bus(inner, bus).await;
    }
    sent
}

/// Sends one message on this host's bus.
async fn publish_bus(inner: &Inner, bus: BytesMut) {
    inner.counters.live_batch();
    if let Err(error) = inner
        .client
        .publish(bus_subject(inner.me()), bus.freeze())
        .await
    {
        tracing::debug!(%error, "a bus message was not published");
    }
}

/// Sends `durable`'s pending events to the stream, if they are due (their
/// window passed, a run ended, they fill a batch, the agent leaves) and none is
/// in flight.
async fn send_due(inner: &Inner, durable: &mut Durable) -> Option<BoxFuture<'static, Sent>> {
    let now = Instant::now();
    // A batch to send again is due once its wait is over (checked below).
    let due = durable.retry_at.is_some()
        || durable
            .since
            .is_some_and(|since| since + inner.config.durable_window <= now)
        || durable.ends_run
        || durable.closed
        || durable.pending.len() >= inner.config.max_batch_bytes;
    if durable.in_flight
        || durable.events == 0
        || !due
        || durable.retry_at.is_some_and(|at| at > now)
    {
        return None;
    }
    let payload = std::mem::take(&mut durable.pending).freeze();
    let (first, events) = (durable.first, durable.events);
    durable.events = 0;
    durable.since = None;
    durable.ends_run = false;
    durable.retry_at = None;
    let channel = &durable.channel;
    let message = channel.batch(first, payload.clone());
    inner.counters.stream_batch();
    durable.in_flight = true;
    let subject = channel.subject.clone();
    let acknowledging = match inner.js.send_publish(subject.clone(), message).await {
        Ok(ack) => ack.into_future().boxed(),
        Err(error) => futures::future::ready(Err(error)).boxed(),
    };
    Some(
        async move {
            Sent {
                subject,
                first,
                events,
                payload,
                acknowledged: acknowledging.await,
            }
        }
        .boxed(),
    )
}

/// What the stream said of a batch.
fn acknowledged(
    inner: &Inner,
    agents: &mut HashMap<String, Durable>,
    dues: &mut BinaryHeap<Reverse<(Instant, String)>>,
    sent: Sent,
) {
    let Some(durable) = agents.get_mut(&sent.subject) else {
        return;
    };
    durable.in_flight = false;
    match sent.acknowledged {
        Ok(ack) => {
            durable.channel.last = ack.sequence;
            durable.lead = durable.lead.saturating_sub(sent.events);
            // Events the lead held back.
            if durable.outbox.waiting() {
                let mut state = lock(&durable.outbox.state);
                durable.outbox.list(&mut state);
            }
        }
        Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => {
            inner.counters.refused();
            tracing::warn!(subject = %sent.subject, epoch = durable.channel.epoch, "events refused: another owner has published");
            let agent = durable.channel.agent.clone();
            durable.outbox.close(true);
            durable.outbox.settled();
            agents.remove(&sent.subject);
            if let Some(owned) = inner.owned.get(&agent).map(|owned| owned.clone()) {
                owned.leaving();
            }
            inner.supervisor.evict(
                &agent,
                "another host published its events: it holds the agent now",
            );
        }
        Err(error) => {
            tracing::debug!(%error, "a batch of events was not stored; sending it again");
            // Sent again, with its message id (and what came since), after a wait.
            let mut again = BytesMut::from(&sent.payload[..]);
            if durable.events > 0 {
                again.extend_from_slice(b"\n");
                again.extend_from_slice(&durable.pending);
            }
            durable.pending = again;
            durable.first = sent.first;
            durable.events += sent.events;
            let now = Instant::now();
            let retry_at = now + Duration::from_millis(250);
            durable.retry_at = Some(retry_at);
            durable.since = durable.since.or(Some(now));
            dues.push(Reverse((retry_at, sent.subject)));
        }
    }
}

/// Publishes one batch to the stream alone (a new owner's `owner_changed`), and
/// on this host's bus, sending it again (same message id) for at most ten
/// seconds: whether the stream took it (false: another owner published since
/// the subject's last message).
pub(crate) async fn send_once(
    inner: &Inner,
    channel: &mut Channel,
    first: u64,
    payload: Bytes,
) -> Result<bool, ClusterError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wait = Duration::from_millis(50);
    loop {
        let message = channel.batch(first, payload.clone());
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
                let mut bus = BytesMut::new();
                section(&mut bus, &channel.subject, channel.epoch, first, &payload);
                publish_bus(inner, bus).await;
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
