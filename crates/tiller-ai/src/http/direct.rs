//! HTTP/1.1 in the task that reads the stream: hyper's client connection, whose
//! future is polled by whoever polls the response body (the agent's run), so a
//! byte read from the socket reaches the SSE decoder in the same poll — no
//! connection task between them and no wake-up of another.
//!
//! Connections are kept per thread (a shard's are its own): an idle one is
//! checked when it is taken (a connection the server closed meanwhile is
//! dropped, never used) and given up after [`IDLE_FOR`]; at most
//! [`IDLE_PER_ORIGIN`] wait per origin. TLS is the system's (OpenSSL through
//! `native-tls`, as `reqwest` uses here), offered without ALPN, so the server
//! answers in HTTP/1.1. Unlike `reqwest`, it follows no redirect: a 3xx is
//! the provider's answer, an error like any other.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper::header::{AUTHORIZATION, HOST, HeaderMap, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::client::{self, Failed, Response};

/// How long resolving a host, connecting to it (the time shared among its
/// addresses, tried in turn) and its TLS handshake may each take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may be silent before TCP checks that its peer is
/// there, and then how often (three times), as `reqwest` does.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// How long an idle connection is kept for the next request.
const IDLE_FOR: Duration = Duration::from_secs(90);
/// The most idle connections kept per origin on one thread.
const IDLE_PER_ORIGIN: usize = 1024;

/// Where a request goes, as parsed once from its URL.
struct Target {
    origin: Origin,
    host: String,
    port: u16,
    /// The `Host` header: the host, and the port when it is not the scheme's.
    authority: HeaderValue,
    /// The path and query, as the request line carries them.
    path: Uri,
    /// Basic credentials from the URL's user and password, if it has them.
    credentials: Option<HeaderValue>,
}

/// A connection's scheme, host and port: what an idle connection is kept by.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Origin {
    tls: bool,
    host_port: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, Failed> {
        let invalid = || Failed::fatal(format!("`{}` is not a valid URL", super::shown_url(url)));
        let parsed = reqwest::Url::parse(url).map_err(|_| invalid())?;
        let tls = match parsed.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(invalid()),
        };
        let host = parsed.host_str().ok_or_else(invalid)?.to_owned();
        let port = parsed.port_or_known_default().ok_or_else(invalid)?;
        let authority = match parsed.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.clone(),
        };
        let path = match parsed.query() {
            Some(query) => format!("{}?{query}", parsed.path()),
            None => parsed.path().to_owned(),
        };
        let credentials = match (parsed.username(), parsed.password()) {
            ("", None) => None,
            (user, password) => {
                use base64::Engine as _;
                let decode = |part: &str| {
                    percent_encoding::percent_decode_str(part)
                        .decode_utf8_lossy()
                        .into_owned()
                };
                let pair = format!("{}:{}", decode(user), decode(password.unwrap_or("")));
                let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
                let mut value =
                    HeaderValue::from_str(&format!("Basic {encoded}")).map_err(|_| invalid())?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(Target {
            credentials,
            origin: Origin {
                tls,
                host_port: format!("{host}:{port}"),
            },
            // An IPv6 address is written in brackets in a URL, bare in a socket address.
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            authority: HeaderValue::from_str(&authority).map_err(|_| invalid())?,
            path: path.parse().map_err(|_| invalid())?,
        })
    }
}

