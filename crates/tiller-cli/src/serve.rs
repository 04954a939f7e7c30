//! `tiller serve`: the agents of a folder of agent files, over HTTP
//! ([`tiller_server`]), until Ctrl-C or SIGTERM.

use std::path::Path;
use std::sync::Arc;

use tiller::store::MemoryStore;
use tiller::{
    Definitions, Supervisor, SupervisorConfig,
    agents::{AskAgentConfig, Compression, LlmConfigs},
    store::SessionStore,
};
use tiller_server::{JwtKeys, Server, ServerConfig, Tokens};

use crate::cluster::{ClusterOptions, NatsFiles};
use crate::outcome::Exit;
use crate::sessions::open_store;

/// Where JSON Web Tokens' keys come from (`--jwt-*`); none accepts no JWT.
#[derive(Debug, Clone, Copy)]
pub struct JwtOptions<'a> {
    /// The environment variable holding the HS256 secret.
    pub secret_env: Option<&'a str>,
    /// The PEM file of the RS256 or ES256 public key.
    pub public_key: Option<&'a Path>,
    /// The issuer tokens must name.
    pub issuer: Option<&'a str>,
    /// The audience tokens must name.
    pub audience: Option<&'a str>,
    /// Seconds a token is still taken past its `exp`.
    pub leeway: u64,
    /// The longest a token may live.
    pub max_lifetime: std::time::Duration,
}

impl Default for JwtOptions<'_> {
    fn default() -> Self {
        JwtOptions {
            secret_env: None,
            public_key: None,
            issuer: None,
            audience: None,
            leeway: 0,
            max_lifetime: JwtKeys::DEFAULT_MAX_LIFETIME,
        }
    }
}

impl JwtOptions<'_> {
    /// The keys these options give, if any; an unset variable or an unreadable
    /// key is an error naming it.
    fn keys(&self) -> Result<Option<JwtKeys>, String> {
        let keys = match (self.secret_env, self.public_key) {
            (Some(variable), _) => JwtKeys::hs256_from_env(variable)?,
            (None, Some(path)) => JwtKeys::public_key_file(path)?,
            (None, None) if self.issuer.is_some() || self.audience.is_some() => {
                return Err(
                    "--jwt-issuer and --jwt-audience need --jwt-secret-env or --jwt-public-key"
                        .to_owned(),
                );
            }
            (None, None) => return Ok(None),
        };
        let keys = keys
            .with_leeway(self.leeway)
            .with_max_lifetime(self.max_lifetime);
        let keys = match self.issuer {
            Some(issuer) => keys.with_issuer(issuer),
            None => keys,
        };
        Ok(Some(match self.audience {
            Some(audience) => keys.with_audience(audience),
            None => keys,
        }))
    }
}

/// What `tiller serve` was given.
#[derive(Debug)]
pub struct ServeOptions<'a> {
    /// The address to listen on.
    pub listen: &'a str,
    /// The folder of agent files.
    pub agents: Option<&'a Path>,
    /// The named LLM configurations.
    pub llms: Option<&'a Path>,
    /// The session store's URL.
    pub store: Option<&'a str>,
    /// The token file.
    pub tokens: Option<&'a Path>,
    /// How JSON Web Tokens are checked, if they are accepted.
    pub jwt: JwtOptions<'a>,
    /// Whether to take context headers from requests.
    pub trust_context_headers: bool,
    /// How long runs in flight may finish at shutdown before they are aborted.
    pub finish_runs: std::time::Duration,
    /// How long an agent may idle in memory before it hibernates (never: `None`).
    pub hibernate_after: Option<std::time::Duration>,
    /// How long an agent may idle before it gives up its actor, its state kept
    /// in memory (never: `None`).
    pub dormant_after: Option<std::time::Duration>,
    /// Page origins whose browser requests are accepted besides loopback ones.
    pub allowed_origins: &'a [String],
    /// Host names an open server answers besides loopback ones.
    pub allowed_hosts: &'a [String],
    /// Whether inline agent files may carry commands, servers and keys.
    pub trust_inline_definitions: bool,
    /// The longest assistant answer kept whole when a session is reloaded, for
    /// agent files that set no `compression` (off: `None`).
    pub compress_chars: Option<u32>,
    /// The most connections open at once.
    pub max_connections: usize,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// How long closed sessions are kept (forever: `None`).
    pub retain_closed: Option<std::time::Duration>,
    /// The cluster to be a host of, if any.
    pub cluster: Option<ClusterOptions<'a>>,
}

