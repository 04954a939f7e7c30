//! Rate limits shared by every agent of a process: one pace per provider account.
//!
//! An account is a key at a provider's address (or a name the caller gives it, such
//! as a named LLM configuration) and a model, as providers count their limits per
//! model. [`RateLimits`] keeps one [`Account`] per such pair; every request to it
//! takes its turn there first:
//!
//! - The first request to an account goes alone. Its response's headers teach the
//!   limits (OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`,
//!   Anthropic's `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`);
//!   an account whose responses carry none is not paced at all.
//! - After that each request takes one request and its estimated tokens (a
//!   quarter of its body's bytes plus the output the account's answers have been
//!   averaging) from two buckets that refill at the rate the headers imply (a
//!   full bucket within `max_retry_after`, however long the headers' reset).
//!   The requests queue tenant by tenant, by weighted fair queueing
//!   ([`RateLimits::set_weight`]): a tenant waits behind its own backlog and
//!   its share of the others', never behind all of another tenant's. The one at
//!   the head waits until the buckets cover it, so concurrent requests go out
//!   one after another rather than all at once. A head that is served sets the
//!   timer of the next one's turn, on that request's own runtime, for when the
//!   buckets will cover it: a request queued behind a served one is woken once
//!   (it sleeps again only if a 429 or new headers came meanwhile).
//! - A 429 pauses the whole account for the wait it names (`retry-after`, or the
//!   tokens' reset), and the request is tried again after it.
//! - When a response ends, its reservation is settled against the usage it
//!   reported, so the buckets track what the provider counted.
//!
//! Every wait longer than a millisecond is reported to
//! [`Transport::on_rate_limited`] (agents turn it into a `rate_limited` event)
//! and counted in [`AccountStats`].
//!
//! [`Transport::on_rate_limited`]: crate::Transport::on_rate_limited

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use crate::{limits, lock};

/// The accounts of one process (a supervisor's agents share one), each paced on
/// its own. Cloning is cheap and shares the accounts.
#[derive(Clone, Default)]
pub struct RateLimits {
    accounts: Arc<Mutex<HashMap<u64, Arc<Account>>>>,
    weights: Weights,
    /// How many processes share each account (see [`RateLimits::set_sharers`]).
    sharers: Arc<AtomicU32>,
}

/// Each tenant's share of an account's turns (1 when unnamed).
type Weights = Arc<Mutex<HashMap<Arc<str>, u32>>>;

impl fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimits")
            .field("accounts", &lock(&self.accounts).len())
            .finish()
    }
}

impl RateLimits {
    /// No accounts yet; each is made by its first request.
    pub fn new() -> Self {
        RateLimits::default()
    }

    /// Gives `tenant` `weight` shares of every account's turns (each tenant has
    /// one unless given more; 0 counts as 1): with its requests queued beside
    /// others', it is served `weight` times as much as a tenant of one share.
    pub fn set_weight(&self, tenant: &str, weight: u32) {
        lock(&self.weights).insert(Arc::from(tenant), weight.max(1));
    }

    /// Paces every account as one of `sharers` processes that share it (the
    /// live hosts of a cluster): the limits a response states are divided
    /// among them, so that together they keep to the account's. 0 counts as 1;
    /// a bucket already learned takes the new share with the next response.
    pub fn set_sharers(&self, sharers: u32) {
        self.sharers.store(sharers.max(1), Ordering::Relaxed);
    }

    /// The account of `model` at `origin` (`host:port`) of `provider`, reached
    /// with `credential` (the key as sent; only hashes of it are kept), or of
    /// the name the caller gave it (each key of a name is an account of its own). Built-in providers take their turn here
    /// themselves; a [`Provider`](crate::Provider) of the host's can too.
    pub fn account(
        &self,
        provider: &str,
        origin: &str,
        model: &str,
        named: Option<&str>,
        credential: Option<&[u8]>,
    ) -> Arc<Account> {
        // Keyed per process: no one can make their account's key collide
        // with another's.
        static KEYS: OnceLock<RandomState> = OnceLock::new();
        let mut keyed = KEYS.get_or_init(RandomState::new).build_hasher();
        (named, model, credential).hash(&mut keyed);
        if named.is_none() {
            (provider, origin).hash(&mut keyed);
        }
        let key = keyed.finish();
        let mut accounts = lock(&self.accounts);
        accounts
            .entry(key)
            .or_insert_with(|| {
                let name = named.unwrap_or(provider);
                let label = match credential {
                    Some(credential) => {
                        // 32 bits of a hash: the same in every process, and no
                        // way back to the key.
                        let mut fingerprint = DefaultHasher::new();
                        credential.hash(&mut fingerprint);
                        format!("{name}/{model} key {:08x}", fingerprint.finish() >> 32)
                    }
                    None => format!("{name}/{model}"),
                };
                Arc::new(Account::new(
                    label,
                    self.weights.clone(),
                    self.sharers.clone(),
                ))
            })
            .clone()
    }

