//! The accept loop: HTTP/1.1 connections, each bounded in time and in number.
//!
//! - **A request's head must arrive in time.** A client has
//!   [`crate::ServerConfig::header_timeout`] to send a request's head, counted from
//!   when the server starts waiting for it: on a new connection, and again after
//!   each response on a kept-alive one. A client that sends half a request, or
//!   keeps a connection open without using it, is disconnected. A response being
//!   streamed (server-sent events) and an upgraded WebSocket are not requests being
//!   read, so they are never cut by it.
//! - **At most [`crate::ServerConfig::max_connections`] connections.** One past it
//!   is answered `503 too-many-connections` and closed, so a crowd of idle clients
//!   slows no one down for longer than the timeout above.
//! - **Graceful end.** Once shutdown is asked, no connection is accepted; idle
//!   kept-alive connections close; requests in flight finish.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use axum::serve::Listener;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::ServerConfig;
use crate::error::Problem;

/// How many connections past the cap are answered at once; others past that are
/// closed unanswered.
const REFUSALS_AT_ONCE: usize = 64;

/// How long a connection past the cap has to send its request's head before it
/// is closed unanswered.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` under `config`'s bounds until `shutdown`
/// completes, then lets the requests in flight finish.
pub(crate) async fn serve(
    mut listener: TcpListener,
    router: Router,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout);
    let open = Arc::new(Semaphore::new(config.max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let max = config.max_connections;
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = Listener::accept(&mut listener) => accepted,
            () = &mut shutdown => break,
        };
        // Events are small writes that must leave at once: without TCP_NODELAY,
        // Nagle's algorithm holds each until the last is acknowledged, which a
        // client's delayed ACK stretches to tens of milliseconds. Err only for a
        // connection already closed.
        let _ = tcp.set_nodelay(true);
        let Ok(permit) = open.clone().try_acquire_owned() else {
            if let Ok(slot) = refusing.clone().try_acquire_owned() {
                connections.spawn(async move {
                    refuse(tcp, max).await;
                    drop(slot);
                });
            }
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let (http, stop) = (http.clone(), stop.clone());
        connections.spawn(async move {
            let _permit = permit;
            let connection = http
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades();
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            match ended {
                Err(error) if error.is_timeout() => {
                    tracing::debug!("a connection sent no request in time and was closed");
                }
                Err(error) => tracing::debug!(%error, "a connection failed"),
                Ok(()) => {}
            }
        });
    }
    drop(listener);
    stop.cancel();
    connections.close();
    connections.wait().await;
}

/// Answers a connection past the cap with 503 and closes it.
async fn refuse(tcp: TcpStream, max: usize) {
    let problem = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too-many-connections",
        format!("the server holds {max} connections, the most it takes: try again shortly"),
    );
    let body = serde_json::to_string(&problem).unwrap_or_default();
    let answer = hyper::service::service_fn(move |_| {
        let mut response = Response::new(Body::from(body.clone()));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let mut http = http1::Builder::new();
    http.keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(REFUSAL_WAIT);
    let served = http.serve_connection(TokioIo::new(tcp), answer);
    // A client that does not read its answer is dropped with it.
    let _ = tokio::time::timeout(REFUSAL_WAIT * 2, served).await;
}
