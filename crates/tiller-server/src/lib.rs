//! Tiller's agents over HTTP.
//!
//! A JSON API to create agents from definitions (by name, or an agent file sent
//! inline), list them, read their state, prompt (at once, or `?wait=true` for the
//! run's outcome), steer, queue follow-ups, abort, reset and delete them; and each
//! agent's events as server-sent events that a client can resume with
//! `Last-Event-ID`. Errors are `application/problem+json`. With bearer tokens
//! configured ([`Tokens`]), each agent belongs to the tenant (and user) that created
//! it and no other sees it. Without them the server answers this machine only
//! (loopback `Host` and `Origin`). An agent file sent inline chooses only among what
//! the operator configured ([`ServerConfig::trust_inline_definitions`]), and every
//! resource has a bound ([`ServerConfig`]). `POST /api/stream` is pi's proxy endpoint: pi-agent-core's
//! `streamProxy` makes its model calls through it, with the server's keys. `tiller
//! serve` runs it.
//!
//! | method and path | does | answers |
//! |---|---|---|
//! | `GET /` | the dashboard: agents, a live conversation view, prompt, steer, abort, reset | 200 HTML |
//! | `GET /healthz` | liveness, whether the session store writes, and (a host of a cluster) whether it has joined | 200 `ok`, 503 `store-unavailable`, 503 `joining` |
//! | `GET /openapi.json` | this API described in OpenAPI 3.1 ([`OPENAPI_YAML`]) | 200 |
//! | `GET /metrics` | Prometheus text: agents by status, runs started and ended, model calls and their time to the first event, responses by route and status, problems by kind, connections by where they are served, events streamed, proxied calls, each provider account's pace (requests, waits, 429s, learned tokens per minute), each failing endpoint's circuit breaker, each tenant's budget and spending (with tokens, for a token marked `metrics: true`) | 200 |
//! | `GET /definitions` | the agent definitions it makes agents from | 200 |
//! | `POST /agents` | `{"definition": NAME, "version"?, "id"?, "name"?}` or `{"inline": AGENT_FILE, …}` (without an id, the server makes up a time-ordered UUID; an id whose session the store has is 409 `session-exists`) | 201 the agent |
//! | `GET /agents[?after=ID&limit=N]` | a page of agents and their status, in id order (a `Link` header names the next) | 200 |
//! | `GET /agents/{id}` | its state: transcript, queues, what is streaming; in a cluster, its `owner` host and epoch | 200 |
//! | `POST /agents/{id}/prompt[?wait=true]` | `{"text": …}` | 202, or 200 the run's outcome |
//! | `POST /agents/{id}/reply[?wait=true]` | `{"type": "answer" \| "approve" \| "deny", "request_id": …}`: the reply to the request it names | 202, or 200 the run's outcome |
//! | `POST /agents/{id}/steer`, `/follow_up` | `{"text": …}` | 204 |
//! | `POST /agents/{id}/abort` | aborts the run, answers once idle | 204 |
//! | `POST /agents/{id}/reset` | forgets transcript and queues | 204 |
//! | `POST /agents/{id}/compact[?wait=true]` | `{"instructions"?: …}` or nothing: the oldest messages replaced by a summary now (the store keeps them) | 202, or 200 the outcome with its `compactions` |
//! | `DELETE /agents/{id}` | stops the agent | 204 |
//! | `POST /triggers/{topic}` | an event's JSON payload (at most [`MAX_EVENT_BYTES`]), the caller's tenant's: the agents whose triggers match it are prompted (spawned, thawed or resumed) once their debounce windows close | 202 `{"matched": N}` |
//! | `GET /agents/{id}/events` | server-sent events, `id:` the sequence number | 200 |
//! | `GET /agents/{id}/ws[?after=N]` | WebSocket: the events as text frames; prompt, steer, follow-up, abort and reset frames the other way | 101 |
//! | `GET /events` | every event of every agent the caller may see, agents created later joining (no resume) | 200 |
//! | `GET /sessions[?user_id=&status=&limit=]` | the caller's sessions (conversations) the store keeps, most recent first | 200 |
//! | `GET /sessions/{id}` | one session: owner, definition, message count, the agent holding it | 200 |
//! | `GET /sessions/{id}/messages[?from=&limit=]` | a page of its transcript, from the store | 200 |
//! | `POST /sessions/{id}/resume` | `{"definition": NAME}` or `{"inline": …}` (for its tools): an agent holding the session again | 201 the agent, 200 if one holds it |
//! | `DELETE /sessions/{id}` | stops the agent holding it, forgets the session | 204 |
//! | `/mcp` | MCP over streamable HTTP: each definition a tool that runs the agent, working for the caller's token | MCP |
//! | `POST /api/stream` | pi's proxy: `{model, context, options}` as pi-agent-core's `streamProxy` sends them; the server calls the model with its own keys | 200 server-sent events in pi's proxy form |
//! | `GET /v1/models` | the OpenAI API's model list: the definitions, each a model | 200 |
//! | `POST /v1/chat/completions` | the OpenAI API's chat completions (streamed or not) on a session of the definition `model` names; `X-Tiller-Session` continues one (see `protocols/chat.rs`) | 200 a `chat.completion` or its chunks, `X-Tiller-Session` naming the session |
//! | `POST /v1/responses` | the OpenAI API's responses (streamed or not) on a session of the definition `model` names; `previous_response_id` or `conversation` continues one (see `protocols/responses.rs`) | 200 a `response` or its events |
//! | `POST /ai-sdk/{definition}` | the AI SDK's UI message stream (`useChat`'s transports): the chat `id` is the session (see `protocols/ui_stream.rs`) | 200 a UI message stream |
//! | `POST /ag-ui/{definition}` | AG-UI: a `RunAgentInput`, its `threadId` the session (see `protocols/ag_ui.rs`) | 200 AG-UI events |
//!
//! ```no_run
//! use tiller::{Definitions, Supervisor};
//! use tiller_server::{Server, ServerConfig};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let definitions = Definitions::load_dir("agents")?.with_default_model(tiller::faux::demo_model());
//! let server = Server::new(Supervisor::start().await?, definitions, ServerConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
//! server.serve(listener, std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

