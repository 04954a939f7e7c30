//! Each agent's events as server-sent events: `id:` is the agent's sequence
//! number, `event:` the event's type, `data:` the envelope as JSON.
//!
//! A client that reconnects with `Last-Event-ID` resumes after that event with
//! nothing lost or repeated, from a bounded replay buffer the server keeps per
//! agent. Past the buffer (a client away too long), the stream starts with a
//! `lagged` notice counting what it missed; the finished messages among them are
//! in the store, for the client to read from `GET /sessions/{id}/messages`. A
//! slow client gets the same notice from its own bounded queue rather than
//! slowing the agent.
//!
//! Every stream is lean ([`tiller::wire`]): a `message_update` carries its
//! piece, and a client that cannot rebuild (it came in the middle of a message,
//! or lagged) gets that message's next update whole, as a snapshot. Each form of
//! an event is turned into JSON once and the bytes are shared by every client
//! and the replay buffer. `?updates=full` asks for every update whole.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::SelectAll;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tiller::wire::{Cursor, Frame, Updates};
use tiller::{
    AgentHandle, Delivered, Envelope,
    runtime::{AgentId, Notice, Relay, Subscription},
};
use tokio::sync::{broadcast, mpsc};

use crate::Shared;
use crate::metrics::{AgentClock, Metrics};

/// The last events of one agent, for clients that come back. It records each
/// event as the agent publishes it (a [`Relay`]: no task, no queue, no wake-up
/// per event), until it is dropped.
pub(crate) struct Replay {
    recording: Arc<Recording>,
    _relay: Relay,
}

/// What the relay writes to.
struct Recording {
    events: Mutex<VecDeque<Arc<Envelope>>>,
    capacity: usize,
}

impl Replay {
    /// Starts recording `agent`'s events, keeping the last `capacity`, and
    /// counting its runs and model calls in `metrics`.
    ///
    /// When the agent stops, the relay sends its id and this recording on
    /// `stopped`, for the server to forget both ([`Shared::forget_stopped`]).
    pub(crate) fn record(
        agent: &AgentHandle,
        capacity: usize,
        metrics: &Arc<Metrics>,
        stopped: &mpsc::UnboundedSender<Stopped>,
    ) -> Arc<Replay> {
        let recording = Arc::new(Recording {
            events: Mutex::new(VecDeque::with_capacity(capacity.min(1_024))),
            capacity: capacity.max(1),
        });
        let relay = {
            let recording = recording.clone();
            let metrics = metrics.clone();
            // The agent's model calls, timed for the metrics.
            let mut clock = AgentClock::default();
            let stopped = stopped.clone();
            agent.relay(move |envelope| {
                metrics.observe(&envelope.event, &mut clock);
                recording.push(envelope.clone());
                if let Delivered::Notice(Notice::AgentStopped { .. }) = envelope.event {
                    // The server is gone when no one receives.
                    let _ = stopped.send(Stopped {
                        agent: envelope.agent_id.clone(),
                        recording: Arc::downgrade(&recording),
                    });
                }
            })
        };
        Arc::new(Replay {
            recording,
            _relay: relay,
        })
    }

    /// The recorded events numbered after `seq` and below `until`, and how many
    /// of them are gone from the buffer. The relay records each event while the
    /// agent publishes it, under the lock a subscription is made under: every
    /// event below a live subscription's first one is here already (or was
    /// published before the recording began, and counts as gone).
    fn between(&self, seq: u64, until: u64) -> (Vec<Arc<Envelope>>, u64) {
        let events = lock(&self.recording.events);
        let kept: Vec<_> = events
            .iter()
            .filter(|envelope| envelope.seq > seq && envelope.seq < until)
            .cloned()
            .collect();
        // A client claiming an event past the last one (any number may come in a
        // header) missed nothing.
        let next = seq.saturating_add(1);
        let missed = match kept.first() {
            Some(first) => first.seq - next,
            None => until.saturating_sub(next),
        };
        (kept, missed)
    }
}

/// An agent that stopped, and the recording of its events to forget.
pub(crate) struct Stopped {
    agent: AgentId,
    recording: Weak<Recording>,
}

