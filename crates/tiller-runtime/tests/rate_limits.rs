//! Many agents on one provider account: the supervisor's shared rate limiter
//! against a server that enforces a token budget, as providers do.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::join_all;
use tiller::{
    AgentEvent, AgentSettings, AgentSpec, Delivered, Model, RunEnd, Supervisor, SupervisorConfig,
    ai::ApiKey,
};
use tiller_test_support::sse::{OPENAI_DONE, openai_delta, openai_finish, openai_usage};
use tiller_test_support::{MockResponse, MockServer};

/// The agents, one prompt each.
const AGENTS: usize = 200;
/// The account's tokens per window, and the window: a tokens-per-minute budget
/// in fast motion.
const TOKENS: f64 = 4_000.0;
const WINDOW: Duration = Duration::from_millis(500);
/// The tokens each answer writes.
const OUTPUT_TOKENS: u64 = 20;

/// A token bucket as a provider keeps one: refilled continuously, a request
/// charged its input (a quarter of its body's bytes) and output when it
/// arrives, a 429 with `retry-after-ms` when the bucket cannot cover it.
struct Account {
    level: f64,
    at: Instant,
}

struct Counts {
    answered: AtomicU64,
    throttled: AtomicU64,
}

fn provider(server: &MockServer) -> Arc<Counts> {
    let counts = Arc::new(Counts {
        answered: AtomicU64::new(0),
        throttled: AtomicU64::new(0),
    });
    let account = Mutex::new(Account {
        level: TOKENS,
        at: Instant::now(),
    });
    let seen = counts.clone();
    server.respond_with(move |request| {
        let per_second = TOKENS / WINDOW.as_secs_f64();
        let input = (request.body.to_string().len() as u64).div_ceil(4);
        let charge = (input + OUTPUT_TOKENS) as f64;
        let mut account = account.lock().unwrap();
        let now = Instant::now();
        account.level =
            (account.level + now.duration_since(account.at).as_secs_f64() * per_second).min(TOKENS);
        account.at = now;
        let headers = |response: MockResponse, level: f64| {
            let full_in = ((TOKENS - level.max(0.0)) / per_second * 1000.0).ceil();
            response
                .header("x-ratelimit-limit-tokens", &format!("{TOKENS}"))
                .header(
                    "x-ratelimit-remaining-tokens",
                    &format!("{}", level.max(0.0).floor()),
                )
                .header("x-ratelimit-reset-tokens", &format!("{full_in}ms"))
        };
        if account.level < charge {
            seen.throttled.fetch_add(1, Ordering::Relaxed);
            let wait = ((charge - account.level) / per_second * 1000.0).ceil();
            let refused = MockResponse::status(429, "Rate limit reached for tokens per minute")
                .header("retry-after-ms", &format!("{wait}"));
            return headers(refused, account.level);
        }
        account.level -= charge;
        seen.answered.fetch_add(1, Ordering::Relaxed);
        let body = [
            openai_delta(serde_json::json!({"role": "assistant", "content": ""})),
            openai_delta(serde_json::json!({"content": "Done."})),
            openai_finish("stop"),
            openai_usage(input, OUTPUT_TOKENS),
            OPENAI_DONE.to_owned(),
        ]
        .concat();
        headers(MockResponse::sse(body), account.level)
    });
    counts
}

/// What 200 agents saw: how each run ended, the 429s the server sent, and the
/// `rate_limited` events.
struct Outcome {
    ends: Vec<RunEnd>,
    throttled: u64,
    answered: u64,
    waits: usize,
}

async fn two_hundred_agents(share_rate_limits: bool) -> Outcome {
    let server = MockServer::start().await;
    let counts = provider(&server);
    let supervisor = Supervisor::with_config(SupervisorConfig {
        share_rate_limits,
        ..SupervisorConfig::default()
    })
    .await
    .unwrap();
    let model = Model::openai_compatible(server.base_url(), "gpt-test").with_provider("openai");
    let mut settings = AgentSettings::new(model);
    settings.definition.run.stream.transport.api_key = Some(ApiKey::new("sk-shared"));
    let settings = Arc::new(settings);
    let agents =
        join_all((0..AGENTS).map(|_| supervisor.spawn(AgentSpec::new(settings.clone())))).await;
    let waits = Arc::new(AtomicU64::new(0));
    let runs = agents.into_iter().enumerate().map(|(index, agent)| {
        let agent = agent.unwrap();
        let waits = waits.clone();
        async move {
            let mut events = agent.subscribe();
            let counting = tokio::spawn(async move {
                while let Some(envelope) = events.next().await {
                    match envelope.event {
                        Delivered::Event(AgentEvent::RateLimited { wait_ms, .. }) => {
                            assert!(wait_ms > 0);
                            waits.fetch_add(1, Ordering::Relaxed);
                        }
                        Delivered::Event(AgentEvent::AgentEnd { .. }) => return,
                        _ => {}
                    }
                }
            });
            let outcome = agent
                .run(format!(
                    "Agent {index}: summarize ticket {index} in one word."
                ))
                .await
                .unwrap();
            counting.await.unwrap();
            outcome.end
        }
    });
    let ends = join_all(runs).await;
    if let Some(limits) = supervisor.rate_limits() {
        let stats = limits.stats();
        assert_eq!(stats.len(), 1, "one account: {stats:?}");
        assert_eq!(stats[0].throttled, counts.throttled.load(Ordering::Relaxed));
    }
    Outcome {
        ends,
        throttled: counts.throttled.load(Ordering::Relaxed),
        answered: counts.answered.load(Ordering::Relaxed),
        waits: waits.load(Ordering::Relaxed) as usize,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_agents_share_one_accounts_limits_and_none_fails() {
    let paced = two_hundred_agents(true).await;
    let alone = two_hundred_agents(false).await;
    println!(
        "200 agents, one account of {TOKENS} tokens per {} ms: with the shared limiter {} 429s, {} runs completed, {} waits; without it {} 429s, {} runs completed",
        WINDOW.as_millis(),
        paced.throttled,
        paced
            .ends
            .iter()
            .filter(|end| **end == RunEnd::Completed)
            .count(),
        paced.waits,
        alone.throttled,
        alone
            .ends
            .iter()
            .filter(|end| **end == RunEnd::Completed)
            .count(),
    );
    // With the limiter every run completes, each answered once.
    assert!(
        paced.ends.iter().all(|end| *end == RunEnd::Completed),
        "{:?}",
        paced.ends
    );
    assert_eq!(paced.answered, AGENTS as u64);
    // The calls waited their turn, as events said.
    assert!(paced.waits > 0);
    // Alone, each agent meets the limit by itself: a storm of 429s.
    assert!(alone.throttled >= 100, "{}", alone.throttled);
    assert!(
        paced.throttled * 10 <= alone.throttled,
        "with the limiter {} 429s, without {}",
        paced.throttled,
        alone.throttled
    );
}
