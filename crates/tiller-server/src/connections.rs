//! The accept loop: HTTP/1.1 connections, each bounded in time and in number.
//!
//! - **A request's head must arrive in time.** A client has
//!   [`crate::ServerConfig::header_timeout`] to send a request's head, counted from
//!   when the server starts waiting for it: on a new connection, and again after
//!   each response on a kept-alive one. A client that sends half a request, or
//!   keeps a connection open without using it, is disconnected. A response being
//!   streamed (server-sent events) and an upgraded WebSocket are not requests being
//!   read, so they are never cut by it.
//! - **At most [`crate::ServerConfig::max_connections`] connections**, and
//!   [`crate::ServerConfig::max_connections_per_address`] from one address. One
//!   past either is answered `503 too-many-connections` and closed, so a crowd of
//!   idle clients slows no one down for longer than the timeout above. A WebSocket
//!   leaves the count once upgraded; it counts against its caller's streams
//!   ([`crate::ServerConfig::max_streams_per_caller`]).
//! - **An open server is this machine's.** Without tokens, a connection from
//!   another address is answered `403 not-this-machine` and closed.
//! - **Graceful end.** Once shutdown is asked, no connection is accepted; idle
//!   kept-alive connections close; requests in flight finish, within
//!   `finish_runs` and [`IN_FLIGHT_GRACE`] more (then they are cut off
//!   unanswered).
//! - **Connections live on the shards, beside their agent.** One loop accepts;
//!   each connection goes to one of the supervisor's shards
//!   ([`tiller::Supervisor::spawn_on_shard`]), where its requests and its streams
//!   run on a current-thread runtime. There it peeks at its first request's line
//!   without reading it: one naming an agent (`/agents/{id}/…`: its events, its
//!   WebSocket, its operations) moves the connection to that agent's shard
//!   ([`tiller::Supervisor::shard_of`]), so the agent's events reach the socket
//!   without waking another thread. Any other stays on the shard chosen in
//!   turn, where an event of an agent of another shard wakes it once per batch.
//!   A kept-alive connection stays where its first request put it. The wait
//!   for the first bytes counts against the header timeout; the connection's
//!   later heads get what was left of it.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
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

use tiller::Supervisor;

use crate::ServerConfig;
use crate::error::Problem;
use crate::metrics::Metrics;
use crate::quota::Counts;

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
    supervisor: &Supervisor,
    config: &ServerConfig,
    metrics: &Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout);
    let max = config.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let open = Arc::new(Semaphore::new(max));
    let per_address = config.max_connections_per_address.max(1);
    let by_address: Counts<IpAddr> = Counts::default();
    let refusing = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let open_server = config.tokens.is_empty();
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut accepted = 0usize;
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = Listener::accept(&mut listener) => accepted,
            () = &mut shutdown => break,
        };
        // Events are small writes that must leave at once: without TCP_NODELAY,
        // Nagle's algorithm holds each until the last is acknowledged, which a
        // client's delayed ACK stretches to tens of milliseconds. Err only for a
        // connection already closed.
        let _ = tcp.set_nodelay(true);
        let address = peer.ip().to_canonical();
        let admitted = if open_server && !address.is_loopback() {
            Err(Problem::new(
                StatusCode::FORBIDDEN,
                "not-this-machine",
                "this server has no tokens and answers this machine only: give it --tokens to serve others",
            ))
        } else {
            by_address
                .take(address, per_address)
                .ok_or_else(|| too_many(format!("{per_address} connections from your address")))
                .and_then(|counted| {
                    let permit = open
                        .clone()
                        .try_acquire_owned()
                        .map_err(|_| too_many(format!("{max} connections")))?;
                    Ok((counted, permit))
                })
        };
        let (counted, permit) = match admitted {
            Ok(admitted) => admitted,
            Err(problem) => {
                if let Ok(slot) = refusing.clone().try_acquire_owned() {
                    connections.spawn(async move {
                        refuse(tcp, problem).await;
                        drop(slot);
                    });
                }
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        let (http, stop) = (http.clone(), stop.clone());
        accepted = accepted.wrapping_add(1);
        let in_turn = accepted % supervisor.shard_count().max(1);
        let placement = Placement {
            shards: supervisor.clone(),
            metrics: metrics.clone(),
            in_turn,
            header_timeout: config.header_timeout,
        };
        let connection = connections.track_future(async move {
            let _held = (permit, counted);
            placement.serve(tcp, http, service, stop).await;
        });
        supervisor.spawn_on_shard(in_turn, connection);
    }
    drop(listener);
    stop.cancel();
    connections.close();
    // Requests in flight finish, within the runs' time to finish and a grace
    // more: one waiting on a run parked at a store that stays down never would.
    let grace = config.finish_runs.saturating_add(IN_FLIGHT_GRACE);
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "requests still in flight {}s into shutdown are cut off unanswered",
            grace.as_secs()
        );
    }
}

