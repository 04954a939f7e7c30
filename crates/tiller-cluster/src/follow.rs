//! Following agents' events from any host.
//!
//! Each host has one listener on every host's bus (see `publish.rs`): it takes
//! each bus message apart and hands each agent's section to the followers of
//! that agent on this host. A follower registers with the listener first, then,
//! when it resumes after a `Last-Event-ID` or finds a gap in the numbers (a
//! section it was handed too late to keep, a bus message lost), reads the
//! stream (an ordered consumer of the agent's subject, from the oldest batch
//! kept) until the gap is filled, and goes on live. Events are passed on as the
//! JSON they were published as, each once, in order.
//!
//! - A batch of an older owner than one already seen is dropped: once a follower
//!   has seen `owner_changed`, the previous owner's late batches do not count.
//! - A new owner numbers its events from past what the previous one may have
//!   published live only ([`LIVE_LEAD`](crate::publish::LIVE_LEAD)); a gap that
//!   the stream ends with `owner_changed` is that jump, not a loss.
//! - A gap the stream cannot fill (events past the owner's bound, or gone from
//!   the stream) is told as a `lagged` notice, numbered like the first event
//!   missed.
//!
//! Across a change of owner the subjects stay the same, so a follower reads on
//! without a break.
//!
//! The listener wakes a follower at most once per
//! [`ClusterConfig::delivery_window`](crate::ClusterConfig::delivery_window),
//! with everything every host's bus brought it meanwhile in its inbox.

use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tiller_runtime::Envelope;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use crate::Inner;
use crate::error::ClusterError;
use crate::names::{BUSES, EventSubject, stamp_of};

/// How long a gap may wait for the stream to fill it before it is told as
/// missed: more than a leader election, during which the stream takes nothing.
const GAP_WAIT: Duration = Duration::from_secs(30);

/// Items a follower holds for its reader (backpressure beyond: the live
/// subscription's buffer, then the stream).
const READ_AHEAD: usize = 1_024;

/// One item a follower reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// An event (or notice): its number, and its envelope's JSON as published.
    Event {
        /// The agent's number for it.
        seq: u64,
        /// `{"agent_id": …, "seq": …, "event": {…}}`.
        json: Bytes,
    },
    /// Events the follower will not see: `missed` of them, from `seq` on.
    Lagged {
        /// The first one missed.
        seq: u64,
        /// How many.
        missed: u64,
    },
}

impl Followed {
    /// The event's type (`message_update`, `owner_changed`, `lagged`, …).
    pub fn event_type(&self) -> &str {
        match self {
            Followed::Event { json, .. } => {
                std::str::from_utf8(json).map_or("event", Envelope::type_in)
            }
            Followed::Lagged { .. } => "lagged",
        }
    }
}

/// An agent's (or agents') events, as they are published. Ends after an
/// `agent_stopped` of the one agent it follows, or when NATS gives up.
pub struct Following {
    items: mpsc::Receiver<Followed>,
    _task: AbortOnDropHandle<()>,
}

impl Stream for Following {
    type Item = Followed;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Followed>> {
        self.items.poll_recv(cx)
    }
}

/// A batch as published: its owner's epoch, its first number, its lines.
#[derive(Clone)]
pub(crate) struct Batch {
    epoch: u64,
    first: u64,
    payload: Bytes,
}

/// The sections of a bus message: each agent's subject and batch.
fn sections(payload: &Bytes) -> impl Iterator<Item = (&str, Batch)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let rest = &payload[at..];
        let end = rest.iter().position(|byte| *byte == b'\n')?;
        let header = std::str::from_utf8(&rest[..end]).ok()?;
        let mut fields = header.split(' ');
        let (subject, epoch, first, length) = (
            fields.next()?,
            fields.next()?.parse().ok()?,
            fields.next()?.parse().ok()?,
            fields.next()?.parse::<usize>().ok()?,
        );
        let start = at + end + 1;
        let stop = start
            .checked_add(length)
            .filter(|stop| *stop <= payload.len())?;
        at = stop;
        Some((
            subject,
            Batch {
                epoch,
                first,
                payload: payload.slice(start..stop),
            },
        ))
    })
}

impl Batch {
    fn of(message: &async_nats::Message) -> Option<Batch> {
        let (epoch, first) = stamp_of(message)?;
        Some(Batch {
            epoch,
            first,
            payload: message.payload.clone(),
        })
    }

