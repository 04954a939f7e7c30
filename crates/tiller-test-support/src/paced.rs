//! A loopback HTTP/1.1 server that streams as a model does: each SSE event is one
//! chunk written on its own, spaced in time, and the body's end in a write of its
//! own after the last event, on keep-alive connections. Blocking I/O, one thread
//! per connection, so it can run in a process of its own and leave the measured
//! process's CPU clock alone; it counts the connections it accepts.
//!
//! What it answers depends on the request's `model`:
//! - `spaced-N`: the reply, one event per write, `N` µs apart;
//! - `whole`: the reply in one write;
//! - `late-end-N`: the reply in one write, the body's end `N` ms later — unless
//!   the client has closed the connection by then, which is counted;
//! - `tools`: [`tool_script`]'s answer to the request, in one write;
//! - `stamped-N`: [`STAMPED_TOKENS`] text deltas `N` µs apart, each the
//!   [`monotonic_ns`] it was written at followed by a space, so that a reader in
//!   another process can tell how long each token took to reach it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::sse::{
    OPENAI_DONE, openai_delta, openai_finish, openai_text, openai_tool_call, openai_usage,
};
use crate::workload::monotonic_ns;

/// The text deltas of a `stamped-N` reply.
pub const STAMPED_TOKENS: usize = 32;

/// What a server has seen, shared with its threads.
#[derive(Default)]
pub struct Counts {
    connections: AtomicUsize,
    responses: Mutex<usize>,
    response_ended: Condvar,
    closed_before_end: AtomicUsize,
}

impl Counts {
    fn response_ended(&self) {
        *self.responses.lock().unwrap() += 1;
        self.response_ended.notify_all();
    }
}

/// A paced server on a thread of its own, serving until the process ends.
pub struct PacedServer {
    port: u16,
    counts: Arc<Counts>,
    /// Whether it speaks TLS (as `localhost`).
    tls: bool,
}

impl PacedServer {
    /// Starts serving `reply` (the events of one streamed answer) on a free port.
    pub fn start(reply: Vec<String>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts = Arc::new(Counts::default());
        let counted = counts.clone();
        std::thread::spawn(move || serve(listener, reply, counted));
        PacedServer {
            port,
            counts,
            tls: false,
        }
    }

    /// Starts serving `reply` in TLS as `localhost`, with a certificate of
    /// its own made now; returns the certificate's PEM, for the client to trust.
    pub fn start_tls(reply: Vec<String>) -> (Self, String) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let certificate = certified.cert.pem();
        let identity = native_tls::Identity::from_pkcs8(
            certificate.as_bytes(),
            certified.signing_key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let acceptor = native_tls::TlsAcceptor::new(identity).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts = Arc::new(Counts::default());
        let counted = counts.clone();
        std::thread::spawn(move || {
            serve_each(listener, reply, counted, move |tcp| {
                acceptor.accept(tcp).ok()
            });
        });
        let server = PacedServer {
            port,
            counts,
            tls: true,
        };
        (server, certificate)
    }

    /// The base URL of its OpenAI-style API.
    pub fn base_url(&self) -> String {
        match self.tls {
            true => format!("https://localhost:{}/v1", self.port),
            false => format!("http://127.0.0.1:{}/v1", self.port),
        }
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.counts.connections.load(Ordering::SeqCst)
    }

    /// Blocks until `count` responses have been written to the end (or found
    /// their client gone).
    pub fn wait_for_responses(&self, count: usize) {
        let mut responses = self.counts.responses.lock().unwrap();
        while *responses < count {
            responses = self.counts.response_ended.wait(responses).unwrap();
        }
    }

    /// How many `late-end` responses the client closed before their end came.
    pub fn closed_before_end(&self) -> usize {
        self.counts.closed_before_end.load(Ordering::SeqCst)
    }
}

/// The events of a recorded OpenAI reply (115 SSE events), each with its blank
/// line: what the benches' paced servers stream.
pub fn recorded_reply() -> Vec<String> {
    let cassette = crate::Cassette::load(
        "openai",
        "refusal_matrix__chat_control_non_refusing_stream_is_unchanged",
    );
    let body = &cassette.exchanges[0].response.body;
    body.split_inclusive("\n\n").map(str::to_owned).collect()
}

