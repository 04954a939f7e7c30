//! The command line: `tiller run` and `tiller chat`, and the options they share.

use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use tiller::ai::ThinkingLevel;

/// Run agents from a terminal or a script.
///
/// With no provider configured (no --provider, --base-url or --model, no TILLER_*
/// variables, no provider's API key such as OPENAI_API_KEY, ANTHROPIC_API_KEY or
/// GEMINI_API_KEY) the agent talks to Tiller's scripted `faux` model, and says so
/// on stderr.
#[derive(Debug, Parser)]
#[command(name = "tiller", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: CliCommand,
}

/// The NATS URLs of `--cluster` (or `$TILLER_CLUSTER`), separated by commas:
/// a user's password or a token in them never shows in `Debug`.
#[derive(Clone)]
pub struct ClusterUrls(pub String);

impl std::str::FromStr for ClusterUrls {
    type Err = std::convert::Infallible;

    fn from_str(urls: &str) -> Result<Self, Self::Err> {
        Ok(ClusterUrls(urls.to_owned()))
    }
}

impl std::fmt::Debug for ClusterUrls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[cfg(feature = "cluster")]
        return f
            .debug_list()
            .entries(tiller_cluster::ClusterConfig::servers_from(&self.0))
            .finish();
        #[cfg(not(feature = "cluster"))]
        f.write_str("[…]")
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Run one prompt to the end, then exit.
    ///
    /// Exit status: 0 when the answer ended normally; 1 when the run ended in a
    /// provider or tool-loop error (said on stderr); 2 for bad usage or a bad agent
    /// file; 130 after Ctrl-C (the first aborts the run, whose events still end with
    /// agent_end; a second exits at once).
    Run {
        /// The agent and how to show it.
        #[command(flatten)]
        agent: AgentOptions,
        /// The prompt; `-` reads it from standard input.
        prompt: String,
        /// A file sent with the prompt (a PDF, text, CSV, WAV…, at most 32 MiB),
        /// its type known from its extension; repeatable.
        #[arg(long = "file", value_name = "PATH")]
        files: Vec<PathBuf>,
    },
    /// Talk with an agent, line by line.
    ///
    /// A line typed while the agent is idle is a prompt; a line typed while it works
    /// steers it. Commands: /file PATH attaches a file to the next message,
    /// /follow TEXT queues a follow-up, /abort stops the run,
    /// /reset clears the conversation, /state summarises it, /quit leaves (so does the
    /// end of input). Ctrl-C aborts the run, not the program. Reads a pipe as well as
    /// a terminal.
    Chat {
        /// The agent and how to show it.
        #[command(flatten)]
        agent: AgentOptions,
    },
    /// Serve agents over HTTP: a JSON API to create, prompt, steer, abort, reset
    /// and delete agents, and their events as server-sent events.
    ///
    /// Agents are made from the agent files in --agents (by name) or from one sent
    /// inline. A file that names no model gets the one the environment names
    /// (TILLER_PROVIDER, TILLER_MODEL, TILLER_BASE_URL, a provider's API key), else
    /// the scripted faux model. With --tokens each request needs a bearer token and
    /// each tenant sees only its own agents. POST /api/stream is pi's proxy endpoint
    /// (pi-agent-core's streamProxy), answered by the models the server knows;
    /// /mcp offers the definitions to MCP hosts over streamable HTTP.
    /// Ctrl-C (or SIGTERM) refuses new work, lets runs finish for --finish-runs
    /// seconds, then stops accepting, ends the event streams and shuts the agents
    /// down. TILLER_LOG (tracing's filter syntax, such as `info`) logs each request
    /// and the runs it starts, linked by their spans. GET /sessions lists the conversations --store keeps, which
    /// POST /sessions/{id}/resume brings back. Exit status: 0 after a clean shutdown, 1 when the address cannot
    /// be used, 2 for bad usage or bad agent files.
    Serve(ServeArgs),
    /// Offer agents to MCP hosts (an editor, a desktop assistant) over stdio: each
    /// agent definition of --agents is a tool that runs the agent on the call's
    /// `text` and answers with its final answer, its text streamed as progress.
    ///
    /// Files that name no model get the one the environment names, else the faux
    /// model. Stdout carries the protocol alone; messages go to stderr. Exit status:
    /// 0 once the host disconnects, 1 when an MCP server the files list cannot be
    /// reached, 2 for bad agent files.
    Mcp {
        /// A folder of agent files (YAML or JSON), each offered as a tool.
        #[arg(long, value_name = "DIR")]
        agents: Option<PathBuf>,
        /// Named LLM configurations the agent files may use (default: $TILLER_LLMS).
        #[arg(long, value_name = "FILE")]
        llms: Option<PathBuf>,
    },
    /// Run an evaluation suite: every case against every model it lists, and a
    /// table of how each did.
    ///
    /// The suite (YAML or JSON) names the agent under test (a file or a
    /// definition of a folder), the models,
    /// the repetitions, the concurrency, a budget and the cases with what each
    /// expects (see the README's "Evaluations"). Every run keeps its session in
    /// the store, owned by the tenant `eval-RUN`. Exit status: 0 when every run
    /// passed (with --baseline: when no case got worse than in the baseline); 1
    /// when one did not (got worse, or nothing could be compared), or the store
    /// failed; 2 for a bad suite, agent, model, run id (or one used before) or
    /// baseline.
    Eval(EvalArgs),
    /// List, show or remove the sessions a store keeps.
    Sessions {
        /// What to do with them.
        #[command(subcommand)]
        action: SessionsAction,
        /// The session store. Default: $TILLER_STORE, else an SQLite file under the
        /// user's data directory.
        #[arg(long, value_name = "URL", global = true)]
        store: Option<String>,
    },
}

