//! [`McpServer`]: which MCP server to use, how to reach it (a command line over
//! stdio, or a URL over streamable HTTP), the prefix and filters its tools take,
//! and the bounds of the connection. Deserializable, as agent files declare it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tiller_core::ToolFilter;

/// An MCP server whose tools agents use.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// Its name: in errors and logs, and the default prefix of its tools.
    pub name: String,
    /// A command line that runs the server over stdio (`[program, args…]`).
    #[serde(default)]
    pub command: Vec<String>,
    /// Variables set for the command. The command starts with a clean
    /// environment, as command tools do: `PATH`, `HOME` and `LANG`, the variables
    /// [`McpServer::pass_env`] names, and these.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables of Tiller's environment passed on to the command, by name.
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// The folder the command runs in (the caller's when `None`).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The server's streamable HTTP endpoint, instead of a command.
    #[serde(default)]
    pub url: Option<String>,
    /// Headers sent with every HTTP request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The variable holding the bearer token for HTTP (never the token itself).
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// Put before each tool's name, as the model sees it; `{name}_` when `None`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// The only tools of its to use, by the server's own names or `prefix*`
    /// (all when empty).
    #[serde(default)]
    pub include_tools: Vec<String>,
    /// Tools of its not to use, by the server's own names or `prefix*`.
    #[serde(default)]
    pub exclude_tools: Vec<String>,
    /// Resources (by name or URI) and prompts (by name) of its not to offer, as
    /// names or `prefix*`: they are not listed, such a prompt is refused as
    /// unknown, and `read_resource` refuses their URIs.
    #[serde(default)]
    pub exclude_components: Vec<String>,
    /// How long connecting (start-up and handshake) may take.
    #[serde(
        default = "default_connect_timeout",
        with = "millis",
        rename = "connect_timeout_ms"
    )]
    pub connect_timeout: Duration,
    /// The first wait before reconnecting to a server that went away; it doubles
    /// up to [`McpServer::max_reconnect_delay`].
    #[serde(
        default = "default_reconnect_delay",
        with = "millis",
        rename = "reconnect_delay_ms"
    )]
    pub reconnect_delay: Duration,
    /// How long one tool call may take before it is cancelled and fails.
    #[serde(
        default = "default_call_timeout",
        with = "millis",
        rename = "call_timeout_ms"
    )]
    pub call_timeout: Duration,
    /// The longest wait between two attempts to reconnect.
    #[serde(
        default = "default_max_reconnect_delay",
        with = "millis",
        rename = "max_reconnect_delay_ms"
    )]
    pub max_reconnect_delay: Duration,
    #[serde(skip)]
    pub(crate) bearer_token: Option<String>,
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_reconnect_delay() -> Duration {
    Duration::from_millis(250)
}

