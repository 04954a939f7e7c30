//! Following agents' events from any host: an ordered consumer of the events
//! stream, filtered to one agent's subject (or a tenant's), read as the owner
//! published it — batches of envelopes, one per line, numbered from the batch's
//! `Tiller-First` header. Events are passed on as the JSON they were published
//! as (no decoding, no encoding again). A resuming client's stream starts from
//! the oldest batch JetStream keeps and skips what it has seen; a gap in the
//! numbers (events past the owner's bound, or gone from the stream) is told as
//! a `lagged` notice, numbered like the first event missed. Across a change of
//! owner the subject stays the same, so a follower reads on without a break.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tiller::Envelope;

use crate::Inner;
use crate::error::ClusterError;
use crate::names::{EventSubject, FIRST_HEADER};

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

type Messages = Pin<
    Box<
        dyn Stream<
                Item = Result<
                    async_nats::jetstream::Message,
                    async_nats::jetstream::consumer::pull::OrderedError,
                >,
            > + Send,
    >,
>;

/// An agent's (or agents') events, as they are published. Ends after an
/// `agent_stopped` of the one agent it follows, or when NATS gives up.
pub struct Following {
    messages: Messages,
    ready: VecDeque<Followed>,
    /// The number each followed agent's next event should have (one agent's,
    /// when it follows one; none for several, whose numbers are each their own).
    next: Option<u64>,
    /// Whether it follows one agent (numbers checked, stop at its end).
    single: bool,
    done: bool,
}

impl Following {
    fn new(messages: Messages, after: Option<u64>, single: bool) -> Self {
        Following {
            messages,
            ready: VecDeque::new(),
            next: after.map(|seen| seen.saturating_add(1)),
            single,
            done: false,
        }
    }

    /// Takes one published batch apart.
    fn unpack(&mut self, message: &async_nats::Message) {
        let Some(first) = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(FIRST_HEADER))
            .and_then(|value| value.as_str().parse::<u64>().ok())
        else {
            return;
        };
        let payload = &message.payload;
        let mut seq = first;
        for line in payload.split(|byte| *byte == b'\n') {
            let this = seq;
            seq += 1;
            if self.single {
                match self.next {
                    Some(next) if this < next => continue,
                    Some(next) if this > next => self.ready.push_back(Followed::Lagged {
                        seq: next,
                        missed: this - next,
                    }),
                    _ => {}
                }
                self.next = Some(this + 1);
            }
            let start = line.as_ptr() as usize - payload.as_ptr() as usize;
            self.ready.push_back(Followed::Event {
                seq: this,
                json: payload.slice(start..start + line.len()),
            });
        }
    }
}

impl Stream for Following {
    type Item = Followed;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Followed>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                if self.single && item.event_type() == "agent_stopped" {
                    self.done = true;
                    self.ready.clear();
                }
                return Poll::Ready(Some(item));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match self.messages.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(message))) => self.unpack(&message),
                Poll::Ready(Some(Err(error))) => {
                    // The ordered consumer recreates itself after most errors.
                    tracing::debug!(%error, "following events");
                }
                Poll::Ready(None) => {
                    self.done = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A consumer of `filter` from `policy` on.
async fn consume(
    inner: &Inner,
    filter: String,
    policy: DeliverPolicy,
) -> Result<Messages, ClusterError> {
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

/// One agent's events: after `after` (replayed from what the stream keeps), or
/// from now on.
pub(crate) async fn follow(
    inner: &Inner,
    subject: &EventSubject,
    after: Option<u64>,
) -> Result<Following, ClusterError> {
    let policy = match after {
        Some(_) => DeliverPolicy::All,
        None => DeliverPolicy::New,
    };
    let messages = consume(inner, subject.subject(), policy).await?;
    Ok(Following::new(messages, after, true))
}

/// Every agent's events under `tenant` (and `user`), from now on.
pub(crate) async fn follow_all(
    inner: &Inner,
    tenant: Option<&str>,
    user: Option<&str>,
) -> Result<Following, ClusterError> {
    let messages = consume(
        inner,
        EventSubject::filter(tenant, user),
        DeliverPolicy::New,
    )
    .await?;
    Ok(Following::new(messages, None, false))
}
