//! `tiller run`: one prompt, to the end of its run.

use std::path::PathBuf;

use futures::StreamExt;
use tiller::ai::{FileContent, UserMessage};
use tiller::{AgentEvent, Delivered};
use tokio::io::AsyncReadExt;

use crate::cli::AgentOptions;
use crate::interrupt::Interrupts;
use crate::outcome::{Exit, verdict};
use crate::session::Session;

/// Runs `prompt` (`-`: standard input) with `files` attached and answers the exit
/// status.
pub async fn run(options: &AgentOptions, prompt: &str, files: &[PathBuf]) -> Exit {
    let mut interrupts = Interrupts::listen();
    let prompt = if prompt == "-" {
        let mut text = String::new();
        if let Err(error) = tokio::io::stdin().read_to_string(&mut text).await {
            crate::say!("tiller: cannot read the prompt from standard input: {error}");
            return Exit::Usage;
        }
        text
    } else {
        prompt.to_owned()
    };
    if prompt.trim().is_empty() {
        crate::say!("tiller: the prompt is empty");
        return Exit::Usage;
    }
    let mut message = UserMessage::text(prompt);
    for path in files {
        match FileContent::read(path) {
            Ok(file) => message = message.with_file(file),
            Err(error) => {
                crate::say!("tiller: {error}");
                return Exit::Usage;
            }
        }
    }
    let mut session = match Session::start(options).await {
        Ok(session) => session,
        Err(exit) => return exit,
    };
    if let Err(error) = session.agent.prompt(message).await {
        crate::say!("tiller: {error}");
        return Exit::Failed;
    }

    let mut interrupted = false;
    let ended = loop {
        tokio::select! {
            envelope = session.events.next() => {
                let Some(envelope) = envelope else {
                    break Err("the agent stopped before its run ended".to_owned());
                };
                if let Err(error) = session.output.write(&envelope) {
                    session.agent.abort();
                    break Err(format!("cannot write to stdout: {error}"));
                }
                if let Delivered::Event(AgentEvent::AgentEnd { messages, reason, output }) = &envelope.event {
                    break verdict(*reason, messages, output.as_ref());
                }
            }
            () = interrupts.next() => {
                if interrupted {
                    return Exit::Interrupted;
                }
                interrupted = true;
                session.agent.abort();
            }
        }
    };
    session.supervisor.shutdown().await;
    match ended {
        _ if interrupted => Exit::Interrupted,
        Ok(()) => Exit::Success,
        Err(message) => {
            crate::say!("tiller: {message}");
            Exit::Failed
        }
    }
}
