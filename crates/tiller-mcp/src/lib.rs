//! Tiller and the Model Context Protocol.
//!
//! [`McpClient`] connects to an MCP server — a command line spoken to over stdio,
//! or a streamable HTTP endpoint — and hands out its tools as agent tools, named
//! `{prefix}{tool}` for the model and narrowed by include and exclude lists. It keeps
//! the connection up: a tool list the server says changed is read again, a server
//! that goes away is reconnected to with a growing delay (its tools answer a clear
//! error meanwhile), a call's progress notifications become
//! `tool_execution_update` events, and an aborted run cancels its calls on the
//! server. Text, images and resources in results become the tool's output; a result
//! marked as an error is the tool's error.
//!
//! [`McpToolServer`] goes the other way: it offers agent tools to MCP hosts over
//! stdio, as `tiller mcp` offers agent definitions, each a tool that runs the agent.
//!
//! ```no_run
//! use tiller_mcp::{McpClient, McpServer};
//!
//! # async fn demo() -> Result<(), tiller_mcp::McpError> {
//! let files = McpClient::connect(
//!     McpServer::stdio("fs", "mcp-server-filesystem", ["/srv/docs"]).excluding(["write_*"]),
//! )
//! .await?;
//! for tool in files.tools() {
//!     println!("{}", tool.name()); // fs_read_text_file, fs_list_directory, …
//! }
//! # Ok(())
//! # }
//! ```

pub mod catalog;
mod client;
mod config;
mod error;
mod server;
mod tool;

pub use catalog::{McpPrompt, McpResource, READ_RESOURCE, ReadResourceTool};
pub use client::McpClient;
pub use config::McpServer;
pub use error::McpError;
pub use server::{McpHttpConfig, McpHttpService, McpSessions, McpToolServer, ServedPrompt};
pub use tool::McpTool;
