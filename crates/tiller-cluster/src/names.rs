//! The cluster's names in NATS: buckets, the events stream, subjects and keys,
//! and the rendezvous hash that places an agent on a host.
//!
//! An id becomes one subject token (and one KV key) as unpadded base64url, whose
//! alphabet NATS takes in both; a missing tenant or user is `-`, which no id
//! encodes to (an id encodes to two characters at least).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The KV bucket of agent leases: key the agent, value its owner.
pub(crate) const LEASES: &str = "tiller_leases";
/// The KV bucket of host heartbeats: key the host, value its record.
pub(crate) const HOSTS: &str = "tiller_hosts";
/// The stream every agent's events go to.
pub(crate) const EVENTS: &str = "TILLER_EVENTS";
/// The subjects of [`EVENTS`].
pub(crate) const EVENT_SUBJECTS: &str = "tiller.events.>";

/// Each host's bus: its agents' events as soon as they are published, on core
/// NATS, one message for many agents (see `publish.rs`).
pub(crate) fn bus_subject(host: &str) -> String {
    format!("tiller.bus.{}", token(host))
}

/// Every host's bus.
pub(crate) const BUSES: &str = "tiller.bus.*";

/// Headers of a batch of events.
pub(crate) const EPOCH_HEADER: &str = "Tiller-Epoch";
/// The number of a batch's first event.
pub(crate) const FIRST_HEADER: &str = "Tiller-First";

/// A published batch's owner epoch and first event number, from its headers.
pub(crate) fn stamp_of(message: &async_nats::Message) -> Option<(u64, u64)> {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(name))
            .and_then(|value| value.as_str().parse::<u64>().ok())
    };
    Some((header(EPOCH_HEADER)?, header(FIRST_HEADER)?))
}

/// `text` as one subject token or KV key.
pub(crate) fn token(text: &str) -> String {
    URL_SAFE_NO_PAD.encode(text)
}

/// An optional part (tenant, user) as one token.
fn part(text: Option<&str>) -> String {
    text.map_or_else(|| "-".to_owned(), token)
}

/// Where an agent's events go: its tenant and user are in the subject, so that
/// one filter follows a tenant's (or a user's) agents, as `GET /events` does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventSubject {
    /// The agent.
    pub agent: String,
    /// The tenant it belongs to.
    pub tenant: Option<String>,
    /// The user it belongs to.
    pub user: Option<String>,
}

impl EventSubject {
    /// The subject of the stream (the durable batches), which also names the
    /// agent's sections on the buses.
    pub(crate) fn subject(&self) -> String {
        format!(
            "tiller.events.{}.{}.{}",
            part(self.tenant.as_deref()),
            part(self.user.as_deref()),
            token(&self.agent)
        )
    }

    /// The beginning every subject of `tenant`'s agents (of `user`'s, when
    /// given; of every agent with neither) shares.
    pub(crate) fn prefix(tenant: Option<&str>, user: Option<&str>) -> String {
        match (tenant, user) {
            (None, None) => "tiller.events.".to_owned(),
            (tenant, None) => format!("tiller.events.{}.", part(tenant)),
            (tenant, user) => format!("tiller.events.{}.{}.", part(tenant), part(user)),
        }
    }
}

/// The subject an agent's owner takes its requests on (a [`crate::Request`]
/// as JSON): what a NATS user must be allowed to publish to reach it.
pub fn op_subject(agent: &str) -> String {
    format!("tiller.op.{}", token(agent))
}

/// The subject a host takes requests of other hosts on (activations, statuses).
pub(crate) fn host_subject(host: &str) -> String {
    format!("tiller.host.{}", token(host))
}

/// FNV-1a over `parts`, each followed by a zero byte: the same in every process
/// and every build, unlike the standard library's hasher.
fn fnv(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    // FNV's low bits mix poorly: a final avalanche (from MurmurHash3's fmix64).
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// `hosts` in the order they are preferred for `agent` (rendezvous hashing):
/// every host computes the same order from the same live hosts, and when one
/// host goes, only its agents change places.
pub(crate) fn preferred<'a>(agent: &str, hosts: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut ranked: Vec<(u64, &str)> = hosts
        .into_iter()
        .map(|host| (fnv(&[agent, host]), host))
        .collect();
    ranked.sort_by(|a, b| b.cmp(a));
    ranked.into_iter().map(|(_, host)| host).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_become_tokens_nats_takes() {
        let odd = "agent with spaces/and.dots>*";
        let encoded = token(odd);
        assert!(
            encoded
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{encoded}"
        );
        let subject = EventSubject {
            agent: "a".to_owned(),
            tenant: None,
            user: Some("u".to_owned()),
        };
        assert_eq!(subject.subject(), "tiller.events.-.dQ.YQ");
        assert_eq!(EventSubject::prefix(Some("t"), None), "tiller.events.dA.");
        assert_eq!(
            EventSubject::prefix(Some("t"), Some("u")),
            "tiller.events.dA.dQ."
        );
        assert_eq!(EventSubject::prefix(None, None), "tiller.events.");
        assert!(
            subject
                .subject()
                .starts_with(&EventSubject::prefix(None, Some("u")))
        );
    }

    #[test]
    fn placement_is_stable_and_moves_only_the_lost_hosts_agents() {
        let hosts = ["h1", "h2", "h3"];
        let agents: Vec<String> = (0..3_000).map(|n| format!("agent-{n}")).collect();
        let first =
            |agent: &str, hosts: &[&'static str]| preferred(agent, hosts.iter().copied())[0];
        let mut counts = std::collections::HashMap::new();
        for agent in &agents {
            *counts.entry(first(agent, &hosts)).or_insert(0) += 1;
            assert_eq!(first(agent, &hosts), first(agent, &["h3", "h1", "h2"]));
        }
        // Spread: each host gets roughly a third.
        assert!(
            counts.values().all(|&n| (800..1_200).contains(&n)),
            "{counts:?}"
        );
        for agent in &agents {
            let before = first(agent, &hosts);
            let after = first(agent, &["h1", "h3"]);
            if before != "h2" {
                assert_eq!(before, after);
            }
        }
    }
}
