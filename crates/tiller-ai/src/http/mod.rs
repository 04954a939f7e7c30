//! HTTP shared by every provider: request assembly, the client, retries before the
//! first byte, and reading the body within its limits: an idle timeout that only
//! events reset (keep-alive comments do not), a deadline for the whole response, and
//! a cap on the body's size.
//!
//! The body is not read by a spawned task: [`HttpSource::poll`] is driven by the
//! consumer polling the [`crate::AssistantStream`], decodes each network chunk in
//! place and hands back as soon as events are ready. By default the connection
//! itself is driven there too (HTTP/1.1, [`direct`]); [`client`] says when
//! `reqwest` sends instead. Dropping the stream drops the response, which closes
//! the connection.

mod client;
mod direct;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;

use crate::builder::MessageBuilder;
use crate::catalog;
use crate::decode::{BodyDecoder, WireDecoder};
use crate::error::StreamError;
use crate::limits::{Limit, millis};
use crate::model::Model;
use crate::options::{ApiKey, StreamOptions};
use crate::providers::excerpt;
use crate::ratelimit::{Account, RateLimitObserver, Ticket};
use crate::retry::{self, RetryPolicy};
use crate::watchdog::Watchdog;
use client::{Body, Client, Response};

pub use client::use_thread_client;

/// The most of an error body kept, and the most read.
const ERROR_BODY_LIMIT: usize = 16 * 1024;

/// A request ready to send (and to send again on retry).
pub(crate) struct HttpRequest {
    url: String,
    headers: HeaderMap,
    body: Bytes,
    provider: String,
    /// The account the request counts against, when the caller shares rate limits.
    account: Option<Arc<Account>>,
    /// The tenant it is made for, whose share of the account's turns it takes.
    tenant: Option<Arc<str>>,
    /// Signs the request (adds its signature headers) before each attempt, for
    /// providers whose signatures expire (AWS's, after five minutes).
    signer: Option<Signer>,
}

/// What signs a request: its URL, its headers to add to, its body.
pub(crate) type Signer =
    Box<dyn Fn(&str, &mut HeaderMap, &[u8]) -> Result<(), StreamError> + Send + Sync>;

/// The API key for `model`: the one in the options, else the provider's environment
/// variable. Providers without a known variable (local servers) need none. A key from
/// the environment is sent only to its provider's own host: a model of that provider
/// at another address gets [`StreamError::KeyWithheld`] while the variable is set,
/// unless the caller passes the key explicitly; with the variable unset there is no
/// key to withhold, and the request goes out without one (a local server that
/// speaks the provider's API needs none).
pub(crate) fn api_key(
    model: &Model,
    options: &StreamOptions,
) -> Result<Option<ApiKey>, StreamError> {
    if let Some(key) = &options.transport.api_key {
        return Ok(Some(key.clone()));
    }
    let Some(provider) = catalog::provider(&model.provider) else {
        return Ok(None);
    };
    if provider.api_key_env.is_empty() {
        return Ok(None);
    }
    let key = provider.api_key_from(|name| std::env::var(name).ok());
    let host = origin(&model.base_url);
    let own_host = host == origin(provider.base_url);
    match key {
        Some((_, key)) if own_host => Ok(Some(ApiKey::new(key))),
        Some((env_var, _)) => Err(StreamError::KeyWithheld {
            provider: model.provider.clone(),
            env_var: env_var.to_owned(),
            host: host.map_or_else(|| "an invalid address".to_owned(), |(host, _)| host),
        }),
        None if own_host => Err(StreamError::MissingApiKey {
            provider: model.provider.clone(),
            env_var: provider.api_key_env.join(" or "),
        }),
        None => Ok(None),
    }
}

/// The host and port of a URL, the part a key is bound to.
fn origin(url: &str) -> Option<(String, u16)> {
    let url = reqwest::Url::parse(url).ok()?;
    Some((url.host_str()?.to_owned(), url.port_or_known_default()?))
}