    /// Each account's figures, sorted by account.
    pub fn stats(&self) -> Vec<AccountStats> {
        let mut stats: Vec<_> = lock(&self.accounts)
            .values()
            .map(|account| account.stats())
            .collect();
        stats.sort_by(|a, b| a.account.cmp(&b.account));
        stats
    }
}

/// One account's figures since the process started.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountStats {
    /// The account: provider and model, with a fingerprint of the key (never the
    /// key) or the name it was given.
    pub account: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests that waited their turn.
    pub waits: u64,
    /// The time they waited, in all.
    pub waited: Duration,
    /// Responses with status 429.
    pub throttled: u64,
    /// The account's requests per minute as learned from its headers, if any.
    pub requests_per_minute: Option<f64>,
    /// The account's tokens per minute as learned from its headers, if any.
    pub tokens_per_minute: Option<f64>,
}

/// Why a request waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WaitCause {
    /// The account's requests or tokens are used up until they refill.
    Paced,
    /// The provider answered 429 and asked for a pause.
    Throttled,
}

/// A wait about to start, as reported to [`Transport::on_rate_limited`](crate::Transport::on_rate_limited).
#[derive(Debug, Clone)]
pub struct RateLimitWait {
    /// The account (see [`AccountStats::account`]).
    pub account: Arc<str>,
    /// How long the request is expected to wait.
    pub wait: Duration,
    /// Why.
    pub cause: WaitCause,
}

/// Told of each wait before it starts.
#[derive(Clone)]
pub struct RateLimitObserver(Arc<dyn Fn(&RateLimitWait) + Send + Sync>);

impl RateLimitObserver {
    /// An observer calling `observe`.
    pub fn new(observe: impl Fn(&RateLimitWait) + Send + Sync + 'static) -> Self {
        RateLimitObserver(Arc::new(observe))
    }

    fn tell(&self, wait: &RateLimitWait) {
        (self.0)(wait);
    }
}

impl fmt::Debug for RateLimitObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RateLimitObserver")
    }
}

/// The waits shorter than this are not reported.
const UNREPORTED_WAIT: Duration = Duration::from_millis(1);

/// The pause after a 429 that names no wait.
const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// The output tokens an answer is reckoned to take before any answer of the
/// account reported its usage: generous, as the difference is given back when
/// the answer settles.
const FIRST_OUTPUT_TOKENS: f64 = 256.0;

/// One account's pace: see [`Account::turn`].
pub struct Account {
    label: Arc<str>,
    pace: Mutex<Pace>,
    /// Woken when the first request's headers are in (or it fails).
    learned: Notify,
    /// The requests waiting for their turn, tenant by tenant.
    queue: Mutex<FairQueue>,
    weights: Weights,
    /// How many processes share the account's limits.
    sharers: Arc<AtomicU32>,
    requests: AtomicU64,
    waits: AtomicU64,
    waited_micros: AtomicU64,
    throttled: AtomicU64,
}

struct Pace {
    learning: Learning,
    requests: Bucket,
    tokens: Bucket,
    /// No request goes out before this (after a 429).
    paused_until: Option<Instant>,
    /// The output tokens an answer has averaged (an exponential mean);
    /// [`FIRST_OUTPUT_TOKENS`] until an answer says.
    output_tokens: f64,
    /// Whether an answer has reported its usage yet.
    output_known: bool,
    /// What the requests waiting in the queue will take.
    queued_tokens: f64,
    queued_requests: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Learning {
    /// No request has gone out.
    Unknown,
    /// The first request is out; the others wait for its headers.
    Probing,
    /// Its headers came (with limits or without).
    Known,
}

/// A continuously refilling bucket, unlimited until a limit is learned. Its level
/// goes below zero while requests wait for what they reserved.
struct Bucket {
    limit: Option<f64>,
    per_second: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(now: Instant) -> Self {
        Bucket {
            limit: None,
            per_second: 0.0,
            level: 0.0,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(limit) = self.limit {
            let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
            self.level = (self.level + elapsed * self.per_second).min(limit);
        }
        self.at = now;
    }

    /// How long until the bucket holds `amount` (none when it does, or has no
    /// limit; more than the bucket ever holds goes once it is full).
    fn deficit(&mut self, amount: f64, now: Instant) -> Duration {
        let Some(limit) = self.limit else {
            return Duration::ZERO;
        };
        self.refill(now);
        let missing = amount.min(limit) - self.level;
        if missing <= 0.0 || self.per_second <= 0.0 {
            return Duration::ZERO;
        }
        limits::seconds(missing / self.per_second).unwrap_or(Duration::MAX)
    }

    /// Takes `amount`.
    fn spend(&mut self, amount: f64) {
        if self.limit.is_some() {
            self.level -= amount;
        }
    }

    /// Gives back (or, negative, takes more of) what a reservation misjudged.
    fn give_back(&mut self, amount: f64, now: Instant) {
        if let Some(limit) = self.limit {
            self.refill(now);
            self.level = (self.level + amount).min(limit);
        }
    }

    /// What a response's headers say: the limit, what remains of it and when it
    /// is whole again. The pace learned fills the bucket within `longest`
    /// (headers saying it refills over an hour make no request wait longer
    /// than a `retry-after` could).
    fn learn(&mut self, window: Window, now: Instant, longest: Duration) {
        let limit = window.limit.or(self.limit).unwrap_or(window.remaining);
        if limit <= 0.0 {
            return;
        }
        let refill = match window.reset {
            Some(reset) if reset > Duration::ZERO && limit > window.remaining => {
                (limit - window.remaining) / reset.as_secs_f64()
            }
            _ if self.per_second > 0.0 => self.per_second,
            // Providers count per minute unless they say otherwise.
            _ => limit / 60.0,
        };
        self.refill(now);
        if self.limit.is_none() {
            self.level = window.remaining;
        }
        self.limit = Some(limit);
        let slowest = limit / longest.as_secs_f64().max(1.0);
        self.per_second = refill.clamp(slowest, limit * 1000.0);
        // The provider's count has not seen the requests still in flight: the
        // lower of the two is the truth.
        self.level = self.level.min(window.remaining);
    }

    fn per_minute(&self) -> Option<f64> {
        self.limit.map(|_| self.per_second * 60.0)
    }
}

/// One limit as a response's headers state it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Window {
    limit: Option<f64>,
    remaining: f64,
    reset: Option<Duration>,
}

impl Account {
    fn new(label: String, weights: Weights, sharers: Arc<AtomicU32>) -> Self {
        let now = Instant::now();
        Account {
            label: label.into(),
            pace: Mutex::new(Pace {
                learning: Learning::Unknown,
                requests: Bucket::new(now),
                tokens: Bucket::new(now),
                paused_until: None,
                output_tokens: FIRST_OUTPUT_TOKENS,
                output_known: false,
                queued_tokens: 0.0,
                queued_requests: 0.0,
            }),
            learned: Notify::new(),
            queue: Mutex::default(),
            weights,
            sharers,
            requests: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            waited_micros: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
        }
    }