/// How long past [`crate::ServerConfig::finish_runs`] requests in flight may
/// take to finish once shutdown begins.
pub(crate) const IN_FLIGHT_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Where a connection is served: on the shard of the agent its first request
/// names (read with `peek`, so hyper still parses it whole), else on the one
/// chosen in turn.
struct Placement {
    shards: Supervisor,
    metrics: Arc<Metrics>,
    /// The shard chosen in turn.
    in_turn: usize,
    header_timeout: Duration,
}

impl Placement {
    /// Serves `tcp` where it belongs.
    async fn serve(
        self,
        tcp: TcpStream,
        mut http: http1::Builder,
        service: TowerToHyperService<Router>,
        stop: CancellationToken,
    ) {
        let Placement {
            shards,
            metrics: placed,
            in_turn,
            header_timeout,
        } = self;
        if shards.shard_count() < 2 {
            return serve_connection(tcp, http, service, stop).await;
        }
        let (stopping, peeking) = (stop.clone(), tokio::time::Instant::now());
        let named = tokio::time::timeout(header_timeout, agent_named(&tcp));
        let home = tokio::select! {
            named = named => match named {
                Ok(named) => named.map(|id| shards.shard_of(&id)),
                Err(_) => {
                    tracing::debug!("a connection sent no request in time and was closed");
                    return;
                }
            },
            // An idle connection closes at once when the server stops.
            () = stopping.cancelled() => return,
        };
        placed.connection_placed(home.is_some());
        // The wait for the first bytes counts against the head's time: a
        // client trickling its head gets no second `header_timeout`.
        http.header_read_timeout(header_timeout.saturating_sub(peeking.elapsed()));
        let serve = move |tcp| serve_connection(tcp, http, service, stop);
        match home {
            Some(home) if home != in_turn => match tcp.into_std() {
                Ok(tcp) => {
                    let moved = shards.spawn_on_shard(home, async move {
                        match TcpStream::from_std(tcp) {
                            Ok(tcp) => serve(tcp).await,
                            Err(error) => tracing::debug!(%error, "a connection failed"),
                        }
                    });
                    // Err only when the shards are being dropped.
                    let _ = moved.await;
                }
                Err(error) => tracing::debug!(%error, "a connection failed"),
            },
            _ => serve(tcp).await,
        }
    }
}

/// Serves one connection's requests until it closes, or ends gracefully once
/// `stop` is cancelled.
async fn serve_connection(
    tcp: TcpStream,
    http: http1::Builder,
    service: TowerToHyperService<Router>,
    stop: CancellationToken,
) {
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
}

/// The longest request line read to find the agent it names; a longer one is
/// served where it is.
const REQUEST_LINE_PEEKED: usize = 512;

/// The agent the connection's first request names (`/agents/{id}…`), read from
/// the first bytes to arrive without taking them from the socket. `None` for a
/// request naming none, an id that needs decoding, or a line not yet whole.
async fn agent_named(tcp: &TcpStream) -> Option<String> {
    let mut line = [0u8; REQUEST_LINE_PEEKED];
    let peeked = tcp.peek(&mut line).await.ok()?;
    let line = &line[..peeked];
    let line = &line[..line.iter().position(|&byte| byte == b'\n')?];
    let target = line.split(|&byte| byte == b' ').nth(1)?;
    let id = target.strip_prefix(b"/agents/")?;
    let id = &id[..id
        .iter()
        .position(|&byte| matches!(byte, b'/' | b'?' | b'#'))
        .unwrap_or(id.len())];
    if id.is_empty() || id.contains(&b'%') {
        return None;
    }
    String::from_utf8(id.to_vec()).ok()
}

/// 503 `too-many-connections`: the server holds `what`, the most it takes.
fn too_many(what: String) -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too-many-connections",
        format!("the server holds {what}, the most it takes: try again shortly"),
    )
}

/// Answers a connection the server does not take with `problem` and closes it.
async fn refuse(tcp: TcpStream, problem: Problem) {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let body = serde_json::to_string(&problem).unwrap_or_default();
    let answer = hyper::service::service_fn(move |_| {
        let mut response = Response::new(Body::from(body.clone()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
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
