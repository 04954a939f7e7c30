//! The agent a command talks to: spawned under a supervisor, with a bounded
//! subscription and the output its events are written to.

use tiller::{
    AgentContext, AgentHandle, AgentSpec, Supervisor, SupervisorConfig, runtime::Subscription,
};

use crate::cli::AgentOptions;
use crate::outcome::Exit;
use crate::render::Output;
use crate::sessions::open_store;
use crate::setup::{Setup, SetupError};

/// The most unread events a command holds for its output: far more than a run
/// produces between two writes, and a bound on memory when stdout is stuck.
pub const EVENT_BUFFER: usize = 1 << 16;

/// One agent, its events and where they are written.
#[derive(Debug)]
pub struct Session {
    /// The supervisor the agent runs under.
    pub supervisor: Supervisor,
    /// The agent.
    pub agent: AgentHandle,
    /// Every event of the agent, in order, with room for [`EVENT_BUFFER`] unread
    /// ones; past that (an output that cannot keep up) the oldest are dropped and a
    /// `lagged` notice says how many.
    pub events: Subscription,
    /// Where events are written.
    pub output: Output,
}

impl Session {
    /// Sets up the agent the options describe; on failure says why on stderr and
    /// answers the exit status.
    pub async fn start(options: &AgentOptions) -> Result<Session, Exit> {
        // A session, and a user's memory, outlive the process: in the store.
        let supervisor = if options.session.is_some() || options.user.is_some() {
            let store = open_store(options.store.as_deref()).await?;
            Supervisor::with_store(SupervisorConfig::default(), store).await
        } else {
            Supervisor::start().await
        }
        .map_err(Exit::failed)?;
        let setup = Setup::new(options, &supervisor)
            .await
            .map_err(|error| match error {
                SetupError::Mcp(_) => Exit::failed(error),
                _ => Exit::usage(error),
            })?;
        if let Some(notice) = &setup.notice {
            crate::say!("tiller: {notice}");
        }
        let structured = setup.settings.definition.run.stream.output_schema.is_some();
        let mut spec = AgentSpec::new(setup.settings).with_name(setup.name);
        if let Some(user) = &options.user {
            spec = spec.with_context(AgentContext::new().with_user_id(user.clone()));
        }
        if let Some(session) = &options.session {
            // This invocation's agent and model, the session's conversation.
            spec = spec.with_session(session.clone()).with_own_settings();
        }
        let agent = supervisor.spawn(spec).await.map_err(Exit::failed)?;
        let events = agent.subscribe_with_buffer(EVENT_BUFFER);
        Ok(Session {
            supervisor,
            agent,
            events,
            output: Output::new(options.events).structured(structured),
        })
    }
}