    fn stats(&self) -> AccountStats {
        let pace = lock(&self.pace);
        AccountStats {
            account: self.label.to_string(),
            requests: self.requests.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            waited: Duration::from_micros(self.waited_micros.load(Ordering::Relaxed)),
            throttled: self.throttled.load(Ordering::Relaxed),
            requests_per_minute: pace.requests.per_minute(),
            tokens_per_minute: pace.tokens.per_minute(),
        }
    }

    /// Waits for a request's turn, `body_bytes` the size of its body (a quarter
    /// of it is its estimated input tokens), made for `tenant` (tenants take
    /// turns by weight: see the module docs); `observer` hears of a wait before
    /// it starts. Tell the ticket what the response said, then settle it.
    pub async fn turn(
        self: &Arc<Self>,
        body_bytes: usize,
        tenant: Option<&str>,
        observer: Option<&RateLimitObserver>,
    ) -> Ticket {
        let input = (body_bytes as f64 / 4.0).ceil();
        // The first request to an account goes alone; the others wait for what
        // it teaches.
        loop {
            let learned = self.learned.notified();
            let learning = {
                let mut pace = lock(&self.pace);
                let learning = pace.learning;
                if learning == Learning::Unknown {
                    pace.learning = Learning::Probing;
                }
                learning
            };
            match learning {
                Learning::Unknown => {
                    self.requests.fetch_add(1, Ordering::Relaxed);
                    return Ticket {
                        account: Arc::clone(self),
                        estimate: input,
                        probe: true,
                    };
                }
                Learning::Probing => learned.await,
                Learning::Known => break,
            }
        }
        let started = Instant::now();
        let (estimate, expected, cause) = {
            let mut pace = lock(&self.pace);
            let estimate = input + pace.output_tokens;
            let (expected, cause) = pace.expected_wait(estimate, started);
            pace.queued_tokens += estimate;
            pace.queued_requests += 1.0;
            (estimate, expected, cause)
        };
        let queued = Queued {
            account: self,
            estimate,
        };
        if expected >= UNREPORTED_WAIT
            && let Some(observer) = observer
        {
            observer.tell(&RateLimitWait {
                account: Arc::clone(&self.label),
                wait: expected,
                cause,
            });
        }
        // Tenant by tenant: only the head of the queue watches the buckets, and
        // sees the corrections (a settlement, a 429) made while it slept when it
        // wakes.
        let weight = tenant.map_or(1, |tenant| {
            lock(&self.weights).get(tenant).copied().unwrap_or(1)
        });
        let (place, wake) = lock(&self.queue).join(tenant, estimate, weight);
        let mut place = Place {
            account: self,
            place,
            served: false,
        };
        if let Some(wake) = wake {
            while lock(&self.queue).head != Some(place.place.1) {
                wake.0.notified().await;
            }
        }
        loop {
            let wait = lock(&self.pace).take(estimate, Instant::now());
            if wait.is_zero() {
                break;
            }
            tokio::time::sleep(wait).await;
        }
        place.served = true;
        drop(place);
        drop(queued);
        let waited = started.elapsed();
        if waited >= UNREPORTED_WAIT {
            self.waits.fetch_add(1, Ordering::Relaxed);
            let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
            self.waited_micros.fetch_add(micros, Ordering::Relaxed);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ticket {
            account: Arc::clone(self),
            estimate,
            probe: false,
        }
    }
}

/// The requests waiting for an account's turn, served tenant by tenant
/// (start-time fair queueing, weighted): each gets a start tag, the later of
/// the tag being served and where its tenant's backlog ends (each request
/// moves that end on by its estimated tokens over its tenant's weight); the
/// smallest tag goes next. A tenant's request so waits behind its own backlog
/// and its share of the others', never behind all of another tenant's: one
/// that has nothing queued goes next. Requests of no tenant share one.
#[derive(Default)]
struct FairQueue {
    /// The start tag of the request served last.
    served: f64,
    /// Where each tenant's backlog ends, while past `served`.
    last: HashMap<Option<Arc<str>>, f64>,
    /// The requests waiting, by their tag's bits (non-negative floats order as
    /// their bits do) and arrival.
    waiting: BTreeMap<(u64, u64), Waiter>,
    /// The timer of the head's turn, set by the head before it.
    turn: Option<Pin<Box<Sleep>>>,
    /// The arrival number of the request at the head, watching the buckets.
    head: Option<u64>,
    arrivals: u64,
}

/// A request waiting in a [`FairQueue`].
struct Waiter {
    wake: Arc<Wakeup>,
    /// The tokens it will take.
    estimate: f64,
    /// The runtime it waits on, whose timers time its turn (none outside one).
    runtime: Option<Handle>,
}

impl Waiter {
    /// The timer of its turn `wait` from now, set on its own runtime and
    /// waking it: one wake-up for its turn, where waking it to set its own
    /// timer was two. Its runtime, not the caller's: that one may not be
    /// driven again. None when there is nothing to wait for, or no timer can
    /// be set (outside a runtime, or on one without timers or shutting down,
    /// which panics here): it is then woken at once.
    fn time_turn(&self, wait: Duration) -> Option<Pin<Box<Sleep>>> {
        let runtime = self.runtime.as_ref().filter(|_| !wait.is_zero())?;
        let waker = Waker::from(Arc::clone(&self.wake));
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut turn = {
                let _entered = runtime.enter();
                Box::pin(tokio::time::sleep(wait))
            };
            let pending = turn
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending();
            pending.then_some(turn)
        }))
        .ok()
        .flatten()
    }
}

