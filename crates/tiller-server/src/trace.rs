//! A `tracing` span per request: `request{method, route, agent | session}`, with
//! an `answered{status}` event at its end. A run a request starts gets its `run`
//! span (agent, session, run number) as a child of the request's, so a log or a
//! trace links the request to the agent and the run it started.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;
use tracing::field::Empty;

/// Runs the request in its span.
pub(crate) async fn span(route: Option<MatchedPath>, request: Request, next: Next) -> Response {
    let route = route.as_ref().map_or("other", MatchedPath::as_str);
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        route,
        agent = Empty,
        session = Empty
    );
    // `/agents/{id}…` and `/sessions/{id}…`: the id is the path's second segment.
    let id = request.uri().path().split('/').nth(2);
    if let Some(id) = id {
        if route.starts_with("/agents/{id}") {
            span.record("agent", id);
        } else if route.starts_with("/sessions/{id}") {
            span.record("session", id);
        }
    }
    async move {
        let response = next.run(request).await;
        tracing::info!(status = response.status().as_u16(), "answered");
        response
    }
    .instrument(span)
    .await
}
