//! What can go wrong in a cluster, as a caller can act on it.

use tiller_runtime::{AgentError, SpawnError};

/// Why a cluster request, or joining, failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The agent's owner refused or could not carry out the op (as it would
    /// have in one process).
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// No session has this id: there is no such agent to activate.
    #[error("no agent has the id `{0}`")]
    NoSuchAgent(String),
    /// The agent could not be brought up on a host (its definition is gone, a
    /// tool is missing); said by the host that tried.
    #[error("the agent `{agent}` could not be brought up: {reason}")]
    CannotActivate {
        /// The agent.
        agent: String,
        /// Why.
        reason: String,
    },
    /// The agent could not be spawned here.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// No host answered in time: NATS is away, the agent's owner is being
    /// replaced, or no host is live. Retrying later (with the same idempotency
    /// key) is safe.
    #[error("the cluster could not reach the agent `{agent}` in time: {reason}; retry")]
    Unavailable {
        /// The agent.
        agent: String,
        /// What was in the way.
        reason: String,
    },
    /// The agent's owner refused the op: the principal it was sent for may not
    /// act on this agent, or the op is not one a host may forward.
    #[error("the agent `{agent}`'s host refused the op: {reason}")]
    Forbidden {
        /// The agent.
        agent: String,
        /// Why.
        reason: String,
    },
    /// The configuration cannot be used.
    #[error("the cluster configuration cannot be used: {0}")]
    Config(String),
    /// NATS or JetStream refused or failed.
    #[error("NATS: {0}")]
    Nats(String),
    /// This host is leaving the cluster (a drain or a shutdown): it takes no new
    /// agent.
    #[error("this host is leaving the cluster")]
    Leaving,
}

impl ClusterError {
    /// Whether the same request may succeed if retried (with the same key).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClusterError::Unavailable { .. } | ClusterError::Nats(_)
        )
    }

    pub(crate) fn nats(error: impl std::fmt::Display) -> Self {
        ClusterError::Nats(error.to_string())
    }
}