/// What wakes a request waiting in a [`FairQueue`]: notified by the head
/// before it, or as the waker of the timer that head set for its turn.
struct Wakeup(Notify);

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

impl FairQueue {
    /// Places a request of `tenant` and `estimate` tokens: its place, and what
    /// wakes it when it is at the head (none when it is there already).
    fn join(
        &mut self,
        tenant: Option<&str>,
        estimate: f64,
        weight: u32,
    ) -> ((u64, u64), Option<Arc<Wakeup>>) {
        self.arrivals += 1;
        let arrival = self.arrivals;
        let key = tenant.map(Arc::from);
        let start = self
            .last
            .get(&key)
            .map_or(self.served, |last| last.max(self.served));
        self.last
            .insert(key, start + estimate.max(1.0) / f64::from(weight.max(1)));
        let place = (start.to_bits(), arrival);
        if self.head.is_none() && self.waiting.is_empty() {
            // Served at once: the queue's time moves on to it, so that a tenant
            // that had the account alone builds up no lead over the next one.
            self.served = start;
            self.head = Some(arrival);
            return (place, None);
        }
        let wake = Arc::new(Wakeup(Notify::new()));
        self.waiting.insert(
            place,
            Waiter {
                wake: wake.clone(),
                estimate,
                runtime: Handle::try_current().ok(),
            },
        );
        (place, Some(wake))
    }

    /// The request at `place` leaves the queue (served, or dropped): the next
    /// one goes to the head when it was there. A head served (`pace` given)
    /// sets the timer of the next one's turn, on the next one's runtime, for
    /// when `pace` will cover it; a head dropped wakes it at once, as does a
    /// timer that cannot be set.
    fn leave(&mut self, place: (u64, u64), pace: Option<&Mutex<Pace>>) {
        if self.head != Some(place.1) {
            self.waiting.remove(&place);
            return;
        }
        self.head = None;
        self.turn = None;
        if let Some(((tag, arrival), next)) = self.waiting.pop_first() {
            self.served = f64::from_bits(tag);
            self.head = Some(arrival);
            let wait = pace.map_or(Duration::ZERO, |pace| {
                lock(pace).wait(next.estimate, Instant::now())
            });
            self.turn = next.time_turn(wait);
            if self.turn.is_none() {
                next.wake.0.notify_one();
            }
        }
        let served = self.served;
        self.last.retain(|_, last| *last > served);
    }
}

/// A request's place in its account's [`FairQueue`], left when dropped.
struct Place<'a> {
    account: &'a Account,
    place: (u64, u64),
    /// Whether its request was served, not given up: only a served head sets
    /// the timer of the next one's turn.
    served: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let pace = self.served.then_some(&self.account.pace);
        lock(&self.account.queue).leave(self.place, pace);
    }
}

