//! The agent a command talks to: spawned under a supervisor, with a subscription
//! that never drops an event and the output its events are written to.

use tiller::{AgentHandle, AgentSpec, Subscription, Supervisor};

use crate::cli::AgentOptions;
use crate::outcome::Exit;
use crate::render::Output;
use crate::setup::Setup;

/// One agent, its events and where they are written.
#[derive(Debug)]
pub struct Session {
    /// The supervisor the agent runs under.
    pub supervisor: Supervisor,
    /// The agent.
    pub agent: AgentHandle,
    /// Every event of the agent, in order (unbounded: a command shows them all).
    pub events: Subscription,
    /// Where events are written.
    pub output: Output,
}

impl Session {
    /// Sets up the agent the options describe; on failure says why on stderr and
    /// answers the exit status.
    pub async fn start(options: &AgentOptions) -> Result<Session, Exit> {
        let setup = Setup::new(options).map_err(|error| {
            eprintln!("tiller: {error}");
            Exit::Usage
        })?;
        if let Some(notice) = &setup.notice {
            eprintln!("tiller: {notice}");
        }
        let failed = |error: &dyn std::fmt::Display| {
            eprintln!("tiller: {error}");
            Exit::Failed
        };
        let supervisor = Supervisor::start().await.map_err(|e| failed(&e))?;
        let agent = supervisor
            .spawn(AgentSpec::new(setup.settings).with_name(setup.name))
            .map_err(|e| failed(&e))?;
        let events = agent.subscribe_with_buffer(usize::MAX);
        Ok(Session {
            supervisor,
            agent,
            events,
            output: Output::new(options.events),
        })
    }
}