/// The options of `tiller serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on (port 0 picks a free one; the address is said
    /// on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8787")]
    pub listen: String,
    /// A folder of agent files (YAML or JSON) the API makes agents from.
    #[arg(long, value_name = "DIR")]
    pub agents: Option<PathBuf>,
    /// Named LLM configurations the agent files may use (default: $TILLER_LLMS).
    #[arg(long, value_name = "FILE")]
    pub llms: Option<PathBuf>,
    /// The session store (`memory:`, `sqlite://PATH`, `postgres://…`). Default:
    /// in memory.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Bearer tokens and their tenants (`tokens: [{token, tenant, user}]`, YAML
    /// or JSON): every request then needs a token, and each tenant sees only its
    /// own agents. Without it the server is open to anyone who can reach it.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// Also accept JSON Web Tokens signed (HS256) with the secret this
    /// environment variable holds: their claims give the tenant (`tenant_id`,
    /// else `default`), the user (`user_id`, else `sub`) and the client
    /// (`client_id`); `exp` is required and `nbf` checked. Beside --tokens.
    #[arg(long, value_name = "VAR", conflicts_with = "jwt_public_key")]
    pub jwt_secret_env: Option<String>,
    /// Also accept JSON Web Tokens signed (RS256 or ES256) by the private half
    /// of this PEM public key; claims as for --jwt-secret-env.
    #[arg(long, value_name = "FILE")]
    pub jwt_public_key: Option<PathBuf>,
    /// Accept only JWTs issued by this issuer (`iss`).
    #[arg(long, value_name = "ISS")]
    pub jwt_issuer: Option<String>,
    /// Accept only JWTs meant for this audience (`aud`).
    #[arg(long, value_name = "AUD")]
    pub jwt_audience: Option<String>,
    /// Seconds a JWT is still taken past its `exp` (or before its `nbf`):
    /// the clock skew allowed with the issuer.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub jwt_leeway: u64,
    /// The longest a JWT may live, in seconds (from its `iat`, or from now):
    /// longer-lived tokens are refused.
    #[arg(long, value_name = "SECONDS", default_value_t = 86_400)]
    pub jwt_max_lifetime: u64,
    /// Take X-User-Id, X-Session-Id, X-Client-Id and X-Evaluation from requests
    /// into the agents' context (only behind a gateway that sets them).
    #[arg(long)]
    pub trust_context_headers: bool,
    /// On Ctrl-C or SIGTERM, give runs in flight this many seconds to finish
    /// (new work is refused with 503 meanwhile) before aborting them.
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub finish_runs: u64,
    /// Let an agent idle this many seconds leave memory (its session stays in
    /// the store; its next request brings it back). Default: never.
    #[arg(long, value_name = "SECS")]
    pub hibernate_after: Option<u64>,
    /// Let an agent idle this many seconds give up its actor, its state kept
    /// in memory (its next request wakes it, with no store read). Default:
    /// never.
    #[arg(long, value_name = "SECS")]
    pub dormant_after: Option<u64>,
    /// A page origin (`https://app.example.com`) whose browser requests are
    /// accepted, besides loopback ones and the server's own; repeatable.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// A host name the server answers without --tokens, besides loopback
    /// (`localhost`, 127.0.0.1, ::1); repeatable.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_hosts: Vec<String>,
    /// Let agent files sent inline carry what only an operator should: command
    /// tools, a model's base_url, api_key_env, a tool's env, MCP servers, and
    /// models the server does not serve. Only for clients trusted with a shell.
    #[arg(long)]
    pub trust_inline_definitions: bool,
    /// Cut assistant answers longer than N characters when a session is
    /// reloaded (resume, restart, thaw), keeping their start and end with a
    /// marker the agent's `lookup` tool reads whole; for agent files that set
    /// no `compression`. Default: off.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub compress_chars: Option<u32>,
    /// The most connections open at once (503 past it).
    #[arg(long, value_name = "N", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// The largest request body, in bytes (413 past it): a prompt's files travel
    /// in it, base64-encoded (a third larger). From 1 KiB to 64 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20,
          value_parser = clap::value_parser!(u32).range(1024..=64 << 20))]
    pub max_body_bytes: u32,
    /// Delete closed sessions this many days after their last change (checked
    /// every hour). Default: keep them.
    #[arg(long, value_name = "DAYS")]
    pub retain_closed_days: Option<u64>,
    /// Be one host of a cluster on these NATS servers (JetStream; URLs
    /// separated by commas): any host takes any request, each agent has one
    /// owner, and a dead host's agents come back on the others. Needs
    /// --store postgres://… shared by every host. `tls://` requires TLS; a
    /// user and password (`USER:PASSWORD@`) or a token (`TOKEN@`) in the URLs
    /// are taken from $TILLER_CLUSTER only, never from the command line.
    #[arg(
        long,
        value_name = "URLS",
        env = "TILLER_CLUSTER",
        hide_env_values = true
    )]
    pub cluster: Option<ClusterUrls>,
    /// A NATS credentials file (a user JWT and its NKey seed, as `nsc`
    /// writes it) for the cluster's bus.
    #[arg(
        long,
        value_name = "FILE",
        env = "TILLER_NATS_CREDS",
        requires = "cluster"
    )]
    pub nats_creds: Option<PathBuf>,
    /// A file holding this host's NKey user seed (`SU…`) for the cluster's bus.
    #[arg(
        long,
        value_name = "FILE",
        env = "TILLER_NATS_NKEY",
        requires = "cluster"
    )]
    pub nats_nkey: Option<PathBuf>,
    /// The certificate authority (PEM) that signed the NATS servers'
    /// certificates; TLS is then required.
    #[arg(
        long,
        value_name = "FILE",
        env = "TILLER_NATS_CA",
        requires = "cluster"
    )]
    pub nats_ca: Option<PathBuf>,
    /// This host's client certificate (PEM), for NATS servers that verify
    /// clients (mutual TLS); with --nats-key.
    #[arg(long, value_name = "FILE", env = "TILLER_NATS_CERT", requires_all = ["cluster", "nats_key"])]
    pub nats_cert: Option<PathBuf>,
    /// The key (PEM) of --nats-cert.
    #[arg(long, value_name = "FILE", env = "TILLER_NATS_KEY", requires_all = ["cluster", "nats_cert"])]
    pub nats_key: Option<PathBuf>,
    /// Join a NATS bus off this machine without credentials or TLS anyway.
    /// Anyone who reaches that bus can then read every agent's events and
    /// send any agent any op.
    #[arg(long, requires = "cluster")]
    pub insecure_cluster: bool,
    /// How long an agent stays idle before its lease is marked idle: a host
    /// that dies leaves its idle agents for their next request, and its busy
    /// ones are taken over at once.
    #[arg(long, value_name = "SECS", default_value_t = 30, requires = "cluster",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_after: u64,
    /// This host's id in the cluster (letters, digits, `-`, `_`, `.`). A host
    /// restarted under its id takes its place back at once. Default: a new id.
    #[arg(long, value_name = "ID", requires = "cluster")]
    pub host_id: Option<String>,
    /// In a cluster, on Ctrl-C or SIGTERM, first move this host's agents to
    /// the other hosts, each between two turns (POST /admin/drain does the
    /// same while serving).
    #[arg(long, requires = "cluster")]
    pub drain: bool,
    /// How long a silent host's agents wait before the others take them over;
    /// every host of a cluster must be given the same. Must exceed a NATS
    /// leader election (see docs/cluster.md).
    #[arg(long, value_name = "SECS", default_value_t = 15, requires = "cluster",
          value_parser = clap::value_parser!(u64).range(2..=3_600))]
    pub lease_ttl: u64,
}

