//! A host of a cluster before it has joined: its port already listens (so a
//! load balancer's check and a script's `curl` get an answer, not a hang), and
//! every request, `/healthz` included, is answered 503 `joining` with
//! `Retry-After: 1` until the host has joined and the server takes over the
//! same socket.

use std::os::fd::AsFd;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

use crate::error::Problem;

/// Runs `join` while answering every request on `listener` 503 `joining`; once
/// it completes, the requests in flight are answered and `listener` is the
/// caller's again.
///
/// # Errors
/// When the socket cannot be shared with the interim answerer.
pub async fn while_joining<T>(
    listener: &TcpListener,
    join: impl Future<Output = T>,
) -> std::io::Result<T> {
    let shared = std::net::TcpListener::from(listener.as_fd().try_clone_to_owned()?);
    shared.set_nonblocking(true)?;
    let interim = TcpListener::from_std(shared)?;
    let (joined, done) = tokio::sync::oneshot::channel::<()>();
    let answering = tokio::spawn(async move {
        let app = axum::Router::new().fallback(joining);
        let _ = axum::serve(interim, app)
            .with_graceful_shutdown(async move {
                let _ = done.await;
            })
            .await;
    });
    let outcome = join.await;
    let _ = joined.send(());
    // The requests in flight are answered; a client slow to read them does
    // not hold the server back.
    let mut answering = tokio_util::task::AbortOnDropHandle::new(answering);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), &mut answering).await;
    Ok(outcome)
}

/// 503 `joining`.
async fn joining() -> Response {
    let mut response = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "joining",
        "this host is joining its cluster: it takes requests once it has joined",
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}
