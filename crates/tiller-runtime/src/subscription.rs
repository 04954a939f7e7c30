//! Subscribers: every event of an agent, wrapped in an envelope with the agent's id
//! and a per-agent sequence number, through a bounded queue per subscriber.
//!
//! Publishing never waits for a subscriber. One whose queue is full loses its oldest
//! events, is told exactly how many it missed (a `lagged` notice, numbered like the
//! first event missed) and goes on with the oldest event still queued; the others are
//! not slowed. Each subscriber picks its own bound. Dropping a [`Subscription`]
//! unsubscribes.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use serde::{Deserialize, Serialize};
use tiller_core::AgentEvent;

use crate::wakes;

/// An agent's id.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AgentId(Arc<str>);

impl AgentId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id's text, shared.
    pub(crate) fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

impl From<&str> for AgentId {
    fn from(id: &str) -> Self {
        AgentId(id.into())
    }
}

impl From<String> for AgentId {
    fn from(id: String) -> Self {
        AgentId(id.into())
    }
}

impl Borrow<str> for AgentId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// One delivery to a subscriber: `{"agent_id": …, "seq": …, "event": {"type": …}}`.
///
/// Serialized with serde it is the full form (a `message_update` with the message
/// as it stands); on a wire it is sent lean, turned into bytes once for every
/// reader ([`Envelope::lean`], see [`crate::wire`]).
#[derive(Clone, Serialize, Deserialize)]
pub struct Envelope {
    /// The agent.
    pub agent_id: AgentId,
    /// The agent's sequence number for this delivery, rising by one per event.
    pub seq: u64,
    /// The event, exactly as the loop emitted it, or a notice.
    pub event: Delivered,
    /// Its JSON forms, made at most once each.
    #[serde(skip)]
    pub(crate) json: crate::wire::Encoded,
}

impl PartialEq for Envelope {
    fn eq(&self, other: &Self) -> bool {
        (&self.agent_id, self.seq, &self.event) == (&other.agent_id, other.seq, &other.event)
    }
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("agent_id", &self.agent_id)
            .field("seq", &self.seq)
            .field("event", &self.event)
            .finish()
    }
}

impl Envelope {
    /// Event `seq` of `agent_id`.
    pub fn new(agent_id: AgentId, seq: u64, event: Delivered) -> Self {
        Envelope {
            agent_id,
            seq,
            event,
            json: crate::wire::Encoded::default(),
        }
    }

    /// The type of the event in an envelope's JSON (`message_update`,
    /// `lagged`, …), without decoding it; `event` when there is none. An
    /// envelope's fields come in order (`agent_id`, `seq`, `event`) and an
    /// event's `type` first, and inside a JSON string a quote is escaped, so the
    /// first `"event":{"type":"` is the one.
    pub fn type_in(json: &str) -> &str {
        const EVENT: &str = "\"event\":{\"type\":\"";
        json.find(EVENT)
            .map(|at| &json[at + EVENT.len()..])
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("event")
    }
}

/// What an envelope carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Delivered {
    /// An event of the agent's run.
    Event(AgentEvent),
    /// A notice about the subscription or the agent.
    Notice(Notice),
}

/// Notices the runtime adds to an agent's events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Notice {
    /// This subscriber fell behind and missed `missed` events, from the envelope's `seq` on.
    Lagged {
        /// How many events were missed.
        missed: u64,
    },
    /// The agent failed and was restarted from its last finished message.
    AgentRestarted {
        /// What failed.
        reason: String,
    },
    /// The agent stopped; no more events will come.
    AgentStopped {
        /// Why.
        reason: String,
    },
    /// Another host holds the agent from here on (a cluster's failover or
    /// drain, published by `tiller-cluster`); its events follow.
    OwnerChanged {
        /// The host that holds it now.
        host: String,
        /// The epoch of its claim, higher than any claim before.
        epoch: u64,
    },
    /// The turn the previous owner had in progress when it stopped is run again
    /// from its start: a client drops what it showed of that turn.
    TurnRestarted,
}

/// An agent's publisher.
pub(crate) struct Hub {
    subscribers: Mutex<Subscribers>,
    next_seq: AtomicU64,
}

/// The hub's mailboxes, and whether their wakes are held for a batch.
#[derive(Default)]
struct Subscribers {
    mailboxes: Vec<Arc<Mailbox>>,
    /// Set between [`Hub::hold_wakes`] and [`Hub::release_wakes`]: deliveries
    /// queue without waking their subscriber, which is woken once at the end.
    holding: bool,
}