/// The host and port of a URL as text (`host:port`), or the URL when it has none.
pub(crate) fn origin_text(url: &str) -> String {
    match origin(url) {
        Some((host, port)) => format!("{host}:{port}"),
        None => url.to_owned(),
    }
}

/// The headers a key travels in.
const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "x-api-key", "x-goog-api-key"];

/// A JSON POST to `path` under the model's base URL. Headers apply in order: the
/// provider's fixed headers and credential, then the model's, then the options'.
pub(crate) fn post_json<T: Serialize>(
    model: &Model,
    path: &str,
    body: &T,
    fixed_headers: &[(&'static str, &'static str)],
    credential: Option<(&'static str, String)>,
    options: &StreamOptions,
) -> Result<HttpRequest, StreamError> {
    let invalid = |message: String| StreamError::InvalidRequest { message };
    let url = format!("{}/{path}", model.base_url.trim_end_matches('/'));
    let unserializable =
        |error: serde_json::Error| invalid(format!("could not serialize the request: {error}"));
    let body = if options.extra_body.is_empty() {
        serde_json::to_vec(body).map_err(unserializable)?
    } else {
        // The caller's keys, where the request sets none of its own: an
        // inline `model` or `n` never redirects or multiplies the call.
        let mut value = serde_json::to_value(body).map_err(unserializable)?;
        let Some(object) = value.as_object_mut() else {
            return Err(invalid("extra body keys need a JSON object body".into()));
        };
        for (key, extra) in &options.extra_body {
            object.entry(key.clone()).or_insert_with(|| extra.clone());
        }
        serde_json::to_vec(&value).map_err(unserializable)?
    };
    let mut headers = HeaderMap::with_capacity(8);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
    for (name, value) in fixed_headers {
        headers.insert(*name, HeaderValue::from_static(value));
    }
    let given = credential
        .iter()
        .map(|(name, value)| (*name, value.as_str()));
    for (name, value) in given
        .chain(model.headers.iter())
        .chain(options.transport.headers.iter())
    {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("`{name}` is not a valid header name")))?;
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            invalid(format!(
                "the value of header `{name}` is not valid in a header"
            ))
        })?;
        // Credentials and any header a model or caller adds may carry a secret:
        // none is ever shown by `Debug` or kept by the HTTP layer's indexing.
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    let account = options.transport.rate_limits.as_ref().map(|limits| {
        let credential = CREDENTIAL_HEADERS
            .iter()
            .find_map(|name| headers.get(*name))
            .map(HeaderValue::as_bytes);
        limits.account(
            &model.provider,
            &origin_text(&model.base_url),
            &model.id,
            options.account.as_deref(),
            credential,
        )
    });
    Ok(HttpRequest {
        url,
        headers,
        body: Bytes::from(body),
        provider: model.provider.clone(),
        account,
        tenant: options.transport.tenant.clone(),
        signer: None,
    })
}

impl HttpRequest {
    /// The same request, signed by `signer` now (so a request that cannot be
    /// signed fails before it is sent) and again before each retry.
    pub(crate) fn signed_by(mut self, signer: Signer) -> Result<Self, StreamError> {
        signer(&self.url, &mut self.headers, &self.body)?;
        self.signer = Some(signer);
        Ok(self)
    }
}

/// A response being fetched and decoded.
pub(crate) struct HttpSource {
    phase: Phase,
    /// The request's turn at its account, settled when the response ends.
    ticket: Option<Ticket>,
    body: BodyDecoder,
    watchdog: Watchdog,
    max_body_bytes: u64,
    body_bytes: u64,
}

enum Phase {
    Connecting(Pin<Box<dyn Future<Output = Result<Sent, StreamError>> + Send>>),
    Streaming {
        body: Body,
        status: u16,
        /// Whether any byte of the body has arrived.
        received: bool,
    },
    Done,
}

