//! Graceful shutdown: once it begins, requests that would start new work (an
//! agent, a run, a resumed session, a proxied call) get 503 `shutting-down`;
//! runs in flight get [`crate::ServerConfig::finish_runs`] to end; then the
//! event streams close, once they have sent the events already published (a
//! client that watched a run to its end gets its `agent_end`), and the supervisor
//! aborts what still runs.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, Stream, StreamExt};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::Shared;
use crate::error::Problem;

/// The routes whose `POST` starts new work.
const NEW_WORK: [&str; 6] = [
    "/agents",
    "/triggers/{topic}",
    "/agents/{id}/prompt",
    "/agents/{id}/reply",
    "/sessions/{id}/resume",
    "/api/stream",
];

/// The routes whose `POST` or `DELETE` writes nothing to the session store, or
/// must reach an agent whatever the store does (an abort).
const WRITES_NOTHING: [&str; 3] = ["/api/stream", "/admin/drain", "/agents/{id}/abort"];

/// What a client is told to wait before it tries again while the store fails.
const STORE_RETRY_AFTER_SECONDS: u64 = 2;

impl Shared {
    /// `Ok` while the session store takes writes; else 503 `store-unavailable`
    /// (with `Retry-After`): nothing the request would change could be kept.
    pub(crate) fn writable(&self) -> Result<(), Problem> {
        if self.supervisor.store_health().is_unavailable() {
            return Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "the session store cannot write just now (a full disk or a lost database): \
                 requests that would write change nothing until it recovers; try again later",
            ));
        }
        Ok(())
    }

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
        if self.config.drain_on_shutdown
            && let Some(drained) = self.agents.drain().await
        {
            tracing::info!(
                moved = drained.moved.len(),
                failed = drained.failed.len(),
                "moved this host's agents away"
            );
        }
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

/// Refuses requests that start new work once shutdown has begun, and requests
/// that would write while the session store cannot (503 `store-unavailable`,
/// `Retry-After`).
pub(crate) async fn refuse_new_work(
    State(shared): State<Arc<Shared>>,
    route: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let route = route.as_ref().map(MatchedPath::as_str);
    let starts_work =
        request.method() == Method::POST && route.is_some_and(|route| NEW_WORK.contains(&route));
    if starts_work && let Err(problem) = shared.accepting() {
        return problem.into_response();
    }
    let writes = matches!(*request.method(), Method::POST | Method::DELETE)
        && route.is_none_or(|route| !WRITES_NOTHING.contains(&route));
    if writes && let Err(problem) = shared.writable() {
        return store_unavailable(problem);
    }
    next.run(request).await
}

/// `problem` with the `Retry-After` a client waits while the store fails.
pub(crate) fn store_unavailable(problem: Problem) -> Response {
    let mut response = problem.into_response();
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from(STORE_RETRY_AFTER_SECONDS),
    );
    response
}

/// `events` until `closing` is cancelled, then those of them ready at that moment
/// (published already), then the end.
pub(crate) fn until_closing<S: Stream + Unpin>(
    events: S,
    closing: &CancellationToken,
) -> UntilClosing<S> {
    UntilClosing {
        events,
        closing: Box::pin(closing.clone().cancelled_owned()),
    }
}

/// The stream [`until_closing`] makes.
pub(crate) struct UntilClosing<S> {
    events: S,
    closing: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<S: Stream + Unpin> Stream for UntilClosing<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        if let Poll::Ready(event) = self.events.poll_next_unpin(cx) {
            return Poll::Ready(event);
        }
        match self.closing.poll_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use futures::channel::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::until_closing;

    #[tokio::test]
    async fn a_closed_stream_sends_the_events_published_before_it_ends() {
        let (publish, published) = mpsc::unbounded();
        let closing = CancellationToken::new();
        let mut events = until_closing(published, &closing);
        publish.unbounded_send(0).unwrap();
        assert_eq!(events.next().await, Some(0));
        // Closed with two events not yet sent, and the publisher still there.
        publish.unbounded_send(1).unwrap();
        publish.unbounded_send(2).unwrap();
        closing.cancel();
        assert_eq!(events.collect::<Vec<_>>().await, vec![1, 2]);
        drop(publish);
    }

    #[tokio::test]
    async fn a_waiting_stream_ends_when_closed() {
        let (_publish, published) = mpsc::unbounded::<u32>();
        let closing = CancellationToken::new();
        let mut events = until_closing(published, &closing);
        let (next, ()) = futures::join!(events.next(), async { closing.cancel() });
        assert_eq!(next, None);
    }
}