/// One subscriber's queue, or a relay that takes each delivery as it is published.
struct Mailbox {
    capacity: usize,
    state: Mutex<MailboxState>,
}

type RelayFn = Box<dyn FnMut(&Arc<Envelope>) + Send>;

/// A callback that sees every delivery of an agent as it is published, in order
/// and without a queue (a parent's `ask_agent` passing a sub-agent's events on, a
/// server's replay buffer); made by [`crate::AgentHandle::relay`], removed when
/// dropped.
pub struct Relay {
    mailbox: Arc<Mailbox>,
    starts_at: u64,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("starts_at", &self.starts_at)
            .finish_non_exhaustive()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.mailbox.close();
    }
}

#[derive(Default)]
struct MailboxState {
    /// Set for a relay, which takes each delivery instead of queueing it.
    relay: Option<RelayFn>,
    queue: VecDeque<Arc<Envelope>>,
    /// Events dropped since the subscriber last read, and the first one's number.
    missed: u64,
    first_missed: u64,
    waker: Option<Waker>,
    /// The thread the subscriber last waited on ([`wakes::this_thread`]).
    reader: u64,
    closed: bool,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues an envelope, dropping the oldest when full, and wakes the
    /// subscriber unless `hold`; false once unsubscribed.
    fn deliver(&self, envelope: &Arc<Envelope>, hold: bool) -> bool {
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        if let Some(relay) = state.relay.as_mut() {
            relay(envelope);
            return true;
        }
        if state.queue.len() == self.capacity
            && let Some(dropped) = state.queue.pop_front()
        {
            if state.missed == 0 {
                state.first_missed = dropped.seq;
            }
            state.missed += 1;
        }
        state.queue.push_back(envelope.clone());
        if !hold {
            Self::wake_reader(state);
        }
        true
    }

    /// Wakes the subscriber if it waits and has something to read.
    fn wake(&self) {
        Self::wake_reader(self.lock());
    }

    /// Wakes the subscriber `state` belongs to, if it waits and has something
    /// to read, after letting go of the lock.
    fn wake_reader(mut state: MutexGuard<'_, MailboxState>) {
        if !state.queue.is_empty()
            && let Some(waker) = state.waker.take()
        {
            let reader = state.reader;
            drop(state);
            wakes::wake(waker, reader);
        }
    }

