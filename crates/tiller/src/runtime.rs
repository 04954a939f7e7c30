//! What a supervisor's agents share: the supervisor actor they link to, the root of
//! their cancellation tree, the configuration, and which actor belongs to which agent.

use std::sync::{Arc, Weak};

use dashmap::DashMap;
use ractor::{ActorCell, ActorId};
use tokio_util::sync::CancellationToken;

use crate::cell::AgentCell;
use crate::supervisor::SupervisorConfig;

pub(crate) struct Runtime {
    /// The supervisor actor; agent actors are linked to it.
    pub(crate) supervisor: ActorCell,
    /// Every run's token descends from this one.
    pub(crate) root: CancellationToken,
    pub(crate) config: SupervisorConfig,
    /// The agent of each live actor.
    pub(crate) actors: Arc<DashMap<ActorId, Weak<AgentCell>>>,
}

impl Runtime {
    /// Remembers whose actor `actor` is, so its failure can be answered.
    pub(crate) fn watch(&self, actor: ActorId, cell: &Arc<AgentCell>) {
        self.actors.insert(actor, Arc::downgrade(cell));
    }
}
