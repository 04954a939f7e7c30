//! What one caller may hold open at once: at most
//! [`crate::ServerConfig::max_streams_per_caller`] event streams (server-sent
//! events, WebSockets, `GET /events`, pi proxy calls), counted per token (its
//! tenant and user, whatever headers a gateway adds; everyone is one caller on an
//! open server); past it, 429 `too-many-streams`.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};

use crate::Shared;
use crate::error::Problem;
use crate::tenants::Scope;

/// One open stream of a caller, given back when dropped.
pub(crate) struct StreamSlot {
    shared: Arc<Shared>,
    holder: Scope,
}

impl Shared {
    /// A slot for one more stream of the caller of `headers`, if it has room.
    pub(crate) fn stream_slot(
        self: &Arc<Self>,
        headers: &HeaderMap,
    ) -> Result<StreamSlot, Problem> {
        let holder = self.caller(headers)?.token_holder;
        let max = self.config.max_streams_per_caller;
        let mut open = self.streams.entry(holder.clone()).or_insert(0);
        if *open >= max {
            return Err(Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-streams",
                format!(
                    "you hold {max} event streams open, the most one caller may: close one first"
                ),
            ));
        }
        *open += 1;
        Ok(StreamSlot {
            shared: self.clone(),
            holder,
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.shared.streams.remove_if_mut(&self.holder, |_, open| {
            *open -= 1;
            *open == 0
        });
    }
}
