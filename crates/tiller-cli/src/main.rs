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
    let telemetry = tiller_cli::telemetry::init(matches!(cli.command, CliCommand::Serve(_)));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            tiller_cli::say!("tiller: cannot start the async runtime: {error}");
            return Exit::Failed.into();
        }
    };
    let exit = runtime.block_on(async {
        match &cli.command {
            CliCommand::Run {
                agent,
                prompt,
                files,
            } => tiller_cli::run::run(agent, prompt, files).await,
            CliCommand::Chat { agent } => tiller_cli::chat::chat(agent).await,
            CliCommand::Serve(args) => tiller_cli::serve::serve(args.options()).await,
            CliCommand::Mcp { agents, llms } => {
                tiller_cli::mcp::mcp(agents.as_deref(), llms.as_deref()).await
            }
            CliCommand::Eval(args) => tiller_cli::eval::eval(args).await,
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
