//! A loopback HTTP server that answers with queued responses and records requests.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::cassette::Cassette;

/// A request the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct CapturedRequest {
    /// The method.
    pub method: String,
    /// The path, such as `/v1/chat/completions`.
    pub path: String,
    /// The headers, names in lower case, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when it was not JSON).
    pub body: Value,
}

impl CapturedRequest {
    /// The value of a header, if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One scripted response: status, headers and a body sent in chunks, ending
/// normally, by cutting the connection, by stalling forever, or by repeating its
/// last chunk forever.
#[derive(Debug, Clone)]
pub struct MockResponse {
    status: u16,
    headers: Vec<(String, String)>,
    chunks: Vec<Bytes>,
    chunk_delay: Duration,
    header_delay: Duration,
    ending: Ending,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ending {
    Complete,
    Cut,
    Stall,
    Repeat,
}

impl MockResponse {
    /// `200` with an event-stream body.
    pub fn sse(body: impl Into<String>) -> Self {
        MockResponse::status(200, body).header("content-type", "text/event-stream")
    }

    /// A response with `status` and a plain body.
    pub fn status(status: u16, body: impl Into<String>) -> Self {
        MockResponse {
            status,
            headers: Vec::new(),
            chunks: vec![Bytes::from(body.into())],
            chunk_delay: Duration::ZERO,
            header_delay: Duration::ZERO,
            ending: Ending::Complete,
        }
    }

    /// A JSON response with `status`.
    pub fn json(status: u16, body: &Value) -> Self {
        MockResponse::status(status, body.to_string()).header("content-type", "application/json")
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sends the body as these separate chunks instead of one.
    pub fn chunks<S: AsRef<[u8]>>(mut self, chunks: impl IntoIterator<Item = S>) -> Self {
        self.chunks = chunks
            .into_iter()
            .map(|chunk| Bytes::copy_from_slice(chunk.as_ref()))
            .collect();
        self
    }

    /// Waits this long before each chunk.
    pub fn chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay = delay;
        self
    }

    /// Waits this long before sending the status and headers.
    pub fn header_delay(mut self, delay: Duration) -> Self {
        self.header_delay = delay;
        self
    }

    /// Cuts the connection after the chunks, without ending the body.
    pub fn cut(mut self) -> Self {
        self.ending = Ending::Cut;
        self
    }

    /// Sends the chunks, then nothing more, ever.
    pub fn stall(mut self) -> Self {
        self.ending = Ending::Stall;
        self
    }

    /// Sends the chunks but the last, then nothing more, ever: an endless stream
    /// that stops after its first text.
    pub fn stall_after_first(mut self) -> Self {
        self.chunks.pop();
        self.stall()
    }

    /// Sends the chunks, then the last one again and again, forever (each after the
    /// chunk delay): a keep-alive flood, or an endless body.
    pub fn repeat_last(mut self) -> Self {
        self.ending = Ending::Repeat;
        self
    }

    /// The same response as a recorded one.
    pub fn recorded(status: u16, content_type: &str, body: impl Into<Bytes>) -> Self {
        MockResponse {
            chunks: vec![body.into()],
            ..MockResponse::status(status, "")
        }
        .header("content-type", content_type)
    }

    fn into_response(self) -> Response {
        let delay = self.chunk_delay;
        let last = self.chunks.last().cloned().unwrap_or_default();
        let chunks = stream::iter(self.chunks).then(move |chunk| async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, std::io::Error>(chunk)
        });
        let body: BoxStream<'static, Result<Bytes, std::io::Error>> = match self.ending {
            Ending::Complete => chunks.boxed(),
            Ending::Cut => chunks
                .chain(stream::once(async {
                    // Let the server flush what it wrote before the connection goes.
                    tokio::task::yield_now().await;
                    Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "cut by the test",
                    ))
                }))
                .boxed(),
            Ending::Stall => chunks.chain(stream::pending()).boxed(),
            Ending::Repeat => chunks
                .chain(stream::repeat(last).then(move |chunk| async move {
                    if delay.is_zero() {
                        tokio::task::yield_now().await;
                    } else {
                        tokio::time::sleep(delay).await;
                    }
                    Ok(chunk)
                }))
                .boxed(),
        };
        let mut response = Response::new(Body::from_stream(body));
        *response.status_mut() = StatusCode::from_u16(self.status).unwrap();
        for (name, value) in &self.headers {
            response.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        response
    }
}