impl Shared {
    /// Forgets, as `stopped` says them, the replay buffer and owner of each agent
    /// that stops, however it stopped (through the API, by its host, taken over);
    /// ends with the server.
    pub(crate) async fn forget_stopped(
        shared: Weak<Shared>,
        mut stopped: mpsc::UnboundedReceiver<Stopped>,
    ) {
        while let Some(Stopped { agent, recording }) = stopped.recv().await {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            // An agent of the same id may be running again by now: only this
            // recording goes, and the owner only while no agent has the id.
            shared.replays.remove_if(&agent, |_, replay| {
                std::ptr::eq(Arc::as_ptr(&replay.recording), recording.as_ptr())
            });
            let gone = |id: &AgentId| shared.supervisor.get(id.as_str()).is_none();
            shared.owners.remove_if(&agent, |id, _| gone(id));
            shared
                .agents_held
                .by_agent
                .remove_if(&agent, |id, _| gone(id));
        }
    }
}

impl Recording {
    fn push(&self, envelope: Arc<Envelope>) {
        let mut events = lock(&self.events);
        if events.len() == self.capacity {
            events.pop_front();
        }
        events.push_back(envelope);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The events a client reads: when it came back after `last_seen`, the recorded
/// events it has not seen (or a `lagged` notice for those gone from the buffer),
/// then the live ones from `live`; each event once, in order.
pub(crate) fn envelopes(
    agent_id: AgentId,
    live: Subscription,
    replay: &Replay,
    last_seen: Option<u64>,
) -> impl Stream<Item = Arc<Envelope>> + use<> {
    let mut head = Vec::new();
    if let Some(seq) = last_seen {
        let (replayed, missed) = replay.between(seq, live.starts_at());
        if missed > 0 {
            head.push(Arc::new(Envelope::new(
                agent_id,
                seq.saturating_add(1),
                Delivered::Notice(Notice::Lagged { missed }),
            )));
        }
        head.extend(replayed);
    }
    futures::stream::iter(head).chain(live)
}

/// `?updates=lean|full`: the form of the updates a client gets (lean when not
/// said).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct UpdatesQuery {
    #[serde(default)]
    pub(crate) updates: Updates,
}

/// `data: JSON\n\n` of `value`, one server-sent event without a name,
/// appended to `out`.
pub(crate) fn sse_data(out: &mut Vec<u8>, value: &impl serde::Serialize) {
    out.extend_from_slice(b"data: ");
    // Writing to a Vec cannot fail, and what is written here serializes.
    let _ = serde_json::to_writer(&mut *out, value);
    out.extend_from_slice(b"\n\n");
}

/// A `text/event-stream` response of `frames` (each one or more whole events),
/// with a `: keep-alive` comment every `keep_alive` besides; it ends when
/// `frames` does. The frames' bytes go out as they are: a frame shared by many
/// clients is never copied for one.
pub(crate) fn event_stream(
    frames: impl Stream<Item = Bytes> + Send + 'static,
    keep_alive: Duration,
) -> Response {
    let frames = frames
        .map(Some)
        .chain(futures::stream::once(async { None }));
    let ticks = futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(keep_alive).await;
        Some((Some(Bytes::from_static(b": keep-alive\n\n")), ()))
    });
    let body = futures::stream::select(frames, ticks)
        .take_while(|frame| std::future::ready(frame.is_some()))
        .filter_map(|frame| std::future::ready(frame.map(Ok::<_, Infallible>)));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// One agent's envelopes, in order, as a client that asked for `updates` gets
/// them.
pub(crate) fn framed(
    envelopes: impl Stream<Item = Arc<Envelope>>,
    updates: Updates,
) -> impl Stream<Item = Frame> {
    let mut cursor = Cursor::new(updates);
    envelopes.map(move |envelope| cursor.frame(&envelope))
}

/// Many agents' envelopes, each agent's in order, as a client that asked for
/// `updates` gets them.
pub(crate) fn framed_each(
    envelopes: impl Stream<Item = Arc<Envelope>>,
    updates: Updates,
) -> impl Stream<Item = Frame> {
    let mut cursors = Cursors::new(updates);
    envelopes.map(move |envelope| cursors.frame(&envelope))
}