impl HttpSource {
    pub(crate) fn start(
        request: HttpRequest,
        wire: WireDecoder,
        options: &StreamOptions,
    ) -> Result<Self, StreamError> {
        let client = Client::of(&request.url, options)?;
        let connecting = send(
            client,
            request,
            options.retry.clone(),
            options.idle_timeout,
            options.transport.on_rate_limited.clone(),
            Expect::EventStream,
        );
        Ok(HttpSource {
            phase: Phase::Connecting(Box::pin(connecting)),
            ticket: None,
            body: BodyDecoder::new(wire, &options.limits),
            watchdog: Watchdog::new(options.idle_timeout, options.response_deadline),
            max_body_bytes: options.limits.max_body_bytes,
            body_bytes: 0,
        })
    }

    /// The request's turn at its account, once the response is over.
    pub(crate) fn take_ticket(&mut self) -> Option<Ticket> {
        self.ticket.take()
    }

    /// Makes progress: `Ready` once events are queued on `out` or it is finished.
    pub(crate) fn poll(&mut self, cx: &mut TaskContext<'_>, out: &mut MessageBuilder) -> Poll<()> {
        loop {
            match &mut self.phase {
                Phase::Connecting(connecting) => match connecting.as_mut().poll(cx) {
                    Poll::Pending => {
                        let Poll::Ready(error) = self.watchdog.poll_expired(cx) else {
                            return Poll::Pending;
                        };
                        self.phase = Phase::Done;
                        out.fail(error);
                    }
                    Poll::Ready(Err(error)) => {
                        self.phase = Phase::Done;
                        out.fail(error);
                    }
                    Poll::Ready(Ok(Sent { response, ticket })) => {
                        self.ticket = ticket;
                        self.phase = Phase::Streaming {
                            status: response.status.as_u16(),
                            body: response.body,
                            received: false,
                        };
                        self.watchdog.restart();
                    }
                },
                Phase::Streaming {
                    body,
                    status,
                    received,
                } => match body.poll_chunk(cx) {
                    Poll::Ready(Some(Ok(bytes))) => {
                        *received |= !bytes.is_empty();
                        self.body_bytes = self.body_bytes.saturating_add(bytes.len() as u64);
                        if self.body_bytes > self.max_body_bytes {
                            self.phase = Phase::Done;
                            out.fail(Limit::BodyBytes.exceeded(self.max_body_bytes));
                            continue;
                        }
                        let events_before = self.body.events();
                        self.body.feed(&bytes, out);
                        if self.body.events() != events_before {
                            self.watchdog.restart();
                        }
                        if out.is_finished() {
                            if let Phase::Streaming { body, .. } =
                                std::mem::replace(&mut self.phase, Phase::Done)
                            {
                                drain(body, cx);
                            }
                        } else if out.has_events() {
                            return Poll::Ready(());
                        }
                    }
                    // Nothing came, whether the body ended cleanly or not.
                    Poll::Ready(None | Some(Err(_))) if !*received => {
                        let status = *status;
                        self.phase = Phase::Done;
                        out.fail(StreamError::EmptyBody {
                            provider: out.message().provider.clone(),
                            status,
                        });
                    }
                    Poll::Ready(Some(Err(message))) => {
                        self.phase = Phase::Done;
                        out.fail(StreamError::Incomplete { message });
                    }
                    Poll::Ready(None) => {
                        self.phase = Phase::Done;
                        self.body.end(out);
                    }
                    Poll::Pending => {
                        let Poll::Ready(error) = self.watchdog.poll_expired(cx) else {
                            return Poll::Pending;
                        };
                        self.phase = Phase::Done;
                        out.fail(error);
                    }
                },
                Phase::Done => {
                    if !out.is_finished() {
                        out.fail(StreamError::Incomplete {
                            message: "the response body was abandoned".to_owned(),
                        });
                    }
                    return Poll::Ready(());
                }
            }
        }
    }
}

