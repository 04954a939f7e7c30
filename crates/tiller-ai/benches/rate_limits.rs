//! The shared rate limiter's cost per model call, with 1,000 agents on one
//! account (target: at most 5 µs of CPU per call).
//!
//! Each of 1,000 tasks on a two-worker runtime makes its calls' turns at the
//! account as a request does: it waits its turn, the response's rate-limit
//! headers are read, and the call is settled against its usage. Two regimes:
//! the account's limits far away (no call waits), and paced (the account's
//! tokens run out and the calls queue, each woken in turn). Beside each, the
//! floor measured in the same run: the same tasks doing what any shared count
//! must (a mutex taken, the clock read, once per call), and for the paced
//! calls a queue of bare 2 ms sleeps, alternated with them over seven rounds
//! (the median difference is the figure; target at most 5 µs above), on the
//! two-worker runtime and again on one thread, where no wake-up crosses
//! threads and the limiter's own work shows from under the noise. Process
//! CPU (user + system) over N and 2N calls per task, the difference divided by
//! N × 1,000.
//!
//! ```text
//! cargo bench -p tiller-ai --bench rate_limits
//! ```

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue};
use tiller_ai::RateLimits;
use tiller_ai::ratelimit::Account;
use tiller_test_support::workload::cpu_time;

const AGENTS: usize = 1_000;
/// Rounds of the paced figure and its floor, alternated.
const PACED_ROUNDS: usize = 7;
/// A request body's size: about 100 input tokens.
const BODY_BYTES: usize = 400;

fn headers(limit: &str, remaining: &str, reset: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-ratelimit-limit-tokens",
        HeaderValue::from_str(limit).unwrap(),
    );
    headers.insert(
        "x-ratelimit-remaining-tokens",
        HeaderValue::from_str(remaining).unwrap(),
    );
    headers.insert(
        "x-ratelimit-reset-tokens",
        HeaderValue::from_str(reset).unwrap(),
    );
    headers.insert(
        "x-ratelimit-limit-requests",
        HeaderValue::from_static("1000000000"),
    );
    headers.insert(
        "x-ratelimit-remaining-requests",
        HeaderValue::from_static("999999999"),
    );
    headers.insert(
        "x-ratelimit-reset-requests",
        HeaderValue::from_static("1ms"),
    );
    headers
}

/// An account that has learned `tokens_per_minute` from its first answer.
async fn learned(tokens_per_minute: u64) -> Arc<Account> {
    let limits = RateLimits::new();
    let account = limits.account(
        "openai",
        "api.openai.com:443",
        "gpt-bench",
        None,
        Some(b"Bearer sk"),
    );
    let mut first = account.turn(BODY_BYTES, None, None).await;
    // 120 tokens used of the minute's budget, whole again in 120/rate of a minute.
    let reset_ms = (120.0 * 60_000.0 / tokens_per_minute as f64).max(1.0);
    first.answered(
        200,
        &headers(
            &tokens_per_minute.to_string(),
            &(tokens_per_minute - 120).to_string(),
            &format!("{reset_ms}ms"),
        ),
        None,
        Duration::from_secs(60),
    );
    first.settle(100, 20);
    account
}