fn default_max_reconnect_delay() -> Duration {
    Duration::from_secs(30)
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

impl McpServer {
    fn new(name: impl Into<String>) -> Self {
        McpServer {
            name: name.into(),
            command: Vec::new(),
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            cwd: None,
            url: None,
            headers: BTreeMap::new(),
            bearer_token_env: None,
            prefix: None,
            include_tools: Vec::new(),
            exclude_tools: Vec::new(),
            exclude_components: Vec::new(),
            connect_timeout: default_connect_timeout(),
            call_timeout: default_call_timeout(),
            reconnect_delay: default_reconnect_delay(),
            max_reconnect_delay: default_max_reconnect_delay(),
            bearer_token: None,
        }
    }

    /// A server run as `program` with `args`, spoken to over its stdin and stdout.
    pub fn stdio<I, S>(name: impl Into<String>, program: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut server = McpServer::new(name);
        server.command = std::iter::once(program.into())
            .chain(args.into_iter().map(Into::into))
            .collect();
        server
    }

    /// A server at a streamable HTTP endpoint.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        let mut server = McpServer::new(name);
        server.url = Some(url.into());
        server
    }

    /// The same server with `Authorization: Bearer TOKEN` on every HTTP request.
    pub fn with_bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer_token = Some(token.into());
        self
    }

    /// The same server with a header on every HTTP request.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The same server with a variable set for its command.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// The same server's command getting the variable `name` of Tiller's
    /// environment (it gets none but `PATH`, `HOME` and `LANG` otherwise).
    pub fn passing_env(mut self, name: impl Into<String>) -> Self {
        self.pass_env.push(name.into());
        self
    }

    /// The same server with another bound on one tool call.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The same server with its tools named `{prefix}{tool}` for the model.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// The same server keeping only these of its tools (names or `prefix*`).
    pub fn including<I: IntoIterator<Item = S>, S: Into<String>>(mut self, tools: I) -> Self {
        self.include_tools = tools.into_iter().map(Into::into).collect();
        self
    }

    /// The same server dropping these of its tools (names or `prefix*`).
    pub fn excluding<I: IntoIterator<Item = S>, S: Into<String>>(mut self, tools: I) -> Self {
        self.exclude_tools = tools.into_iter().map(Into::into).collect();
        self
    }

    /// The same server withholding these of its resources (names or URIs) and
    /// prompts (names), each a name or `prefix*`.
    pub fn excluding_components<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        components: I,
    ) -> Self {
        self.exclude_components = components.into_iter().map(Into::into).collect();
        self
    }

    /// Whether the resource or prompt called `name` (or at the URI `name`) is
    /// offered: [`McpServer::exclude_components`] names none of them.
    pub fn offers(&self, name: &str) -> bool {
        !self
            .exclude_components
            .iter()
            .any(|pattern| ToolFilter::matches(pattern, name))
    }

    /// The same server with another bound on connecting.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The same server reconnecting after `first`, doubling up to `max`.
    pub fn with_reconnect_delays(mut self, first: Duration, max: Duration) -> Self {
        self.reconnect_delay = first;
        self.max_reconnect_delay = max;
        self
    }

    /// Which of its tools it keeps.
    pub fn filter(&self) -> ToolFilter {
        ToolFilter {
            include: self.include_tools.clone(),
            exclude: self.exclude_tools.clone(),
        }
    }

    /// The name the model sees for the server's tool `tool`.
    pub fn tool_name(&self, tool: &str) -> String {
        match &self.prefix {
            Some(prefix) => format!("{prefix}{tool}"),
            None => format!("{}_{tool}", self.name),
        }
    }

    /// What is wrong with it, if anything: it needs a name, and a command or a
    /// URL (not both).
    pub fn check(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("`name` must not be empty".to_owned());
        }
        match (self.command.is_empty(), &self.url) {
            (false, None) | (true, Some(_)) => Ok(()),
            _ => Err(
                "give either `command` (a command line) or `url` (a streamable HTTP endpoint)"
                    .to_owned(),
            ),
        }
    }

    /// The bearer token: the one given, else the variable's.
    pub(crate) fn bearer(&self) -> Option<String> {
        self.bearer_token.clone().or_else(|| {
            self.bearer_token_env
                .as_ref()
                .and_then(|name| std::env::var(name).ok())
        })
    }
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token, nor header or variable values (they may hold secrets).
        let names = |pairs: &BTreeMap<String, String>| pairs.keys().cloned().collect::<Vec<_>>();
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("env", &names(&self.env))
            .field("pass_env", &self.pass_env)
            .field("url", &self.url)
            .field("headers", &names(&self.headers))
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "…"))
            .field("bearer_token_env", &self.bearer_token_env)
            .field("prefix", &self.prefix)
            .field("include_tools", &self.include_tools)
            .field("exclude_tools", &self.exclude_tools)
            .field("exclude_components", &self.exclude_components)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_a_token_or_a_header_value() {
        let server = McpServer::http("remote", "https://mcp.example/mcp")
            .with_bearer_token("s3cret-token")
            .with_header("x-api-key", "k3y-value");
        let shown = format!("{server:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("k3y"),
            "{shown}"
        );
        assert!(shown.contains("x-api-key"), "{shown}");
    }

    #[test]
    fn an_agent_file_entry_reads_with_its_defaults() {
        let server: McpServer = serde_json::from_value(serde_json::json!({
            "name": "fs",
            "command": ["mcp-server-filesystem", "/data"],
            "exclude_tools": ["write_*"],
            "exclude_components": ["secrets.txt", "file:///data/private/*"],
        }))
        .unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(server.tool_name("read_text_file"), "fs_read_text_file");
        assert!(!server.filter().keeps("write_file"));
        assert!(!server.offers("secrets.txt") && !server.offers("file:///data/private/a"));
        assert!(server.offers("file:///data/public/a") && server.filter().keeps("secrets.txt"));
        assert_eq!(server.connect_timeout, Duration::from_secs(30));
    }
}
