//! What travels between hosts, as JSON: the records in the two KV buckets, the
//! requests an agent's owner answers, and activations.

use serde::{Deserialize, Serialize};
use tiller_runtime::{AgentError, AgentState, Op};

/// A host's heartbeat, the value of its key in the hosts bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostRecord {
    /// Which life of the host this is: a new one at each start and after each
    /// time it fenced itself. A lease names the life that holds it.
    pub(crate) incarnation: String,
    /// Whether the host is moving its agents away: it is not chosen for new ones.
    #[serde(default)]
    pub(crate) draining: bool,
}

/// A lease, the value of an agent's key in the leases bucket. The revision of the
/// write that claimed it is the owner's epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    /// The owner.
    pub(crate) host: String,
    /// The owner's life ([`HostRecord::incarnation`]): the lease is held while
    /// that life's heartbeat lives.
    pub(crate) incarnation: String,
    /// Whether the agent has work that must not wait for a request: a run, or
    /// queued messages. When the owner dies, such agents are taken over at
    /// once; the others come back on their next request.
    #[serde(default)]
    pub(crate) busy: bool,
}

/// What is asked of an agent's owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Request {
    /// Carry out `op` (the same `key` is never applied twice); answered once the
    /// op is durable.
    Submit {
        /// The op.
        op: Op,
        /// Its idempotency key.
        key: String,
        /// Whom the sending host authorised it for: the owner checks it
        /// against the agent's ([`crate::Activator::admit`]).
        #[serde(default)]
        on_behalf: Principal,
    },
    /// The agent's state.
    State,
    /// Stop the agent for good (its session closed) and give its lease up.
    Stop,
}

impl Request {
    /// Whether the request may leave the agent with work to do (a run, queued
    /// messages): its owner marks the lease busy before carrying it out.
    pub(crate) fn makes_work(&self) -> bool {
        match self {
            Request::Submit { op, .. } => matches!(
                op,
                Op::Prompt { .. }
                    | Op::Continue
                    | Op::Reply(_)
                    | Op::Steer { .. }
                    | Op::FollowUp { .. }
            ),
            Request::State | Request::Stop => false,
        }
    }
}

/// Whom an op was authorised for by the host that took it: a tenant and a
/// user, each `None` where the host's caller had none (an open server, a Rust
/// host acting for itself).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// The host that holds an agent, and its epoch (the revision of the lease
/// write that made it the owner; every store write of the agent carries it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The owner host's id.
    pub host: String,
    /// Its epoch.
    pub epoch: u64,
}

/// The owner's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Response {
    /// The op is carried out (and durable).
    Done,
    /// The agent's state, and who holds it.
    State {
        /// The state.
        state: Box<AgentState>,
        /// The owner's [`Holder`].
        holder: Holder,
    },
    /// The agent was stopped.
    Stopped,
}

/// A reply on the wire: the owner's answer, the agent's refusal, or word that
/// this host does not hold the agent (any more): the sender routes again.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reply {
    Ok(Response),
    Refused(AgentError),
    NotHere,
    /// The owner's host refused the op for whom it came from, or for what it
    /// asks ([`crate::Activator::admit`]).
    Forbidden(String),
    /// The owner could not mark its lease busy (NATS did not answer): nothing
    /// was carried out.
    Unavailable(String),
}

/// Why a host is asked to bring an agent up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reason {
    /// A request found no owner.
    Request,
    /// Its owner died with work left: the turn in progress is run again.
    Failover,
    /// Its owner handed it over between two turns (a drain): the run goes on.
    HandOff,
}

/// What a host asks of another.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum HostRequest {
    /// Bring this agent up (answered with [`Activated`]).
    Activate { agent: String, reason: Reason },
    /// The status of each of these agents it owns (answered with a list of
    /// pairs; an agent it does not own is left out).
    Statuses { agents: Vec<String> },
}

/// What an activation came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Activated {
    /// The agent is held here, from this epoch.
    Here { epoch: u64 },
    /// Another host holds it (and is live): send it the request.
    OwnedBy { host: String },
    /// There is no such agent.
    NoSuchAgent,
    /// It could not be brought up; `retry` says whether trying again may help.
    Failed { reason: String, retry: bool },
}
