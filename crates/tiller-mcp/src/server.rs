//! [`McpToolServer`]: agent tools offered to MCP hosts (an editor, a desktop
//! assistant, another agent runtime). Each tool is listed with its name,
//! description and argument schema; a call runs it, its updates going back as
//! progress notifications when the host asked for them, and a host's cancellation
//! cancelling it. Text and images come back as content, details as structured
//! content, a tool's error as an error result. It may offer prompts too
//! ([`McpToolServer::with_prompts`]). `tiller mcp` serves agent definitions this
//! way, each a tool that runs the agent and a prompt holding its instructions.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, ListPromptsResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, Prompt, PromptMessage, ResourceContents,
    Role, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use tiller_ai::Content;
use tiller_core::{AgentContext, AgentTool, ToolContext, ToolOutput};
use tokio_util::sync::CancellationToken;

/// Who a call over HTTP works for, from its request's head.
type ContextFrom = Arc<dyn Fn(&http::request::Parts) -> AgentContext + Send + Sync>;

/// A prompt an [`McpToolServer`] offers: a name, what it is for, and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedPrompt {
    /// Its name.
    pub name: String,
    /// What it is for.
    pub description: Option<String>,
    /// What `prompts/get` answers, as one user message.
    pub text: String,
}

/// Agent tools, served over MCP.
#[derive(Clone)]
pub struct McpToolServer {
    tools: Arc<BTreeMap<String, Arc<dyn AgentTool>>>,
    prompts: Arc<BTreeMap<String, ServedPrompt>>,
    name: String,
    instructions: Option<String>,
    context_from: Option<ContextFrom>,
}

/// [`McpToolServer`] as a streamable HTTP endpoint: a tower service to mount in
/// a router (`tiller serve` mounts it at `/mcp`).
pub type McpHttpService = StreamableHttpService<McpToolServer, LocalSessionManager>;

/// The bounds of [`McpToolServer::http_service`].
#[derive(Debug, Clone)]
pub struct McpHttpConfig {
    /// The `Host` names (or `host:port`) requests may carry: loopback by default,
    /// against DNS rebinding; empty accepts any.
    pub allowed_hosts: Vec<String>,
    /// The largest request body.
    pub max_body_bytes: usize,
    /// How long a session may go without a request before it ends (5 minutes by
    /// default).
    pub idle_timeout: Duration,
    /// Cancelled to end every session (at shutdown).
    pub stop: CancellationToken,
}

/// The live sessions of an [`McpHttpService`].
#[derive(Clone)]
pub struct McpSessions(Arc<LocalSessionManager>);

impl McpSessions {
    /// The ids of the live sessions.
    pub async fn ids(&self) -> HashSet<Arc<str>> {
        self.0.sessions.read().await.keys().cloned().collect()
    }
}

impl Default for McpHttpConfig {
    fn default() -> Self {
        McpHttpConfig {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            max_body_bytes: 1 << 20,
            idle_timeout: Duration::from_secs(300),
            stop: CancellationToken::new(),
        }
    }
}

impl McpToolServer {
    /// A server named `name` (as hosts see it) offering `tools`.
    pub fn new(
        name: impl Into<String>,
        tools: impl IntoIterator<Item = Arc<dyn AgentTool>>,
    ) -> Self {
        McpToolServer {
            tools: Arc::new(
                tools
                    .into_iter()
                    .map(|tool| (tool.name().to_owned(), tool))
                    .collect(),
            ),
            prompts: Arc::default(),
            name: name.into(),
            instructions: None,
            context_from: None,
        }
    }

    /// The same server offering `prompts` too (by name; the last of a name wins).
    pub fn with_prompts(mut self, prompts: impl IntoIterator<Item = ServedPrompt>) -> Self {
        self.prompts = Arc::new(
            prompts
                .into_iter()
                .map(|prompt| (prompt.name.clone(), prompt))
                .collect(),
        );
        self
    }

    /// The same server making each HTTP call's tools work for the context
    /// `context_from` reads from its request's head (its bearer token, say).
    pub fn with_context_from(
        mut self,
        context_from: impl Fn(&http::request::Parts) -> AgentContext + Send + Sync + 'static,
    ) -> Self {
        self.context_from = Some(Arc::new(context_from));
        self
    }

    /// This server as a streamable HTTP endpoint, one session per host, and its
    /// live sessions.
    pub fn http_service(self, config: McpHttpConfig) -> (McpHttpService, McpSessions) {
        let mut http = StreamableHttpServerConfig::default()
            .with_allowed_hosts(config.allowed_hosts)
            .with_cancellation_token(config.stop);
        http.max_request_body_bytes = config.max_body_bytes;
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(config.idle_timeout);
        let sessions = Arc::new(sessions);
        let service = StreamableHttpService::new(move || Ok(self.clone()), sessions.clone(), http);
        (service, McpSessions(sessions))
    }