/// The options of `tiller eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The suite file (YAML, or JSON when it ends in `.json`).
    pub suite: PathBuf,
    /// The run's id (letters, digits, `-`, `_`); its sessions are
    /// `eval-RUN.CASE.MODEL.REPETITION`. Default: a new id.
    #[arg(long, value_name = "ID")]
    pub run: Option<String>,
    /// A report of an earlier run (`--json`): flags each case that got worse,
    /// beyond the suite's thresholds, and decides the exit status.
    #[arg(long, value_name = "REPORT")]
    pub baseline: Option<PathBuf>,
    /// Writes the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Writes the runs as JUnit XML to this file, for CI.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// The session store the runs are kept in. Default: $TILLER_STORE, else an
    /// SQLite file under the user's data directory.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

/// What `tiller sessions` does.
#[derive(Debug, Subcommand)]
pub enum SessionsAction {
    /// Every session, most recently changed first.
    List,
    /// One session's transcript and queued messages.
    Show {
        /// The session.
        name: String,
        /// The stored session as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Starts a branch of a session: its first N messages (shared in the
    /// store, not copied) and the context as it stood there; prints its id.
    Fork {
        /// The session.
        name: String,
        /// How many of its messages the branch begins with.
        #[arg(long, value_name = "N")]
        at: u64,
        /// The branch's id (a new one when not given).
        #[arg(long, value_name = "ID")]
        id: Option<String>,
    },
    /// The branches forked from a session.
    Branches {
        /// The session.
        name: String,
    },
    /// Deletes a session with its messages (and its sub-agents' sessions);
    /// its branches keep what they began with. With --tenant, every session of
    /// the tenant (an evaluation's: `eval-RUN`).
    Rm {
        /// The session.
        #[arg(required_unless_present = "tenant", conflicts_with = "tenant")]
        name: Option<String>,
        /// Every session of this tenant instead.
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
    },
    /// Deletes the closed sessions last changed more than DAYS days ago.
    Prune {
        /// How many days a closed session is kept.
        #[arg(long, value_name = "DAYS")]
        older_than_days: u64,
    },
}

/// Which agent to run, on which model, and how to show its events.
#[derive(Debug, Clone, Default, Args)]
pub struct AgentOptions {
    /// An agent file (YAML or JSON): system prompt, model, tools.
    #[arg(long, value_name = "FILE")]
    pub agent: Option<PathBuf>,
    /// The provider; `faux` is Tiller's scripted model. Default: $TILLER_PROVIDER.
    #[arg(long, value_name = "NAME", value_parser = provider_names())]
    pub provider: Option<String>,
    /// The server, for any OpenAI-compatible one (llama.cpp, vLLM, Ollama), or one
    /// speaking the API of --provider (anthropic, openai-responses, bedrock; gemini
    /// at its /v1beta root).
    /// Default: $TILLER_BASE_URL.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model: `provider/model-id`, or a model id with --provider or --base-url.
    /// Default: $TILLER_MODEL, else the agent file's, else the provider's default.
    #[arg(long, value_name = "ID")]
    pub model: Option<String>,
    /// Named LLM configurations, for an agent file that names one with `llm:` (YAML,
    /// or JSON: names to provider, model, base_url, api_key_env, temperature,
    /// max_tokens and thinking). Default: $TILLER_LLMS.
    #[arg(long, value_name = "FILE")]
    pub llms: Option<PathBuf>,
    /// The system prompt (replaces the agent file's).
    #[arg(long, value_name = "TEXT", conflicts_with = "instructions_prompt")]
    pub system: Option<String>,
    /// The system prompt from a prompt of the agent file's MCP servers:
    /// `server/name`, or a name one of them offers (replaces the file's
    /// instructions; --prompt-arg fills its arguments).
    #[arg(long, value_name = "NAME", requires = "agent")]
    pub instructions_prompt: Option<String>,
    /// An argument of --instructions-prompt, as KEY=VALUE; repeatable.
    #[arg(long = "prompt-arg", value_name = "KEY=VALUE", value_parser = key_value, requires = "instructions_prompt")]
    pub prompt_args: Vec<(String, String)>,
    /// How hard the model should think: off, minimal, low, medium, high or xhigh.
    #[arg(long, value_name = "LEVEL", value_parser = thinking_levels())]
    pub thinking: Option<ThinkingLevel>,
    /// The most turns (model calls) a run makes.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_turns: Option<u32>,
    /// The most tokens one model response may hold. Default: the provider's.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// The model's context window in tokens, for a server no catalog knows (a
    /// llama.cpp server's -c): the conversation is compacted to stay inside it.
    /// Default: $TILLER_CONTEXT_WINDOW, else the catalog's (128000 for a model it
    /// does not list).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub context_window: Option<u32>,
    /// With --session: cut assistant answers longer than N characters when the
    /// session is reloaded, keeping their start and end with a marker the agent's
    /// `lookup` tool reads whole. Default: the agent file's `compression`, else off.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub compress_chars: Option<u32>,
    /// Keep the conversation in the session NAME: a later `--session NAME` continues
    /// it (its transcript and queued messages), with this invocation's agent and
    /// model. Without it (and without --user), nothing is kept.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// The user the agent works for (its context's user id): an agent file's
    /// `memory` is this user's, kept in the store across sessions.
    #[arg(long, value_name = "ID")]
    pub user: Option<String>,
    /// Where sessions (and users' memory) are kept: `sqlite://PATH` or
    /// `postgres://USER@HOST:PORT/DB`, opened with --session or --user.
    /// Default: $TILLER_STORE, else an SQLite file under the user's data directory
    /// ($XDG_DATA_HOME/tiller/sessions.db or ~/.local/share/tiller/sessions.db).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// How events are written: `text` streams the answer to stdout and tool activity
    /// to stderr; `jsonl` writes every event to stdout as one JSON object per line,
    /// each update carrying its piece; `jsonl-full` carries in each update the
    /// message as it stands (bytes growing with the square of an answer's length).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = EventFormat::Text)]
    pub events: EventFormat,
}

/// How events are written to stdout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum EventFormat {
    /// The answer's text on stdout; tool calls, thinking and errors on stderr.
    #[default]
    Text,
    /// One JSON object per event envelope and line, nothing else; an update
    /// carries its piece ([`tiller::wire`]).
    Jsonl,
    /// As `jsonl`, every update with the message (or arguments) as it stands.
    JsonlFull,
}

fn provider_names() -> PossibleValuesParser {
    let known = tiller::ai::catalog::providers().iter().map(|p| p.name);
    PossibleValuesParser::new(known.chain(["faux"]))
}

fn thinking_levels() -> impl TypedValueParser<Value = ThinkingLevel> {
    PossibleValuesParser::new(ThinkingLevel::ALL.map(|level| level.as_str()))
        .try_map(|level| level.parse::<ThinkingLevel>())
}

/// `KEY=VALUE`, split at the first `=`.
fn key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("`{text}` is not KEY=VALUE"))
}
