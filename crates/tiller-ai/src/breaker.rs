//! Circuit breakers, one per provider endpoint, shared by every agent of a process.
//!
//! A breaker counts an endpoint's failures that retrying did not fix
//! ([`StreamError::is_unavailable`]: a 5xx after the retries, an overloaded
//! provider, a timeout, no connection). After [`BreakerPolicy::failures`] in a row
//! it opens: calls to the endpoint fail at once with [`StreamError::CircuitOpen`]
//! (an agent with fallback models moves on to the next without waiting). After
//! [`BreakerPolicy::open_for`] one call goes through as a probe; its success closes
//! the breaker, its failure opens it again for as long.
//!
//! [`StreamError::is_unavailable`]: crate::StreamError::is_unavailable
//! [`StreamError::CircuitOpen`]: crate::StreamError::CircuitOpen

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::lock;
use crate::model::Model;

/// When a breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerPolicy {
    /// Failures in a row that open the breaker (at least 1). Default 5.
    pub failures: u32,
    /// How long it stays open before a probe. Default 30 s.
    #[serde(rename = "open_for_ms", with = "crate::millis")]
    pub open_for: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            failures: 5,
            open_for: Duration::from_secs(30),
        }
    }
}

/// The breakers of one process, one per endpoint (a provider at an address).
/// Cloning is cheap and shares them.
#[derive(Clone, Default)]
pub struct Breakers {
    policy: BreakerPolicy,
    endpoints: Arc<Mutex<HashMap<String, Breaker>>>,
}

impl fmt::Debug for Breakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breakers")
            .field("policy", &self.policy)
            .field("endpoints", &lock(&self.endpoints).len())
            .finish()
    }
}

/// What a breaker lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The call goes ahead.
    Go,
    /// The call goes ahead as the open breaker's probe: its success closes it.
    Probe,
    /// The breaker is open: the endpoint gets no call for this long yet.
    Open {
        /// Until the next probe.
        retry_in: Duration,
    },
}

/// An endpoint's breaker as `/metrics` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerStats {
    /// `provider host:port`.
    pub endpoint: String,
    /// Whether it is open now (a probe in flight counts as open).
    pub open: bool,
    /// Failures in a row.
    pub failures: u32,
    /// How many times it opened.
    pub opened: u64,
}

#[derive(Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    probing: bool,
    opened: u64,
}

impl Breakers {
    /// Breakers that open as `policy` says.
    pub fn new(policy: BreakerPolicy) -> Self {
        Breakers {
            policy,
            endpoints: Arc::default(),
        }
    }

    /// The endpoint `model` is served at.
    pub fn endpoint(model: &Model) -> String {
        format!(
            "{} {}",
            model.provider,
            crate::http::origin_text(&model.base_url)
        )
    }

    /// Whether a call to `endpoint` goes ahead now. Past an open breaker's wait
    /// the first call through is its probe; the others are refused until the
    /// probe ends.
    pub fn admit(&self, endpoint: &str) -> Admission {
        let mut endpoints = lock(&self.endpoints);
        let Some(breaker) = endpoints.get_mut(endpoint) else {
            return Admission::Go;
        };
        let Some(until) = breaker.open_until else {
            return Admission::Go;
        };
        let now = Instant::now();
        if now < until || breaker.probing {
            return Admission::Open {
                retry_in: until.saturating_duration_since(now),
            };
        }
        breaker.probing = true;
        Admission::Probe
    }

    /// Records how a call to `endpoint` that reached it ended: `unavailable`
    /// when it failed in a way retrying did not fix; `probe` when it was the
    /// open breaker's probe ([`Admission::Probe`]). While the breaker is open,
    /// only its probe's success closes it (a call let through before it opened
    /// says nothing of now).
    pub fn record(&self, endpoint: &str, unavailable: bool, probe: bool) {
        let mut endpoints = lock(&self.endpoints);
        if !unavailable {
            if let Some(breaker) = endpoints.get_mut(endpoint) {
                if breaker.open_until.is_some() && !probe {
                    return;
                }
                if breaker.open_until.is_some() {
                    tracing::info!(endpoint, "the circuit closed: the probe succeeded");
                }
                breaker.failures = 0;
                breaker.open_until = None;
                breaker.probing = false;
            }
            return;
        }
        let breaker = endpoints.entry(endpoint.to_owned()).or_default();
        breaker.failures = breaker.failures.saturating_add(1);
        if breaker.open_until.is_some() && !probe {
            // A call let through before it opened: counted, nothing more.
            return;
        }
        if probe || breaker.failures >= self.policy.failures.max(1) {
            if !probe {
                breaker.opened += 1;
                tracing::warn!(
                    endpoint,
                    failures = breaker.failures,
                    "the circuit opened: the endpoint failed too often"
                );
            }
            let now = Instant::now();
            breaker.open_until = Some(
                now.checked_add(self.policy.open_for)
                    .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365)),
            );
            if probe {
                breaker.probing = false;
            }
        }
    }

    /// Lets the next call through as a probe again: the probe in flight ended
    /// without an answer either way (aborted, or failed before it was sent).
    pub fn release(&self, endpoint: &str) {
        if let Some(breaker) = lock(&self.endpoints).get_mut(endpoint) {
            breaker.probing = false;
        }
    }

    /// Every endpoint that failed since the process started, sorted.
    pub fn stats(&self) -> Vec<BreakerStats> {
        let now = Instant::now();
        let mut stats: Vec<_> = lock(&self.endpoints)
            .iter()
            .map(|(endpoint, breaker)| BreakerStats {
                endpoint: endpoint.clone(),
                open: breaker.probing || breaker.open_until.is_some_and(|until| now < until),
                failures: breaker.failures,
                opened: breaker.opened,
            })
            .collect();
        stats.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_breaker_opens_after_failures_in_a_row_and_a_probe_closes_it() {
        let breakers = Breakers::new(BreakerPolicy {
            failures: 2,
            open_for: Duration::from_secs(10),
        });
        let endpoint = "openai api.openai.com:443";
        breakers.record(endpoint, true, false);
        assert_eq!(breakers.admit(endpoint), Admission::Go);
        breakers.record(endpoint, true, false);
        assert_eq!(
            breakers.admit(endpoint),
            Admission::Open {
                retry_in: Duration::from_secs(10)
            }
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        // One probe; the others wait for it, and a late success of a call let
        // through before it opened says nothing.
        assert_eq!(breakers.admit(endpoint), Admission::Probe);
        assert!(matches!(breakers.admit(endpoint), Admission::Open { .. }));
        breakers.record(endpoint, false, false);
        assert!(matches!(breakers.admit(endpoint), Admission::Open { .. }));
        // It failed: open again, for as long.
        breakers.record(endpoint, true, true);
        assert_eq!(
            breakers.admit(endpoint),
            Admission::Open {
                retry_in: Duration::from_secs(10)
            }
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(breakers.admit(endpoint), Admission::Probe);
        breakers.record(endpoint, false, true);
        assert_eq!(breakers.admit(endpoint), Admission::Go);
        assert_eq!(
            breakers.stats(),
            [BreakerStats {
                endpoint: endpoint.to_owned(),
                open: false,
                failures: 0,
                opened: 1
            }]
        );
    }
}
