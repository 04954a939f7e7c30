//! Counted shares: how many of something each holder has open at once.
//!
//! [`Counts`] is what the server bounds by holder: event streams per caller (at
//! most [`crate::ServerConfig::max_streams_per_caller`] server-sent events,
//! WebSockets, `GET /events` and pi proxy calls, counted per token: its tenant and
//! user, whatever headers a gateway adds; everyone is one caller on an open
//! server; 429 `too-many-streams` past it) and connections per address
//! ([`crate::connections`]).

use std::hash::Hash;
use std::sync::Arc;

use axum::http::StatusCode;
use dashmap::DashMap;

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

/// One open stream of a caller.
pub(crate) type StreamSlot = Share<Scope>;

impl Shared {
    /// A slot for one more stream of `caller`, if it has room.
    pub(crate) fn stream_slot(&self, caller: &Caller) -> Result<StreamSlot, Problem> {
        let max = self.config.max_streams_per_caller;
        self.streams
            .take(caller.token_holder.clone(), max)
            .ok_or_else(|| {
                Problem::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too-many-streams",
                    format!(
                        "you hold {max} event streams open, the most one caller may: close one first"
                    ),
                )
            })
    }
}
