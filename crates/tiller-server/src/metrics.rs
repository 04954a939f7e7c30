//! `GET /metrics`: the server in Prometheus' text format. Agents by status, HTTP
//! responses by route and status, problems by kind, events written to
//! event-stream clients, and the pi proxy's model calls with their time to the
//! first event.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use dashmap::DashMap;
use tiller::AgentStatus;

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
    /// Model calls through `/api/stream`.
    proxy_calls: AtomicU64,
    /// Their summed time to the first event, in microseconds.
    proxy_first_event_micros: AtomicU64,
    /// How many of them produced a first event.
    proxy_first_events: AtomicU64,
}

impl Metrics {
    /// One more event written to a streaming client.
    pub(crate) fn event_streamed(&self) {
        self.events_streamed.fetch_add(1, Ordering::Relaxed);
    }

    /// One more model call through the proxy.
    pub(crate) fn proxy_call(&self) {
        self.proxy_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// A proxied call's first event came after `wait`.
    pub(crate) fn proxy_first_event(&self, wait: Duration) {
        let micros = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.proxy_first_event_micros
            .fetch_add(micros, Ordering::Relaxed);
        self.proxy_first_events.fetch_add(1, Ordering::Relaxed);
    }
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
pub(crate) async fn render(State(shared): State<Arc<Shared>>) -> Response {
    let metrics = &shared.metrics;
    let mut text = String::new();
    let mut by_status = [0u64; 4];
    for agent in shared.supervisor.list() {
        let slot = match agent.status {
            AgentStatus::Idle => 0,
            AgentStatus::Running => 1,
            AgentStatus::Hibernated => 2,
            AgentStatus::Stopped { .. } => 3,
        };
        by_status[slot] += 1;
    }
    header_of(&mut text, "tiller_agents", "gauge", "Agents by status.");
    for (status, count) in ["idle", "running", "hibernated", "stopped"]
        .iter()
        .zip(by_status)
    {
        let _ = writeln!(text, "tiller_agents{{status=\"{status}\"}} {count}");
    }
    header_of(
        &mut text,
        "tiller_http_responses_total",
        "counter",
        "HTTP responses by route and status.",
    );
    let mut responses: Vec<_> = metrics
        .responses
        .iter()
        .map(|entry| (entry.key().clone(), *entry.value()))
        .collect();
    responses.sort();
    for ((route, status), count) in responses {
        let _ = writeln!(
            text,
            "tiller_http_responses_total{{route=\"{route}\",status=\"{status}\"}} {count}"
        );
    }
    header_of(
        &mut text,
        "tiller_problems_total",
        "counter",
        "Problem responses by kind.",
    );
    let mut problems: Vec<_> = metrics
        .problems
        .iter()
        .map(|entry| (entry.key().clone(), *entry.value()))
        .collect();
    problems.sort();
    for (kind, count) in problems {
        let _ = writeln!(text, "tiller_problems_total{{kind=\"{kind}\"}} {count}");
    }
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
        header_of(&mut text, name, "counter", help);
        let _ = writeln!(text, "{name} {}", value.load(Ordering::Relaxed));
    }
    header_of(
        &mut text,
        "tiller_proxy_first_event_seconds",
        "summary",
        "Time from a proxied call to the model's first event.",
    );
    let micros = metrics.proxy_first_event_micros.load(Ordering::Relaxed);
    let _ = writeln!(
        text,
        "tiller_proxy_first_event_seconds_sum {}\ntiller_proxy_first_event_seconds_count {}",
        micros as f64 / 1e6,
        metrics.proxy_first_events.load(Ordering::Relaxed)
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

fn header_of(text: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
}