    /// The same server telling hosts how to use it.
    pub fn with_instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// Serves one host over this process's stdin and stdout until it disconnects.
    pub async fn serve_stdio(self) -> Result<(), String> {
        let running: RunningService<RoleServer, McpToolServer> = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|error| error.to_string())?;
        running
            .waiting()
            .await
            .map(|_| ())
            .map_err(|error| error.to_string())
    }
}

impl ServerHandler for McpToolServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = if self.prompts.is_empty() {
            ServerCapabilities::builder().enable_tools().build()
        } else {
            ServerCapabilities::builder()
                .enable_prompts()
                .enable_tools()
                .build()
        };
        let config = ServerConfig::new(capabilities).with_server_info(Implementation::new(
            self.name.clone(),
            env!("CARGO_PKG_VERSION"),
        ));
        match &self.instructions {
            Some(instructions) => config.with_instructions(instructions.clone()),
            None => config,
        }
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.tools
                .values()
                .map(|tool| listed(tool.as_ref()))
                .collect(),
        ))
    }

    async fn list_prompts(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(
            self.prompts
                .values()
                .map(|prompt| Prompt::new(&prompt.name, prompt.description.as_deref(), None))
                .collect(),
        ))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let Some(prompt) = self.prompts.get(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("there is no prompt `{}`", request.name),
                None,
            ));
        };
        let mut result = GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            prompt.text.clone(),
        )]);
        if let Some(description) = &prompt.description {
            result = result.with_description(description.clone());
        }
        Ok(GetPromptResponse::Complete(result))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = self.tools.get(&*request.name) else {
            return Err(ErrorData::invalid_params(
                format!("there is no tool `{}`", request.name),
                None,
            ));
        };
        // Progress goes out in order, from one task, while the host asked for it.
        let (updates, mut pending) = tokio::sync::mpsc::unbounded_channel::<ToolOutput>();
        let mut forwarding = None;
        if let Some(token) = context.meta.get_progress_token() {
            let peer = context.peer.clone();
            forwarding = Some(tokio::spawn(async move {
                let mut step = 0u64;
                while let Some(update) = pending.recv().await {
                    step += 1;
                    let notification = ProgressNotificationParam::new(token.clone(), step as f64)
                        .with_message(update.text_content());
                    if peer.notify_progress(notification).await.is_err() {
                        // A host that went away needs no progress.
                        return;
                    }
                }
            }));
        }
        let ctx =
            ToolContext::detached(context.id.to_string(), context.ct.clone(), move |update| {
                // Err once no one forwards progress: it is dropped.
                let _ = updates.send(update);
            });
        let ctx = match (
            &self.context_from,
            context.extensions.get::<http::request::Parts>(),
        ) {
            (Some(context_from), Some(parts)) => ctx.with_agent(context_from(parts)),
            _ => ctx,
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        let result = match tool.execute(args, ctx).await {
            Ok(output) => result_of(output),
            Err(error) => CallToolResult::error(vec![ContentBlock::text(error.message())]),
        };
        // The progress already reported goes out before the result (the tool's
        // context is gone, so the forwarding ends once it is sent), waited for
        // at most `PROGRESS_DRAIN`.
        if let Some(forwarding) = forwarding {
            let _ = tokio::time::timeout(PROGRESS_DRAIN, forwarding).await;
        }
        Ok(CallToolResponse::Complete(result))
    }
}

/// The longest a result waits for the progress reported before it to go out.
const PROGRESS_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// A tool as MCP lists it.
fn listed(tool: &dyn AgentTool) -> Tool {
    let schema = match tool.parameters() {
        Value::Object(schema) => schema.clone(),
        _ => serde_json::Map::new(),
    };
    Tool::new(
        tool.name().to_owned(),
        tool.description().to_owned(),
        Arc::new(schema),
    )
}

/// A tool's output as MCP's result: text, images and audio as content, other files
/// as embedded resources (`attachment:NAME`), details as structured content.
fn result_of(output: ToolOutput) -> CallToolResult {
    let content = output
        .content
        .into_iter()
        .map(|content| match content {
            Content::Text(text) => ContentBlock::text(text.text),
            Content::Image(image) => ContentBlock::image(image.data, image.mime_type),
            Content::File(file) if file.is_audio() => {
                ContentBlock::audio(file.data, file.mime_type)
            }
            Content::File(file) => ContentBlock::resource(
                ResourceContents::blob(file.data, format!("attachment:{}", file.name))
                    .with_mime_type(file.mime_type),
            ),
        })
        .collect();
    let mut result = CallToolResult::success(content);
    if !output.details.is_null() {
        result.structured_content = Some(output.details);
    }
    result
}