/// A request in the queue of its account: what it will take, given back to the
/// queue's count when it leaves (served, or dropped while waiting).
struct Queued<'a> {
    account: &'a Account,
    estimate: f64,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut pace = lock(&self.account.pace);
        pace.queued_tokens -= self.estimate;
        pace.queued_requests -= 1.0;
    }
}

impl Pace {
    /// What is left of the pause after a 429.
    fn pause_left(&self, now: Instant) -> Duration {
        self.paused_until
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now))
    }

    /// How long a request of `estimate` tokens joining the queue now can expect
    /// to wait: until the buckets cover it and everything queued before it, or
    /// the pause after a 429 ends.
    fn expected_wait(&mut self, estimate: f64, now: Instant) -> (Duration, WaitCause) {
        let paused = self.pause_left(now);
        let paced = self
            .requests
            .deficit(self.queued_requests + 1.0, now)
            .max(self.tokens.deficit(self.queued_tokens + estimate, now));
        if paused > paced {
            (paused, WaitCause::Throttled)
        } else {
            (paced, WaitCause::Paced)
        }
    }

    /// How long until the buckets cover one request and `estimate` tokens and
    /// no pause holds.
    fn wait(&mut self, estimate: f64, now: Instant) -> Duration {
        self.pause_left(now)
            .max(self.requests.deficit(1.0, now))
            .max(self.tokens.deficit(estimate, now))
    }

    /// Takes one request and `estimate` tokens if the buckets cover them and no
    /// pause holds; else how long until they may.
    fn take(&mut self, estimate: f64, now: Instant) -> Duration {
        let wait = self.wait(estimate, now);
        if wait.is_zero() {
            self.requests.spend(1.0);
            self.tokens.spend(estimate);
        }
        wait
    }
}

/// A request's turn at its account: told what the response said
/// ([`Ticket::answered`]), and settled when the response ends ([`Ticket::settle`]).
pub struct Ticket {
    account: Arc<Account>,
    /// The tokens reserved.
    estimate: f64,
    /// Whether this is the account's first request, the others waiting for its headers.
    probe: bool,
}

impl Ticket {
    /// Learns from a response's status and headers; a 429 pauses the account for
    /// `requested` (the wait the response asks for) or its tokens' reset, at
    /// most `max_pause` (a request asked to wait longer fails on its own; the
    /// account does not wait for it). The account's first answer lets the
    /// requests waiting for it go.
    pub fn answered(
        &mut self,
        status: u16,
        headers: &HeaderMap,
        requested: Option<Duration>,
        max_pause: Duration,
    ) {
        let now = Instant::now();
        let (requests, tokens) = windows(headers);
        // This process's part of what the account allows.
        let sharers = f64::from(self.account.sharers.load(Ordering::Relaxed).max(1));
        let share = |window: Window| Window {
            limit: window.limit.map(|limit| limit / sharers),
            remaining: window.remaining / sharers,
            reset: window.reset,
        };
        let (requests, tokens) = (requests.map(share), tokens.map(share));
        {
            let mut pace = lock(&self.account.pace);
            if let Some(window) = requests {
                pace.requests.learn(window, now, max_pause);
            }
            if let Some(window) = tokens {
                pace.tokens.learn(window, now, max_pause);
            }
            if status == 429 {
                self.account.throttled.fetch_add(1, Ordering::Relaxed);
                let pause = requested
                    .or_else(|| tokens.and_then(|window| window.reset))
                    .or_else(|| requests.and_then(|window| window.reset))
                    .unwrap_or(DEFAULT_PAUSE)
                    .min(max_pause);
                if let Some(until) = now.checked_add(pause) {
                    pace.paused_until = Some(pace.paused_until.map_or(until, |at| at.max(until)));
                }
                // Nothing reserved is spent, and the provider will count the retry
                // (the first request reserved nothing).
                if !self.probe {
                    pace.tokens.give_back(self.estimate, now);
                    pace.requests.give_back(1.0, now);
                }
                self.estimate = 0.0;
            }
            pace.learning = Learning::Known;
        }
        self.end_probe();
    }

    /// Settles the reservation against the tokens the response reported, and
    /// learns from them what an answer takes.
    pub fn settle(mut self, input: u64, output: u64) {
        let now = Instant::now();
        let used = (input + output) as f64;
        {
            let mut pace = lock(&self.account.pace);
            if used > 0.0 {
                pace.tokens.give_back(self.estimate - used, now);
                pace.output_tokens = if pace.output_known {
                    0.8 * pace.output_tokens + 0.2 * output as f64
                } else {
                    output as f64
                };
                pace.output_known = true;
            }
        }
        self.probe = false;
    }

