//! [`McpClient`]: a connection to one MCP server, kept up. It starts the server
//! (or reaches its URL), lists its tools, and hands them out as agent tools. When
//! the server says its tools changed, the list is read again; when the server goes
//! away, the client reconnects with a growing delay, and the tools answer a clear
//! error meanwhile.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use rmcp::model::{NumberOrString, ProgressNotificationParam, ProgressToken};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use tiller_core::{AgentTool, ToolContext, ToolError, ToolOutput};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::catalog::{Catalog, READ_RESOURCE, read_catalog};
use crate::config::McpServer;
use crate::error::McpError;
use crate::tool::McpTool;

type Service = RunningService<RoleClient, Handler>;
type Update = Box<dyn Fn(ToolOutput) + Send + Sync>;

/// A connection to an MCP server, kept up until it and every tool it handed out
/// are dropped (or [`McpClient::close`]). Cheap to clone; clones share the
/// connection.
#[derive(Clone)]
pub struct McpClient {
    shared: Arc<Shared>,
    _closer: Arc<Closer>,
}

/// Closes the connection when the last [`McpClient`] clone goes.
struct Closer(CancellationToken);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A tool as the server listed it.
#[derive(Debug, Clone)]
struct Listed {
    remote: Arc<str>,
    description: String,
    parameters: serde_json::Value,
}

/// What the client and its tools share.
pub(crate) struct Shared {
    config: McpServer,
    /// The live connection's peer, or why there is none.
    peer: RwLock<Result<Peer<RoleClient>, String>>,
    /// The server's tools that the filters keep.
    tools: RwLock<Arc<[Listed]>>,
    /// Its resources and prompts.
    catalog: RwLock<Arc<Catalog>>,
    /// Bumped each time the tool list is read again or the connection changes.
    changes: watch::Sender<u64>,
    /// Where each call's progress notifications go, by token.
    progress: Mutex<HashMap<String, Update>>,
    /// The command's process id (0 for HTTP, or before it starts).
    process_id: AtomicU32,
    closed: CancellationToken,
}

impl McpClient {
    /// Connects to `server` and lists its tools; fails when that cannot be done
    /// within its `connect_timeout`. Once connected, it stays connected: a server
    /// that goes away is reconnected to in the background.
    pub async fn connect(server: McpServer) -> Result<McpClient, McpError> {
        let closed = CancellationToken::new();
        let shared = Arc::new(Shared {
            config: server,
            peer: RwLock::new(Err("not connected yet".to_owned())),
            tools: RwLock::new(Arc::from(Vec::new())),
            catalog: RwLock::new(Arc::default()),
            changes: watch::Sender::new(0),
            progress: Mutex::new(HashMap::new()),
            process_id: AtomicU32::new(0),
            closed: closed.clone(),
        });
        let service = shared.start().await?;
        tokio::spawn(keep_up(Arc::downgrade(&shared), service));
        Ok(McpClient {
            shared,
            _closer: Arc::new(Closer(closed)),
        })
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        self.shared.name()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Its tools as agent tools, named for the model (`{prefix}{tool}`), as last
    /// listed, and `{prefix}read_resource` when it offers resources (see
    /// [`crate::catalog`]). A tool the server stops offering answers an error.
    pub fn tools(&self) -> Vec<Arc<dyn AgentTool>> {
        let listed = self.shared.listed();
        let mut tools: Vec<Arc<dyn AgentTool>> = listed
            .iter()
            .map(|tool| {
                Arc::new(McpTool {
                    client: self.clone(),
                    remote: tool.remote.clone(),
                    name: self.shared.config.tool_name(&tool.remote),
                    description: tool.description.clone(),
                    parameters: tool.parameters.clone(),
                }) as Arc<dyn AgentTool>
            })
            .collect();
        // A tool of the server's own by that name wins.
        if !listed.iter().any(|tool| &*tool.remote == READ_RESOURCE)
            && let Some(reader) = self.resource_tool()
        {
            tools.push(Arc::new(reader));
        }
        tools
    }

    /// The process id of the server's command, while one runs (`None` for HTTP).
    pub fn process_id(&self) -> Option<u32> {
        Some(self.shared.process_id.load(Ordering::Relaxed)).filter(|&id| id != 0)
    }

    /// Whether it is connected now.
    pub fn is_connected(&self) -> bool {
        read(&self.shared.peer).is_ok()
    }

    /// Resolves at the next change after this call: the tool list read again, the
    /// connection lost or made again.
    pub fn changed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut changes = self.shared.changes.subscribe();
        async move {
            // Err only once the client is gone.
            let _ = changes.changed().await;
        }
    }

