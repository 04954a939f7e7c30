//! Quotas and counted shares: how many of something each holder has at once.
//!
//! [`Counts`] is what the server bounds by holder: event streams per caller (at
//! most [`crate::ServerConfig::max_streams_per_caller`] server-sent events,
//! WebSockets, `GET /events` and pi proxy calls, counted per token: its tenant and
//! user, whatever headers a gateway adds; everyone is one caller on an open
//! server; 429 `too-many-streams` past it), connections per address
//! ([`crate::connections`]), and live agents per tenant and per user.
//!
//! [`Quotas`] bound what a caller can make: live agents and stored sessions per
//! tenant and per user, trigger windows and their bytes per tenant, and a
//! tenant's event streams and MCP sessions. The server's defaults are
//! [`crate::ServerConfig::tenant_quotas`] and [`crate::ServerConfig::user_quotas`];
//! a token file gives a tenant its own (`tenants: {acme: {quotas: {agents: 50},
//! user_quotas: {agents: 5}}}`). Past one, 429 `quota-exceeded`, its `field`
//! naming the quota (`quotas.agents`, `user_quotas.sessions`, …).

use std::hash::Hash;
use std::sync::Arc;

use axum::http::StatusCode;
use dashmap::DashMap;
use serde::Deserialize;
use tiller::runtime::AgentId;

use crate::Shared;
use crate::error::Problem;
use crate::tenants::{Caller, Scope};

/// How many each holder has open; a holder with none is not kept.
pub(crate) struct Counts<K: Eq + Hash>(Arc<DashMap<K, usize>>);

impl<K: Eq + Hash> Default for Counts<K> {
    fn default() -> Self {
        Counts(Arc::default())
    }
}

impl<K: Eq + Hash + Clone> Counts<K> {
    /// One more for `holder`, unless it holds `max` already; given back when the
    /// returned share is dropped.
    pub(crate) fn take(&self, holder: K, max: usize) -> Option<Share<K>> {
        let mut held = self.0.entry(holder.clone()).or_insert(0);
        if *held >= max {
            return None;
        }
        *held += 1;
        Some(Share {
            counts: self.0.clone(),
            holder,
        })
    }

    /// How many `holder` holds.
    pub(crate) fn held(&self, holder: &K) -> usize {
        self.0.get(holder).map_or(0, |held| *held)
    }
}

/// One of a holder's shares, given back when dropped.
pub(crate) struct Share<K: Eq + Hash> {
    counts: Arc<DashMap<K, usize>>,
    holder: K,
}

impl<K: Eq + Hash> Drop for Share<K> {
    fn drop(&mut self) {
        self.counts.remove_if_mut(&self.holder, |_, held| {
            *held -= 1;
            *held == 0
        });
    }
}

/// One open stream of a caller: its share of the caller's and of its tenant's.
pub(crate) struct StreamSlot {
    _caller: Share<Scope>,
    _tenant: Share<Option<String>>,
}

impl Shared {
    /// A slot for one more stream of `caller`, if it and its tenant have room.
    pub(crate) fn stream_slot(&self, caller: &Caller) -> Result<StreamSlot, Problem> {
        let max = self.config.max_streams_per_caller;
        let holder = &caller.token_holder;
        let mine = self.streams.take(holder.clone(), max).ok_or_else(|| {
            Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-streams",
                format!(
                    "you hold {max} event streams open, the most one caller may: close one first"
                ),
            )
        })?;
        let tenant_max = self
            .quotas_of(holder.tenant.as_deref())
            .0
            .streams
            .unwrap_or(usize::MAX);
        let tenant = self
            .tenant_streams
            .take(holder.tenant.clone(), tenant_max)
            .ok_or_else(|| {
                exceeded(
                    "quotas.streams",
                    &tenant_name(holder),
                    tenant_max,
                    "event streams open",
                )
            })?;
        Ok(StreamSlot {
            _caller: mine,
            _tenant: tenant,
        })
    }
}

