//! How much of a response Tiller accepts, and the arithmetic of waits that come from
//! outside.
//!
//! Everything a server sends is bounded: one SSE line or event, the whole body, the
//! content blocks (text, thinking, tool calls) of one response. Going past a bound
//! ends the stream with [`StreamError::LimitExceeded`](crate::StreamError) naming
//! the limit and its value; memory stays within the bound. Durations that come from
//! outside (a `retry-after`, a caller's timeout of `Duration::MAX`) are converted
//! with saturating arithmetic, never a panic.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::error::StreamError;

/// The bounds on one streamed response. `StreamLimits::default()` suits every known
/// provider with room to spare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamLimits {
    /// The longest SSE line, and the most data one SSE event may carry (its `data:`
    /// lines joined); for Bedrock, the largest event-stream message. Default 8 MiB.
    pub max_event_bytes: usize,
    /// The most bytes of one response body. Default 64 MiB.
    pub max_body_bytes: u64,
    /// The most content blocks (text, thinking and tool calls together) one response
    /// may hold. Default 1,024.
    pub max_content_blocks: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            max_event_bytes: 8 * 1024 * 1024,
            max_body_bytes: 64 * 1024 * 1024,
            max_content_blocks: 1024,
        }
    }
}

/// Which bound a response went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Limit {
    /// [`StreamLimits::max_event_bytes`], for one line or one event.
    EventBytes,
    /// [`StreamLimits::max_body_bytes`].
    BodyBytes,
    /// [`StreamLimits::max_content_blocks`].
    ContentBlocks,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::EventBytes => "bytes in one event-stream line or event",
            Limit::BodyBytes => "bytes in the response body",
            Limit::ContentBlocks => "content blocks in one response",
        })
    }
}

impl Limit {
    /// The error of going past this limit, whose value is `max`.
    pub(crate) fn exceeded(self, max: impl TryInto<u64>) -> StreamError {
        StreamError::LimitExceeded {
            limit: self,
            max: max.try_into().unwrap_or(u64::MAX),
        }
    }
}

/// A duration in whole milliseconds, saturating at `u64::MAX`.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The instant `limit` from now; `None` when that is too far to represent (a
/// `Duration::MAX` timeout), which means "never".
pub(crate) fn deadline_after(limit: Duration) -> Option<Instant> {
    Instant::now().checked_add(limit)
}

/// Seconds as a server writes them (`1.5`, `1e20`), as a duration: `None` when not a
/// finite, non-negative number; `Duration::MAX` when too long to represent.
pub(crate) fn seconds(value: f64) -> Option<Duration> {
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_durations_saturate() {
        assert_eq!(seconds(1.5), Some(Duration::from_millis(1500)));
        assert_eq!(seconds(1e20), Some(Duration::MAX));
        assert_eq!(seconds(1e300), Some(Duration::MAX));
        assert_eq!(seconds(f64::INFINITY), None);
        assert_eq!(seconds(-1.0), None);
        assert_eq!(seconds(f64::NAN), None);
        assert_eq!(millis(Duration::MAX), u64::MAX);
        assert_eq!(millis(Duration::from_millis(7)), 7);
        assert_eq!(deadline_after(Duration::MAX), None);
        assert!(deadline_after(Duration::from_secs(1)).is_some());
    }
}
