//! [`Event`]s a host publishes through the [`Supervisor`](crate::Supervisor): a
//! topic and a JSON payload ("an order was paid", "a ticket was opened"), for
//! whatever listens — the agents whose triggers match them
//! (`tiller_agents::Triggers`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest topic, in bytes.
pub const MAX_TOPIC_BYTES: usize = 256;

/// Something that happened, published for the agents that wait for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// What happened: `order.paid`, `ticket.opened`, … (at most
    /// [`MAX_TOPIC_BYTES`], no control characters).
    pub topic: String,
    /// Its data.
    pub payload: Value,
    /// The tenant it belongs to: only its triggers see it, and the agents it
    /// starts are the tenant's (`None` on a single-tenant host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The user of the tenant it comes from, when a user's: the sessions it
    /// starts are that user's own (a user sees only its own sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl Event {
    /// An event of no tenant.
    pub fn new(topic: impl Into<String>, payload: Value) -> Self {
        Event {
            topic: topic.into(),
            payload,
            tenant: None,
            user: None,
        }
    }

    /// The same event, the tenant's.
    pub fn for_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The same event, from `user` of its tenant.
    pub fn for_user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Whether the topic is one a publisher may use.
    pub fn check(&self) -> Result<(), EventError> {
        let topic = &self.topic;
        if topic.is_empty() || topic.len() > MAX_TOPIC_BYTES || topic.chars().any(char::is_control)
        {
            return Err(EventError::Topic(format!(
                "a topic is 1 to {MAX_TOPIC_BYTES} bytes without control characters"
            )));
        }
        Ok(())
    }
}

/// Why an event was not published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The topic is empty, too long or holds control characters.
    #[error("bad topic: {0}")]
    Topic(String),
    /// What listens to events has stopped (the host is shutting down).
    #[error("events are no longer taken: the host is shutting down")]
    Closed,
    /// Too many events wait to be gathered; nothing of this one was taken.
    #[error("too many events are waiting: try again shortly")]
    Full,
    /// A session key the event gives cannot name a session (empty, longer than
    /// [`MAX_ID_BYTES`](crate::MAX_ID_BYTES), control characters); nothing of
    /// it was taken.
    #[error("bad session key: {0}")]
    Key(String),
    /// The tenant holds its quota of what the event would add to (`quota`:
    /// `trigger_windows`, `trigger_bytes`, or `agents` for windows that would
    /// start one); nothing of it was taken.
    #[error("the tenant holds {max} of its {quota} quota: wait for its windows to close")]
    Quota {
        /// Which quota.
        quota: &'static str,
        /// Its bound.
        max: usize,
    },
}

/// What takes the events published through a supervisor: installed once, with
/// [`Supervisor::set_event_sink`](crate::Supervisor::set_event_sink).
pub trait EventSink: Send + Sync {
    /// Takes `event`; how many triggers it matched.
    fn publish(&self, event: Event) -> Result<usize, EventError>;
}

/// The installed sink, if any.
pub(crate) type Sink = std::sync::OnceLock<Arc<dyn EventSink>>;
