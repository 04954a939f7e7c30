//! [`ClusterConfig`]: how a host joins the cluster, and the timings and bounds
//! the cluster keeps. `docs/cluster.md` says why the default timings hold.

use std::time::Duration;

use crate::connect::{NatsSecurity, NatsUrl};
use crate::error::ClusterError;

/// How a host joins the cluster. Every host of one cluster must be given the same
/// lease TTL: the first host to join sets it on the hosts bucket, and a host given
/// another is refused ([`ClusterError::Config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The NATS servers (`nats://HOST:PORT`, `tls://HOST:PORT`, perhaps with
    /// `USER:PASSWORD@` or `TOKEN@`), any of the cluster's nodes: the client
    /// moves to another when one is lost.
    pub servers: Vec<NatsUrl>,
    /// The host's credentials and TLS beside its URLs.
    pub security: NatsSecurity,
    /// This host's id, unique in the cluster (letters, digits, `-`, `_` and `.`,
    /// at most [`MAX_HOST_ID_BYTES`]). A host that restarts under the same id
    /// takes over its own heartbeat at once, and its old leases become orphans.
    pub host_id: String,
    /// How long a host's heartbeat lives without renewal: a host silent that long
    /// is dead, and its agents are taken over. Must exceed a JetStream leader
    /// election (5.5–7.5 s measured on loopback), so that losing a NATS node costs
    /// no lease.
    pub lease_ttl: Duration,
    /// How much earlier than `lease_ttl` a host that could not renew fences
    /// itself: it stops its agents once `lease_ttl − fence_margin` has passed
    /// since its last successful renewal was sent, before anyone may take them.
    pub fence_margin: Duration,
    /// How often the heartbeat is renewed (and retried while NATS is away).
    pub renew_every: Duration,
    /// How long a forwarded request may take, retries and activations included,
    /// before it is answered 503 with a retry (a request sent while its agent's
    /// owner is being replaced waits up to this long).
    pub request_deadline: Duration,
    /// How many NATS nodes keep each lease, heartbeat and event (at most the
    /// cluster's size).
    pub replicas: usize,
    /// How many published batches of events JetStream keeps per agent, for
    /// clients resuming with `Last-Event-ID`; finished messages stay in the store.
    pub event_batches_kept: i64,
    /// How long JetStream keeps an agent's events.
    pub event_retention: Duration,
    /// The most events an owner holds while JetStream does not take them (a NATS
    /// leader election); past it the oldest are dropped, and followers are told
    /// how many they missed.
    pub max_unpublished_events: usize,
    /// The most bytes one published batch of events holds (under NATS's message
    /// size limit, 1 MiB by default).
    pub max_batch_bytes: usize,
    /// How long an owner gathers its agent's events before it writes them to
    /// the stream as one batch (they reach followers at once on the live path;
    /// the stream serves resumes and fences owners). A run's end goes at once.
    /// Shorter windows cost the replicated stream more writes: 1 s by default.
    pub durable_window: Duration,
    /// The least time between two messages on this host's bus: events that
    /// come sooner wait for the next one (at most this long), so that a busy
    /// host sends many agents' events in one message. The first event after a
    /// quiet spell goes at once.
    pub live_interval: Duration,
    /// How long this host's listener holds its wakes of followers (each
    /// reading an agent of another host) after it hands them events: each is
    /// woken once at the end with everything handed meanwhile, however many
    /// hosts' bus messages came (as
    /// [`SupervisorConfig::delivery_window`](tiller_runtime::SupervisorConfig::delivery_window)
    /// does for subscribers). Zero wakes them at once; at most 1 s; 1 ms by
    /// default.
    pub delivery_window: Duration,
    /// How many agents a failover or a drain brings up or moves at once.
    pub parallel_moves: usize,
    /// How long an agent stays idle before its lease is marked idle (so that a
    /// failover leaves it for its next request): one write of the lease per
    /// idle spell, not per run.
    pub idle_after: Duration,
}

/// The longest host id, in bytes.
pub const MAX_HOST_ID_BYTES: usize = 128;