    /// Closes the connection (a command's process is ended).
    pub fn close(&self) {
        self.shared.closed.cancel();
    }
}

impl Shared {
    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    fn listed(&self) -> Arc<[Listed]> {
        read(&self.tools).clone()
    }

    /// Its resources and prompts, as last listed.
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        read(&self.catalog).clone()
    }

    /// How it was configured.
    pub(crate) fn config(&self) -> &McpServer {
        &self.config
    }

    /// The live connection, or why there is none.
    pub(crate) fn peer(&self) -> Result<Peer<RoleClient>, String> {
        read(&self.peer).clone().map_err(|why| {
            format!(
                "the MCP server `{}` is not connected ({why}); Tiller is reconnecting to it",
                self.name()
            )
        })
    }

    /// How long one tool call may take.
    pub(crate) fn call_timeout(&self) -> std::time::Duration {
        self.config.call_timeout
    }

    /// The live connection, for a call of the tool `remote`; the reason it cannot
    /// be made when the server is away or no longer offers the tool.
    pub(crate) fn peer_for(&self, remote: &str) -> Result<Peer<RoleClient>, ToolError> {
        let peer = self.peer().map_err(ToolError::new)?;
        if !self.listed().iter().any(|tool| &*tool.remote == remote) {
            return Err(ToolError::new(format!(
                "the MCP server `{}` no longer offers the tool `{remote}`",
                self.name()
            )));
        }
        Ok(peer)
    }

    /// Routes the progress notifications for `token` to `ctx`'s updates until the
    /// returned guard is dropped.
    pub(crate) fn track_progress(
        self: &Arc<Self>,
        token: &ProgressToken,
        ctx: &ToolContext,
    ) -> Progress {
        let token = token_key(token);
        let ctx = ctx.clone();
        lock(&self.progress).insert(token.clone(), Box::new(move |update| ctx.update(update)));
        Progress {
            shared: self.clone(),
            token,
        }
    }

    /// Starts the server (or reaches its URL), shakes hands and lists its tools,
    /// within the connect timeout; the connection is then the live one.
    async fn start(self: &Arc<Self>) -> Result<Service, McpError> {
        let config = &self.config;
        let timeout = config.connect_timeout;
        let connecting = async {
            let handler = Handler {
                shared: Arc::downgrade(self),
            };
            let service = match (&config.url, config.command.split_first()) {
                (Some(url), None) => {
                    let mut transport = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                    if let Some(token) = config.bearer() {
                        transport = transport.auth_header(token);
                    }
                    transport = transport.custom_headers(headers(config)?);
                    handler
                        .serve(StreamableHttpClientTransport::from_config(transport))
                        .await
                }
                (None, Some((program, args))) => {
                    let mut command = tokio::process::Command::new(program);
                    command.args(args);
                    tiller_core::process::clean_env(
                        &mut command,
                        config.pass_env.iter().map(String::as_str),
                    );
                    command.envs(&config.env);
                    tiller_core::process::contain(&mut command);
                    if let Some(cwd) = &config.cwd {
                        command.current_dir(cwd);
                    }
                    let (transport, stderr) = TokioChildProcess::builder(command)
                        .stderr(Stdio::piped())
                        .spawn()
                        .map_err(|error| McpError::Spawn {
                            server: config.name.clone(),
                            program: program.clone(),
                            detail: error.to_string(),
                        })?;
                    self.process_id
                        .store(transport.id().unwrap_or(0), Ordering::Relaxed);
                    let logging =
                        stderr.map(|stderr| tokio::spawn(log_stderr(config.name.clone(), stderr)));
                    match handler.serve(transport).await {
                        Ok(service) => Ok(service),
                        // A server that ended before it answered says why on
                        // its stderr: the last lines go with the error.
                        Err(error) => {
                            let said = match logging {
                                Some(logging) => tokio::time::timeout(STDERR_WAIT, logging)
                                    .await
                                    .ok()
                                    .and_then(Result::ok)
                                    .unwrap_or_default(),
                                None => String::new(),
                            };
                            return Err(self.connect_error(if said.is_empty() {
                                format!("{error} (it wrote nothing to stderr)")
                            } else {
                                format!("{error}; the end of its stderr:\n{said}")
                            }));
                        }
                    }
                }
                _ => {
                    return Err(McpError::Config {
                        server: config.name.clone(),
                        detail: config.check().err().unwrap_or_default(),
                    });
                }
            }
            .map_err(|error| self.connect_error(error))?;
            let listed = self.list(service.peer()).await?;
            let catalog = read_catalog(service.peer(), config).await;
            Ok((service, (listed, catalog)))
        };
        let (service, (listed, catalog)) = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| McpError::Timeout {
                server: config.name.clone(),
                after: timeout,
            })??;
        *write(&self.tools) = listed;
        *write(&self.catalog) = Arc::new(catalog);
        *write(&self.peer) = Ok(service.peer().clone());
        self.changes.send_modify(|changes| *changes += 1);
        Ok(service)
    }

    /// The server's tools the filters keep.
    async fn list(&self, peer: &Peer<RoleClient>) -> Result<Arc<[Listed]>, McpError> {
        let tools = peer
            .list_all_tools()
            .await
            .map_err(|error| self.connect_error(format!("listing its tools failed: {error}")))?;
        let filter = self.config.filter();
        let mut names = std::collections::HashSet::new();
        let mut listed = Vec::with_capacity(tools.len());
        for tool in tools {
            if !filter.keeps(&tool.name) {
                continue;
            }
            let name = self.config.tool_name(&tool.name);
            if !names.insert(name.clone()) {
                return Err(McpError::DuplicateTool {
                    server: self.config.name.clone(),
                    name,
                });
            }
            listed.push(Listed {
                remote: Arc::from(&*tool.name),
                description: tool.description.as_deref().unwrap_or_default().to_owned(),
                parameters: serde_json::Value::Object((*tool.input_schema).clone()),
            });
        }
        Ok(Arc::from(listed))
    }

    /// Reads the tool list again (the server said it changed).
    async fn refresh(&self) {
        let Ok(peer) = read(&self.peer).clone() else {
            return;
        };
        let catalog = read_catalog(&peer, &self.config).await;
        *write(&self.catalog) = Arc::new(catalog);
        match self.list(&peer).await {
            Ok(listed) => {
                *write(&self.tools) = listed;
                self.changes.send_modify(|changes| *changes += 1);
            }
            Err(error) => tracing::warn!(%error, "could not read an MCP server's tools again"),
        }
    }

    fn connect_error(&self, error: impl std::fmt::Display) -> McpError {
        McpError::Connect {
            server: self.config.name.clone(),
            detail: error.to_string(),
        }
    }

    fn lost(&self, why: String) {
        *write(&self.peer) = Err(why);
        self.changes.send_modify(|changes| *changes += 1);
    }
}

