//! Which client sends a request, and the response either gives back.
//!
//! By default a request to an `http` or `https` URL goes out on an HTTP/1.1
//! connection driven in the stream's own task ([`super::direct`]). `reqwest`
//! sends it instead when the caller brings a client of its own
//! ([`Transport::http_client`](crate::Transport::http_client)), when the
//! environment names a proxy (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, in
//! either case; `reqwest` honours them and `NO_PROXY`), or when
//! `TILLER_HTTP_CLIENT=reqwest` asks for it. Both behave the same to the caller:
//! the same retries, limits, timeouts and errors.

use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use super::direct;
use crate::error::StreamError;
use crate::options::StreamOptions;

/// What sends a request.
pub(crate) enum Client {
    /// HTTP/1.1 driven by whoever reads the response ([`direct`]).
    Direct,
    Reqwest(reqwest::Client),
}

/// A request that got no response: whether trying again may help, and why.
pub(crate) struct Failed {
    pub(crate) retryable: bool,
    pub(crate) message: String,
}

impl Failed {
    pub(crate) fn retryable(message: String) -> Failed {
        Failed {
            retryable: true,
            message,
        }
    }

    pub(crate) fn fatal(message: String) -> Failed {
        Failed {
            retryable: false,
            message,
        }
    }
}

/// A response whose head has arrived.
pub(crate) struct Response {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Body,
}

/// A response's body, read chunk by chunk.
pub(crate) enum Body {
    Direct(direct::Body),
    Reqwest(BoxStream<'static, reqwest::Result<Bytes>>),
}

impl Body {
    /// The next chunk; `None` at the body's end; an error when it broke off.
    pub(crate) fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, String>>> {
        match self {
            Body::Direct(body) => body.poll_chunk(cx),
            Body::Reqwest(body) => body.poll_next_unpin(cx).map(|chunk| {
                chunk.map(|chunk| chunk.map_err(|error| super::describe(&error.without_url())))
            }),
        }
    }

    /// [`Body::poll_chunk`], awaited.
    pub(crate) async fn next(&mut self) -> Option<Result<Bytes, String>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }
}

impl Client {
    /// The client for a request to `url` with `options`.
    pub(crate) fn of(url: &str, options: &StreamOptions) -> Result<Client, StreamError> {
        if let Some(client) = &options.transport.http_client {
            return Ok(Client::Reqwest(client.clone()));
        }
        let web = url.starts_with("http://") || url.starts_with("https://");
        if web && direct_allowed() {
            return Ok(Client::Direct);
        }
        shared_client().map(Client::Reqwest)
    }

    /// POSTs `body` to `url` and waits for the response's head.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response, Failed> {
        match self {
            Client::Direct => direct::post(url, headers, body).await,
            Client::Reqwest(client) => {
                let sent = client.post(url).headers(headers).body(body).send().await;
                match sent {
                    Ok(mut response) => Ok(Response {
                        status: response.status(),
                        headers: std::mem::take(response.headers_mut()),
                        body: Body::Reqwest(response.bytes_stream().boxed()),
                    }),
                    Err(error) => Err(Failed {
                        retryable: error.is_connect() || error.is_request() || error.is_timeout(),
                        message: super::describe(&error.without_url()),
                    }),
                }
            }
        }
    }
}

/// Whether requests may go out on [`direct`] connections: unless the
/// environment names a proxy or asks for `reqwest` (read once).
fn direct_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| {
        let set = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
        let proxied = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]
            .iter()
            .any(|name| set(name) || set(&name.to_ascii_lowercase()));
        let reqwest_asked =
            std::env::var("TILLER_HTTP_CLIENT").is_ok_and(|client| client == "reqwest");
        !proxied && !reqwest_asked
    })
}

type BuiltClient = Result<reqwest::Client, String>;

thread_local! {
    /// Whether streams started on this thread use a client of the thread's own
    /// (see [`use_thread_client`]), and that client once built.
    static THREAD_CLIENT: std::cell::OnceCell<BuiltClient> = const { std::cell::OnceCell::new() };
    static OWN_CLIENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Streams started on this thread from now on (those that bring no client of
/// their own) use a `reqwest` client of this thread's own where they use
/// `reqwest` at all. A thread that runs a current-thread runtime calls it so
/// that its streams' connections, and their tasks, stay on that runtime rather
/// than on whichever runtime opened a pooled connection first. (Connections
/// driven in the stream's own task are kept per thread in any case.)
pub fn use_thread_client() {
    OWN_CLIENT.with(|own| own.set(true));
}

fn build_client() -> BuiltClient {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .build()
        .map_err(|error| super::describe(&error))
}

/// The `reqwest` client for a stream that brings none of its own: this
/// thread's (see [`use_thread_client`]), or the one the process shares. Each
/// is built once (loading the system's root certificates takes milliseconds:
/// streams that start together wait for the one build rather than each making
/// its own).
fn shared_client() -> Result<reqwest::Client, StreamError> {
    static CLIENT: OnceLock<BuiltClient> = OnceLock::new();
    let built = if OWN_CLIENT.with(std::cell::Cell::get) {
        THREAD_CLIENT.with(|client| client.get_or_init(build_client).clone())
    } else {
        CLIENT.get_or_init(build_client).clone()
    };
    built.map_err(|reason| StreamError::InvalidRequest {
        message: format!("could not create the HTTP client: {reason}"),
    })
}
