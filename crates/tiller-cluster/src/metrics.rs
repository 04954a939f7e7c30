//! What `/metrics` shows of the cluster: counters the cluster keeps, and what
//! the view holds now.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::Inner;

/// The cluster's counters.
#[derive(Default)]
pub(crate) struct Counters {
    forwarded: AtomicU64,
    activations: AtomicU64,
    failovers: AtomicU64,
    refusals: AtomicU64,
    fenced: AtomicU64,
    live_batches: AtomicU64,
    stream_batches: AtomicU64,
    lease_writes: AtomicU64,
    ops_refused: AtomicU64,
}

impl Counters {
    pub(crate) fn forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn activated(&self) {
        self.activations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed_over(&self) {
        self.failovers.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused(&self) {
        self.refusals.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn fenced(&self) {
        self.fenced.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn live_batch(&self) {
        self.live_batches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stream_batch(&self) {
        self.stream_batches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused_op(&self) {
        self.ops_refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn lease_write(&self) {
        self.lease_writes.fetch_add(1, Ordering::Relaxed);
    }
}

/// The cluster's figures on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterMetrics {
    /// This host.
    pub host: String,
    /// Live hosts, as this one sees them.
    pub hosts_live: usize,
    /// Leases this host holds (the agents it owns).
    pub leases_held: usize,
    /// Leases in the cluster.
    pub leases_total: usize,
    /// Requests this host forwarded to another host's agent.
    pub forwarded_requests: u64,
    /// Agents brought up here (new, taken over, moved here).
    pub activations: u64,
    /// Agents taken over here after their host died.
    pub failovers: u64,
    /// Writes refused because another owner had taken over: lease updates
    /// refused by compare-and-set and event batches refused by JetStream.
    pub fencing_refusals: u64,
    /// Times this host fenced itself (it could not renew its heartbeat).
    pub self_fences: u64,
    /// Events dropped because JetStream did not take them in time.
    pub events_dropped: u64,
    /// Batches of events published on the live path.
    pub live_batches: u64,
    /// Batches of events written to the stream.
    pub stream_batches: u64,
    /// Writes of leases that mark them busy or idle.
    pub lease_writes: u64,
    /// Ops this host's agents refused for whom they came from or what they
    /// asked ([`crate::Activator::admit`]).
    pub ops_refused: u64,
}

pub(crate) fn snapshot(inner: &Inner) -> ClusterMetrics {
    let counters = &inner.counters;
    ClusterMetrics {
        host: inner.me().to_owned(),
        hosts_live: inner.view.live(),
        leases_held: inner.owned.len(),
        leases_total: inner.view.leased().len(),
        forwarded_requests: counters.forwarded.load(Ordering::Relaxed),
        activations: counters.activations.load(Ordering::Relaxed),
        failovers: counters.failovers.load(Ordering::Relaxed),
        fencing_refusals: counters.refusals.load(Ordering::Relaxed),
        self_fences: counters.fenced.load(Ordering::Relaxed),
        events_dropped: inner.owned.iter().map(|owned| owned.outbox.dropped()).sum(),
        live_batches: counters.live_batches.load(Ordering::Relaxed),
        stream_batches: counters.stream_batches.load(Ordering::Relaxed),
        lease_writes: counters.lease_writes.load(Ordering::Relaxed),
        ops_refused: counters.ops_refused.load(Ordering::Relaxed),
    }
}
