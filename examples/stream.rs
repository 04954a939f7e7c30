//! Streams one reply from a model to the terminal.
//!
//! ```text
//! cargo run --example stream -- "Why is the sky blue?"
//! ```
//!
//! With no provider configured it uses Tiller's scripted `faux` model, so it runs
//! anywhere. Point it at a real one with environment variables:
//!
//! ```text
//! OPENAI_API_KEY=sk-... cargo run --example stream -- "Hello"
//! TILLER_MODEL=anthropic/claude-sonnet-4-5 ANTHROPIC_API_KEY=... cargo run --example stream -- "Hello"
//! TILLER_BASE_URL=http://127.0.0.1:8080/v1 cargo run --example stream -- "Hello"   # llama.cpp, vLLM, Ollama
//! ```
//!
//! Ctrl-C aborts the request; the partial reply is kept.

use std::io::Write;
use std::process::ExitCode;

use futures::StreamExt;
use tiller_ai::{AssistantEvent, Context, Message, StreamOptions};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let prompt = if args.is_empty() {
        "Hello! What can you do?".to_owned()
    } else {
        args.join(" ")
    };
    let (model, api_key) = match tiller_ai::env::from_env() {
        Ok(Some(chosen)) => (chosen.model, chosen.api_key),
        Ok(None) => {
            eprintln!(
                "No provider configured (set OPENAI_API_KEY, ANTHROPIC_API_KEY, TILLER_MODEL or TILLER_BASE_URL): using the scripted faux model."
            );
            (tiller_ai::faux::demo_model(), None)
        }
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    eprintln!("[{} {} at {}]", model.provider, model.id, model.base_url);

    let context = Context::new()
        .with_system_prompt("You are a helpful assistant. Answer in a few sentences.")
        .with_message(Message::user(prompt));
    let options = StreamOptions {
        transport: tiller::ai::Transport {
            api_key,
            ..tiller::ai::Transport::default()
        },
        ..StreamOptions::default()
    };
    let cancel = options.transport.cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });

    let mut events = tiller_ai::stream(&model, &context, &options);
    let mut stdout = std::io::stdout();
    while let Some(event) = events.next().await {
        match event {
            AssistantEvent::TextDelta { delta, .. } => {
                print!("{delta}");
                let _ = stdout.flush();
            }
            AssistantEvent::ThinkingDelta { delta, .. } => eprint!("{delta}"),
            AssistantEvent::ThinkingEnd { .. } => eprintln!(),
            AssistantEvent::Done { message, .. } => {
                println!();
                let usage = message.usage;
                eprintln!(
                    "[{:?} · {} tokens in, {} out · ${:.6}]",
                    message.stop_reason,
                    usage.input + usage.cache_read + usage.cache_write,
                    usage.output,
                    usage.cost.total
                );
                return ExitCode::SUCCESS;
            }
            AssistantEvent::Error { error, .. } => {
                println!();
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
            _ => {}
        }
    }
    ExitCode::FAILURE
}
