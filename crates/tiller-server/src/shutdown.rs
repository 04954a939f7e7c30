//! Graceful shutdown: once it begins, requests that would start new work (an
//! agent, a run, a resumed session, a proxied call) get 503 `shutting-down`;
//! runs in flight get [`crate::ServerConfig::finish_runs`] to end; then the
//! event streams close and the supervisor aborts what still runs.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Shared;
use crate::error::Problem;

/// The routes whose `POST` starts new work.
const NEW_WORK: [&str; 5] = [
    "/agents",
    "/agents/{id}/prompt",
    "/agents/{id}/reply",
    "/sessions/{id}/resume",
    "/api/stream",
];

impl Shared {
    /// `Ok` unless shutdown has begun.
    pub(crate) fn accepting(&self) -> Result<(), Problem> {
        if self.stopping.is_cancelled() {
            return Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting-down",
                "the server is shutting down and takes no new work",
            ));
        }
        Ok(())
    }

    /// Begins shutdown: refuses new work, waits up to `finish_runs` for every
    /// agent to be idle, then ends the event streams.
    pub(crate) async fn drain(&self) {
        self.stopping.cancel();
        let supervisor = &self.supervisor;
        let runs = supervisor
            .list()
            .into_iter()
            .filter_map(|agent| supervisor.get(agent.id.as_str()))
            .map(|agent| async move { agent.wait_for_idle().await });
        // Runs still going when the time is up are aborted by the supervisor's
        // shutdown.
        let _ =
            tokio::time::timeout(self.config.finish_runs, futures::future::join_all(runs)).await;
        self.closing.cancel();
    }
}

/// Refuses requests that start new work once shutdown has begun.
pub(crate) async fn refuse_new_work(
    State(shared): State<Arc<Shared>>,
    route: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let starts_work = request.method() == Method::POST
        && route.is_some_and(|route| NEW_WORK.contains(&route.as_str()));
    if starts_work && let Err(problem) = shared.accepting() {
        return problem.into_response();
    }
    next.run(request).await
}