/// Set in the environment of a bench binary started again to be the server.
const SERVE_VAR: &str = "TILLER_BENCH_PACED_SERVER";

/// For a bench's `main`, first thing: when this process was started by
/// [`PacedProcess::start`], serves `reply` until killed and returns `true`.
pub fn serve_if_asked(reply: &[String]) -> bool {
    if std::env::var_os(SERVE_VAR).is_none() {
        return false;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("{}", listener.local_addr().unwrap().port());
    serve(listener, reply.to_vec(), Default::default());
    true
}

/// A paced server in a process of its own — the running executable started
/// again, which calls [`serve_if_asked`] — so that the measuring process's CPU
/// clock counts the client alone. Killed when dropped.
pub struct PacedProcess {
    child: std::process::Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl PacedProcess {
    /// Starts it and waits for its port.
    pub fn start() -> Self {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env(SERVE_VAR, "1")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut port = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();
        PacedProcess {
            child,
            port: port.trim().parse().unwrap(),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An OpenAI-compatible model on it; `id` picks what it answers.
    pub fn model(&self, id: &str) -> tiller_ai::Model {
        tiller_ai::Model::openai_compatible(format!("http://127.0.0.1:{}/v1", self.port), id)
    }
}

/// The floor a reader of these streams is measured against: the CPU per reply
/// of bare tokio `TcpStream`s reading `count` replies of `model` each, on
/// `connections` keep-alive connections at once (after two replies each to warm
/// up), on the current runtime: no HTTP parsing, no decoding, nothing handed on.
pub async fn bare_replies(port: u16, model: &str, connections: usize, count: usize) -> Duration {
    const WARM_UP: usize = 2;
    let request = {
        let body = json!({ "model": model }).to_string();
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let request = request.as_bytes();
    let read = |mut socket: tokio::net::TcpStream, replies: usize| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buffer = vec![0; 64 * 1024];
        for _ in 0..replies {
            socket.write_all(request).await.unwrap();
            let mut tail = Vec::new();
            loop {
                let read = socket.read(&mut buffer).await.unwrap();
                assert!(read > 0, "the server closed the connection");
                tail.extend_from_slice(&buffer[..read]);
                if tail.ends_with(b"\r\n0\r\n\r\n") {
                    break;
                }
                let keep = tail.len().saturating_sub(8);
                tail.drain(..keep);
            }
        }
        socket
    };
    let connect = |_| async {
        let socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        socket.set_nodelay(true).unwrap();
        read(socket, WARM_UP).await
    };
    let sockets = futures::future::join_all((0..connections).map(connect)).await;
    let started = crate::workload::cpu_time();
    futures::future::join_all(sockets.into_iter().map(|socket| read(socket, count))).await;
    (crate::workload::cpu_time() - started) / (connections * count) as u32
}

impl Drop for PacedProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves `reply` (the events of one streamed answer) on `listener` until the
/// process ends, counting what it sees in `counts`.
pub fn serve(listener: TcpListener, reply: Vec<String>, counts: Arc<Counts>) {
    serve_each(listener, reply, counts, Some);
}

/// Serves each connection `listener` accepts, as `open` makes it (`None`
/// drops it: a failed TLS handshake), on a thread of its own.
fn serve_each<C: Connection + 'static>(
    listener: TcpListener,
    reply: Vec<String>,
    counts: Arc<Counts>,
    open: impl Fn(TcpStream) -> Option<C> + Send + Sync + 'static,
) {
    let reply = Arc::new(reply);
    let open = Arc::new(open);
    for connection in listener.incoming() {
        let Ok(connection) = connection else { continue };
        counts.connections.fetch_add(1, Ordering::SeqCst);
        let (reply, counts, open) = (reply.clone(), counts.clone(), open.clone());
        std::thread::spawn(move || {
            if let Some(connection) = open(connection) {
                let _ = serve_connection(connection, &reply, &counts);
            }
        });
    }
}

/// A connection the server reads requests from and writes replies to.
trait Connection: Read + Write {
    /// Its TCP socket.
    fn socket(&self) -> &TcpStream;
}

impl Connection for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }
}

impl Connection for native_tls::TlsStream<TcpStream> {
    fn socket(&self) -> &TcpStream {
        self.get_ref()
    }
}

fn serve_connection(
    connection: impl Connection,
    reply: &[String],
    counts: &Counts,
) -> std::io::Result<()> {
    connection.socket().set_nodelay(true)?;
    let mut reader = BufReader::new(connection);
    while let Some(body) = read_request(&mut reader)? {
        let writer = reader.get_mut();
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let model = request["model"].as_str().unwrap_or_default();
        writer.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        )?;
        if let Some(spacing) = model.strip_prefix("spaced-") {
            let spacing = Duration::from_micros(spacing.parse().unwrap_or(300));
            for event in reply {
                std::thread::sleep(spacing);
                writer.write_all(&chunk(event))?;
            }
        } else if let Some(wait) = model.strip_prefix("late-end-") {
            writer.write_all(&chunk(&reply.concat()))?;
            std::thread::sleep(Duration::from_millis(wait.parse().unwrap_or(20)));
            if closed(writer.socket())? {
                counts.closed_before_end.fetch_add(1, Ordering::SeqCst);
                counts.response_ended();
                return Ok(());
            }
        } else if let Some(spacing) = model.strip_prefix("stamped-") {
            let spacing = Duration::from_micros(spacing.parse().unwrap_or(30_000));
            writer.write_all(&chunk(&openai_delta(
                json!({"role": "assistant", "content": ""}),
            )))?;
            for _ in 0..STAMPED_TOKENS {
                std::thread::sleep(spacing);
                let token = format!("{} ", monotonic_ns());
                writer.write_all(&chunk(&openai_delta(json!({"content": token}))))?;
            }
            let end = [
                openai_finish("stop"),
                openai_usage(10, STAMPED_TOKENS as u64),
                OPENAI_DONE.to_owned(),
            ];
            writer.write_all(&chunk(&end.concat()))?;
        } else if model == "tools" {
            writer.write_all(&chunk(&tool_script(&request)))?;
        } else {
            writer.write_all(&chunk(&reply.concat()))?;
        }
        writer.write_all(b"0\r\n\r\n")?;
        counts.response_ended();
    }
    Ok(())
}

