//! What the server's test suites share: a server on loopback over real HTTP,
//! agents on the scripted faux model, and a reader of server-sent events.

#![allow(dead_code, clippy::unwrap_used)]

use futures::StreamExt;
use serde_json::{Value, json};
use tiller::agents::agent_file::AgentFile;
use tiller::faux::FauxProvider;
use tiller::{Definitions, Supervisor, SupervisorConfig, runtime::Shards};
use tiller_server::{Owner, Server, ServerConfig, Tokens};
use tiller_test_support::tools::TOOLED_AGENT_FILE;

pub(crate) const HELPER: &str = "
type: object
description: You help.
json_schema_extra: {kind: agent, name: helper}
";

/// A server on loopback whose definitions (`helper`) answer with `faux`.
pub(crate) struct Running {
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    pub(crate) async fn start(faux: &FauxProvider, config: ServerConfig) -> Self {
        Running::serve(Definitions::new().with_default_model(faux.model()), config).await
    }

    /// Like [`Running::start`], with `tooled` ([`TOOLED_AGENT_FILE`]) beside `helper`.
    pub(crate) async fn tooled(faux: &FauxProvider, config: ServerConfig) -> Self {
        let mut definitions = Definitions::new().with_default_model(faux.model());
        definitions
            .insert(AgentFile::parse("tooled.yaml", TOOLED_AGENT_FILE).unwrap())
            .unwrap();
        Running::serve(definitions, config).await
    }

    /// Like [`Running::start`], with the agents and connections on two shards.
    pub(crate) async fn on_two_shards(faux: &FauxProvider, config: ServerConfig) -> Self {
        let supervisor = Supervisor::with_config(SupervisorConfig {
            shards: Shards::Count(2),
            ..SupervisorConfig::default()
        })
        .await
        .unwrap();
        let definitions = Definitions::new().with_default_model(faux.model());
        Running::on(supervisor, definitions, config).await
    }

    /// Serves `definitions`, with `helper` added.
    pub(crate) async fn serve(definitions: Definitions, config: ServerConfig) -> Self {
        Running::on(Supervisor::start().await.unwrap(), definitions, config).await
    }

    /// Serves `supervisor`'s agents and `definitions`, with `helper` added.
    pub(crate) async fn on(
        supervisor: Supervisor,
        mut definitions: Definitions,
        config: ServerConfig,
    ) -> Self {
        definitions
            .insert(AgentFile::parse("helper.yaml", HELPER).unwrap())
            .unwrap();
        let server = Server::new(supervisor, definitions, config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(server.serve(listener, async move {
            let _ = stopped.await;
        }));
        Running {
            base,
            http: reqwest::Client::new(),
            stop: Some(stop),
            served,
        }
    }

    pub(crate) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.send_as(method, path, None, body).await
    }

    /// Sends a request with `token` as its bearer token, when given.
    pub(crate) async fn send_as(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POSTs `body` with `headers`, returning the status and the raw body.
    pub(crate) async fn post_raw(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> (u16, String) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub(crate) async fn create_helper(&self) -> String {
        let (status, agent) = self.post("/agents", json!({"definition": "helper"})).await;
        assert_eq!(status, 201, "{agent}");
        agent["id"].as_str().unwrap().to_owned()
    }

    /// Makes a `helper` agent with `token`; its id.
    pub(crate) async fn create_helper_as(&self, token: &str) -> String {
        let (status, agent) = self
            .send_as(
                reqwest::Method::POST,
                "/agents",
                Some(token),
                Some(json!({"definition": "helper"})),
            )
            .await;
        assert_eq!(status, 201, "{agent}");
        agent["id"].as_str().unwrap().to_owned()
    }

    /// Opens an agent's event stream, resuming after `last` when given.
    pub(crate) async fn events(&self, id: &str, last: Option<u64>) -> SseReader {
        let last = last.map(|last| last.to_string());
        let headers: Vec<(&str, &str)> = last
            .iter()
            .map(|last| ("Last-Event-ID", last.as_str()))
            .collect();
        self.stream(&format!("/agents/{id}/events"), &headers).await
    }

    /// Opens an agent's event stream on a connection of its own, whose first
    /// request it is.
    pub(crate) async fn events_alone(&self, id: &str) -> SseReader {
        let alone = reqwest::Client::new().get(format!("{}/agents/{id}/events", self.base));
        SseReader::of(alone).await
    }

    /// Opens the event stream at `path` with `headers`.
    pub(crate) async fn stream(&self, path: &str, headers: &[(&str, &str)]) -> SseReader {
        let mut request = self.http.get(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        SseReader::of(request).await
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.served.await.unwrap().unwrap();
    }
}

/// One server-sent event: its id (the data's `seq` when it has no `id:`), its
/// type and its data as JSON.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sse {
    pub(crate) id: u64,
    pub(crate) numbered: bool,
    pub(crate) kind: String,
    pub(crate) data: Value,
}

pub(crate) struct SseReader {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
    /// Bytes of the body read so far.
    read: usize,
}

impl SseReader {
    /// Sends `request` and reads its answer, an event stream.
    async fn of(request: reqwest::RequestBuilder) -> SseReader {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        SseReader {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
            read: 0,
        }
    }

    /// The next event (keep-alive comments skipped).
    pub(crate) async fn next(&mut self) -> Sse {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|line| line.strip_prefix(name))
                        .map(|value| value.trim_start().to_owned())
                };
                if let (Some(kind), Some(data)) = (field("event:"), field("data:")) {
                    let data: Value = serde_json::from_str(&data).unwrap();
                    let id = field("id:");
                    return Sse {
                        numbered: id.is_some(),
                        id: id.map_or_else(
                            || data["seq"].as_u64().unwrap(),
                            |id| id.parse().unwrap(),
                        ),
                        kind,
                        data,
                    };
                }
                continue;
            }
            let chunk = self.body.next().await.expect("the stream went on").unwrap();
            self.read += chunk.len();
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// The bytes of the stream read so far.
    pub(crate) fn bytes_read(&self) -> usize {
        self.read
    }

    /// Events up to and including the next `agent_end`.
    pub(crate) async fn until_end(&mut self) -> Vec<Sse> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await;
            let end = event.kind == "agent_end";
            events.push(event);
            if end {
                return events;
            }
        }
    }
}

/// A server config whose bearer tokens map to tenants: `(token, tenant)`.
pub(crate) fn closed(tokens: &[(&str, &str)]) -> ServerConfig {
    let users: Vec<_> = tokens
        .iter()
        .map(|(token, tenant)| (*token, *tenant, None))
        .collect();
    closed_for(&users)
}

/// A server config whose tokens are each a tenant's, and a user's when one is named.
pub(crate) fn closed_for(tokens: &[(&str, &str, Option<&str>)]) -> ServerConfig {
    let tokens = tokens
        .iter()
        .fold(Tokens::new(), |tokens, (token, tenant, user)| {
            tokens.with(
                *token,
                Owner {
                    tenant: (*tenant).to_owned(),
                    user: user.map(str::to_owned),
                    metrics: false,
                    admin: false,
                },
            )
        });
    ServerConfig {
        tokens,
        ..ServerConfig::default()
    }
}

pub(crate) fn kinds(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|event| event.kind.as_str()).collect()
}