/// POSTs `body` to `url` with `headers` on an idle connection to its origin, or
/// a new one, and waits for the response's head, driving the connection here.
pub(crate) async fn post(
    url: &str,
    mut headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Failed> {
    let target = Target::parse(url)?;
    // A caller's own `Host` or `Authorization` stays (as with `reqwest`).
    headers
        .entry(HOST)
        .or_insert_with(|| target.authority.clone());
    if let Some(credentials) = &target.credentials {
        headers
            .entry(AUTHORIZATION)
            .or_insert_with(|| credentials.clone());
    }
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = target.path.clone();
    *request.headers_mut() = headers;
    // A kept connection the server closed just before it was taken gives the
    // request back unsent: it goes out again on a new one.
    if let Some(conn) = take_idle(&target.origin) {
        match conn.send(request).await {
            Sent::Answered(response, conn) => return Ok(respond(response, conn, target.origin)),
            Sent::Failed(failed) => return Err(failed),
            Sent::Unsent(unsent) => request = unsent,
        }
    }
    let conn = Conn::open(&target).await?;
    match conn.send(request).await {
        Sent::Answered(response, conn) => Ok(respond(response, conn, target.origin)),
        Sent::Failed(failed) => Err(failed),
        Sent::Unsent(_) => Err(Failed::retryable(format!(
            "the connection to {} closed before the request was sent",
            target.origin.host_port
        ))),
    }
}

fn respond(response: hyper::Response<Incoming>, conn: Box<Conn>, origin: Origin) -> Response {
    let (parts, incoming) = response.into_parts();
    Response {
        status: parts.status,
        headers: parts.headers,
        body: client::Body::Direct(Body {
            incoming,
            // A connection that ended with the head has nothing more to drive.
            conn: conn.driver.is_some().then_some(conn),
            origin,
        }),
    }
}

/// An HTTP/1.1 connection: the handle requests are sent on, and the future
/// that does its reading and writing (most of a kilobyte: kept boxed).
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// `None` once it has ended (dropping it gives back a request it held).
    driver: Option<Connection<TokioIo<Socket>, Full<Bytes>>>,
}

/// How sending a request on a connection went.
enum Sent {
    Answered(hyper::Response<Incoming>, Box<Conn>),
    /// The connection could not take it; the request was not written.
    Unsent(Request<Full<Bytes>>),
    Failed(Failed),
}

impl Conn {
    async fn open(target: &Target) -> Result<Box<Conn>, Failed> {
        let host_port = &target.origin.host_port;
        let tcp = connect(target).await?;
        // Each event is a small write of the server's; the request is one of ours.
        let _ = tcp.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE)
            .with_interval(KEEPALIVE)
            .with_retries(3);
        let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive);
        let socket = if target.origin.tls {
            let connector = tls_connector()?;
            let handshake = connector.connect(&target.host, tcp);
            let tls =
                within_connect_timeout(format!("the TLS handshake with {host_port}"), handshake)
                    .await?
                    .map_err(|error| {
                        Failed::retryable(format!(
                            "the TLS handshake with {host_port} failed: {}",
                            super::describe(&error)
                        ))
                    })?;
            Socket::Tls(Box::new(tls))
        } else {
            Socket::Plain(tcp)
        };
        let (sender, driver) = http1::handshake(TokioIo::new(socket))
            .await
            .map_err(|error| Failed::retryable(super::describe(&error)))?;
        Ok(Box::new(Conn {
            sender,
            driver: Some(driver),
        }))
    }

    /// Sends `request` and drives the connection until the response's head
    /// arrives.
    async fn send(mut self: Box<Self>, request: Request<Full<Bytes>>) -> Sent {
        let mut answer = std::pin::pin!(self.sender.try_send_request(request));
        let answered = std::future::poll_fn(|cx| {
            if let Some(driver) = &mut self.driver
                && Pin::new(driver).poll(cx).is_ready()
            {
                // The connection ended (a server's close of an idle one ends it
                // cleanly): dropped, it gives back a request it had not
                // written, and the answer says how it went.
                self.driver = None;
            }
            answer.as_mut().poll(cx)
        })
        .await;
        match answered {
            Ok(response) => Sent::Answered(response, self),
            Err(mut error) => match error.take_message() {
                Some(request) => Sent::Unsent(request),
                None => Sent::Failed(Failed::retryable(super::describe(error.error()))),
            },
        }
    }

    /// Whether the connection can take another request now (polling it once
    /// notices a close the server sent while it was idle).
    fn is_reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let Some(driver) = &mut self.driver else {
            return false;
        };
        if Pin::new(driver).poll(&mut cx).is_ready() {
            return false;
        }
        matches!(self.sender.poll_ready(&mut cx), Poll::Ready(Ok(())))
    }
}

