//! What a supervisor's agents share: the supervisor actor they link to, the root of
//! their cancellation tree, the configuration, the session store's writer, and
//! which actor belongs to which agent.

use std::sync::{Arc, Weak};

use dashmap::DashMap;
use ractor::{ActorCell, ActorId};
use tiller_store::StoreWriter;
use tokio_util::sync::CancellationToken;

use crate::agent::Agent;
use crate::supervisor::SupervisorConfig;

pub(crate) struct Runtime {
    /// The supervisor actor; agent actors are linked to it.
    pub(crate) supervisor: ActorCell,
    /// Every run's token descends from this one.
    pub(crate) root: CancellationToken,
    pub(crate) config: SupervisorConfig,
    /// Where agents' sessions are written, grouped into shared transactions.
    pub(crate) writer: StoreWriter,
    /// The agent of each live actor, so its failure can be answered.
    pub(crate) actors: Arc<DashMap<ActorId, Weak<Agent>>>,
}