/// A call's progress routing; dropping it stops it.
pub(crate) struct Progress {
    shared: Arc<Shared>,
    token: String,
}

/// A progress token as a map key.
fn token_key(token: &ProgressToken) -> String {
    match &token.0 {
        NumberOrString::String(token) => token.to_string(),
        NumberOrString::Number(number) => number.to_string(),
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        lock(&self.shared.progress).remove(&self.token);
    }
}

/// Keeps the connection up: when the server goes away, reconnects with a delay
/// that doubles up to the configured bound; ends when the client is closed or gone.
async fn keep_up(shared: Weak<Shared>, mut service: Service) {
    loop {
        let Some(closed) = shared.upgrade().map(|shared| shared.closed.clone()) else {
            let _ = service.cancel().await;
            return;
        };
        let stop = service.cancellation_token();
        let waiting = service.waiting();
        tokio::pin!(waiting);
        let ended = tokio::select! {
            () = closed.cancelled() => {
                stop.cancel();
                let _ = waiting.await;
                return;
            }
            ended = &mut waiting => ended,
        };
        let Some(current) = shared.upgrade() else {
            return;
        };
        let why = match ended {
            Ok(reason) => format!("the connection ended: {reason:?}"),
            Err(error) => format!("the connection failed: {error}"),
        };
        tracing::warn!(server = current.name(), %why, "an MCP server went away; reconnecting");
        current.lost(why);
        let mut delay = current.config.reconnect_delay;
        drop(current);
        service = loop {
            tokio::select! {
                () = closed.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            let Some(current) = shared.upgrade() else {
                return;
            };
            match current.start().await {
                Ok(service) => {
                    tracing::info!(server = current.name(), "reconnected to an MCP server");
                    break service;
                }
                Err(error) => {
                    current.lost(error.to_string());
                    delay = (delay * 2).min(current.config.max_reconnect_delay);
                }
            }
        };
    }
}

/// The server's notifications: progress of calls, and tool list changes.
struct Handler {
    shared: Weak<Shared>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let token = token_key(&params.progress_token);
        let text = match (&params.message, params.total) {
            (Some(message), _) => message.clone(),
            (None, Some(total)) => format!("{} of {total}", params.progress),
            (None, None) => params.progress.to_string(),
        };
        if let Some(update) = lock(&shared.progress).get(&token) {
            update(ToolOutput::text(text).with_details(serde_json::json!({
                "progress": params.progress,
                "total": params.total,
            })));
        }
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        if let Some(shared) = self.shared.upgrade() {
            // Not in this handler: the listing is a request on the same connection.
            tokio::spawn(async move { shared.refresh().await });
        }
    }
}