    fn close(&self) {
        let (waker, relay) = {
            let mut state = self.lock();
            state.closed = true;
            (state.waker.take(), state.relay.take())
        };
        // A relay's captures go now, not at the next publish.
        drop(relay);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Hub {
    /// A hub whose first delivery is numbered `first`.
    pub(crate) fn starting_at(first: u64) -> Self {
        Hub {
            subscribers: Mutex::new(Subscribers::default()),
            next_seq: AtomicU64::new(first),
        }
    }

    /// A new subscription holding at most `capacity` unread events; it sees what is
    /// published from now on.
    pub(crate) fn subscribe(&self, agent_id: &AgentId, capacity: usize) -> Subscription {
        let mailbox = Arc::new(Mailbox {
            capacity: capacity.max(1),
            state: Mutex::new(MailboxState::default()),
        });
        let starts_at = self.register(mailbox.clone());
        Subscription {
            agent_id: agent_id.clone(),
            mailbox,
            starts_at,
            done: false,
        }
    }

    /// A relay calling `relay` with every delivery published from now on, on the
    /// publishing thread, in number order. It must not block.
    pub(crate) fn relay(&self, relay: impl FnMut(&Arc<Envelope>) + Send + 'static) -> Relay {
        let mailbox = Arc::new(Mailbox {
            capacity: 0,
            state: Mutex::new(MailboxState {
                relay: Some(Box::new(relay)),
                ..MailboxState::default()
            }),
        });
        let starts_at = self.register(mailbox.clone());
        Relay { mailbox, starts_at }
    }

    /// The number the next delivery will get: everything below it is published.
    pub(crate) fn next_seq(&self) -> u64 {
        let _subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.next_seq.load(Ordering::Relaxed)
    }

    /// Adds `mailbox` to the subscribers; answers the number of the first delivery
    /// it gets. The number is read under the same lock as publishing takes it:
    /// nothing numbered below reaches the mailbox, everything from it on does.
    fn register(&self, mailbox: Arc<Mailbox>) -> u64 {
        let mut subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        subscribers.mailboxes.push(mailbox);
        self.next_seq.load(Ordering::Relaxed)
    }

    /// Publishes to every subscriber, numbering the delivery. The number is taken
    /// under the subscribers' lock, so deliveries from different threads (the
    /// actor's events, a stop notice) reach every subscriber in number order.
    pub(crate) fn publish(&self, agent_id: &AgentId, event: Delivered) {
        self.publish_with(agent_id, event, || {});
    }

    /// [`Hub::publish`], running `first` under the subscribers' lock before the
    /// event is numbered: a state change made there (the agent going idle) is never
    /// seen by another thread before the event is delivered, so nothing that
    /// thread publishes next can overtake it.
    pub(crate) fn publish_with(&self, agent_id: &AgentId, event: Delivered, first: impl FnOnce()) {
        let mut subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        first();
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        if subscribers.mailboxes.is_empty() {
            return;
        }
        let envelope = Arc::new(Envelope::new(agent_id.clone(), seq, event));
        let hold = subscribers.holding;
        subscribers
            .mailboxes
            .retain(|mailbox| mailbox.deliver(&envelope, hold));
    }

    /// From now until [`Hub::release_wakes`], deliveries wake no subscriber: a
    /// batch of events costs a subscriber on another thread one wake, not one
    /// per event.
    pub(crate) fn hold_wakes(&self) {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .holding = true;
    }

    /// Ends [`Hub::hold_wakes`], waking each subscriber that has something to
    /// read. Deliveries from other threads while held were queued under the
    /// same lock, so they are woken here too.
    pub(crate) fn release_wakes(&self) {
        let mut subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        subscribers.holding = false;
        for mailbox in &subscribers.mailboxes {
            mailbox.wake();
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        for mailbox in self
            .subscribers
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .mailboxes
            .drain(..)
        {
            mailbox.close();
        }
    }
}

/// An agent's events, in order. Ends after an `agent_stopped` notice, or when the
/// agent is gone.
pub struct Subscription {
    agent_id: AgentId,
    mailbox: Arc<Mailbox>,
    starts_at: u64,
    done: bool,
}

impl Subscription {
    /// The sequence number of the first delivery this subscription can see:
    /// everything numbered below it was published before it subscribed.
    pub fn starts_at(&self) -> u64 {
        self.starts_at
    }
}

impl Stream for Subscription {
    type Item = Arc<Envelope>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Arc<Envelope>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let mut state = self.mailbox.lock();
        if state.missed > 0 {
            let missed = std::mem::take(&mut state.missed);
            let seq = state.first_missed;
            drop(state);
            return Poll::Ready(Some(Arc::new(Envelope::new(
                self.agent_id.clone(),
                seq,
                Delivered::Notice(Notice::Lagged { missed }),
            ))));
        }
        if let Some(envelope) = state.queue.pop_front() {
            drop(state);
            if matches!(
                envelope.event,
                Delivered::Notice(Notice::AgentStopped { .. })
            ) {
                self.done = true;
            }
            return Poll::Ready(Some(envelope));
        }
        if state.closed {
            drop(state);
            self.done = true;
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        state.reader = wakes::this_thread();
        Poll::Pending
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.mailbox.close();
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("agent_id", &self.agent_id)
            .field("queued", &self.mailbox.lock().queue.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn lagged(missed: u64) -> Delivered {
        Delivered::Notice(Notice::Lagged { missed })
    }

    #[test]
    fn a_held_batch_wakes_a_waiting_subscriber_once_and_delivers_all_of_it_in_order() {
        let id = AgentId::from("a");
        let hub = Hub::starting_at(0);
        let mut subscription = hub.subscribe(&id, 16);
        let wakes = Arc::new(Counting::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut subscription).poll_next(&mut cx).is_pending());

        hub.hold_wakes();
        for missed in 1..=3 {
            hub.publish(&id, lagged(missed));
        }
        assert_eq!(wakes.0.load(Ordering::Relaxed), 0, "no wake while held");
        hub.release_wakes();
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1, "one wake for the batch");

        for (seq, missed) in (0..3).zip(1..=3) {
            let Poll::Ready(Some(envelope)) = Pin::new(&mut subscription).poll_next(&mut cx) else {
                panic!("delivery {seq} is ready");
            };
            assert_eq!((envelope.seq, &envelope.event), (seq, &lagged(missed)));
        }
        assert!(Pin::new(&mut subscription).poll_next(&mut cx).is_pending());

        // Unheld, each delivery wakes the subscriber waiting for it.
        hub.publish(&id, lagged(4));
        assert_eq!(wakes.0.load(Ordering::Relaxed), 2);
    }
}