mod agents;
#[cfg(feature = "cluster")]
mod clustered;
mod connections;
mod error;
mod events;
mod files;
mod inline;
mod joining;
mod jwt;
mod local;
mod mcp;
mod memory;
mod metrics;
mod origin;
mod protocols;
mod proxy;
mod quota;
mod reach;
mod sessions;
mod shutdown;
mod socket;
mod tenants;
mod trace;
mod triggers;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::Html;
use axum::routing::{delete, get, post};
use dashmap::DashMap;
use tiller::mcp::McpHttpConfig;
use tiller::{Definitions, Supervisor, runtime::AgentId};
use tokio_util::sync::CancellationToken;

pub use error::Problem;
pub use joining::while_joining;
pub use jwt::JwtKeys;
pub use quota::Quotas;
pub use sessions::MAX_PAGE;
pub use tenants::{Owner, Tokens};
pub use triggers::MAX_EVENT_BYTES;

use events::Replay;
use metrics::Metrics;
use proxy::ProxyModels;

/// The dashboard: plain HTML, CSS and a little JavaScript, no build step.
const DASHBOARD: &str = include_str!("dashboard.html");

/// The API's OpenAPI 3.1 description, kept as YAML beside the crate's sources.
pub const OPENAPI_YAML: &str = include_str!("../openapi.yaml");

/// [`OPENAPI_YAML`] as JSON, as `GET /openapi.json` serves it.
fn openapi_json() -> &'static str {
    static JSON: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        serde_saphyr::from_str::<serde_json::Value>(OPENAPI_YAML).map_or_else(
            |error| serde_json::json!({"error": error.to_string()}).to_string(),
            |spec| spec.to_string(),
        )
    });
    &JSON
}

/// `GET /healthz`: 200 `ok`, or 503 `store-unavailable` while the session store
/// cannot write (requests that would write are refused meanwhile, and the
/// writes already taken wait for it).
async fn healthz(State(shared): State<Arc<Shared>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match shared.writable() {
        Ok(()) => "ok".into_response(),
        Err(problem) => shutdown::store_unavailable(problem),
    }
}