/// What one tenant, or one user of it, may hold at once; `None` is no bound of
/// its own (the server's default, or none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Quotas {
    /// Live agents (created or resumed through the API, or by triggers, until
    /// deleted or stopped; a hibernating agent is live).
    pub agents: Option<usize>,
    /// Sessions the store keeps (active or closed), counted when a new one is
    /// made.
    pub sessions: Option<usize>,
    /// Trigger windows open at once (each a session an event will prompt).
    pub trigger_windows: Option<usize>,
    /// Bytes of the event payloads waiting in them.
    pub trigger_bytes: Option<usize>,
    /// Event streams open at once (a tenant's; per caller,
    /// [`crate::ServerConfig::max_streams_per_caller`] bounds each token).
    pub streams: Option<usize>,
    /// MCP sessions open at once on `/mcp`.
    pub mcp_sessions: Option<usize>,
}

impl Quotas {
    /// These, each left `None` taken from `defaults`.
    pub fn or(self, defaults: Quotas) -> Quotas {
        Quotas {
            agents: self.agents.or(defaults.agents),
            sessions: self.sessions.or(defaults.sessions),
            trigger_windows: self.trigger_windows.or(defaults.trigger_windows),
            trigger_bytes: self.trigger_bytes.or(defaults.trigger_bytes),
            streams: self.streams.or(defaults.streams),
            mcp_sessions: self.mcp_sessions.or(defaults.mcp_sessions),
        }
    }

    /// A tenant's defaults: 1,000 live agents, 100,000 sessions, 1,000 trigger
    /// windows holding 16 MiB, 256 streams, the server's MCP sessions per tenant.
    pub fn tenant_defaults() -> Quotas {
        Quotas {
            agents: Some(1_000),
            sessions: Some(100_000),
            trigger_windows: Some(1_000),
            trigger_bytes: Some(16 << 20),
            streams: Some(256),
            mcp_sessions: None,
        }
    }

    /// A user's defaults: 100 live agents, 10,000 sessions.
    pub fn user_defaults() -> Quotas {
        Quotas {
            agents: Some(100),
            sessions: Some(10_000),
            ..Quotas::default()
        }
    }
}

/// 429 `quota-exceeded`: `holder` has `max` of what `quota` (its field in the
/// token file) counts.
pub(crate) fn exceeded(quota: &str, holder: &str, max: usize, what: &str) -> Problem {
    Problem {
        field: Some(quota.to_owned()),
        ..Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "quota-exceeded",
            format!("{holder} has {max} {what}, its quota (`{quota}`): free some first"),
        )
    }
}

/// The shares a live agent holds of its tenant's and its user's quotas.
pub(crate) struct AgentShares {
    _tenant: Share<Option<String>>,
    _user: Option<Share<Scope>>,
}

impl Shared {
    /// The quotas of `tenant` (`None` on an open server) and of each of its
    /// users.
    pub(crate) fn quotas_of(&self, tenant: Option<&str>) -> (Quotas, Quotas) {
        let config = &self.config;
        let (tenant, user) = tenant
            .map(|tenant| config.tokens.quotas(tenant))
            .unwrap_or_default();
        (tenant.or(config.tenant_quotas), user.or(config.user_quotas))
    }

    /// A live agent's shares of `owner`'s quotas, unless its tenant or its
    /// user holds its quota of live agents already (`admitted`: counted
    /// whatever it holds, an agent admitted before).
    pub(crate) fn agent_shares(
        &self,
        owner: &Scope,
        admitted: bool,
    ) -> Result<AgentShares, Problem> {
        let (tenant, user) = self.quotas_of(owner.tenant.as_deref());
        let bound = |max: Option<usize>| {
            if admitted {
                usize::MAX
            } else {
                max.unwrap_or(usize::MAX)
            }
        };
        let tenant_max = bound(tenant.agents);
        let holder = tenant_name(owner);
        let tenant_share = self
            .agents_held
            .tenants
            .take(owner.tenant.clone(), tenant_max)
            .ok_or_else(|| exceeded("quotas.agents", &holder, tenant_max, "live agents"))?;
        let user_share = match &owner.user {
            None => None,
            Some(name) => {
                let max = bound(user.agents);
                Some(
                    self.agents_held
                        .users
                        .take(owner.clone(), max)
                        .ok_or_else(|| {
                            exceeded(
                                "user_quotas.agents",
                                &format!("user `{name}`"),
                                max,
                                "live agents",
                            )
                        })?,
                )
            }
        };
        Ok(AgentShares {
            _tenant: tenant_share,
            _user: user_share,
        })
    }

