//! The hosts and the leases as this host last saw them, kept by a watcher of
//! each bucket: which hosts are live (placement), who owns which agent (lists,
//! failover). The view may lag the buckets by a moment; every decision that
//! matters (a claim, a takeover) is made again by compare-and-set on the bucket
//! itself.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use async_nats::jetstream::{self, consumer};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::StreamExt;
use tokio::sync::Notify;

use crate::error::ClusterError;
use crate::names;
use crate::wire::{HostRecord, LeaseRecord};
use crate::{Inner, Leased};

/// A lease as the view holds it.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) record: LeaseRecord,
}

#[derive(Default)]
struct ViewState {
    hosts: HashMap<String, HostRecord>,
    leases: HashMap<String, Lease>,
}

/// What the watchers saw.
#[derive(Default)]
pub(crate) struct View {
    state: RwLock<ViewState>,
    /// Told when a host's life ends (its heartbeat expired, or it started anew):
    /// the failover looks for its busy agents.
    pub(crate) lost: Arc<Notify>,
}

impl View {
    fn read(&self) -> RwLockReadGuard<'_, ViewState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, ViewState> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live hosts that take agents (not draining), sorted.
    pub(crate) fn placing(&self) -> Vec<String> {
        let mut hosts: Vec<String> = self
            .read()
            .hosts
            .iter()
            .filter(|(_, record)| !record.draining)
            .map(|(host, _)| host.clone())
            .collect();
        hosts.sort();
        hosts
    }

    /// How many hosts are live.
    pub(crate) fn live(&self) -> usize {
        self.read().hosts.len()
    }

    /// The agents whose lease is busy and whose owner's life has ended.
    pub(crate) fn busy_orphans(&self) -> Vec<String> {
        let state = self.read();
        state
            .leases
            .iter()
            .filter(|(_, lease)| {
                lease.record.busy
                    && state
                        .hosts
                        .get(&lease.record.host)
                        .is_none_or(|host| host.incarnation != lease.record.incarnation)
            })
            .map(|(agent, _)| agent.clone())
            .collect()
    }

    /// Whether `agent`'s lease is busy and its owner's life has ended.
    pub(crate) fn is_busy_orphan(&self, agent: &str) -> bool {
        let state = self.read();
        state.leases.get(agent).is_some_and(|lease| {
            lease.record.busy
                && state
                    .hosts
                    .get(&lease.record.host)
                    .is_none_or(|host| host.incarnation != lease.record.incarnation)
        })
    }

    /// `agent`'s owner, when its lease is busy and the owner lives in the life
    /// that took it.
    pub(crate) fn working_owner(&self, agent: &str) -> Option<String> {
        let state = self.read();
        let lease = state.leases.get(agent)?;
        let lives = state
            .hosts
            .get(&lease.record.host)
            .is_some_and(|host| host.incarnation == lease.record.incarnation);
        (lease.record.busy && lives).then(|| lease.record.host.clone())
    }

    /// Every leased agent, sorted by id.
    pub(crate) fn leased(&self) -> Vec<Leased> {
        let mut leased: Vec<Leased> = self
            .read()
            .leases
            .iter()
            .map(|(id, lease)| Leased {
                id: id.clone(),
                host: lease.record.host.clone(),
                busy: lease.record.busy,
            })
            .collect();
        leased.sort_by(|a, b| a.id.cmp(&b.id));
        leased
    }

    /// The owner `agent`'s lease names.
    pub(crate) fn owner_of(&self, agent: &str) -> Option<String> {
        self.read()
            .leases
            .get(agent)
            .map(|lease| lease.record.host.clone())
    }

    /// Applies a heartbeat entry; whether a life ended with it.
    fn host(&self, host: String, record: Option<HostRecord>) -> bool {
        let mut state = self.write();
        let before = match record {
            Some(record) => state
                .hosts
                .insert(host, record.clone())
                .filter(|old| old.incarnation != record.incarnation),
            None => state.hosts.remove(&host),
        };
        before.is_some()
    }

