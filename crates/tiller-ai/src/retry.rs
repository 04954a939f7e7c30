//! When and how long to wait before trying a request again.
//!
//! Only failures before the first byte of a response are retried: connection errors
//! and the statuses 408, 409, 429 and 5xx (529, Anthropic's "overloaded", included).
//! A wait the server asks for (`retry-after-ms`, or `retry-after` in seconds or as an
//! HTTP date) is honoured as given; a wait longer than [`RetryPolicy::max_retry_after`]
//! (however large: `1e300` seconds is just "too long") fails the request at once with
//! `StreamError::RetryAfterTooLong` rather than hanging. Otherwise the wait grows
//! exponentially from [`RetryPolicy::initial_backoff`] with jitter.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use crate::limits;

/// How a request is retried before its response starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RetryPolicy {
    /// Retries after the first attempt (so `3` means at most four attempts).
    pub max_retries: u32,
    /// The wait before the first retry, doubled for each further one.
    #[serde(rename = "initial_backoff_ms", with = "crate::millis")]
    pub initial_backoff: Duration,
    /// The longest wait the doubling reaches.
    #[serde(rename = "max_backoff_ms", with = "crate::millis")]
    pub max_backoff: Duration,
    /// The longest server-requested wait honoured; a longer one fails at once.
    #[serde(rename = "max_retry_after_ms", with = "crate::millis")]
    pub max_retry_after: Duration,
    /// The 429s a request sharing rate limits ([`crate::RateLimits`]) waits out
    /// at its account before failing; they do not count against `max_retries`.
    pub max_throttled_retries: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            max_throttled_retries: 10,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn never() -> Self {
        RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }
    }

    /// The wait before retry number `attempt + 1`: exponential, capped, with jitter
    /// between half and all of it so that many clients do not retry in step.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let exponential = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(attempt))
            .min(self.max_backoff);
        let half = exponential / 2;
        let jitter_nanos = random_u64() % (half.as_nanos() as u64).max(1);
        half + Duration::from_nanos(jitter_nanos)
    }
}

/// Whether a response status is worth another attempt.
pub(crate) fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 500..=599)
}

/// The wait a response asks for, from `retry-after-ms` or `retry-after`.
pub(crate) fn requested_wait(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(wait) = header("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|ms| limits::seconds(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return limits::seconds(seconds);
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(
        date.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// A random number good enough for jitter, without a random-number crate.
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn retry_after_in_seconds_milliseconds_and_dates() {
        assert_eq!(
            requested_wait(&headers(&[("retry-after", "7")])),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            requested_wait(&headers(&[("retry-after", "1.5")])),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            requested_wait(&headers(&[("retry-after-ms", "250"), ("retry-after", "9")])),
            Some(Duration::from_millis(250))
        );
        let future = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let wait = requested_wait(&headers(&[("retry-after", &future)])).unwrap();
        assert!(
            wait > Duration::from_secs(100) && wait <= Duration::from_secs(120),
            "{wait:?}"
        );
        let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(120));
        assert_eq!(
            requested_wait(&headers(&[("retry-after", &past)])),
            Some(Duration::ZERO)
        );
        assert_eq!(requested_wait(&headers(&[("retry-after", "soon")])), None);
        assert_eq!(requested_wait(&headers(&[("retry-after", "-3")])), None);
        assert_eq!(requested_wait(&HeaderMap::new()), None);
        assert_eq!(
            requested_wait(&headers(&[("retry-after", "1e20")])),
            Some(Duration::MAX)
        );
        assert_eq!(
            requested_wait(&headers(&[("retry-after-ms", "1e300")])),
            Some(Duration::MAX)
        );
        assert_eq!(requested_wait(&headers(&[("retry-after", "inf")])), None);
    }

    #[test]
    fn backoff_doubles_within_jitter_and_stops_at_the_cap() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            ..RetryPolicy::default()
        };
        for _ in 0..100 {
            let first = policy.backoff(0);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = policy.backoff(2);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            let capped = policy.backoff(30);
            assert!(capped >= Duration::from_millis(250) && capped <= Duration::from_millis(500));
        }
    }

    #[test]
    fn retryable_statuses() {
        for status in [408, 409, 429, 500, 502, 503, 529] {
            assert!(is_retryable_status(status), "{status}");
        }
        for status in [400, 401, 403, 404, 422] {
            assert!(!is_retryable_status(status), "{status}");
        }
    }
}
