//! The `tiller` command: run and chat with agents from a terminal or a script.
//!
//! ```text
//! tiller run "Why is the sky blue?"                        # one run, the answer streamed
//! tiller run --agent helper.yaml --events jsonl "2 + 3?"   # an agent file; events as JSON lines
//! tiller chat --base-url http://127.0.0.1:8080/v1           # talk to a local llama.cpp server
//! tiller chat --session notes                               # a conversation kept across invocations
//! tiller sessions list                                      # the kept conversations
//! tiller eval examples/evals/quick.yaml                     # an evaluation suite, its table
//! tiller serve --agents examples/agents                     # agents over HTTP
//! tiller mcp --agents examples/agents                       # agents as MCP tools, over stdio
//! ```
//!
//! This library holds what the binary is made of, so the pieces can be used and
//! tested on their own ([`tiller::agents::agent_file`] reads the agents declared in YAML or
//! JSON, [`tiller::agents::CommandTool`] makes a program a tool): [`setup`] chooses the model from options,
//! environment and file, [`render`] writes events as text or JSON lines, and
//! [`run`] and [`chat`] run agents, [`sessions`] lists and removes the conversations
//! a store keeps, [`eval`] runs evaluation suites ([`tiller::eval`]), [`serve`] serves agents over HTTP ([`tiller_server`]), [`mcp`] offers
//! them to MCP hosts ([`tiller::mcp::McpToolServer`]).
//!
//! Two parts are features, off by default so that a first build is quick:
//! `cluster` (`tiller serve --cluster`, [`cluster`]) and `otlp` (spans exported
//! over OTLP, [`telemetry`]). `cargo install --path crates/tiller-cli --features
//! cluster,otlp` builds both.

/// Writes a line to stderr, like `eprintln!`, but never panics: a closed or broken
/// stderr loses the line, not the run.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Writes to stderr without a newline, like `eprint!`, but never panics.
#[macro_export]
macro_rules! say_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stderr = std::io::stderr();
        let _ = write!(stderr, $($arg)*);
        let _ = stderr.flush();
    }};
}

pub mod chat;
pub mod cli;
pub mod cluster;
pub mod eval;
pub mod interrupt;
pub mod mcp;
pub mod outcome;
pub mod render;
pub mod run;
pub mod serve;
pub mod session;
pub mod sessions;
pub mod setup;
pub mod telemetry;