impl crate::cli::ServeArgs {
    /// The options these arguments give `tiller serve`.
    pub fn options(&self) -> ServeOptions<'_> {
        ServeOptions {
            listen: &self.listen,
            agents: self.agents.as_deref(),
            llms: self.llms.as_deref(),
            store: self.store.as_deref(),
            tokens: self.tokens.as_deref(),
            jwt: JwtOptions {
                secret_env: self.jwt_secret_env.as_deref(),
                public_key: self.jwt_public_key.as_deref(),
                issuer: self.jwt_issuer.as_deref(),
                audience: self.jwt_audience.as_deref(),
                leeway: self.jwt_leeway,
                max_lifetime: std::time::Duration::from_secs(self.jwt_max_lifetime),
            },
            trust_context_headers: self.trust_context_headers,
            finish_runs: std::time::Duration::from_secs(self.finish_runs),
            hibernate_after: self.hibernate_after.map(std::time::Duration::from_secs),
            dormant_after: self.dormant_after.map(std::time::Duration::from_secs),
            allowed_origins: &self.allowed_origins,
            allowed_hosts: &self.allowed_hosts,
            trust_inline_definitions: self.trust_inline_definitions,
            compress_chars: self.compress_chars,
            max_connections: self.max_connections as usize,
            max_body_bytes: self.max_body_bytes as usize,
            retain_closed: self
                .retain_closed_days
                .map(|days| std::time::Duration::from_secs(days.saturating_mul(24 * 3_600))),
            cluster: self.cluster.as_ref().map(|servers| ClusterOptions {
                servers,
                // A URL's secret is welcome from the environment only.
                servers_on_command_line: std::env::var("TILLER_CLUSTER").ok().as_deref()
                    != Some(servers.0.as_str()),
                security: NatsFiles {
                    credentials_file: self.nats_creds.as_deref(),
                    nkey_file: self.nats_nkey.as_deref(),
                    ca_file: self.nats_ca.as_deref(),
                    client_certificate: self.nats_cert.as_deref().zip(self.nats_key.as_deref()),
                    insecure: self.insecure_cluster,
                },
                host_id: self.host_id.as_deref(),
                drain: self.drain,
                lease_ttl: std::time::Duration::from_secs(self.lease_ttl),
                idle_after: std::time::Duration::from_secs(self.idle_after),
            }),
        }
    }
}

/// Runs `tiller serve`.
pub async fn serve(options: ServeOptions<'_>) -> Exit {
    match serving(options).await {
        Ok(exit) | Err(exit) => exit,
    }
}

/// `tiller serve`, each failure its exit status (said on stderr).
async fn serving(options: ServeOptions<'_>) -> Result<Exit, Exit> {
    let ServeOptions {
        listen,
        agents,
        llms,
        store,
        tokens,
        jwt,
        trust_context_headers,
        finish_runs,
        hibernate_after,
        dormant_after,
        allowed_origins,
        allowed_hosts,
        trust_inline_definitions,
        compress_chars,
        max_connections,
        max_body_bytes,
        retain_closed,
        cluster,
    } = options;
    let definitions = connected_definitions(agents, llms).await?;
    let tokens = load_tokens(tokens, jwt)?;
    let drain_on_shutdown = cluster.as_ref().is_some_and(|cluster| cluster.drain);
    let cluster = crate::cluster::config(cluster, store)?;
    let supervisor = start_supervisor(store, hibernate_after, dormant_after, &tokens).await?;
    let definitions = served_definitions(definitions, &supervisor, compress_chars);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| Exit::failed(format!("cannot listen on {listen}: {error}")))?;
    let address = announce(&listener, listen, &definitions, &tokens);
    let defaults = ServerConfig::default();
    let config = ServerConfig {
        tokens,
        trust_context_headers,
        finish_runs,
        allowed_origins: allowed_origins.to_vec(),
        allowed_hosts: defaults
            .allowed_hosts
            .iter()
            .chain(allowed_hosts)
            .cloned()
            .collect(),
        trust_inline_definitions,
        max_connections,
        max_body_bytes,
        retain_closed,
        drain_on_shutdown,
        // Clients see a sub-agent's answer once: the caller's text after it is
        // not streamed again (the transcript keeps it).
        quiet_after_child_content: true,
        ..defaults
    };
    let server = match cluster {
        None => Server::new(supervisor, definitions, config),
        Some(cluster) => {
            crate::cluster::join(
                &listener,
                &address,
                supervisor,
                definitions,
                config,
                cluster,
            )
            .await?
        }
    };
    match server.serve(listener, stop_signal()).await {
        Ok(()) => {
            say!("tiller: stopped");
            Ok(Exit::Success)
        }
        Err(error) => Err(Exit::failed(format!("the server failed: {error}"))),
    }
}

/// The token file at `path`, if given, with the JWT keys `jwt` names.
fn load_tokens(path: Option<&Path>, jwt: JwtOptions<'_>) -> Result<Tokens, Exit> {
    let tokens = path.map(Tokens::load).transpose().map_err(Exit::usage)?;
    let tokens = tokens.unwrap_or_default();
    Ok(match jwt.keys().map_err(Exit::usage)? {
        Some(keys) => tokens.with_jwt(keys),
        None => tokens,
    })
}

