//! Durations in settings, written as whole milliseconds (`idle_timeout_ms: 120000`
//! reads better than `{secs, nanos}`); `#[serde(with = "crate::millis")]`, or
//! `crate::millis::option` for an `Option<Duration>` (`null` for none).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Writes `duration` as milliseconds.
pub fn serialize<S: Serializer>(duration: &Duration, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// Reads milliseconds.
pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Duration, D::Error> {
    u64::deserialize(from).map(Duration::from_millis)
}

/// The same for an optional duration.
pub mod option {
    use super::*;

    /// Writes `duration` as milliseconds, or `null`.
    pub fn serialize<S: Serializer>(duration: &Option<Duration>, to: S) -> Result<S::Ok, S::Error> {
        match duration {
            Some(duration) => super::serialize(duration, to),
            None => to.serialize_none(),
        }
    }

    /// Reads milliseconds or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Option<Duration>, D::Error> {
        Option::<u64>::deserialize(from).map(|ms| ms.map(Duration::from_millis))
    }
}