/// The most of a finished response [`drain`] reads, and how long it waits for it.
const DRAIN_BYTES: usize = 64 * 1024;
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Reads the rest of a response whose stream has ended (servers usually write the
/// body's last chunk after the last event, often in a write of its own), so the
/// connection goes back to the pool instead of being closed: what is already
/// buffered at once, the rest in a task of its own, up to [`DRAIN_BYTES`] within
/// [`DRAIN_WAIT`].
fn drain(mut body: Body, cx: &mut TaskContext<'_>) {
    let mut read = 0;
    loop {
        match body.poll_chunk(cx) {
            Poll::Ready(Some(Ok(bytes))) if read + bytes.len() <= DRAIN_BYTES => {
                read += bytes.len();
            }
            Poll::Pending => break,
            _ => return,
        }
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let rest = async {
            while let Some(Ok(bytes)) = body.next().await {
                read += bytes.len();
                if read > DRAIN_BYTES {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_WAIT, rest).await;
    });
}

/// A response that started, and its turn at its account.
struct Sent {
    response: Response,
    ticket: Option<Ticket>,
}

/// Sends `request`, retrying what is worth retrying, until a successful response
/// starts or the policy gives up. A request that counts against an account waits
/// its turn there before each attempt; its 429s pause the account and are waited
/// out there, up to [`RetryPolicy::max_throttled_retries`] of them.
async fn send(
    client: Client,
    request: HttpRequest,
    policy: RetryPolicy,
    idle_timeout: Option<Duration>,
    observer: Option<RateLimitObserver>,
    expect: Expect,
) -> Result<Sent, StreamError> {
    let mut attempt: u32 = 0;
    let mut throttled: u32 = 0;
    loop {
        // Time queued for the account counts against the idle timeout: a
        // request does not wait there longer than for a silent server.
        let mut ticket = match &request.account {
            Some(account) => {
                let tenant = request.tenant.as_deref();
                let turn = account.turn(request.body.len(), tenant, observer.as_ref());
                Some(idle_bounded(idle_timeout, turn).await?)
            }
            None => None,
        };
        let mut headers = request.headers.clone();
        // Signed again after a retry's wait or a turn's: signatures expire.
        if (attempt > 0 || ticket.is_some())
            && let Some(sign) = &request.signer
        {
            sign(&request.url, &mut headers, &request.body)?;
        }
        let pending = client.post(&request.url, headers, request.body.clone());
        let result = idle_bounded(idle_timeout, pending).await?;
        let wait = match result {
            Ok(response) if response.status.is_success() => {
                if let Some(ticket) = &mut ticket {
                    let status = response.status.as_u16();
                    ticket.answered(status, &response.headers, None, policy.max_retry_after);
                }
                let response = match expect {
                    Expect::EventStream => expect_event_stream(response, idle_timeout).await?,
                    Expect::Document => response,
                };
                return Ok(Sent { response, ticket });
            }
            Ok(response) => {
                let refused = Refused {
                    request: &request,
                    policy: &policy,
                    attempt,
                    throttled,
                };
                match refused.wait(response, &mut ticket, idle_timeout).await? {
                    Some(wait) => wait,
                    None => {
                        throttled += 1;
                        continue;
                    }
                }
            }
            Err(failed) if failed.retryable && attempt < policy.max_retries => {
                policy.backoff(attempt)
            }
            Err(failed) => {
                return Err(StreamError::Connection {
                    url: shown_url(&request.url),
                    attempts: attempt + 1,
                    message: failed.message,
                });
            }
        };
        attempt += 1;
        tracing::warn!(
            provider = %request.provider,
            attempt,
            wait_ms = millis(wait),
            "retrying the request"
        );
        tokio::time::sleep(wait).await;
    }
}

/// What a successful response's body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Events, as a model's answer streams.
    EventStream,
    /// One document (a JSON answer).
    Document,
}

/// Sends `request` (retried, throttled and signed as a stream's request is)
/// and reads its whole body, one document: within the options' idle timeout
/// between chunks, their response deadline and
/// [`StreamLimits::max_body_bytes`](crate::StreamLimits::max_body_bytes).
/// The caller's `accept` header asks for the document's type.
pub(crate) async fn fetch(
    request: HttpRequest,
    options: &StreamOptions,
) -> Result<Bytes, StreamError> {
    let client = Client::of(&request.url, options)?;
    let idle_timeout = options.idle_timeout;
    let max_bytes = options.limits.max_body_bytes;
    let whole = async {
        let sent = send(
            client,
            request,
            options.retry.clone(),
            idle_timeout,
            options.transport.on_rate_limited.clone(),
            Expect::Document,
        )
        .await?;
        let mut body = sent.response.body;
        let mut read = Vec::new();
        while let Some(chunk) = idle_bounded(idle_timeout, body.next()).await? {
            let chunk = chunk.map_err(|message| StreamError::Incomplete { message })?;
            if (read.len() + chunk.len()) as u64 > max_bytes {
                return Err(Limit::BodyBytes.exceeded(max_bytes));
            }
            read.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(read))
    };
    match options.response_deadline {
        Some(deadline) => tokio::time::timeout(deadline, whole).await.map_err(|_| {
            StreamError::DeadlineExceeded {
                deadline_ms: millis(deadline),
            }
        })?,
        None => whole.await,
    }
}

/// `future`, given at most `idle_timeout` when there is one.
async fn idle_bounded<T>(
    idle_timeout: Option<Duration>,
    future: impl std::future::Future<Output = T>,
) -> Result<T, StreamError> {
    match idle_timeout {
        Some(limit) => {
            tokio::time::timeout(limit, future)
                .await
                .map_err(|_| StreamError::Stalled {
                    idle_timeout_ms: millis(limit),
                })
        }
        None => Ok(future.await),
    }
}

/// A response that refused an attempt of `request`.
struct Refused<'a> {
    request: &'a HttpRequest,
    policy: &'a RetryPolicy,
    /// The attempt it answered (0 for the first).
    attempt: u32,
    /// The 429s waited out at the account so far.
    throttled: u32,
}

