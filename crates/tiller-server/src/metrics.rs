//! `GET /metrics`: the server in Prometheus' text format. Agents by status, runs
//! started and ended (by how), the agents' model calls with their time to the first
//! event, HTTP responses by route and status, problems by kind, events written to
//! event-stream clients, the pi proxy's model calls with their time to the
//! first event, and whether the session store writes. Runs and model calls are counted for the agents whose events the
//! server records: those made through the API, and any other once a client follows
//! it.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use dashmap::DashMap;
use tiller::{AgentEvent, Delivered, runtime::AgentStatus};

use crate::Shared;

/// The kind of problem a response carries (`busy`, `invalid`, …), set by
/// [`crate::Problem`]'s response for the metrics to count.
#[derive(Debug, Clone)]
pub(crate) struct ProblemKind(pub(crate) String);

/// What the server counts.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Responses by route pattern and status.
    responses: DashMap<(String, u16), u64>,
    /// Problems by kind.
    problems: DashMap<String, u64>,
    /// Events written to event-stream clients.
    events_streamed: AtomicU64,
    /// Connections served on the shard of the agent their first request names.
    connections_beside_agent: AtomicU64,
    /// Connections served on a shard chosen in turn.
    connections_in_turn: AtomicU64,
    /// Model calls through `/api/stream`.
    proxy_calls: AtomicU64,
    /// Their summed time to the first event, in microseconds.
    proxy_first_event_micros: AtomicU64,
    /// How many of them produced a first event.
    proxy_first_events: AtomicU64,
    /// Runs started.
    runs_started: AtomicU64,
    /// Runs ended, by how (`completed`, `aborted`, …).
    runs_ended: DashMap<String, u64>,
    /// The agents' model calls that produced a first event.
    model_first_events: AtomicU64,
    /// Their summed time from the turn's start to that event, in microseconds.
    model_first_event_micros: AtomicU64,
}

/// What [`Metrics::observe`] remembers of one agent between its events.
#[derive(Debug, Default)]
pub(crate) struct AgentClock {
    /// When its current turn started, until the model's first event.
    turn_started: Option<Instant>,
}