impl ClusterConfig {
    /// The defaults for `servers` and this host's id.
    pub fn new(servers: Vec<NatsUrl>, host_id: impl Into<String>) -> Self {
        ClusterConfig {
            servers,
            security: NatsSecurity::default(),
            host_id: host_id.into(),
            lease_ttl: Duration::from_secs(15),
            fence_margin: Duration::from_secs(3),
            renew_every: Duration::from_secs(1),
            request_deadline: Duration::from_secs(30),
            replicas: 3,
            event_batches_kept: 1_024,
            event_retention: Duration::from_secs(3_600),
            max_unpublished_events: 65_536,
            max_batch_bytes: 512 << 10,
            durable_window: Duration::from_secs(1),
            live_interval: Duration::from_millis(2),
            delivery_window: Duration::from_millis(1),
            parallel_moves: 32,
            idle_after: Duration::from_secs(30),
        }
    }

    /// The servers of `--cluster`: URLs separated by commas.
    pub fn servers_from(list: &str) -> Vec<NatsUrl> {
        list.split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(NatsUrl::from)
            .collect()
    }

    /// How long after its last successful renewal was sent a host fences itself.
    pub fn fence_after(&self) -> Duration {
        self.lease_ttl.saturating_sub(self.fence_margin)
    }

    /// Refuses a configuration whose timings cannot hold or whose id is not one.
    pub fn check(&self) -> Result<(), ClusterError> {
        let refuse = |reason: String| Err(ClusterError::Config(reason));
        crate::connect::check(self)?;
        let id = &self.host_id;
        if id.is_empty()
            || id.len() > MAX_HOST_ID_BYTES
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return refuse(format!(
                "the host id `{}` is not one: letters, digits, `-`, `_` and `.`, at most {MAX_HOST_ID_BYTES} bytes",
                id.escape_debug()
            ));
        }
        if self.lease_ttl < Duration::from_secs(2) {
            return refuse(format!(
                "the lease TTL ({:?}) is under 2 s; NATS keeps per-message ages in seconds",
                self.lease_ttl
            ));
        }
        if self.renew_every.is_zero() || self.renew_every * 2 > self.fence_after() {
            return refuse(format!(
                "renewing every {:?} leaves less than two renewals before fencing at {:?} (TTL {:?} − margin {:?})",
                self.renew_every,
                self.fence_after(),
                self.lease_ttl,
                self.fence_margin
            ));
        }
        if self.fence_margin.is_zero() {
            return refuse("the fence margin must be above zero".to_owned());
        }
        if self.replicas == 0 || self.replicas > 5 {
            return refuse(format!(
                "{} replicas: JetStream keeps 1 to 5",
                self.replicas
            ));
        }
        if self.max_batch_bytes < 1_024 || self.max_unpublished_events == 0 {
            return refuse("the event bounds are too small".to_owned());
        }
        if self.live_interval > Duration::from_secs(1)
            || self.delivery_window > Duration::from_secs(1)
            || self.durable_window > Duration::from_secs(10)
        {
            return refuse(format!(
                "events would wait too long: a live interval of {:?} and a delivery window of {:?} (each at most 1 s), a durable window of {:?} (at most 10 s)",
                self.live_interval, self.delivery_window, self.durable_window
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ClusterConfig {
        ClusterConfig::new(vec!["nats://127.0.0.1:4222".into()], "h1")
    }

    #[test]
    fn the_defaults_hold() {
        assert_eq!(config().check(), Ok(()));
        assert_eq!(config().fence_after(), Duration::from_secs(12));
        assert_eq!(
            ClusterConfig::servers_from("nats://a:1, nats://b:2,"),
            [NatsUrl::from("nats://a:1"), NatsUrl::from("nats://b:2")]
        );
    }

    #[test]
    fn timings_that_cannot_hold_and_bad_ids_are_refused() {
        let refused = |change: fn(&mut ClusterConfig)| {
            let mut config = config();
            change(&mut config);
            matches!(config.check(), Err(ClusterError::Config(_)))
        };
        assert!(refused(|c| c.servers.clear()));
        assert!(refused(|c| c.servers = vec!["http://x".into()]));
        assert!(refused(|c| c.host_id = "a b".to_owned()));
        assert!(refused(|c| c.host_id = String::new()));
        assert!(refused(|c| c.host_id = "h".repeat(200)));
        assert!(refused(|c| c.lease_ttl = Duration::from_secs(1)));
        assert!(refused(|c| c.renew_every = Duration::from_secs(7)));
        assert!(refused(|c| c.fence_margin = Duration::ZERO));
        assert!(refused(|c| c.replicas = 0));
        assert!(refused(|c| c.live_interval = Duration::from_secs(2)));
        assert!(refused(|c| c.delivery_window = Duration::from_secs(2)));
        assert!(refused(|c| c.durable_window = Duration::from_secs(60)));
    }
}