/// Makes the response to a request (see [`MockServer::respond_with`]).
type Responder = Arc<dyn Fn(&CapturedRequest) -> MockResponse + Send + Sync>;

#[derive(Default)]
struct Shared {
    queue: Mutex<VecDeque<MockResponse>>,
    responder: Mutex<Option<Responder>>,
    fallback: Mutex<Option<MockResponse>>,
    requests: Mutex<Vec<CapturedRequest>>,
    arrived: Notify,
    /// Requests let through that break the transcript rules.
    lenient: std::sync::atomic::AtomicBool,
    /// Why requests broke the transcript rules, in order.
    violations: Mutex<Vec<String>>,
}

/// A real HTTP/1.1 server on `127.0.0.1`, answering every path with the next queued
/// response (or `500 no scripted response` when the queue is empty). Stops when dropped.
///
/// Every request is checked against the transcript rules providers hold requests
/// to ([`crate::rules`]): one that breaks them is answered `400`, as a provider
/// would, and recorded ([`MockServer::violations`]); [`MockServer::lenient`] lets
/// such requests through, for a test that sends one on purpose.
pub struct MockServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl MockServer {
    /// Starts a server on a free port.
    pub async fn start() -> Self {
        let shared = Arc::new(Shared::default());
        let app = Router::new().fallback(respond).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        MockServer { addr, shared, task }
    }

    /// The server's address, without a path: `http://127.0.0.1:<port>`.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server's API root: `http://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues a response.
    pub fn push(&self, response: MockResponse) -> &Self {
        self.shared.queue.lock().unwrap().push_back(response);
        self
    }

    /// Queues the recorded responses of a cassette, in order.
    pub fn push_cassette(&self, cassette: &Cassette) -> &Self {
        for exchange in &cassette.exchanges {
            let r = &exchange.response;
            self.push(MockResponse::recorded(r.status, &r.content_type, r.bytes()));
        }
        self
    }

    /// Answers each request with what `respond` makes of it whenever the queue is
    /// empty: a scripted model that is a function of the conversation it is sent.
    pub fn respond_with(
        &self,
        respond: impl Fn(&CapturedRequest) -> MockResponse + Send + Sync + 'static,
    ) -> &Self {
        *self.shared.responder.lock().unwrap() = Some(Arc::new(respond));
        self
    }

    /// Answers with `response` whenever the queue is empty.
    pub fn always(&self, response: MockResponse) -> &Self {
        *self.shared.fallback.lock().unwrap() = Some(response);
        self
    }

    /// The requests received so far, in order.
    pub fn requests(&self) -> Vec<CapturedRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Waits until at least `count` requests have arrived.
    pub async fn wait_for_requests(&self, count: usize) {
        loop {
            let arrived = self.shared.arrived.notified();
            if self.shared.requests.lock().unwrap().len() >= count {
                return;
            }
            arrived.await;
        }
    }

    /// Lets requests that break the transcript rules through to the script.
    pub fn lenient(&self) -> &Self {
        self.shared
            .lenient
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Why requests broke the transcript rules, in order.
    pub fn violations(&self) -> Vec<String> {
        self.shared.violations.lock().unwrap().clone()
    }

    /// How many queued responses have not been sent.
    pub fn remaining(&self) -> usize {
        self.shared.queue.lock().unwrap().len()
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn respond(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Infallible> {
    let captured = CapturedRequest {
        method: method.to_string(),
        path: uri.path().to_owned(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    shared.requests.lock().unwrap().push(captured.clone());
    shared.arrived.notify_waiters();
    if !shared.lenient.load(std::sync::atomic::Ordering::Relaxed)
        && let Err(reason) = crate::rules::check_request(&captured.path, &captured.body)
    {
        shared.violations.lock().unwrap().push(reason.clone());
        let body = serde_json::json!({"error": {"type": "invalid_request_error", "message": format!("the request breaks the transcript rules: {reason}")}});
        return Ok(MockResponse::json(400, &body).into_response());
    }
    let next = shared.queue.lock().unwrap().pop_front();
    let responder = shared.responder.lock().unwrap().clone();
    let next = next
        .or_else(|| responder.map(|respond| respond(&captured)))
        .or_else(|| shared.fallback.lock().unwrap().clone());
    let response = next.unwrap_or_else(|| MockResponse::status(500, "no scripted response"));
    if !response.header_delay.is_zero() {
        tokio::time::sleep(response.header_delay).await;
    }
    Ok(response.into_response())
}

/// An API root on a loopback port where nothing listens (connections are refused).
pub fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/v1")
}