impl Refused<'_> {
    /// How long to wait before trying again; `None`: a 429 the account's next
    /// turn waits out; `Err`: the error the request ends with.
    async fn wait(
        &self,
        response: Response,
        ticket: &mut Option<Ticket>,
        idle_timeout: Option<Duration>,
    ) -> Result<Option<Duration>, StreamError> {
        let (request, policy) = (self.request, self.policy);
        let status = response.status;
        let requested = retry::requested_wait(&response.headers);
        if let Some(ticket) = ticket.as_mut() {
            ticket.answered(
                status.as_u16(),
                &response.headers,
                requested,
                policy.max_retry_after,
            );
        }
        let body = read_capped(response.body, idle_timeout).await;
        let retryable = retry::is_retryable_status(status.as_u16());
        let waited_out = ticket.is_some()
            && status.as_u16() == 429
            && self.throttled < policy.max_throttled_retries
            && requested.is_none_or(|wait| wait <= policy.max_retry_after);
        if waited_out {
            // The account is paused: the next turn there waits it out.
            tracing::warn!(
                provider = %request.provider,
                throttled = self.throttled + 1,
                "the account is rate limited: waiting its turn to try again"
            );
            return Ok(None);
        }
        match requested {
            _ if !retryable || self.attempt >= policy.max_retries => {
                Err(http_error(&request.provider, status, body, requested))
            }
            Some(wait) if wait > policy.max_retry_after => Err(StreamError::RetryAfterTooLong {
                provider: request.provider.clone(),
                status: status.as_u16(),
                retry_after_ms: millis(wait),
                max_retry_after_ms: millis(policy.max_retry_after),
                body,
            }),
            Some(wait) => Ok(Some(wait)),
            None => Ok(Some(policy.backoff(self.attempt))),
        }
    }
}

/// A successful response that is a whole JSON document rather than an event stream
/// (a server ignoring `stream: true`) is an error worth naming.
async fn expect_event_stream(
    response: Response,
    idle_timeout: Option<Duration>,
) -> Result<Response, StreamError> {
    let is_json = response
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !is_json {
        return Ok(response);
    }
    let body = read_capped(response.body, idle_timeout).await;
    Err(StreamError::Malformed {
        message: format!(
            "expected an event stream, but the server answered with JSON: {}",
            excerpt(&body, 300)
        ),
    })
}