/// The most bytes of one line of a server's stderr that are logged; the rest of
/// the line is read and dropped.
const MAX_STDERR_LINE: usize = 8 * 1024;

/// A command's stderr, line by line (each cut to [`MAX_STDERR_LINE`] bytes), as
/// debug logs; read to its end whatever it holds, so the server never blocks on
/// a full pipe.
async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) -> String {
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::with_capacity(256);
    let mut dropped = 0usize;
    let mut last = std::collections::VecDeque::with_capacity(STDERR_TAIL_LINES);
    loop {
        let buffer = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(buffer) => buffer,
        };
        let end = memchr::memchr(b'\n', buffer);
        let part = &buffer[..end.unwrap_or(buffer.len())];
        let room = MAX_STDERR_LINE.saturating_sub(line.len());
        line.extend_from_slice(&part[..part.len().min(room)]);
        dropped += part.len().saturating_sub(room);
        let used = end.map_or(buffer.len(), |end| end + 1);
        reader.consume(used);
        if end.is_some() {
            log_line(&server, &line, dropped, &mut last);
            line.clear();
            dropped = 0;
        }
    }
    if !line.is_empty() {
        log_line(&server, &line, dropped, &mut last);
    }
    Vec::from(last).join("\n")
}

/// The lines of a server's stderr kept for an error when it fails to connect.
const STDERR_TAIL_LINES: usize = 5;

/// How long a server that failed to connect is given to finish its stderr.
const STDERR_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

fn log_line(
    server: &str,
    line: &[u8],
    dropped: usize,
    last: &mut std::collections::VecDeque<String>,
) {
    let line = String::from_utf8_lossy(line);
    if dropped > 0 {
        tracing::debug!(server = %server, dropped, "{line} [… {dropped} more bytes dropped]");
    } else {
        tracing::debug!(server = %server, "{line}");
    }
    if last.len() == STDERR_TAIL_LINES {
        last.pop_front();
    }
    last.push_back(line.into_owned());
}

/// The configured headers, as HTTP's types.
fn headers(config: &McpServer) -> Result<HashMap<http::HeaderName, http::HeaderValue>, McpError> {
    config
        .headers
        .iter()
        .map(|(name, value)| {
            let invalid = |what: &str| McpError::Config {
                server: config.name.clone(),
                detail: format!("the header `{name}` has an invalid {what}"),
            };
            Ok((
                http::HeaderName::try_from(name.as_str()).map_err(|_| invalid("name"))?,
                http::HeaderValue::try_from(value.as_str()).map_err(|_| invalid("value"))?,
            ))
        })
        .collect()
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

fn lock<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(PoisonError::into_inner)
}