    /// Applies a lease entry.
    fn lease(&self, agent: String, record: Option<LeaseRecord>) {
        let mut state = self.write();
        match record {
            Some(record) => {
                state.leases.insert(agent, Lease { record });
            }
            None => {
                state.leases.remove(&agent);
            }
        }
    }
}

/// The id a key stands for.
pub(crate) fn id_of(key: &str) -> Option<String> {
    URL_SAFE_NO_PAD
        .decode(key)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
}

/// One watched entry: its id and value, `None` when deleted or expired.
fn entry<T: serde::de::DeserializeOwned>(
    message: &jetstream::Message,
) -> Option<(String, Option<T>)> {
    let key = message
        .subject
        .as_str()
        .strip_prefix("$KV.")?
        .split_once('.')?
        .1;
    let id = id_of(key)?;
    let headers = message.headers.as_ref();
    let removed = headers.is_some_and(|headers| {
        headers.get("KV-Operation").is_some() || headers.get("Nats-Marker-Reason").is_some()
    });
    if removed {
        return Some((id, None));
    }
    serde_json::from_slice(&message.payload)
        .ok()
        .map(|value| (id, Some(value)))
}

/// Starts the watchers, returning once the view holds both buckets as they
/// stand.
pub(crate) async fn watch(inner: &Arc<Inner>) -> Result<(), ClusterError> {
    let mut hosts = watcher(inner, names::HOSTS, |view, message| {
        if let Some((host, record)) = self::entry(message) {
            view.host(host, record);
        }
    })
    .await?;
    let mut leases = watcher(inner, names::LEASES, |view, message| {
        if let Some((agent, record)) = self::entry(message) {
            view.lease(agent, record);
        }
    })
    .await?;
    inner.share_limits();
    let weak: Weak<Inner> = Arc::downgrade(inner);
    inner.keep(tokio::spawn(async move {
        while let Some(Ok(message)) = hosts.next().await {
            let Some(inner) = weak.upgrade() else { return };
            if let Some((host, record)) = self::entry(&message) {
                if inner.view.host(host, record) {
                    inner.view.lost.notify_one();
                }
                inner.share_limits();
            }
        }
        tracing::warn!("the hosts bucket's watcher ended");
    }));
    let weak: Weak<Inner> = Arc::downgrade(inner);
    inner.keep(tokio::spawn(async move {
        while let Some(Ok(message)) = leases.next().await {
            let Some(inner) = weak.upgrade() else { return };
            if let Some((agent, record)) = self::entry(&message) {
                inner.view.lease(agent, record);
            }
        }
        tracing::warn!("the leases bucket's watcher ended");
    }));
    Ok(())
}

/// How long the first load waits for a bucket's next entry before it takes
/// what it has (the rest expired meanwhile).
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A watcher of `bucket`'s keys, each key's last value first, having applied
/// what the bucket held when it started. The consumer says how many values it
/// has to deliver as it is made, so an empty bucket (or one whose entries
/// expire meanwhile) costs no wait.
async fn watcher(
    inner: &Inner,
    bucket: &str,
    apply: impl Fn(&View, &jetstream::Message),
) -> Result<consumer::push::Ordered, ClusterError> {
    let stream = inner
        .js
        .get_stream(format!("KV_{bucket}"))
        .await
        .map_err(ClusterError::nats)?;
    let consumer = stream
        .create_consumer(consumer::push::OrderedConfig {
            deliver_subject: inner.client.new_inbox(),
            filter_subject: format!("$KV.{bucket}.>"),
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            replay_policy: consumer::ReplayPolicy::Instant,
            ..Default::default()
        })
        .await
        .map_err(ClusterError::nats)?;
    let held = consumer.cached_info().num_pending;
    let mut messages = consumer.messages().await.map_err(ClusterError::nats)?;
    if held == 0 {
        return Ok(messages);
    }
    // Entries that expire meanwhile are never delivered: the wait has an end.
    while let Ok(Some(message)) = tokio::time::timeout(LOAD_WAIT, messages.next()).await {
        let message = message.map_err(ClusterError::nats)?;
        apply(&inner.view, &message);
        if message.info().map_or(true, |info| info.pending == 0) {
            break;
        }
    }
    Ok(messages)
}
