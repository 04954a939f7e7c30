//! Taking over the busy agents of a host whose life ended.
//!
//! Every host watches the heartbeats; when one expires (or its host starts a new
//! life), each live host looks for the leases that name the ended life and are
//! busy (a run, or queued input). The host rendezvous hashing prefers for an
//! agent takes it at once; the next ones wait a second more each, in case the
//! first is gone too. A takeover is a compare-and-set on the lease, so one host
//! wins. Idle agents are left for their next request, which brings them up
//! where it is preferred.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::Inner;
use crate::activate::activate;
use crate::names::preferred;
use crate::wire::{Activated, Reason};

/// How much longer each host after the preferred one waits before it takes an
/// orphan over itself.
const STAGGER: Duration = Duration::from_secs(1);

/// Starts watching for orphans (and takes over those left from before this host
/// joined).
pub(crate) fn start(inner: &Arc<Inner>) {
    inner.keep(tokio::spawn(watch(Arc::downgrade(inner))));
}

async fn watch(inner: Weak<Inner>) {
    let (parallel, every) = match inner.upgrade() {
        Some(inner) => (inner.config.parallel_moves, inner.config.lease_ttl),
        None => return,
    };
    let moves = Arc::new(Semaphore::new(parallel));
    let taking = Arc::new(Mutex::new(HashSet::new()));
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        for agent in strong.view.busy_orphans() {
            if !taking
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(agent.clone())
            {
                continue;
            }
            let placing = strong.view.placing();
            let rank = preferred(&agent, placing.iter().map(String::as_str))
                .iter()
                .position(|host| *host == strong.me());
            let Some(rank) = rank else {
                taking
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&agent);
                continue;
            };
            let (weak, moves, taking) = (inner.clone(), moves.clone(), taking.clone());
            tokio::spawn(async move {
                tokio::time::sleep(STAGGER * rank as u32).await;
                if let Ok(_slot) = moves.acquire().await
                    && let Some(inner) = weak.upgrade()
                    && inner.view.is_busy_orphan(&agent)
                {
                    match activate(&inner, &agent, Reason::Failover).await {
                        Activated::Here { epoch } => {
                            tracing::info!(%agent, epoch, "took over an agent whose host is gone");
                        }
                        other => {
                            tracing::debug!(%agent, outcome = ?other, "did not take an orphan over")
                        }
                    }
                }
                taking
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&agent);
            });
        }
        let lost = strong.view.lost.clone();
        drop(strong);
        // A missed notice is caught by the next look, a TTL later.
        let _ = tokio::time::timeout(every, lost.notified()).await;
    }
}