/// The server's bounds.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The largest request body accepted (413 past it).
    pub max_body_bytes: usize,
    /// Events kept per agent for clients resuming with `Last-Event-ID`.
    pub replay_events: usize,
    /// Unread events per streaming client before it gets a `lagged` notice.
    pub client_buffer: usize,
    /// How often an idle event stream gets a keep-alive comment.
    pub keep_alive: Duration,
    /// Bearer tokens and their tenants; none leaves the server open (see
    /// [`Tokens`]).
    pub tokens: Tokens,
    /// Whether `X-User-Id`, `X-Session-Id`, `X-Client-Id` and `X-Evaluation` add to
    /// a caller's context (only behind a gateway that sets them: anyone can send
    /// headers).
    pub trust_context_headers: bool,
    /// How long runs in flight may go on finishing once shutdown begins (new work
    /// is refused with 503 meanwhile) before they are aborted; zero aborts them at
    /// once.
    pub finish_runs: Duration,
    /// The `Host` names (without a port) an open server (no tokens) answers, and
    /// `/mcp` always (against DNS rebinding): loopback by default; add the names
    /// the server is reached by, or leave it empty to accept any.
    pub allowed_hosts: Vec<String>,
    /// The origins (`scheme://host[:port]`) besides loopback ones and the server's
    /// own whose pages may call the API from a browser; any other `Origin` is
    /// refused (403 `cross-origin`).
    pub allowed_origins: Vec<String>,
    /// How long a client has to send a request's head, on a new connection and
    /// between requests on a kept-alive one (the connection is closed past it).
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive whole (408 `slow-body` past
    /// it).
    pub body_timeout: Duration,
    /// The most connections open at once; one past it is answered 503
    /// `too-many-connections` and closed (at least 1).
    pub max_connections: usize,
    /// The most connections open at once from one address (503
    /// `too-many-connections` past it), so that one client cannot take them all.
    pub max_connections_per_address: usize,
    /// The most event streams (server-sent events, WebSockets, `GET /events`, pi
    /// proxy calls) one caller (a token, or everyone on an open server) holds
    /// open at once (429 `too-many-streams` past it).
    pub max_streams_per_caller: usize,
    /// How long a closed session is kept after its last change before the
    /// server deletes it from the store (checked every hour, and at start);
    /// `None`, the default, keeps them.
    pub retain_closed: Option<Duration>,
    /// The most MCP sessions open at once on `/mcp` (503 past it).
    pub max_mcp_sessions: usize,
    /// The most MCP sessions of one tenant (everyone's, on an open server) open
    /// at once on `/mcp` (429 past it), so that no tenant takes them all.
    pub max_mcp_sessions_per_tenant: usize,
    /// How long an MCP session may go without a request before it ends.
    pub mcp_idle_timeout: Duration,
    /// What each tenant may hold at once where its token file entry does not
    /// say ([`Quotas::tenant_defaults`]; a `None` here is no bound, and the
    /// MCP sessions' default is [`ServerConfig::max_mcp_sessions_per_tenant`]).
    pub tenant_quotas: Quotas,
    /// What each user of a tenant may hold at once where its tenant's entry
    /// does not say ([`Quotas::user_defaults`]).
    pub user_quotas: Quotas,
    /// The operator's guardrails: they check every agent sent inline (before
    /// its own), and the input checks every `/api/stream` call's last user
    /// message before the model is called (403 `guardrail-tripped`).
    pub guardrails: tiller::run::Guardrails,
    /// Whether an agent file sent inline may carry what only an operator should:
    /// command tools, a model's `base_url`, `api_key_env`, a tool's `env` and MCP
    /// servers, and models the server does not serve (see the `inline` rules in
    /// the README's "Exposing `tiller serve`"). Off by default.
    pub trust_inline_definitions: bool,
    /// In a cluster (`Server::clustered`), whether shutdown first moves this
    /// host's agents to the other hosts between two turns (`tiller serve
    /// --drain`); without it, they are left to their leases' expiry, and the
    /// other hosts run again the turns they had in progress.
    pub drain_on_shutdown: bool,
    /// REMLight's child-content rule for every agent the API makes: once a
    /// sub-agent streamed its answer, the caller's own text of that run is not
    /// streamed again (see `RunOptions::quiet_after_child_content`). Off by
    /// default; `tiller serve` turns it on.
    pub quiet_after_child_content: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_body_bytes: 1 << 20,
            replay_events: 1_024,
            client_buffer: 1_024,
            keep_alive: Duration::from_secs(15),
            tokens: Tokens::new(),
            trust_context_headers: false,
            finish_runs: Duration::ZERO,
            allowed_hosts: McpHttpConfig::default().allowed_hosts,
            allowed_origins: Vec::new(),
            trust_inline_definitions: false,
            retain_closed: None,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1_024,
            max_connections_per_address: 256,
            max_streams_per_caller: 64,
            max_mcp_sessions: 256,
            max_mcp_sessions_per_tenant: 64,
            mcp_idle_timeout: Duration::from_secs(300),
            tenant_quotas: Quotas::tenant_defaults(),
            user_quotas: Quotas::user_defaults(),
            guardrails: tiller::run::Guardrails::default(),
            drain_on_shutdown: false,
            quiet_after_child_content: false,
        }
    }
}