/// The supervisor over the store `store` names (memory when none), with the
/// tenants' budgets and weights of `tokens`.
async fn start_supervisor(
    store: Option<&str>,
    hibernate_after: Option<std::time::Duration>,
    dormant_after: Option<std::time::Duration>,
    tokens: &Tokens,
) -> Result<Supervisor, Exit> {
    let store: Arc<dyn SessionStore> = match store {
        None => Arc::new(MemoryStore::new()),
        Some(url) => open_store(Some(url)).await?,
    };
    let config = SupervisorConfig {
        hibernate_after,
        dormant_after,
        ..SupervisorConfig::default()
    };
    let supervisor = Supervisor::with_store(config, store)
        .await
        .map_err(Exit::failed)?;
    for (tenant, budget) in tokens.budgets() {
        if let Err(error) = supervisor.set_tenant_budget(tenant, *budget).await {
            return Err(Exit::failed(format!(
                "the budget of tenant `{tenant}`: {error}"
            )));
        }
    }
    if let Some(limits) = supervisor.rate_limits() {
        for (tenant, weight) in tokens.weights() {
            limits.set_weight(tenant, weight);
        }
    }
    Ok(supervisor)
}

/// The definitions as the server runs them: knowing the supervisor's store
/// (before `ask_agent` takes them, for its sub-agents too), compressing as
/// `--compress-chars` says, with `ask_agent`, whose callers' restatements of a
/// sub-agent's streamed answer are not streamed to clients again.
fn served_definitions(
    definitions: Definitions,
    supervisor: &Supervisor,
    compress_chars: Option<u32>,
) -> Definitions {
    let mut definitions = definitions.with_session_store(supervisor.store().clone());
    if let Some(chars) = compress_chars {
        definitions = definitions.with_compression(Compression::keeping(chars as usize));
    }
    let config = AskAgentConfig {
        quiet_restatements: true,
        ..AskAgentConfig::default()
    };
    definitions.with_ask_agent(supervisor, config)
}

/// Says on stderr what is served where (and warns when only this machine is
/// answered); the address listened on.
fn announce(
    listener: &tokio::net::TcpListener,
    listen: &str,
    definitions: &Definitions,
    tokens: &Tokens,
) -> String {
    let address = listener
        .local_addr()
        .map_or_else(|_| listen.to_owned(), |address| address.to_string());
    let names: Vec<&str> = definitions.iter().map(|file| file.name.as_str()).collect();
    say!(
        "tiller: serving {} agent definition(s) on http://{address} ({})",
        names.len(),
        if names.is_empty() {
            "none: create agents with an inline definition".to_owned()
        } else {
            names.join(", ")
        }
    );
    if tokens.is_empty()
        && listener
            .local_addr()
            .is_ok_and(|address| !address.ip().is_loopback())
    {
        say!(
            "tiller: warning: without --tokens only this machine is answered; other addresses are refused"
        );
    }
    address
}

/// [`definitions`] connected to the MCP servers they list; on failure, says why
/// on stderr and answers the exit status (2 for bad files, 1 for a server that
/// cannot be reached).
pub(crate) async fn connected_definitions(
    agents: Option<&Path>,
    llms: Option<&Path>,
) -> Result<Definitions, Exit> {
    let mut definitions = definitions(agents, llms).map_err(Exit::usage)?;
    definitions.connect_mcp().await.map_err(Exit::failed)?;
    Ok(definitions)
}

/// The agent files of `agents`, with the LLM configurations of `llms` (or
/// `$TILLER_LLMS`) and the model the environment names (else the faux model) for
/// files that name none.
fn definitions(agents: Option<&Path>, llms: Option<&Path>) -> Result<Definitions, String> {
    let definitions = match agents {
        Some(folder) => Definitions::load_dir(folder).map_err(|error| error.to_string())?,
        None => Definitions::new(),
    };
    let llms_path = llms
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("TILLER_LLMS").map(Into::into));
    let llms = match llms_path {
        Some(path) => {
            LlmConfigs::load(&path).map_err(|error| format!("{}: {error}", path.display()))?
        }
        None => LlmConfigs::new(),
    };
    // Chosen as `tiller run` chooses it.
    let chosen = tiller::agents::choose_model(tiller::agents::ModelSources::default(), |name| {
        std::env::var(name)
            .ok()
            .filter(|value| !value.trim().is_empty())
    })
    .map_err(|error| error.to_string())?;
    Ok(definitions
        .with_llms(llms)
        .with_default_model(chosen.model)
        .with_default_key(chosen.api_key))
}

/// Completes at Ctrl-C or SIGTERM.
async fn stop_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
