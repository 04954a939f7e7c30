//! What can go wrong reaching an MCP server.

use std::time::Duration;

/// A server could not be connected to, or would not list its tools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The configuration names neither a command nor a URL, or both.
    #[error("MCP server `{server}`: {detail}")]
    Config {
        /// The server's name.
        server: String,
        /// What is wrong.
        detail: String,
    },
    /// Its command could not be started.
    #[error("MCP server `{server}`: cannot run `{program}`: {detail}")]
    Spawn {
        /// The server's name.
        server: String,
        /// The program.
        program: String,
        /// Why not.
        detail: String,
    },
    /// The handshake failed or the connection broke.
    #[error("MCP server `{server}`: {detail}")]
    Connect {
        /// The server's name.
        server: String,
        /// Why.
        detail: String,
    },
    /// Connecting took longer than the server's `connect_timeout`.
    #[error("MCP server `{server}` did not connect within {after:?}")]
    Timeout {
        /// The server's name.
        server: String,
        /// The bound.
        after: Duration,
    },
    /// A prompt could not be had: the server offers none by that name, or
    /// getting it failed.
    #[error("MCP server `{server}`: prompt `{name}`: {detail}")]
    Prompt {
        /// The server's name.
        server: String,
        /// The prompt.
        name: String,
        /// Why not.
        detail: String,
    },
    /// Two of its tools would have the same name.
    #[error("MCP server `{server}` offers two tools named `{name}`")]
    DuplicateTool {
        /// The server's name.
        server: String,
        /// The name, as the model would see it.
        name: String,
    },
}