/// What every handler shares.
pub(crate) struct Shared {
    supervisor: Supervisor,
    /// The definitions' schedules firing, while the server is.
    schedules: std::sync::OnceLock<tiller::agents::Schedules>,
    /// Where the agents live: this process's supervisor, or the hosts of a
    /// cluster.
    agents: Arc<dyn reach::Agents>,
    definitions: Definitions,
    config: ServerConfig,
    replays: DashMap<AgentId, Arc<Replay>>,
    /// How many event streams each caller holds open ([`quota`]).
    streams: quota::Counts<tenants::Scope>,
    /// How many event streams each tenant holds open.
    tenant_streams: quota::Counts<Option<String>>,
    /// The live agents each tenant and user holds ([`quota`]).
    agents_held: quota::AgentsHeld,
    /// Whose each agent created through the API is.
    owners: DashMap<AgentId, tenants::Scope>,
    /// The models `POST /api/stream` calls.
    proxy_models: ProxyModels,
    /// This, for the tasks it starts.
    me: std::sync::Weak<Shared>,
    /// Where each replay's relay says its agent stopped ([`Shared::forget_stopped`]).
    stopped: tokio::sync::mpsc::UnboundedSender<events::Stopped>,
    /// What [`Shared::forget_stopped`] reads, until the first recording starts it
    /// (on the runtime: a server may be made outside one).
    stops: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<events::Stopped>>>,
    /// Announces each agent created through the API, for `GET /events`.
    created: tokio::sync::broadcast::Sender<AgentId>,
    /// What `/metrics` reports.
    metrics: Arc<Metrics>,
    /// Cancelled when shutdown begins: new runs, agents and proxied calls are refused.
    stopping: CancellationToken,
    /// Cancelled once runs are done or aborted: event streams end.
    closing: CancellationToken,
}