/// A TCP connection to `target`: its addresses tried in turn, each given its
/// share of [`CONNECT_TIMEOUT`], so that one that drops what is sent to it (an
/// IPv6 route that goes nowhere) leaves time for the next.
async fn connect(target: &Target) -> Result<TcpStream, Failed> {
    let host_port = &target.origin.host_port;
    let lookup = tokio::net::lookup_host((target.host.as_str(), target.port));
    let addresses: Vec<SocketAddr> =
        within_connect_timeout(format!("resolving {host_port}"), lookup)
            .await?
            .map_err(|error| Failed::retryable(format!("could not resolve {host_port}: {error}")))?
            .collect();
    let share = CONNECT_TIMEOUT / u32::try_from(addresses.len().max(1)).unwrap_or(u32::MAX);
    let mut failure = format!("{host_port} has no address");
    for address in addresses {
        match tokio::time::timeout(share, TcpStream::connect(address)).await {
            Ok(Ok(tcp)) => return Ok(tcp),
            Ok(Err(error)) => failure = error.to_string(),
            Err(_) => failure = format!("no answer within {} ms", share.as_millis()),
        }
    }
    Err(Failed::retryable(format!(
        "could not connect to {host_port}: {failure}"
    )))
}

/// `step`'s outcome, unless it takes longer than [`CONNECT_TIMEOUT`] (a
/// retryable failure naming `what`).
async fn within_connect_timeout<T>(
    what: String,
    step: impl Future<Output = T>,
) -> Result<T, Failed> {
    tokio::time::timeout(CONNECT_TIMEOUT, step)
        .await
        .map_err(|_| {
            Failed::retryable(format!(
                "{what} took longer than {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })
}

/// A response body, read by polling the connection it arrives on.
pub(crate) struct Body {
    incoming: Incoming,
    /// The connection, until it ends or goes back to be kept.
    conn: Option<Box<Conn>>,
    origin: Origin,
}

impl Body {
    /// The body's next chunk: `None` at its end (when the connection, whole
    /// again, is kept for the next request).
    pub(crate) fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, String>>> {
        loop {
            if let Some(conn) = &mut self.conn
                && let Some(driver) = &mut conn.driver
                && Pin::new(driver).poll(cx).is_ready()
            {
                // Closed or broken: the body says which.
                self.conn = None;
            }
            match Pin::new(&mut self.incoming).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => return Poll::Ready(Some(Ok(data))),
                    // Trailers: nothing of the stream's.
                    Err(_) => continue,
                },
                Poll::Ready(Some(Err(error))) => {
                    self.conn = None;
                    return Poll::Ready(Some(Err(super::describe(&error))));
                }
                Poll::Ready(None) => {
                    if let Some(conn) = self.conn.take() {
                        keep(self.origin.clone(), conn);
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The connections kept on this thread, newest last.
struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

thread_local! {
    static IDLE: RefCell<HashMap<Origin, Vec<Idle>>> = RefCell::new(HashMap::new());
}

fn keep(origin: Origin, conn: Box<Conn>) {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        let kept = idle.entry(origin).or_default();
        if kept.len() < IDLE_PER_ORIGIN {
            kept.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    });
}

/// The newest idle connection to `origin` that can take a request; older ones
/// past [`IDLE_FOR`] and closed ones are dropped on the way.
fn take_idle(origin: &Origin) -> Option<Box<Conn>> {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        let kept = idle.get_mut(origin)?;
        let now = Instant::now();
        kept.retain(|idle| now.duration_since(idle.since) < IDLE_FOR);
        while let Some(Idle { mut conn, .. }) = kept.pop() {
            if conn.is_reusable() {
                return Some(conn);
            }
        }
        None
    })
}

type BuiltConnector = Result<tokio_native_tls::TlsConnector, String>;

thread_local! {
    /// Loading the system's root certificates takes milliseconds: once per thread.
    static TLS: std::cell::OnceCell<BuiltConnector> = const { std::cell::OnceCell::new() };
}

fn tls_connector() -> Result<tokio_native_tls::TlsConnector, Failed> {
    TLS.with(|tls| {
        tls.get_or_init(|| {
            native_tls::TlsConnector::new()
                .map(tokio_native_tls::TlsConnector::from)
                .map_err(|error| super::describe(&error))
        })
        .clone()
    })
    .map_err(|reason| Failed::fatal(format!("could not set up TLS: {reason}")))
}

/// A connection's socket, plain or in TLS.
enum Socket {
    Plain(TcpStream),
    Tls(Box<tokio_native_tls::TlsStream<TcpStream>>),
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Socket::Plain(tcp) => tcp.is_write_vectored(),
            Socket::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}