/// A client's cursor per agent, on a stream of several: each made at the
/// agent's first event, forgotten when it stops.
pub(crate) struct Cursors {
    updates: Updates,
    by_agent: HashMap<AgentId, Cursor>,
}

impl Cursors {
    /// Cursors for a client that asked for `updates`.
    pub(crate) fn new(updates: Updates) -> Self {
        Cursors {
            updates,
            by_agent: HashMap::new(),
        }
    }

    /// Forgets every agent's cursor (the client missed events).
    #[cfg(feature = "cluster")]
    pub(crate) fn clear(&mut self) {
        self.by_agent.clear();
    }

    /// `envelope` as the client gets it.
    pub(crate) fn frame(&mut self, envelope: &Envelope) -> Frame {
        if let Delivered::Notice(Notice::AgentStopped { .. }) = envelope.event {
            self.by_agent.remove(&envelope.agent_id);
            return envelope.lean().clone();
        }
        self.by_agent
            .entry(envelope.agent_id.clone())
            .or_insert_with(|| Cursor::new(self.updates))
            .frame(envelope)
    }
}

/// Every event of the agents `visible` allows, as they come, agents created
/// later (announced on `created`) joining: the stream of `GET /events`. Each
/// agent's events stay in order, lossless or with a `lagged` notice.
pub(crate) fn following(
    shared: Arc<Shared>,
    visible: impl Fn(&str) -> bool + Send + 'static,
) -> impl Stream<Item = Arc<Envelope>> + Send + 'static {
    struct Following<V> {
        shared: Arc<Shared>,
        visible: V,
        created: broadcast::Receiver<AgentId>,
        streams: SelectAll<Subscription>,
        followed: HashSet<AgentId>,
    }
    impl<V: Fn(&str) -> bool> Following<V> {
        fn follow(&mut self, id: &AgentId) {
            if (self.visible)(id.as_str())
                && !self.followed.contains(id)
                && let Some(agent) = self.shared.supervisor.get(id.as_str())
            {
                self.followed.insert(id.clone());
                self.streams
                    .push(agent.subscribe_with_buffer(self.shared.config.client_buffer));
            }
        }

        fn follow_all(&mut self) {
            for agent in self.shared.supervisor.list() {
                self.follow(&agent.id);
            }
        }
    }
    let created = shared.created.subscribe();
    let mut state = Following {
        shared,
        visible,
        created,
        streams: SelectAll::new(),
        followed: HashSet::new(),
    };
    state.follow_all();
    futures::stream::unfold(state, |mut state| async move {
        loop {
            tokio::select! {
                joined = state.created.recv() => match joined {
                    Ok(id) => state.follow(&id),
                    Err(broadcast::error::RecvError::Lagged(_)) => state.follow_all(),
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                Some(envelope) = state.streams.next(), if !state.streams.is_empty() => {
                    return Some((envelope, state));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use tiller::{AgentSettings, AgentSpec, Definitions, Supervisor};

    /// An agent its host stops (not the API) leaves no replay buffer behind.
    #[tokio::test]
    async fn what_the_server_kept_of_an_agent_goes_however_it_stops() {
        let faux = tiller::faux::FauxProvider::new();
        faux.push(tiller::faux::FauxTurn::text("Once."));
        let supervisor = Supervisor::start()
            .await
            .unwrap_or_else(|error| panic!("{error}"));
        let server = crate::Server::new(
            supervisor.clone(),
            Definitions::new(),
            crate::ServerConfig::default(),
        );
        let shared = &server.shared;
        let spec = AgentSpec::new(AgentSettings::new(faux.model())).with_id("h");
        let agent = supervisor
            .spawn(spec)
            .await
            .unwrap_or_else(|error| panic!("{error}"));
        drop(shared.follow(&agent, None));
        let _ = agent.run("hi").await;
        assert!(shared.replays.contains_key("h"));

        assert!(supervisor.stop("h").await);
        // The relay said so while the agent stopped; the server's task forgets.
        for _ in 0..100 {
            if !shared.replays.contains_key("h") {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(!shared.replays.contains_key("h"));
    }
}