/// Tiller's agents over HTTP: the supervisor's agents, the definitions they are
/// made from, and the routes.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// A server for `supervisor`'s agents, creating new ones from `definitions`.
    pub fn new(supervisor: Supervisor, definitions: Definitions, config: ServerConfig) -> Self {
        let agents = Arc::new(local::Local::new(supervisor.clone()));
        Server::made(supervisor, agents, definitions, config)
    }

    /// A server that is one host of a cluster (see [`tiller_cluster`]): it joins
    /// the cluster `cluster` names with `supervisor` (whose store must be the
    /// cluster's PostgreSQL), creates agents on this host, and reaches every
    /// other agent of the cluster through its owner. Any host answers any
    /// request; `POST /admin/drain` moves this host's agents away.
    #[cfg(feature = "cluster")]
    pub async fn clustered(
        supervisor: Supervisor,
        definitions: Definitions,
        config: ServerConfig,
        cluster: tiller_cluster::ClusterConfig,
    ) -> Result<Self, tiller_cluster::ClusterError> {
        let activations = Arc::new(clustered::Activations::default());
        let joined =
            tiller_cluster::Cluster::join(cluster, supervisor.clone(), activations.clone()).await?;
        let server = Server::made(supervisor, Arc::new(joined), definitions, config);
        activations.serve(&server.shared);
        Ok(server)
    }

    fn made(
        supervisor: Supervisor,
        agents: Arc<dyn reach::Agents>,
        definitions: Definitions,
        config: ServerConfig,
    ) -> Self {
        let proxy_models = ProxyModels::of(&definitions);
        // Compressed transcripts' `lookup` reads the agents' own store.
        let definitions = definitions.with_session_store(supervisor.store().clone());
        let (stopped, stops) = tokio::sync::mpsc::unbounded_channel();
        let server = Server {
            shared: Arc::new_cyclic(|me| Shared {
                me: me.clone(),
                stopped,
                stops: std::sync::Mutex::new(Some(stops)),
                supervisor,
                schedules: std::sync::OnceLock::new(),
                agents,
                definitions,
                config,
                proxy_models,
                metrics: Arc::default(),
                created: tokio::sync::broadcast::Sender::new(1_024),
                replays: DashMap::new(),
                owners: DashMap::new(),
                streams: quota::Counts::default(),
                tenant_streams: quota::Counts::default(),
                agents_held: quota::AgentsHeld::default(),
                stopping: CancellationToken::new(),
                closing: CancellationToken::new(),
            }),
        };
        // The definitions' triggers and schedules, on a runtime (a server may
        // be made outside one).
        if tokio::runtime::Handle::try_current().is_ok() {
            triggers::attach(&server.shared, &server.shared.supervisor);
        }
        server
    }

    /// The routes, for a host to serve or nest in its own router.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/", get(|| async { Html(DASHBOARD) }))
            .route("/healthz", get(healthz))
            // With tokens, the guard lets only callers with one reach it.
            .route(
                "/openapi.json",
                get(|| async {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        openapi_json(),
                    )
                }),
            )
            .route("/definitions", get(agents::definitions))
            .route("/agents", post(agents::create).get(agents::list))
            .route("/agents/{id}", get(agents::get).delete(agents::delete))
            .route("/agents/{id}/prompt", post(agents::prompt))
            .route("/triggers/{topic}", post(triggers::publish))
            .route("/agents/{id}/steer", post(agents::steer))
            .route("/agents/{id}/follow_up", post(agents::follow_up))
            .route("/agents/{id}/abort", post(agents::abort))
            .route("/agents/{id}/reset", post(agents::reset))
            .route("/agents/{id}/reply", post(agents::reply))
            .route("/agents/{id}/compact", post(agents::compact))
            .route("/agents/{id}/events", get(agents::events))
            .route("/agents/{id}/ws", get(socket::socket))
            .route("/events", get(agents::all_events))
            .route("/files", post(files::create))
            .route("/files/{id}", delete(files::delete))
            .route("/memory", get(memory::get).delete(memory::delete_all))
            .route("/memory/{id}", delete(memory::delete_one))
            .route("/sessions", get(sessions::list))
            .route(
                "/sessions/{id}",
                get(sessions::get).delete(sessions::delete),
            )
            .route("/sessions/{id}/messages", get(sessions::messages))
            .route("/sessions/{id}/resume", post(sessions::resume))
            .route("/sessions/{id}/fork", post(sessions::fork))
            .route("/sessions/{id}/branches", get(sessions::branches))
            .route("/sessions/{id}/widgets", get(sessions::widgets))
            .route("/api/stream", post(proxy::stream))
            .route("/v1/models", get(protocols::openai::models))
            .route(
                "/v1/chat/completions",
                post(protocols::chat::chat_completions),
            )
            .route("/v1/responses", post(protocols::responses::responses))
            .route("/ai-sdk/{definition}", post(protocols::ui_stream::chat))
            .route("/ag-ui/{definition}", post(protocols::ag_ui::run))
            .route("/metrics", get(metrics::render))
            .route("/admin/drain", post(reach::drain))
            .nest("/mcp", mcp::router(&self.shared))
            .route_layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                shutdown::refuse_new_work,
            ))
            .route_layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                metrics::count,
            ))
            .route_layer(axum::middleware::from_fn(trace::span))
            .fallback(error::no_route)
            .method_not_allowed_fallback(error::method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                origin::guard,
            ))
            .layer(DefaultBodyLimit::max(self.shared.config.max_body_bytes))
            .with_state(self.shared.clone())
    }

    /// Serves on `listener` until `shutdown` completes. Then it refuses new work
    /// (503), gives runs in flight [`ServerConfig::finish_runs`] to end, stops
    /// accepting, ends the event streams once they have sent the events published
    /// by then, lets other requests in flight finish,
    /// and shuts the supervisor down (aborting what still runs and flushing the
    /// store).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let router = self.router();
        let shared = self.shared.clone();
        let pruning = self
            .shared
            .config
            .retain_closed
            .map(|retain| tokio::spawn(sessions::prune_every_hour(shared.clone(), retain)));
        connections::serve(
            listener,
            router,
            &self.shared.supervisor,
            &self.shared.config,
            &self.shared.metrics,
            async move {
                shutdown.await;
                shared.drain().await;
            },
        )
        .await;
        if let Some(pruning) = pruning {
            pruning.abort();
        }
        self.shared.agents.leave().await;
        self.shared.supervisor.shutdown().await;
        Ok(())
    }
}
