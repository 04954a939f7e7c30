//! What a supervisor's agents share: the supervisor actor they link to, the root of
//! their cancellation tree, the configuration, the session store's writer, and the
//! stored form of the settings they were last spawned with.

use std::sync::{Arc, Mutex};

use ractor::ActorCell;
use tiller_store::{Definition, StoreWriter};
use tokio_util::sync::CancellationToken;

use crate::route::lock;
use crate::settings::AgentSettings;
use crate::supervisor::SupervisorConfig;

pub(crate) struct Runtime {
    /// The supervisor actor; agent actors are linked to it.
    pub(crate) supervisor: ActorCell,
    /// Every run's token descends from this one.
    pub(crate) root: CancellationToken,
    pub(crate) config: SupervisorConfig,
    /// Where agents' sessions are written, grouped into shared transactions.
    pub(crate) writer: StoreWriter,
    /// The settings a definition was last made for, and that definition: agents
    /// spawned from one shared `Arc<AgentSettings>` encode it once.
    pub(crate) last_definition: Mutex<Option<(Arc<AgentSettings>, Definition)>>,
}

impl Runtime {
    /// The stored form of `settings`.
    pub(crate) fn definition_of(&self, settings: &Arc<AgentSettings>) -> Definition {
        let mut last = lock(&self.last_definition);
        if let Some((made_for, definition)) = &*last
            && Arc::ptr_eq(made_for, settings)
        {
            return definition.clone();
        }
        let definition = Definition::new(&settings.definition.stored()).unwrap_or_default();
        *last = Some((settings.clone(), definition.clone()));
        definition
    }
}
