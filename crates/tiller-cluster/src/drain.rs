//! Draining a host: every agent it owns moves to another host between two
//! turns, with nothing run twice (no `turn_restarted`).
//!
//! The host first says it drains (placement passes it by), then, for each agent:
//! stops answering its requests (they find no owner, and wait for the next
//! one); lets its run finish the turn in progress and pause; publishes its last
//! events; gives the lease up; and asks the host rendezvous hashing prefers now
//! to bring it up, which goes on with the run.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::Inner;
use crate::activate::{place, stop_taking};
use crate::owned::{Owned, release};
use crate::wire::{Activated, Reason};

/// What a drain did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drained {
    /// The agents now held elsewhere.
    pub moved: Vec<String>,
    /// Those that could not be moved, and why (they come back on their next
    /// request).
    pub failed: Vec<(String, String)>,
    /// For each agent moved, the time from the end of its turn (or from the
    /// start of its move, when idle) to its new owner holding it.
    pub took: Vec<Duration>,
}

pub(crate) async fn drain(inner: &Arc<Inner>) -> Drained {
    // Every run is asked to pause first, at once, so that each pauses at the
    // end of the turn it is in.
    let agents: Vec<(String, Arc<Owned>)> = inner
        .owned
        .iter()
        .map(|entry| (entry.key().clone(), entry.value().clone()))
        .collect();
    inner.life.drain();
    for (agent, owned) in &agents {
        owned.leaving();
        inner.supervisor.pause(agent);
    }
    stop_taking(inner).await;
    let moves = futures::stream::iter(agents)
        .map(|(agent, owned)| async move {
            let moved = move_away(inner, &agent, &owned).await;
            (agent, moved)
        })
        .buffer_unordered(inner.config.parallel_moves);
    let mut drained = Drained::default();
    let results: Vec<(String, Result<Duration, String>)> = moves.collect().await;
    for (agent, moved) in results {
        match moved {
            Ok(took) => {
                drained.moved.push(agent);
                drained.took.push(took);
            }
            Err(why) => drained.failed.push((agent, why)),
        }
    }
    tracing::info!(
        moved = drained.moved.len(),
        failed = drained.failed.len(),
        "drained"
    );
    drained
}

/// Moves one agent; how long it took from its turn's end.
async fn move_away(inner: &Arc<Inner>, agent: &str, owned: &Owned) -> Result<Duration, String> {
    let revision = owned
        .close()
        .await
        .ok_or_else(|| "the agent stopped meanwhile".to_owned())?;
    inner
        .supervisor
        .hand_off(agent, "moved to another host")
        .await;
    let paused = Instant::now();
    owned.outbox.flushed().await;
    inner.owned.remove(agent);
    owned.unrelay();
    release(inner, agent, revision).await;
    match place(inner, agent, Reason::HandOff).await {
        Activated::Here { .. } | Activated::OwnedBy { .. } => Ok(paused.elapsed()),
        Activated::NoSuchAgent => Err("its session is gone".to_owned()),
        Activated::Failed { reason, .. } => Err(reason),
    }
}