    /// Its events: number and JSON.
    fn events(&self) -> impl Iterator<Item = (u64, Bytes)> + '_ {
        let payload = &self.payload;
        payload
            .split(|byte| *byte == b'\n')
            .enumerate()
            .map(move |(n, line)| {
                let start = line.as_ptr() as usize - payload.as_ptr() as usize;
                (
                    self.first + n as u64,
                    payload.slice(start..start + line.len()),
                )
            })
    }
}

fn is_owner_changed(json: &Bytes) -> bool {
    std::str::from_utf8(json).is_ok_and(|json| Envelope::type_in(json) == "owner_changed")
}

/// The batches handed to one follower (of one agent, or of many), read by its
/// task. Handing one takes the reader's waker when it waits, for the listener
/// to wake it at the end of its delivery window.
#[derive(Default)]
struct Inbox {
    state: Mutex<InboxState>,
}

#[derive(Default)]
struct InboxState {
    batches: VecDeque<Batch>,
    waker: Option<Waker>,
    /// Set when the reader is gone, or the listener.
    closed: bool,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `batch` and adds the reader's waker to `wakes` when it waits;
    /// false once the reader is gone. With [`READ_AHEAD`] batches queued the
    /// batch is missed, and the follower fills the gap from the stream.
    fn put(&self, batch: Batch, wakes: &mut Vec<Waker>) -> bool {
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        if state.batches.len() < READ_AHEAD {
            state.batches.push_back(batch);
            wakes.extend(state.waker.take());
        }
        true
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Ends the reader's reading once it has what is queued.
    fn close(&self) {
        let waker = {
            let mut state = self.lock();
            state.closed = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The reading end of an [`Inbox`], closing it when dropped.
struct InboxReader(Arc<Inbox>);

impl InboxReader {
    /// A new inbox and its reader.
    fn open() -> (Arc<Inbox>, InboxReader) {
        let inbox = Arc::new(Inbox::default());
        (inbox.clone(), InboxReader(inbox))
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Batch>> {
        let mut state = self.0.lock();
        if let Some(batch) = state.batches.pop_front() {
            return Poll::Ready(Some(batch));
        }
        if state.closed {
            return Poll::Ready(None);
        }
        match &mut state.waker {
            Some(waker) => waker.clone_from(cx.waker()),
            waker @ None => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The next batch; `None` once the listener is gone.
    async fn recv(&mut self) -> Option<Batch> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl Drop for InboxReader {
    fn drop(&mut self) {
        let batches = {
            let mut state = self.0.lock();
            state.closed = true;
            std::mem::take(&mut state.batches)
        };
        // The bus messages they share go now, not at the next hand or sweep.
        drop(batches);
    }
}

/// The wakes of followers the listener holds until its delivery window ends;
/// dropped (the listener stopped or aborted), it makes them at once.
struct HeldWakes {
    wakers: Vec<Waker>,
    window: Duration,
    /// When the open window ends.
    ends: Option<tokio::time::Instant>,
}

impl HeldWakes {
    fn new(window: Duration) -> Self {
        HeldWakes {
            wakers: Vec::new(),
            window,
            ends: None,
        }
    }

    /// After a hand: with no window, wakes at once; else opens one when a wake
    /// is held and none is open, and says when it ends.
    fn handed(&mut self) -> Option<tokio::time::Instant> {
        if self.window.is_zero() {
            self.wake();
            return None;
        }
        if self.ends.is_some() || self.wakers.is_empty() {
            return None;
        }
        let ends = tokio::time::Instant::now() + self.window;
        self.ends = Some(ends);
        Some(ends)
    }

    /// Makes the wakes held, closing the window.
    fn wake(&mut self) {
        self.ends = None;
        self.wakers.drain(..).for_each(Waker::wake);
    }
}

impl Drop for HeldWakes {
    fn drop(&mut self) {
        self.wake();
    }
}

/// Where this host's listener hands what the buses carry: the followers of
/// each agent (by its subject), and those of many agents (by a subject prefix).
#[derive(Default)]
pub(crate) struct Listeners {
    agents: dashmap::DashMap<String, Vec<Arc<Inbox>>>,
    many: Mutex<Vec<(String, Arc<Inbox>)>>,
}

impl Listeners {
    fn many(&self) -> MutexGuard<'_, Vec<(String, Arc<Inbox>)>> {
        self.many.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `batch`, `subject`'s, to its followers, adding the wakers of those
    /// that wait to `wakes`; a follower with no room left misses it (and fills
    /// the gap from the stream), a gone one is dropped.
    fn hand(&self, subject: &str, batch: Batch, wakes: &mut Vec<Waker>) {
        self.many().retain(|(prefix, follower)| {
            !subject.starts_with(prefix.as_str()) || follower.put(batch.clone(), wakes)
        });
        let gone = match self.agents.get_mut(subject) {
            Some(mut followers) => {
                followers.retain(|follower| follower.put(batch.clone(), wakes));
                followers.is_empty()
            }
            None => false,
        };
        if gone {
            self.agents
                .remove_if(subject, |_, followers| followers.is_empty());
        }
    }

    /// Forgets the followers that are gone (of agents that published nothing
    /// since).
    fn sweep(&self) {
        self.agents.retain(|_, followers| {
            followers.retain(|follower| !follower.is_closed());
            !followers.is_empty()
        });
        self.many().retain(|(_, follower)| !follower.is_closed());
    }
}

impl Drop for Listeners {
    /// The host is gone: its followers' reading ends.
    fn drop(&mut self) {
        for followers in self.agents.iter() {
            followers.iter().for_each(|follower| follower.close());
        }
        self.many()
            .iter()
            .for_each(|(_, follower)| follower.close());
    }
}

/// How often the listener forgets followers that are gone.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Starts this host's listener on every host's bus. The wakes of the followers
/// it hands events are held for [`ClusterConfig::delivery_window`], so that
/// each is woken once for every host's messages meanwhile.
///
/// [`ClusterConfig::delivery_window`]: crate::ClusterConfig::delivery_window
pub(crate) async fn listen(inner: &Arc<Inner>) -> Result<(), ClusterError> {
    let mut buses = inner
        .client
        .subscribe(BUSES)
        .await
        .map_err(ClusterError::nats)?;
    let window = inner.config.delivery_window;
    let weak = Arc::downgrade(inner);
    inner.keep(tokio::spawn(async move {
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        let mut held = HeldWakes::new(window);
        let window_end = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(window_end);
        loop {
            tokio::select! {
                message = buses.next() => {
                    let Some(message) = message else { return };
                    let Some(inner) = weak.upgrade() else { return };
                    for (subject, batch) in sections(&message.payload) {
                        inner.listeners.hand(subject, batch, &mut held.wakers);
                    }
                    if let Some(ends) = held.handed() {
                        window_end.as_mut().reset(ends);
                    }
                }
                () = &mut window_end, if held.ends.is_some() => held.wake(),
                _ = sweep.tick() => {
                    let Some(inner) = weak.upgrade() else { return };
                    inner.listeners.sweep();
                }
            }
        }
    }));
    Ok(())
}

/// One agent's events put in order from the two paths.
struct Order {
    /// The number of the next event to pass on (`None`: the first one seen).
    next: Option<u64>,
    /// The newest owner seen.
    epoch: u64,
    /// Live events past a gap, waiting for it to be filled.
    held: BTreeMap<u64, Bytes>,
    ready: Vec<Followed>,
}

impl Order {
    fn pass(&mut self, seq: u64, json: Bytes) {
        self.ready.push(Followed::Event { seq, json });
        self.next = Some(seq + 1);
    }

    /// Passes on the held events that follow.
    fn drain(&mut self) {
        while let Some(next) = self.next {
            match self.held.first_key_value() {
                Some((&seq, _)) if seq < next => {
                    self.held.pop_first();
                }
                Some((&seq, _)) if seq == next => {
                    if let Some((seq, json)) = self.held.pop_first() {
                        self.pass(seq, json);
                    }
                }
                _ => return,
            }
        }
    }

    /// Takes a batch from the live path (`durable` false) or the stream.
    fn offer(&mut self, batch: &Batch, durable: bool) {
        // The stream fenced its batches itself, and is read from its start.
        if !durable && batch.epoch < self.epoch {
            return;
        }
        self.epoch = self.epoch.max(batch.epoch);
        for (seq, json) in batch.events() {
            let next = *self.next.get_or_insert(seq);
            if seq < next {
                continue;
            }
            if seq == next {
                self.pass(seq, json);
                self.drain();
            } else if !durable {
                self.held.insert(seq, json);
            } else {
                // The stream has nothing between: a new owner's jump, or a loss.
                if !is_owner_changed(&json) {
                    self.ready.push(Followed::Lagged {
                        seq: next,
                        missed: seq - next,
                    });
                }
                self.held.retain(|held, _| *held > seq);
                self.pass(seq, json);
                self.drain();
            }
        }
    }

    /// Whether live events wait for a gap to be filled.
    fn gapped(&self) -> bool {
        !self.held.is_empty()
    }

    /// Gives the gap up: what the stream did not bring is told as missed.
    fn give_up(&mut self) {
        let (Some(next), Some((&seq, _))) = (self.next, self.held.first_key_value()) else {
            return;
        };
        self.ready.push(Followed::Lagged {
            seq: next,
            missed: seq - next,
        });
        self.next = Some(seq);
        self.drain();
    }
}

type Consumer = Pin<
    Box<
        dyn Stream<
                Item = Result<
                    async_nats::jetstream::Message,
                    async_nats::jetstream::consumer::pull::OrderedError,
                >,
            > + Send,
    >,
>;

/// A consumer of the stream's `filter` from `policy` on.
async fn consume(
    inner: &Inner,
    filter: String,
    policy: DeliverPolicy,
) -> Result<Consumer, ClusterError> {
    let consumer = inner
        .events
        .create_consumer(OrderedConfig {
            filter_subject: filter,
            deliver_policy: policy,
            ..OrderedConfig::default()
        })
        .await
        .map_err(ClusterError::nats)?;
    let messages = consumer.messages().await.map_err(ClusterError::nats)?;
    Ok(Box::pin(messages))
}

/// One agent's events: after `after` (read from the stream first), or from now
/// on.
pub(crate) async fn follow(
    inner: &Arc<Inner>,
    subject: &EventSubject,
    after: Option<u64>,
) -> Result<Following, ClusterError> {
    let name = subject.subject();
    let (inbox, live) = InboxReader::open();
    inner
        .listeners
        .agents
        .entry(name.clone())
        .or_default()
        .push(inbox);
    let stream = match after {
        Some(_) => Some(consume(inner, name.clone(), DeliverPolicy::All).await?),
        None => None,
    };
    let (sender, items) = mpsc::channel(READ_AHEAD);
    let task = tokio::spawn(read(inner.clone(), name, live, stream, after, sender));
    Ok(Following {
        items,
        _task: AbortOnDropHandle::new(task),
    })
}

/// The follower's task: live batches in order, gaps filled from the stream.
async fn read(
    inner: Arc<Inner>,
    durable_subject: String,
    mut live: InboxReader,
    mut stream: Option<Consumer>,
    after: Option<u64>,
    sender: mpsc::Sender<Followed>,
) {
    let mut order = Order {
        next: after.map(|seen| seen.saturating_add(1)),
        epoch: 0,
        held: BTreeMap::new(),
        ready: Vec::new(),
    };
    // Until the stream has delivered what it held when it was opened.
    let mut replaying = stream.is_some();
    let mut gap_since: Option<tokio::time::Instant> = None;
    loop {
        let gap_deadline = gap_since.map(|since| since + GAP_WAIT);
        tokio::select! {
            batch = live.recv() => match batch {
                Some(batch) => order.offer(&batch, false),
                None => return,
            },
            message = next_of(stream.as_mut()) => match message {
                Some(Ok(message)) => {
                    if let Some(batch) = Batch::of(&message) {
                        order.offer(&batch, true);
                    }
                    if message.info().is_ok_and(|info| info.pending == 0) {
                        replaying = false;
                    }
                }
                Some(Err(error)) => tracing::debug!(%error, "catching up on events"),
                None => stream = None,
            },
            () = crate::sleep_until(gap_deadline) => {
                order.give_up();
            },
        }
        for item in order.ready.drain(..) {
            let stopped = item.event_type() == "agent_stopped";
            if sender.send(item).await.is_err() || stopped {
                return;
            }
        }
        // A gap calls for the stream; once filled and caught up, live alone.
        match (order.gapped(), stream.is_some()) {
            (true, false) => {
                stream = consume(&inner, durable_subject.clone(), DeliverPolicy::All)
                    .await
                    .ok();
            }
            (false, true) if !replaying => stream = None,
            _ => {}
        }
        gap_since = match (order.gapped(), gap_since) {
            (true, None) => Some(tokio::time::Instant::now()),
            (true, since) => since,
            (false, _) => None,
        };
    }
}

/// Every agent's events under `tenant` (and `user`), from now on, as the buses
/// carry them: for a dashboard, each agent's in its order, none filled.
pub(crate) fn follow_all(inner: &Inner, tenant: Option<&str>, user: Option<&str>) -> Following {
    let (inbox, mut taken) = InboxReader::open();
    inner
        .listeners
        .many()
        .push((EventSubject::prefix(tenant, user), inbox));
    let (sender, items) = mpsc::channel(READ_AHEAD);
    let task = tokio::spawn(async move {
        while let Some(batch) = taken.recv().await {
            for (seq, json) in batch.events() {
                if sender.send(Followed::Event { seq, json }).await.is_err() {
                    return;
                }
            }
        }
    });
    Following {
        items,
        _task: AbortOnDropHandle::new(task),
    }
}

/// The next item of `stream`; never, when there is no stream.
async fn next_of<S: Stream + Unpin>(stream: Option<&mut S>) -> Option<S::Item> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of `epoch` from event `first` on, `kinds` its events' types.
    fn batch(epoch: u64, first: u64, kinds: &[&str]) -> Batch {
        let lines: Vec<String> = kinds
            .iter()
            .enumerate()
            .map(|(n, kind)| {
                format!(
                    r#"{{"agent_id":"a","seq":{},"event":{{"type":"{kind}"}}}}"#,
                    first + n as u64
                )
            })
            .collect();
        Batch {
            epoch,
            first,
            payload: Bytes::from(lines.join("\n")),
        }
    }

    fn fresh(after: Option<u64>) -> Order {
        Order {
            next: after.map(|seen| seen + 1),
            epoch: 0,
            held: BTreeMap::new(),
            ready: Vec::new(),
        }
    }

    /// What was passed on: numbers, and `lagged` as `-missed`.
    fn passed(order: &mut Order) -> Vec<i64> {
        order
            .ready
            .drain(..)
            .map(|item| match item {
                Followed::Event { seq, .. } => seq as i64,
                Followed::Lagged { missed, .. } => -(missed as i64),
            })
            .collect()
    }

    /// A waker that counts its wakes.
    struct Counted(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn woken(counted: &Counted) -> usize {
        counted.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn a_waiting_follower_is_woken_once_for_all_it_was_handed() {
        let listeners = Listeners::default();
        let (inbox, mut reader) = InboxReader::open();
        listeners.agents.insert("s".to_owned(), vec![inbox]);
        let (many, mut all) = InboxReader::open();
        listeners.many().push(("s".to_owned(), many));
        let counted = Arc::new(Counted(0.into()));
        let waker = Waker::from(counted.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(reader.poll_recv(&mut cx).is_pending());
        assert!(all.poll_recv(&mut cx).is_pending());

        // Three bus messages within a window: one wake held for each reader.
        let mut held = HeldWakes::new(Duration::from_millis(1));
        for first in [1, 2, 3] {
            listeners.hand("s", batch(5, first, &["e"]), &mut held.wakers);
        }
        listeners.hand("other", batch(5, 1, &["e"]), &mut held.wakers);
        assert_eq!(held.wakers.len(), 2);
        assert_eq!(woken(&counted), 0);
        held.wake();
        assert_eq!(woken(&counted), 2);
        for reader in [&mut reader, &mut all] {
            let read: Vec<u64> = std::iter::from_fn(|| match reader.poll_recv(&mut cx) {
                Poll::Ready(Some(batch)) => Some(batch.first),
                _ => None,
            })
            .collect();
            assert_eq!(read, [1, 2, 3]);
        }

        // Past its read-ahead a follower misses batches, without a wake more.
        for first in 0..READ_AHEAD as u64 + 5 {
            listeners.hand("s", batch(5, first, &["e"]), &mut held.wakers);
        }
        assert_eq!(held.wakers.len(), 2);
        assert_eq!(all.0.lock().batches.len(), READ_AHEAD);

        // A reader gone lets go of its batches, and is forgotten at the next hand.
        let inbox = reader.0.clone();
        drop(reader);
        assert!(inbox.lock().batches.is_empty());
        listeners.hand("s", batch(5, 9, &["e"]), &mut held.wakers);
        assert!(listeners.agents.get("s").is_none());

        // The host gone, and its listener stopped with wakes held: the other
        // reader is woken, reads what was queued, and ends.
        drop(listeners);
        assert_eq!(woken(&counted), 2);
        drop(held);
        assert_eq!(woken(&counted), 4);
        let mut left = 0;
        while let Poll::Ready(Some(_)) = all.poll_recv(&mut cx) {
            left += 1;
        }
        assert_eq!(left, READ_AHEAD);
        assert!(matches!(all.poll_recv(&mut cx), Poll::Ready(None)));
    }

    #[test]
    fn a_window_opens_once_and_a_zero_window_wakes_at_once() {
        let counted = Arc::new(Counted(0.into()));
        let mut held = HeldWakes::new(Duration::from_millis(1));
        assert_eq!(held.handed(), None, "nothing held, no window");
        held.wakers.push(Waker::from(counted.clone()));
        assert!(held.handed().is_some());
        held.wakers.push(Waker::from(counted.clone()));
        assert_eq!(held.handed(), None, "the open window takes it");
        assert_eq!(woken(&counted), 0);
        held.wake();
        assert_eq!(woken(&counted), 2);
        assert_eq!(held.ends, None);

        let mut at_once = HeldWakes::new(Duration::ZERO);
        at_once.wakers.push(Waker::from(counted.clone()));
        assert_eq!(at_once.handed(), None);
        assert_eq!(woken(&counted), 3);
    }

    #[test]
    fn a_bus_message_is_taken_apart_into_each_agents_batch() {
        let mut bus = bytes::BytesMut::new();
        crate::publish::section(&mut bus, "tiller.events.t.u.a", 3, 7, b"{}\n{}");
        crate::publish::section(&mut bus, "tiller.events.t.u.b", 4, 1, b"{}");
        let bus = bus.freeze();
        let found: Vec<(String, u64, u64, Vec<u64>)> = sections(&bus)
            .map(|(subject, batch)| {
                let seqs = batch.events().map(|(seq, _)| seq).collect();
                (subject.to_owned(), batch.epoch, batch.first, seqs)
            })
            .collect();
        assert_eq!(
            found,
            [
                ("tiller.events.t.u.a".to_owned(), 3, 7, vec![7, 8]),
                ("tiller.events.t.u.b".to_owned(), 4, 1, vec![1]),
            ]
        );
        // A section cut short ends the message there.
        let cut = bus.slice(..bus.len() - 1);
        assert_eq!(sections(&cut).count(), 1);
        assert_eq!(sections(&Bytes::from_static(b"garbage")).count(), 0);
    }

    #[test]
    fn live_batches_pass_in_order_from_the_first_seen() {
        let mut order = fresh(None);
        order.offer(&batch(5, 10, &["a", "b"]), false);
        order.offer(&batch(5, 12, &["c"]), false);
        assert_eq!(passed(&mut order), [10, 11, 12]);
        assert!(!order.gapped());
    }

    #[test]
    fn a_live_gap_is_filled_from_the_stream() {
        let mut order = fresh(None);
        order.offer(&batch(5, 10, &["a"]), false);
        order.offer(&batch(5, 13, &["d", "e"]), false);
        assert_eq!(passed(&mut order), [10]);
        assert!(order.gapped());
        // The stream from its start: what was passed is skipped, the gap filled.
        order.offer(&batch(5, 9, &["x", "a", "b", "c", "d"]), true);
        assert_eq!(passed(&mut order), [11, 12, 13, 14]);
        assert!(!order.gapped());
    }

    #[test]
    fn a_new_owners_jump_is_no_loss_and_an_old_owners_late_batch_is_dropped() {
        let mut order = fresh(None);
        order.offer(&batch(5, 10, &["a", "b"]), false);
        // Live-only events of the old owner, then the new owner's jump.
        order.offer(&batch(5, 12, &["c"]), false);
        order.offer(&batch(9, 5_000, &["owner_changed"]), false);
        assert_eq!(passed(&mut order), [10, 11, 12]);
        assert!(order.gapped());
        // The stream had up to 11, then the new owner's owner_changed.
        order.offer(&batch(5, 10, &["a", "b"]), true);
        order.offer(&batch(9, 5_000, &["owner_changed"]), true);
        assert_eq!(passed(&mut order), [5_000]);
        order.offer(&batch(5, 13, &["late"]), false);
        order.offer(&batch(9, 5_001, &["agent_start"]), false);
        assert_eq!(passed(&mut order), [5_001]);
    }

    #[test]
    fn what_the_stream_does_not_have_is_told_as_missed() {
        let mut order = fresh(Some(3));
        order.offer(&batch(5, 7, &["e", "f"]), true);
        assert_eq!(passed(&mut order), [-3, 7, 8]);

        let mut order = fresh(None);
        order.offer(&batch(5, 1, &["a"]), false);
        order.offer(&batch(5, 4, &["d"]), false);
        order.give_up();
        assert_eq!(passed(&mut order), [1, -2, 4]);
        assert!(!order.gapped());
    }
}