    fn end_probe(&mut self) {
        if std::mem::take(&mut self.probe) {
            self.account.learned.notify_waiters();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.probe {
            // The first request failed before its headers came: the others go
            // unpaced, and learn from the next headers that come.
            lock(&self.account.pace).learning = Learning::Known;
            self.end_probe();
        }
    }
}

/// The headers a window is stated in, by dialect: limit, remaining, reset (as
/// names, so that a lookup hashes them without parsing them again).
static OPENAI_REQUESTS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];
static OPENAI_TOKENS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];
static ANTHROPIC_REQUESTS: [HeaderName; 3] = [
    HeaderName::from_static("anthropic-ratelimit-requests-limit"),
    HeaderName::from_static("anthropic-ratelimit-requests-remaining"),
    HeaderName::from_static("anthropic-ratelimit-requests-reset"),
];
static ANTHROPIC_TOKENS: [HeaderName; 3] = [
    HeaderName::from_static("anthropic-ratelimit-tokens-limit"),
    HeaderName::from_static("anthropic-ratelimit-tokens-remaining"),
    HeaderName::from_static("anthropic-ratelimit-tokens-reset"),
];

/// The requests' and the tokens' windows a response's headers state.
fn windows(headers: &HeaderMap) -> (Option<Window>, Option<Window>) {
    let text = |name: &HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let number = |name: &HeaderName| {
        text(name)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let window = |[limit, remaining, reset]: &[HeaderName; 3],
                  until: fn(&str) -> Option<Duration>| {
        Some(Window {
            limit: number(limit),
            remaining: number(remaining)?,
            reset: text(reset).and_then(until),
        })
    };
    (
        window(&OPENAI_REQUESTS, go_duration)
            .or_else(|| window(&ANTHROPIC_REQUESTS, until_timestamp)),
        window(&OPENAI_TOKENS, go_duration).or_else(|| window(&ANTHROPIC_TOKENS, until_timestamp)),
    )
}

/// A duration as OpenAI writes it: `20ms`, `1s`, `6m0s`, `1h2m3.5s`.
fn go_duration(text: &str) -> Option<Duration> {
    let mut seconds = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (scale, unit) = [("ms", 0.001), ("h", 3600.0), ("m", 60.0), ("s", 1.0)]
            .into_iter()
            .find(|(unit, _)| rest.starts_with(unit))
            .map(|(unit, scale)| (scale, unit.len()))?;
        seconds += value * scale;
        rest = &rest[unit..];
    }
    limits::seconds(seconds)
}

/// The time until an RFC 3339 timestamp in UTC, as Anthropic writes resets
/// (`2026-11-26T09:00:30Z`).
fn until_timestamp(text: &str) -> Option<Duration> {
    let at = rfc3339_seconds(text)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    limits::seconds((at - now).max(0.0))
}