/// Whether the client has closed `connection` (without waiting).
fn closed(connection: &TcpStream) -> std::io::Result<bool> {
    connection.set_nonblocking(true)?;
    let peeked = connection.peek(&mut [0; 1]);
    connection.set_nonblocking(false)?;
    match peeked {
        Ok(0) => Ok(true),
        Ok(_) => Ok(false),
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => Ok(true),
        Err(error) => Err(error),
    }
}

/// One chunk of a chunked body.
fn chunk(data: &str) -> Vec<u8> {
    let mut chunk = format!("{:x}\r\n", data.len()).into_bytes();
    chunk.extend_from_slice(data.as_bytes());
    chunk.extend_from_slice(b"\r\n");
    chunk
}

/// The next request's body, or `None` once the client closed the connection.
fn read_request(reader: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut length = 0;
    let mut line = String::new();
    let mut first = true;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if line == "\r\n" && !first {
            break;
        }
        first = false;
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(Some(body))
}

/// A model that calls `add` twice, one call per turn, then answers: which turn
/// this is comes from the tool results the request carries.
pub fn tool_script(request: &Value) -> String {
    let results = request["messages"]
        .as_array()
        .map(|messages| messages.iter().filter(|m| m["role"] == "tool").count())
        .unwrap_or(0);
    match results {
        0 => openai_tool_call("call_1", "add", &json!({"a": 2, "b": 3})),
        1 => openai_tool_call("call_2", "add", &json!({"a": 5, "b": 8})),
        _ => openai_text(&["The answer ", "is 13, after ", "two additions."]),
    }
}