/// The process CPU of `calls` calls by each of the agents, each call `work`, and
/// the wall time.
fn cpu_of<F, Fut>(runtime: &tokio::runtime::Runtime, calls: usize, work: F) -> (Duration, Duration)
where
    F: Fn() -> Fut + Send + Sync + 'static + Clone,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    runtime.block_on(async move {
        let (cpu, wall) = (cpu_time(), Instant::now());
        let tasks: Vec<_> = (0..AGENTS)
            .map(|_| {
                let work = work.clone();
                tokio::spawn(async move {
                    for _ in 0..calls {
                        work().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        (cpu_time() - cpu, wall.elapsed())
    })
}

/// The CPU per call of `calls` more calls per agent: the CPU of 2 × `calls`
/// less that of `calls`, so that starting the tasks does not count.
fn per_call<F, Fut>(runtime: &tokio::runtime::Runtime, calls: usize, work: F) -> (f64, Duration)
where
    F: Fn() -> Fut + Send + Sync + 'static + Clone,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (once, _) = cpu_of(runtime, calls, work.clone());
    let (twice, wall) = cpu_of(runtime, 2 * calls, work);
    let more = twice.saturating_sub(once).as_secs_f64() * 1e6;
    (more / (AGENTS * calls) as f64, wall)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let floor = || {
        let shared = Arc::new(Mutex::new((0.0f64, Instant::now())));
        move || {
            let shared = shared.clone();
            async move {
                {
                    let mut count = shared.lock().unwrap();
                    count.0 += 1.0;
                    count.1 = Instant::now();
                }
                tokio::task::yield_now().await;
            }
        }
    };
    let limiter = |account: Arc<Account>, answer: HeaderMap| {
        let answer = Arc::new(answer);
        move || {
            let account = account.clone();
            let answer = answer.clone();
            async move {
                let mut ticket = account.turn(BODY_BYTES, None, None).await;
                ticket.answered(200, &answer, None, Duration::from_secs(60));
                ticket.settle(100, 20);
                tokio::task::yield_now().await;
            }
        }
    };

    // Far from the limits: no call waits.
    let roomy = runtime.block_on(learned(10_000_000_000));
    let roomy_answer = headers("10000000000", "9999990000", "1ms");
    for _ in 0..3 {
        let (floor_us, _) = per_call(&runtime, 20, floor());
        let (limiter_us, wall) =
            per_call(&runtime, 20, limiter(roomy.clone(), roomy_answer.clone()));
        println!(
            "limiter, {AGENTS} agents on one account, no wait: {limiter_us:.2} µs CPU per model call (floor, a shared mutex and the clock: {floor_us:.2} µs; {:.0} ms wall)  (target <= 5 µs)",
            wall.as_secs_f64() * 1e3
        );
    }
    // Paced: 120 tokens a call, 3,600,000 tokens a minute = 500 calls a second;
    // 2 calls each is 4 s of queue at the learned pace.
    let paced_calls = 2 * AGENTS;
    let paced_seconds = paced_calls as f64 / 500.0;
    let paced_answer = headers("3600000", "0", "60s");
    // Its floor: the same queue without a limiter, each call taking a lock in
    // turn and sleeping its 2 ms, as any pacing of 500 calls a second must, then
    // yielding as the limiter's calls do for their request.
    let queue = || {
        let turnstile = Arc::new(tokio::sync::Mutex::new(()));
        move || {
            let turnstile = turnstile.clone();
            async move {
                let turn = turnstile.lock().await;
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(turn);
                tokio::task::yield_now().await;
            }
        }
    };
    // The two alternate, round by round: on a virtual machine a wake-up's cost
    // drifts by more than the limiter's own work, so the median of the rounds'
    // differences is the figure. On one thread, where no wake-up crosses
    // threads, the limiter's own work shows from under that noise.
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (threads, runtime) in [("two worker threads", &runtime), ("one thread", &current)] {
        let mut above = Vec::new();
        for _ in 0..PACED_ROUNDS {
            let (floor_us, _) = per_call(runtime, 1, queue());
            // A fresh account each round: none starts with what the last left.
            let paced = runtime.block_on(learned(3_600_000));
            let (limiter_us, wall) = per_call(runtime, 1, limiter(paced, paced_answer.clone()));
            above.push(limiter_us - floor_us);
            println!(
                "limiter, {AGENTS} agents on one account on {threads}, paced at 500 calls/s (each call queued, woken in turn): {limiter_us:.2} µs CPU per model call (floor, a queue of 2 ms sleeps: {floor_us:.2} µs; {:+.2} µs; {:.1} s wall for {paced_calls} calls, {paced_seconds:.1} s at the learned pace)",
                limiter_us - floor_us,
                wall.as_secs_f64()
            );
        }
        above.sort_by(f64::total_cmp);
        println!(
            "limiter, paced on {threads}: median over {PACED_ROUNDS} rounds {:+.2} µs per model call above the floor (target <= +5 µs)",
            above[PACED_ROUNDS / 2]
        );
    }
}