/// Up to [`ERROR_BODY_LIMIT`] bytes of a body, as text; whatever arrived when the
/// body fails or stalls.
async fn read_capped(mut chunks: Body, idle_timeout: Option<Duration>) -> String {
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_LIMIT {
        let next = match idle_timeout {
            Some(limit) => tokio::time::timeout(limit, chunks.next())
                .await
                .ok()
                .flatten(),
            None => chunks.next().await,
        };
        match next {
            Some(Ok(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(ERROR_BODY_LIMIT);
    String::from_utf8_lossy(&body).into_owned()
}

fn http_error(
    provider: &str,
    status: reqwest::StatusCode,
    body: String,
    retry_after: Option<Duration>,
) -> StreamError {
    let message = provider_message(&body).unwrap_or_else(|| {
        if body.trim().is_empty() {
            status.canonical_reason().unwrap_or("no body").to_owned()
        } else {
            excerpt(body.trim(), 300)
        }
    });
    StreamError::Http {
        provider: provider.to_owned(),
        status: status.as_u16(),
        message,
        body,
        retry_after_ms: retry_after.map(millis),
    }
}

/// The message inside a provider's JSON error body: `{"error": {"message", "type"}}`
/// (OpenAI, Anthropic and most compatible servers), `{"error": "..."}`,
/// `{"message": "..."}` or `{"detail": ...}`. An empty message (llama-cpp-python's
/// server sends one with its 500s) is no message: the body is shown instead.
fn provider_message(body: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let error = value.get("error");
    let message = error
        .and_then(|e| e.get("message"))
        .or_else(|| error.filter(|e| e.is_string()))
        .or_else(|| value.get("message"))
        .or_else(|| value.get("detail"))?;
    let mut text = match message {
        serde_json::Value::String(text) => text.trim().to_owned(),
        other => other.to_string(),
    };
    if text.is_empty() {
        return None;
    }
    if let Some(kind) = error.and_then(|e| e.get("type")).and_then(|t| t.as_str()) {
        text.push_str(&format!(" ({kind})"));
    }
    Some(text)
}

/// A URL as errors and logs show it: scheme, host, port and path; never a query
/// string or user info, which may carry a key.
fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(url) => format!(
            "{}://{}{}{}",
            url.scheme(),
            url.host_str().unwrap_or(""),
            url.port().map(|p| format!(":{p}")).unwrap_or_default(),
            url.path()
        ),
        Err(_) => "an invalid URL".to_owned(),
    }
}

/// An error and its causes, joined; reqwest's own message names only the first.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_in_errors_lose_their_query_and_user_info() {
        assert_eq!(
            shown_url("https://user:pw@api.example.com:8443/v1/chat?key=sk-secret#x"),
            "https://api.example.com:8443/v1/chat"
        );
        assert_eq!(shown_url("not a url"), "an invalid URL");
    }

    #[test]
    fn provider_messages_from_common_error_bodies() {
        assert_eq!(
            provider_message(
                r#"{"error":{"message":"model: x","type":"not_found_error"},"type":"error"}"#
            ),
            Some("model: x (not_found_error)".to_owned())
        );
        assert_eq!(
            provider_message(
                r#"{"error":{"message":"Incorrect API key","type":"invalid_request_error","code":"invalid_api_key"}}"#
            ),
            Some("Incorrect API key (invalid_request_error)".to_owned())
        );
        assert_eq!(
            provider_message(r#"{"error":"boom"}"#),
            Some("boom".to_owned())
        );
        assert_eq!(
            provider_message(r#"{"detail":"Not Found"}"#),
            Some("Not Found".to_owned())
        );
        assert_eq!(provider_message("<html>bad gateway</html>"), None);
        assert_eq!(
            provider_message(r#"{"error":{"message":"","type":"internal_server_error"}}"#),
            None
        );
    }
}