impl Metrics {
    /// One more event written to a streaming client.
    pub(crate) fn event_streamed(&self) {
        self.events_streamed.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection is served beside its agent, or on a shard chosen in turn.
    pub(crate) fn connection_placed(&self, beside_agent: bool) {
        let count = if beside_agent {
            &self.connections_beside_agent
        } else {
            &self.connections_in_turn
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// One more model call through the proxy.
    pub(crate) fn proxy_call(&self) {
        self.proxy_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// A proxied call's first event came after `wait`.
    pub(crate) fn proxy_first_event(&self, wait: Duration) {
        add_micros(&self.proxy_first_event_micros, wait);
        self.proxy_first_events.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts what one of an agent's events says: a run started or ended, or the
    /// model's first event of a turn.
    pub(crate) fn observe(&self, event: &Delivered, clock: &mut AgentClock) {
        let Delivered::Event(event) = event else {
            return;
        };
        match event {
            AgentEvent::AgentStart => {
                self.runs_started.fetch_add(1, Ordering::Relaxed);
            }
            AgentEvent::TurnStart => clock.turn_started = Some(Instant::now()),
            AgentEvent::MessageStart { message } if message.as_assistant().is_some() => {
                if let Some(started) = clock.turn_started.take() {
                    add_micros(&self.model_first_event_micros, started.elapsed());
                    self.model_first_events.fetch_add(1, Ordering::Relaxed);
                }
            }
            AgentEvent::AgentEnd { reason, .. } => {
                let how = serde_json::to_value(reason)
                    .ok()
                    .and_then(|how| how.as_str().map(str::to_owned))
                    .unwrap_or_default();
                *self.runs_ended.entry(how).or_default() += 1;
            }
            _ => {}
        }
    }
}

fn add_micros(sum: &AtomicU64, wait: Duration) {
    sum.fetch_add(
        u64::try_from(wait.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// Counts every response of a routed request.
pub(crate) async fn count(
    State(shared): State<Arc<Shared>>,
    route: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let route = route.map_or_else(|| "other".to_owned(), |path| path.as_str().to_owned());
    let response = next.run(request).await;
    let metrics = &shared.metrics;
    *metrics
        .responses
        .entry((route, response.status().as_u16()))
        .or_default() += 1;
    if let Some(ProblemKind(kind)) = response.extensions().get::<ProblemKind>() {
        *metrics.problems.entry(kind.clone()).or_default() += 1;
    }
    response
}

/// `GET /metrics`.
pub(crate) async fn render(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    match shared.caller(&headers) {
        Ok(caller) if caller.reads_metrics => {}
        Ok(_) => {
            return crate::Problem::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the metrics cover every tenant: they need a token marked `metrics: true`",
            )
            .into_response();
        }
        Err(problem) => return problem.into_response(),
    }
    let metrics = &shared.metrics;
    let mut text = String::new();
    agent_metrics(&mut text, &shared.supervisor);
    counter(
        &mut text,
        "tiller_runs_started_total",
        "Runs started.",
        &metrics.runs_started,
    );
    header_of(
        &mut text,
        "tiller_runs_ended_total",
        "counter",
        "Runs ended, by how.",
    );
    for (how, count) in sorted(&metrics.runs_ended) {
        let _ = writeln!(text, "tiller_runs_ended_total{{end=\"{how}\"}} {count}");
    }
    summary(
        &mut text,
        "tiller_model_first_event_seconds",
        "Time from a turn's start to the model's first event.",
        &metrics.model_first_event_micros,
        &metrics.model_first_events,
    );
    http_metrics(&mut text, metrics);
    let counters = [
        (
            "tiller_events_streamed_total",
            "Events written to event-stream clients.",
            &metrics.events_streamed,
        ),
        (
            "tiller_proxy_calls_total",
            "Model calls through /api/stream.",
            &metrics.proxy_calls,
        ),
    ];
    for (name, help, value) in counters {
        counter(&mut text, name, help, value);
    }
    summary(
        &mut text,
        "tiller_proxy_first_event_seconds",
        "Time from a proxied call to the model's first event.",
        &metrics.proxy_first_event_micros,
        &metrics.proxy_first_events,
    );
    store_metrics(&mut text, shared.supervisor.store_health());
    provider_metrics(&mut text, &shared.supervisor);
    shared.agents.metrics(&mut text);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Whether the session store writes, and how often it failed.
fn store_metrics(text: &mut String, health: &tiller::store::StoreHealth) {
    let figures = [
        (
            "tiller_store_unavailable",
            "gauge",
            "1 while the session store cannot write (writes wait, requests that would write get 503).",
            u64::from(health.is_unavailable()),
        ),
        (
            "tiller_store_write_failures_total",
            "counter",
            "Tries of a write the session store failed (each tried again).",
            health.failures(),
        ),
        (
            "tiller_store_outages_total",
            "counter",
            "Times the session store became unavailable.",
            health.outages(),
        ),
    ];
    for (name, kind, help, value) in figures {
        header_of(text, name, kind, help);
        let _ = writeln!(text, "{name} {value}");
    }
}

/// What the agents share of their providers: each account's pace (requests,
/// waits, 429s, the learned tokens per minute), each failing endpoint's breaker,
/// and each tenant's budget and spending. A family with nothing to show is left
/// out.
fn provider_metrics(text: &mut String, supervisor: &tiller::Supervisor) {
    use tiller::ai::ratelimit::AccountStats;
    let accounts = supervisor
        .rate_limits()
        .map(|limits| limits.stats())
        .unwrap_or_default();
    let families: [Family<AccountStats, Option<f64>>; 5] = [
        (
            "tiller_rate_limit_requests_total",
            "counter",
            "Requests sent, by provider account.",
            |account| Some(account.requests as f64),
        ),
        (
            "tiller_rate_limit_waits_total",
            "counter",
            "Requests that waited their turn at their account.",
            |account| Some(account.waits as f64),
        ),
        (
            "tiller_rate_limit_wait_seconds_total",
            "counter",
            "Time requests waited at their account, in all.",
            |account| Some(account.waited.as_secs_f64()),
        ),
        (
            "tiller_rate_limit_throttled_total",
            "counter",
            "Responses with status 429, by account.",
            |account| Some(account.throttled as f64),
        ),
        (
            "tiller_rate_limit_tokens_per_minute",
            "gauge",
            "The account's tokens per minute, as learned from its rate-limit headers.",
            |account| account.tokens_per_minute,
        ),
    ];
    for (name, kind, help, value) in families {
        let values: Vec<_> = accounts
            .iter()
            .filter_map(|account| Some((&account.account, value(account)?)))
            .collect();
        if values.is_empty() {
            continue;
        }
        header_of(text, name, kind, help);
        for (account, value) in values {
            let _ = writeln!(text, "{name}{{account={}}} {value}", quoted(account));
        }
    }
    breaker_metrics(text, supervisor);
    tenant_metrics(text, supervisor);
}

/// The live agents, by status.
fn agent_metrics(text: &mut String, supervisor: &tiller::Supervisor) {
    let mut by_status = [0u64; 5];
    for agent in supervisor.list() {
        let slot = match agent.status {
            AgentStatus::Idle => 0,
            AgentStatus::Running => 1,
            AgentStatus::Hibernated => 2,
            AgentStatus::Stopped { .. } => 3,
            AgentStatus::WaitingForInput => 4,
        };
        by_status[slot] += 1;
    }
    header_of(text, "tiller_agents", "gauge", "Agents by status.");
    for (status, count) in [
        "idle",
        "running",
        "hibernated",
        "stopped",
        "waiting_for_input",
    ]
    .iter()
    .zip(by_status)
    {
        let _ = writeln!(text, "tiller_agents{{status=\"{status}\"}} {count}");
    }
}

/// The HTTP responses by route and status, the problems by kind, and where
/// connections are served.
fn http_metrics(text: &mut String, metrics: &Metrics) {
    header_of(
        text,
        "tiller_http_responses_total",
        "counter",
        "HTTP responses by route and status.",
    );
    for ((route, status), count) in sorted(&metrics.responses) {
        let _ = writeln!(
            text,
            "tiller_http_responses_total{{route=\"{route}\",status=\"{status}\"}} {count}"
        );
    }
    header_of(
        text,
        "tiller_problems_total",
        "counter",
        "Problem responses by kind.",
    );
    for (kind, count) in sorted(&metrics.problems) {
        let _ = writeln!(text, "tiller_problems_total{{kind=\"{kind}\"}} {count}");
    }
    header_of(
        text,
        "tiller_connections_total",
        "counter",
        "Connections by where they are served: on the shard of the agent their first request names, or on one chosen in turn.",
    );
    for (placed, count) in [
        ("beside_agent", &metrics.connections_beside_agent),
        ("in_turn", &metrics.connections_in_turn),
    ] {
        let count = count.load(Ordering::Relaxed);
        let _ = writeln!(
            text,
            "tiller_connections_total{{placed=\"{placed}\"}} {count}"
        );
    }
}

/// Each failing endpoint's breaker.
fn breaker_metrics(text: &mut String, supervisor: &tiller::Supervisor) {
    use tiller::ai::BreakerStats;
    let breakers = supervisor.breakers().stats();
    if breakers.is_empty() {
        return;
    }
    let rows: [Family<BreakerStats, u64>; 3] = [
        (
            "tiller_breaker_open",
            "gauge",
            "Whether the endpoint's circuit is open (1) or closed (0).",
            |breaker| u64::from(breaker.open),
        ),
        (
            "tiller_breaker_failures",
            "gauge",
            "The endpoint's failures in a row.",
            |breaker| u64::from(breaker.failures),
        ),
        (
            "tiller_breaker_opened_total",
            "counter",
            "Times the endpoint's circuit opened.",
            |breaker| breaker.opened,
        ),
    ];
    for (name, kind, help, value) in rows {
        header_of(text, name, kind, help);
        for breaker in &breakers {
            let endpoint = quoted(&breaker.endpoint);
            let _ = writeln!(text, "{name}{{endpoint={endpoint}}} {}", value(breaker));
        }
    }
}

/// Each tenant's budget and spending.
fn tenant_metrics(text: &mut String, supervisor: &tiller::Supervisor) {
    use tiller::run::budget::BudgetLimit;
    let budgets = supervisor.tenant_budgets();
    if budgets.is_empty() {
        return;
    }
    header_of(
        text,
        "tiller_tenant_spent",
        "gauge",
        "What each tenant with a budget spent, by what is counted.",
    );
    for (tenant, _, spent) in &budgets {
        let tenant = quoted(tenant);
        // What is counted: every bound but the total, which is a sum.
        let counted = BudgetLimit::ALL
            .into_iter()
            .filter(|limit| *limit != BudgetLimit::TotalTokens);
        for limit in counted {
            let _ = writeln!(
                text,
                "tiller_tenant_spent{{tenant={tenant},counted=\"{}\"}} {}",
                limit.as_str(),
                spent.amount(limit).value()
            );
        }
    }
    header_of(
        text,
        "tiller_tenant_budget",
        "gauge",
        "Each tenant's budget, by bound (only the bounds set).",
    );
    for (tenant, budget, _) in &budgets {
        let tenant = quoted(tenant);
        for limit in BudgetLimit::ALL {
            if let Some(max) = budget.bound(limit) {
                let _ = writeln!(
                    text,
                    "tiller_tenant_budget{{tenant={tenant},bound=\"{}\"}} {}",
                    limit.as_str(),
                    max.value()
                );
            }
        }
    }
}

/// A metric family read from each of a list of figures: its name, type, help
/// and how to read its value from one.
type Family<T, V> = (&'static str, &'static str, &'static str, fn(&T) -> V);

/// A label value, quoted and escaped as Prometheus reads it.
fn quoted(value: &str) -> String {
    let escaped = value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!("\"{escaped}\"")
}

/// The cluster's figures on this host.
#[cfg(feature = "cluster")]
pub(crate) fn cluster_metrics(text: &mut String, metrics: &tiller_cluster::ClusterMetrics) {
    let gauges = [
        (
            "tiller_cluster_hosts_live",
            "Live hosts of the cluster, as this host sees them.",
            metrics.hosts_live as u64,
        ),
        (
            "tiller_cluster_leases_held",
            "Agents this host owns (leases it holds).",
            metrics.leases_held as u64,
        ),
        (
            "tiller_cluster_leases",
            "Leases in the cluster.",
            metrics.leases_total as u64,
        ),
    ];
    for (name, help, value) in gauges {
        header_of(text, name, "gauge", help);
        let _ = writeln!(text, "{name} {value}");
    }
    let counters = [
        (
            "tiller_cluster_forwarded_requests_total",
            "Requests this host forwarded to another host's agent.",
            metrics.forwarded_requests,
        ),
        (
            "tiller_cluster_activations_total",
            "Agents brought up on this host.",
            metrics.activations,
        ),
        (
            "tiller_cluster_failovers_total",
            "Agents taken over here after their host died.",
            metrics.failovers,
        ),
        (
            "tiller_cluster_fencing_refusals_total",
            "Lease writes and event batches refused because another host took over.",
            metrics.fencing_refusals,
        ),
        (
            "tiller_cluster_self_fences_total",
            "Times this host fenced itself for want of a heartbeat.",
            metrics.self_fences,
        ),
        (
            "tiller_cluster_events_dropped_total",
            "Events dropped because JetStream did not take them in time.",
            metrics.events_dropped,
        ),
        (
            "tiller_cluster_live_batches_total",
            "Batches of events published on the live path.",
            metrics.live_batches,
        ),
        (
            "tiller_cluster_stream_batches_total",
            "Batches of events written to the stream.",
            metrics.stream_batches,
        ),
        (
            "tiller_cluster_lease_writes_total",
            "Writes of leases marking them busy or idle.",
            metrics.lease_writes,
        ),
        (
            "tiller_cluster_ops_refused_total",
            "Ops from other hosts refused for whom they came from or what they asked.",
            metrics.ops_refused,
        ),
    ];
    for (name, help, value) in counters {
        header_of(text, name, "counter", help);
        let _ = writeln!(text, "{name} {value}");
    }
}

/// A labelled counter's values, sorted by their labels.
fn sorted<K: Clone + Ord + std::hash::Hash + Eq>(values: &DashMap<K, u64>) -> Vec<(K, u64)> {
    let mut sorted: Vec<_> = values
        .iter()
        .map(|entry| (entry.key().clone(), *entry.value()))
        .collect();
    sorted.sort();
    sorted
}

/// A counter without labels.
fn counter(text: &mut String, name: &str, help: &str, value: &AtomicU64) {
    header_of(text, name, "counter", help);
    let _ = writeln!(text, "{name} {}", value.load(Ordering::Relaxed));
}

/// A summary of times: their sum in seconds (kept in microseconds) and count.
fn summary(text: &mut String, name: &str, help: &str, micros: &AtomicU64, count: &AtomicU64) {
    header_of(text, name, "summary", help);
    let _ = writeln!(
        text,
        "{name}_sum {}\n{name}_count {}",
        micros.load(Ordering::Relaxed) as f64 / 1e6,
        count.load(Ordering::Relaxed)
    );
}

fn header_of(text: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
}
