//! The `tiller` binary; see `tiller --help`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tiller_cli::cli::{Cli, CliCommand};
use tiller_cli::outcome::Exit;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` logs (as `TILLER_LOG` says); every command exports its spans when
    // an OTLP endpoint is set. Dropped last, after the runtime.
    let telemetry = tiller_cli::telemetry::init(matches!(cli.command, CliCommand::Serve { .. }));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            tiller_cli::say!("tiller: cannot start the async runtime: {error}");
            return Exit::Failed.into();
        }
    };
    let exit = runtime.block_on(async {
        match &cli.command {
            CliCommand::Run { agent, prompt } => tiller_cli::run::run(agent, prompt).await,
            CliCommand::Chat { agent } => tiller_cli::chat::chat(agent).await,
            CliCommand::Serve {
                listen,
                agents,
                llms,
                store,
                tokens,
                jwt_secret_env,
                jwt_public_key,
                jwt_issuer,
                jwt_audience,
                jwt_leeway,
                jwt_max_lifetime,
                trust_context_headers,
                finish_runs,
                hibernate_after,
                allowed_origins,
                allowed_hosts,
                trust_inline_definitions,
                compress_chars,
                max_connections,
                retain_closed_days,
                cluster,
                nats_creds,
                nats_nkey,
                nats_ca,
                nats_cert,
                nats_key,
                insecure_cluster,
                idle_after,
                host_id,
                drain,
                lease_ttl,
            } => {
                let options = tiller_cli::serve::ServeOptions {
                    listen,
                    agents: agents.as_deref(),
                    llms: llms.as_deref(),
                    store: store.as_deref(),
                    tokens: tokens.as_deref(),
                    jwt: tiller_cli::serve::JwtOptions {
                        secret_env: jwt_secret_env.as_deref(),
                        public_key: jwt_public_key.as_deref(),
                        issuer: jwt_issuer.as_deref(),
                        audience: jwt_audience.as_deref(),
                        leeway: *jwt_leeway,
                        max_lifetime: std::time::Duration::from_secs(*jwt_max_lifetime),
                    },
                    trust_context_headers: *trust_context_headers,
                    finish_runs: std::time::Duration::from_secs(*finish_runs),
                    hibernate_after: hibernate_after.map(std::time::Duration::from_secs),
                    allowed_origins,
                    allowed_hosts,
                    trust_inline_definitions: *trust_inline_definitions,
                    compress_chars: *compress_chars,
                    max_connections: *max_connections as usize,
                    retain_closed: retain_closed_days.map(|days| {
                        std::time::Duration::from_secs(days.saturating_mul(24 * 3_600))
                    }),
                    cluster: cluster
                        .as_ref()
                        .map(|servers| tiller_cli::serve::ClusterOptions {
                            servers,
                            // A URL's secret is welcome from the environment only.
                            servers_on_command_line: std::env::var("TILLER_CLUSTER")
                                .ok()
                                .as_deref()
                                != Some(servers.0.as_str()),
                            security: tiller_cluster::NatsSecurity {
                                credentials_file: nats_creds.clone(),
                                nkey_file: nats_nkey.clone(),
                                ca_file: nats_ca.clone(),
                                client_certificate: nats_cert.clone().zip(nats_key.clone()),
                                insecure: *insecure_cluster,
                            },
                            host_id: host_id.as_deref(),
                            drain: *drain,
                            lease_ttl: std::time::Duration::from_secs(*lease_ttl),
                            idle_after: std::time::Duration::from_secs(*idle_after),
                        }),
                };
                tiller_cli::serve::serve(options).await
            }
            CliCommand::Mcp { agents, llms } => {
                tiller_cli::mcp::mcp(agents.as_deref(), llms.as_deref()).await
            }
            CliCommand::Sessions { action, store } => {
                tiller_cli::sessions::sessions(action, store.as_deref()).await
            }
        }
    });
    // Dropping the tasks still running kills their tools' processes; a blocked read
    // of standard input is not waited for.
    runtime.shutdown_timeout(Duration::from_millis(200));
    drop(telemetry);
    exit.into()
}
