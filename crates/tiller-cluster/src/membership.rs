//! This host's heartbeat: a key in the hosts bucket, written by
//! compare-and-set every `renew_every`, which NATS expires `lease_ttl` after
//! its last write. The host's leases live as long as it does.
//!
//! A host that has not renewed within `lease_ttl − fence_margin` of the moment
//! its last successful renewal was *sent* fences itself: it stops every agent it
//! owns (their runs cancelled, nothing more written, their requests no longer
//! answered) and starts a new life (a new incarnation), which no lease names. NATS
//! expires the heartbeat `lease_ttl` after it *stored* that renewal, later than it
//! was sent, so the host has stopped before any other host may take its agents.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};
use tokio::time::Instant;

use crate::error::ClusterError;
use crate::names::token;
use crate::wire::HostRecord;
use crate::{Inner, owned};

/// This host's life in the cluster.
pub(crate) struct Life {
    state: Mutex<LifeState>,
}

struct LifeState {
    record: HostRecord,
    /// The revision of the host's key this life last wrote.
    revision: u64,
    /// Whether the key holds this life's record: only then does the host take
    /// agents.
    registered: bool,
    /// When the last successful write of the key was sent.
    renewed: Instant,
}

impl Life {
    pub(crate) fn new() -> Self {
        Life {
            state: Mutex::new(LifeState {
                record: HostRecord {
                    incarnation: tiller_ai::new_id(),
                    draining: false,
                },
                revision: 0,
                registered: false,
                renewed: Instant::now(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LifeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The incarnation that may claim agents: `None` while the host is not
    /// registered (it fenced itself and has not renewed since) or drains.
    pub(crate) fn claiming(&self) -> Option<String> {
        let state = self.lock();
        (state.registered && !state.record.draining).then(|| state.record.incarnation.clone())
    }

    /// Whether this life may still act as an owner: registered, and renewed
    /// within `fence_after` (a host woken from a pause is not, before its
    /// heartbeat task has even run).
    pub(crate) fn fresh(&self, fence_after: std::time::Duration) -> bool {
        let state = self.lock();
        state.registered && state.renewed.elapsed() < fence_after
    }

    /// Marks the host as draining (written with the next renewal).
    pub(crate) fn drain(&self) {
        self.lock().record.draining = true;
    }

    /// Ends this life: the next write of the key starts a new one.
    fn end(&self) {
        let mut state = self.lock();
        state.record.incarnation = tiller_ai::new_id();
        state.registered = false;
    }
}

/// Writes this life's record: by compare-and-set over the revision this life
/// wrote last; when the key no longer holds that revision (it expired, or this
/// host's previous process wrote it), this life is over if it was registered,
/// and the key is written anew for the next one.
async fn write(inner: &Inner) -> Result<(), ClusterError> {
    let key = token(inner.me());
    let (value, revision) = {
        let state = inner.life.lock();
        (record_value(&state.record)?, state.revision)
    };
    let sent = Instant::now();
    let updated = match revision {
        0 => None,
        revision => match inner.hosts.update(&key, value, revision).await {
            Ok(revision) => Some(revision),
            Err(error) if error.kind() == UpdateErrorKind::WrongLastRevision => {
                if inner.life.lock().registered {
                    fence(inner, "its heartbeat expired before it was renewed");
                }
                None
            }
            Err(error) => return Err(ClusterError::nats(error)),
        },
    };
    let revision = match updated {
        Some(revision) => revision,
        None => replace(inner, &key).await?,
    };
    let mut state = inner.life.lock();
    state.revision = revision;
    state.registered = true;
    state.renewed = sent;
    Ok(())
}

/// A host record as the bucket keeps it.
fn record_value(record: &HostRecord) -> Result<bytes::Bytes, ClusterError> {
    serde_json::to_vec(record)
        .map(Into::into)
        .map_err(ClusterError::nats)
}

/// Writes this life's record over whatever the key holds; its revision.
async fn replace(inner: &Inner, key: &str) -> Result<u64, ClusterError> {
    let value = record_value(&inner.life.lock().record)?;
    match inner.hosts.create(key, value.clone()).await {
        Ok(revision) => Ok(revision),
        Err(error) if error.kind() == CreateErrorKind::AlreadyExists => {
            let current = inner
                .hosts
                .entry(key)
                .await
                .map_err(ClusterError::nats)?
                .map_or(0, |entry| entry.revision);
            inner
                .hosts
                .update(key, value, current)
                .await
                .map_err(ClusterError::nats)
        }
        Err(error) => Err(ClusterError::nats(error)),
    }
}

/// Registers a new life of this host.
pub(crate) async fn register(inner: &Arc<Inner>) -> Result<(), ClusterError> {
    write(inner).await
}

/// Writes the record now (a drain's mark), rather than at the next renewal.
pub(crate) async fn announce(inner: &Inner) -> Result<(), ClusterError> {
    write(inner).await
}

/// Starts the heartbeat.
pub(crate) fn start(inner: &Arc<Inner>) {
    inner.keep(tokio::spawn(heartbeat(Arc::downgrade(inner))));
}

async fn heartbeat(inner: Weak<Inner>) {
    let every = match inner.upgrade() {
        Some(inner) => inner.config.renew_every,
        None => return,
    };
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // A write that hangs (NATS electing a leader) is given up at the next tick.
        match tokio::time::timeout(every, write(&inner)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, "the heartbeat was not renewed"),
            Err(_) => tracing::debug!("the heartbeat's renewal timed out"),
        }
        let overdue = {
            let state = inner.life.lock();
            state.registered && state.renewed.elapsed() > inner.config.fence_after()
        };
        if overdue {
            fence(
                &inner,
                &format!(
                    "its host could not renew its heartbeat for {:?}",
                    inner.config.fence_after()
                ),
            );
        }
    }
}

/// Fences this host: every agent it owns stops at once, and its life ends (the
/// next renewal starts a new one, which no lease names).
pub(crate) fn fence(inner: &Inner, reason: &str) {
    tracing::warn!(host = %inner.me(), %reason, "host fenced itself");
    inner.life.end();
    inner.counters.fenced();
    owned::evict_all(inner, reason);
}