    /// Refuses a new session of `owner` when its tenant or its user keeps its
    /// quota of sessions already; resuming `session`, one the store keeps, is
    /// no new one.
    pub(crate) async fn check_sessions(
        &self,
        owner: &Scope,
        session: Option<&str>,
    ) -> Result<(), Problem> {
        let (tenant, user) = self.quotas_of(owner.tenant.as_deref());
        let user_bound = owner.user.is_some() && user.sessions.is_some();
        if tenant.sessions.is_none() && !user_bound {
            return Ok(());
        }
        if let Some(session) = session
            && self
                .supervisor
                .store()
                .count(&tiller::store::SessionFilter::only(session))
                .await?
                > 0
        {
            return Ok(());
        }
        let every = tiller::store::SessionFilter::default();
        self.within_stored(
            owner,
            every,
            "sessions",
            (tenant.sessions, user.sessions),
            "sessions",
        )
        .await
    }

    /// In a cluster, whose agents live on every host: the owner's live agents
    /// are its active sessions in the shared store, counted against its
    /// quotas (agents created at the same moment on two hosts may pass it
    /// together by a few). One admitted before is not refused.
    #[cfg(feature = "cluster")]
    pub(crate) async fn check_cluster_agents(
        &self,
        owner: &Scope,
        admitted: bool,
    ) -> Result<(), Problem> {
        if admitted {
            return Ok(());
        }
        let (tenant, user) = self.quotas_of(owner.tenant.as_deref());
        let active = tiller::store::SessionFilter {
            status: Some(tiller::store::SessionStatus::Active),
            ..Default::default()
        };
        self.within_stored(
            owner,
            active,
            "agents",
            (tenant.agents, user.agents),
            "live agents",
        )
        .await
    }

    /// Refuses one more of the sessions `filter` matches when `owner`'s tenant,
    /// or its user, keeps its quota `quota` of them already (`maxes`: the
    /// tenant's and the user's bounds).
    async fn within_stored(
        &self,
        owner: &Scope,
        mut filter: tiller::store::SessionFilter,
        quota: &str,
        (tenant_max, user_max): (Option<usize>, Option<usize>),
        what: &str,
    ) -> Result<(), Problem> {
        let store = self.supervisor.store();
        filter.tenant_id.clone_from(&owner.tenant);
        if let Some(max) = tenant_max
            && store.count(&filter).await? >= max as u64
        {
            return Err(exceeded(
                &format!("quotas.{quota}"),
                &tenant_name(owner),
                max,
                what,
            ));
        }
        if let (Some(name), Some(max)) = (&owner.user, user_max) {
            filter.user_id = Some(name.clone());
            if store.count(&filter).await? >= max as u64 {
                return Err(exceeded(
                    &format!("user_quotas.{quota}"),
                    &format!("user `{name}`"),
                    max,
                    what,
                ));
            }
        }
        Ok(())
    }
}

/// The live agents each tenant and each user holds, and each agent's shares.
#[derive(Default)]
pub(crate) struct AgentsHeld {
    tenants: Counts<Option<String>>,
    users: Counts<Scope>,
    /// Each live agent's shares, given back when it stops.
    pub(crate) by_agent: DashMap<AgentId, AgentShares>,
}

impl AgentsHeld {
    /// The live agents of `tenant`.
    pub(crate) fn of_tenant(&self, tenant: &Option<String>) -> usize {
        self.tenants.held(tenant)
    }
}

/// A tenant as a problem names it.
pub(crate) fn tenant_name(scope: &Scope) -> String {
    match &scope.tenant {
        Some(tenant) => format!("tenant `{tenant}`"),
        None => "this server".to_owned(),
    }
}