fn rfc3339_seconds(text: &str) -> Option<f64> {
    let text = text
        .strip_suffix('Z')
        .or_else(|| text.strip_suffix("+00:00"))?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let mut time = time.splitn(3, ':');
    let hour: f64 = time.next()?.parse().ok()?;
    let minute: f64 = time.next()?.parse().ok()?;
    let second: f64 = time.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let of_era = year - era * 400;
    let of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let of_era_days = of_era * 365 + of_era / 4 - of_era / 100 + of_year;
    let days = era * 146_097 + of_era_days - 719_468;
    Some(days as f64 * 86_400.0 + hour * 3600.0 + minute * 60.0 + second)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(
                *name,
                HeaderValue::from_str(value).unwrap_or(HeaderValue::from_static("")),
            );
        }
        headers
    }

    #[test]
    fn openai_durations_and_anthropic_timestamps_are_read() {
        assert_eq!(go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(
            go_duration("1h2m3.5s"),
            Some(Duration::from_millis(3_723_500))
        );
        assert_eq!(go_duration("soon"), None);
        assert_eq!(rfc3339_seconds("1970-01-02T00:00:01Z"), Some(86_401.0));
        assert_eq!(
            rfc3339_seconds("2026-11-26T09:00:30Z"),
            Some(1_795_683_630.0)
        );
    }

    #[test]
    fn both_dialects_state_their_windows() {
        let (requests, tokens) = windows(&headers(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "1000"),
            ("x-ratelimit-remaining-tokens", "900"),
            ("x-ratelimit-reset-tokens", "6s"),
        ]));
        assert_eq!(
            requests,
            Some(Window {
                limit: Some(60.0),
                remaining: 59.0,
                reset: Some(Duration::from_secs(1))
            })
        );
        assert_eq!(
            tokens,
            Some(Window {
                limit: Some(1000.0),
                remaining: 900.0,
                reset: Some(Duration::from_secs(6))
            })
        );
        let (requests, tokens) = windows(&headers(&[
            ("anthropic-ratelimit-tokens-limit", "80000"),
            ("anthropic-ratelimit-tokens-remaining", "79000"),
        ]));
        assert_eq!(requests, None);
        assert_eq!(
            tokens,
            Some(Window {
                limit: Some(80000.0),
                remaining: 79000.0,
                reset: None
            })
        );
    }

    /// An account whose first answer said: 1,000 tokens a second, 100 left (the
    /// bucket whole again in 900 ms); 400 bytes are then a 100-token call.
    async fn paced_at_a_thousand_tokens_a_second() -> (RateLimits, Arc<Account>) {
        paced_by(1).await
    }

    /// [`paced_at_a_thousand_tokens_a_second`] for one of `sharers` processes.
    async fn paced_by(sharers: u32) -> (RateLimits, Arc<Account>) {
        let limits = RateLimits::new();
        limits.set_sharers(sharers);
        let account = limits.account("openai", "api.openai.com", "gpt", None, Some(b"sk-test"));
        let mut first = account.turn(400, None, None).await;
        first.answered(
            200,
            &headers(&[
                ("x-ratelimit-limit-tokens", "1000"),
                ("x-ratelimit-remaining-tokens", "100"),
                ("x-ratelimit-reset-tokens", "900ms"),
            ]),
            None,
            Duration::from_secs(60),
        );
        first.settle(100, 0);
        (limits, account)
    }

    /// When each of three 100-token calls, one after the other, got its turn,
    /// in milliseconds from the first's asking.
    async fn three_calls(account: &Arc<Account>) -> Vec<u128> {
        let start = Instant::now();
        let mut waited = Vec::new();
        for _ in 0..3 {
            let ticket = account.turn(400, None, None).await;
            waited.push(start.elapsed().as_millis());
            ticket.settle(100, 0);
        }
        waited
    }

    #[tokio::test(start_paused = true)]
    async fn requests_past_the_learned_rate_wait_their_turn_in_order() {
        let (limits, account) = paced_at_a_thousand_tokens_a_second().await;
        // 400 bytes is 100 tokens: the first fits, each next waits 100 ms more.
        assert_eq!(three_calls(&account).await, [0, 100, 200]);
        let stats = limits.stats();
        assert_eq!(stats.len(), 1);
        assert!(
            stats[0].account.starts_with("openai/gpt key "),
            "{}",
            stats[0].account
        );
        assert!(!stats[0].account.contains("sk-test"));
        assert_eq!((stats[0].requests, stats[0].waits), (4, 2));
        assert_eq!(stats[0].tokens_per_minute, Some(60_000.0));
    }

    /// Whether the head's turn is timed by the head before it.
    fn turn_timed(account: &Account) -> bool {
        lock(&account.queue).turn.is_some()
    }

    /// Calls queued at once each go when the buckets allow, woken by the timer
    /// the call before set; one that gives up its place, waiting at the head
    /// or for its timer, lets the next go as soon as the buckets allow.
    #[tokio::test(start_paused = true)]
    async fn queued_calls_go_on_time_and_a_place_given_up_is_taken_at_once() {
        let (_limits, account) = paced_at_a_thousand_tokens_a_second().await;
        let call = |account: &Arc<Account>, start: Instant| {
            let account = account.clone();
            tokio::spawn(async move {
                account.turn(400, None, None).await.settle(100, 0);
                start.elapsed().as_millis()
            })
        };
        let went = |calls: Vec<tokio::task::JoinHandle<u128>>| async move {
            let mut went = Vec::new();
            for call in calls {
                let call = tokio::time::timeout(Duration::from_secs(60), call);
                went.push(call.await.expect("a queued call never woke").unwrap());
            }
            went
        };
        // The first goes at once, the second waits at the head on its own
        // timer; the third's and the fourth's turns are timed by the call
        // before each.
        let start = Instant::now();
        let queued: Vec<_> = (0..4).map(|_| call(&account, start)).collect();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(turn_timed(&account));
        assert_eq!(went(queued).await, [0, 100, 200, 300]);

        // The bucket is empty: the first waits 100 ms at the head, the second
        // would go at 200 ms. The first gives up its place after 50 ms: the
        // second is woken at once, and goes when the bucket holds its tokens.
        let start = Instant::now();
        let first = call(&account, start);
        tokio::task::yield_now().await;
        let second = call(&account, start);
        tokio::time::sleep(Duration::from_millis(50)).await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert!(!turn_timed(&account));
        assert_eq!(went(vec![second]).await, [100]);

        // The third's turn is timed for 200 ms when it gives up its place at
        // 150 ms: the fourth, behind it, goes at 200 ms, not at 300.
        let start = Instant::now();
        let calls: Vec<_> = (0..3).map(|_| call(&account, start)).collect();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(turn_timed(&account));
        let [head, third, fourth]: [_; 3] = calls.try_into().unwrap();
        third.abort();
        assert!(third.await.unwrap_err().is_cancelled());
        assert_eq!(went(vec![head, fourth]).await, [100, 200]);
    }

    /// A call served on one runtime times the turn of the next on the next's
    /// own runtime: the first runtime, no longer driven once its call is
    /// served, does not hold the next one up.
    #[test]
    fn a_turn_is_timed_on_the_runtime_of_the_call_that_waits_for_it() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let first = runtime();
        let (_limits, account) = first.block_on(paced_at_a_thousand_tokens_a_second());
        // The bucket's 100 tokens go at once: the next call waits 100 ms at the
        // head, the one after it 100 ms more.
        first.block_on(account.turn(400, None, None)).settle(100, 0);
        let (went, gone) = std::sync::mpsc::channel();
        first.block_on(async {
            let head = account.turn(400, None, None);
            let mut head = std::pin::pin!(head);
            assert!(futures::poll!(head.as_mut()).is_pending());
            let waiter = account.clone();
            std::thread::spawn(move || {
                runtime()
                    .block_on(waiter.turn(400, None, None))
                    .settle(100, 0);
                went.send(()).unwrap();
            });
            while lock(&account.queue).waiting.is_empty() {
                std::thread::yield_now();
            }
            head.await.settle(100, 0);
        });
        // `first` is kept, and not driven again.
        gone.recv_timeout(Duration::from_secs(60))
            .expect("the call on the other runtime was never woken");
        drop(first);
    }

    #[tokio::test(start_paused = true)]
    async fn processes_sharing_an_account_each_keep_to_their_part_of_it() {
        // Two hosts: each has half the stated tokens left (50) and half the
        // rate (500 a second).
        let (limits, account) = paced_by(2).await;
        assert_eq!(three_calls(&account).await, [100, 300, 500]);
        assert_eq!(limits.stats()[0].tokens_per_minute, Some(30_000.0));
    }

    /// Tenant A has a hundred calls queued when tenant B's one comes: B's goes
    /// within one refill interval (100 ms) of the call being served, not after
    /// A's hundred; a tenant of four shares gets four of every five turns.
    #[tokio::test(start_paused = true)]
    async fn each_tenant_waits_behind_its_own_backlog_and_its_share_of_the_others() {
        let (limits, account) = paced_at_a_thousand_tokens_a_second().await;
        let backlog: Vec<_> = (0..100)
            .map(|_| {
                let account = account.clone();
                tokio::spawn(async move { account.turn(400, Some("a"), None).await.settle(100, 0) })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        account.turn(400, Some("b"), None).await.settle(100, 0);
        let waited = start.elapsed();
        eprintln!(
            "two tenants on one account: B's one call waited {waited:?} behind A's 100 (one refill interval: 100 ms)"
        );
        assert!(waited <= Duration::from_millis(200), "{waited:?}");

        limits.set_weight("c", 4);
        let start = Instant::now();
        let eight =
            (0..8).map(|_| async { account.turn(400, Some("c"), None).await.settle(100, 0) });
        futures::future::join_all(eight).await;
        // Eight calls at four of every five turns of 100 ms: ten turns.
        assert!(
            start.elapsed() <= Duration::from_millis(1_100),
            "{:?}",
            start.elapsed()
        );
        for call in backlog {
            call.await.unwrap();
        }
        assert_eq!(limits.stats()[0].requests, 110);
    }

    /// Headers that say the tokens refill over a day make no request wait
    /// longer than the longest pause a `retry-after` may ask.
    #[tokio::test(start_paused = true)]
    async fn a_pace_learned_from_headers_waits_no_longer_than_a_retry_after_may() {
        let limits = RateLimits::new();
        let account = limits.account("openai", "api.openai.com", "gpt", None, None);
        let mut first = account.turn(400, None, None).await;
        first.answered(
            200,
            &headers(&[
                ("x-ratelimit-limit-tokens", "1000"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "24h"),
            ]),
            None,
            Duration::from_secs(60),
        );
        first.settle(100, 0);
        let start = Instant::now();
        account.turn(4_000, None, None).await.settle(1_000, 0);
        assert!(
            start.elapsed() <= Duration::from_secs(60),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_pauses_the_account_and_an_account_without_headers_is_not_paced() {
        let limits = RateLimits::new();
        let account = limits.account("local", "127.0.0.1:1", "m", Some("team"), None);
        let mut first = account.turn(10, None, None).await;
        first.answered(200, &HeaderMap::new(), None, Duration::from_secs(60));
        first.settle(0, 0);
        let mut throttled = account.turn(10, None, None).await;
        throttled.answered(
            429,
            &HeaderMap::new(),
            Some(Duration::from_secs(2)),
            Duration::from_secs(60),
        );
        drop(throttled);
        let reported = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&reported);
        let observer = RateLimitObserver::new(move |wait| {
            lock(&seen).push((wait.account.to_string(), wait.wait, wait.cause));
        });
        let start = Instant::now();
        let _ticket = account.turn(10, None, Some(&observer)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert_eq!(
            *lock(&reported),
            [(
                "team/m".to_owned(),
                Duration::from_secs(2),
                WaitCause::Throttled
            )]
        );
        assert_eq!(limits.stats()[0].throttled, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_request_goes_alone_and_the_others_wait_for_its_headers() {
        // A 429 asking for longer than the request may wait pauses the account
        // only as long as that (the request itself fails), and never overflows.
        let limits = RateLimits::new();
        let paused = limits.account("p", "o", "m", None, None);
        let mut first = paused.turn(4, None, None).await;
        first.answered(
            429,
            &HeaderMap::new(),
            Some(Duration::MAX),
            Duration::from_secs(60),
        );
        assert!(lock(&paused.pace).paused_until.is_some());

        let limits = RateLimits::new();
        let account = limits.account("openai", "o", "m", None, None);
        let mut probe = account.turn(4, None, None).await;
        let waiting = tokio::spawn({
            let account = Arc::clone(&account);
            async move { account.turn(4, None, None).await.probe }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        probe.answered(200, &HeaderMap::new(), None, Duration::from_secs(60));
        assert_eq!(waiting.await.ok(), Some(false));
        probe.settle(10, 5);
    }
}
