//! `tiller chat`: a conversation, line by line, from a terminal or a pipe.

use std::io::IsTerminal;

use futures::StreamExt;
use tiller::ai::{FileContent, UserMessage};
use tiller::{
    AgentError, AgentEvent, AgentHandle, AgentMessage, Delivered, Op, Prompt, RunEnd,
    run::{Reply, UserRequest},
    runtime::AgentStatus,
};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use crate::cli::AgentOptions;
use crate::interrupt::Interrupts;
use crate::outcome::{Exit, verdict};
use crate::session::Session;
use crate::setup::describe;

const HELP: &str = "a line is a prompt when the agent is idle, steers it while it works, and \
answers when a tool asks (y or n to approve a call); \
/file PATH attaches a file to the next message, /follow TEXT queues a follow-up, /abort stops the run, /reset clears the conversation, \
/compact [WHAT TO KEEP] replaces its oldest part with a summary, /state summarises it, /quit leaves";

/// Talks with the agent until `/quit` or the end of input; answers the exit status
/// (that of the last run).
pub async fn chat(options: &AgentOptions) -> Exit {
    let mut interrupts = Interrupts::listen();
    let mut session = match Session::start(options).await {
        Ok(session) => session,
        Err(exit) => return exit,
    };
    let interactive = std::io::stdin().is_terminal();
    let mut lines = read_lines();
    let mut input_open = true;
    let mut last_run = Ok(());
    // Files attached by /file, sent with the next message.
    let mut attached = Vec::new();
    // The number after the last event written: at the end of input, the chat
    // leaves once the agent is idle and every event it published is written.
    let mut written = session.events.starts_at();
    let agent = session.agent.clone();
    if interactive {
        let model = match agent.state().await {
            Ok(state) => state.definition.model.as_ref().map(describe),
            Err(_) => None,
        };
        crate::say!("tiller chat with {}: {HELP}", model.unwrap_or_default());
    }
    // A session left waiting for the user (a question, an approval) says so first.
    ask_user(&agent).await;
    if interactive {
        ready();
    }
    loop {
        tokio::select! {
            line = lines.recv(), if input_open => {
                let Some(line) = line else {
                    input_open = false;
                    if !queued(&agent).await && finished(&agent, written) {
                        break;
                    }
                    continue;
                };
                if !command(&agent, &line, options.session.as_deref(), &mut attached).await {
                    break;
                }
                if interactive && agent.status() != AgentStatus::Running {
                    ready();
                }
            }
            envelope = session.events.next() => {
                let Some(envelope) = envelope else { break };
                if let Err(error) = session.output.write(&envelope) {
                    crate::say!("tiller: cannot write to stdout: {error}");
                    break;
                }
                written = written.max(envelope.seq + 1);
                if let Delivered::Event(AgentEvent::AgentEnd { messages, reason, output }) = &envelope.event {
                    last_run = verdict(*reason, messages, output.as_ref());
                    if *reason == RunEnd::Parked {
                        ask_user(&agent).await;
                    } else if let Err(message) = &last_run {
                        crate::say!("[{message}]");
                    }
                    if *reason != RunEnd::Parked && queued(&agent).await {
                        // Queued as the run ended: they run now rather than wait.
                        if let Err(error) = agent.prompt(Prompt::Continue).await {
                            crate::say!("[{error}]");
                        }
                    } else if interactive && input_open {
                        ready();
                    }
                }
                if !input_open && finished(&agent, written) {
                    break;
                }
            }
            () = interrupts.next() => {
                if agent.status() == AgentStatus::Running {
                    agent.abort();
                } else {
                    crate::say!("[Ctrl-C aborts a run; /quit or the end of input leaves]");
                }
            }
        }
    }
    session.supervisor.shutdown().await;
    match last_run {
        Ok(()) => Exit::Success,
        Err(_) => Exit::Failed,
    }
}

/// Carries out one line of input; `false` for `/quit`. Files `attached` go with the
/// next prompt, steering message or follow-up.
async fn command(
    agent: &AgentHandle,
    line: &str,
    session: Option<&str>,
    attached: &mut Vec<FileContent>,
) -> bool {
    match Line::parse(line) {
        Line::Quit => return false,
        Line::Empty => {}
        Line::Prompt(text) => apply(agent, prompt_or_steer(agent, text, attached).await).await,
        Line::Follow(text) => apply(agent, follow(agent, text, attached).await).await,
        Line::File(path) => match FileContent::read(path) {
            Ok(file) => {
                crate::say!(
                    "[{} attached ({}, {} bytes): it goes with your next message]",
                    file.name,
                    file.mime_type,
                    file.size()
                );
                attached.push(file);
            }
            Err(error) => crate::say!("[{error}]"),
        },
        Line::Abort => {
            if matches!(
                agent.status(),
                AgentStatus::Running | AgentStatus::WaitingForInput
            ) {
                agent.abort();
            } else {
                crate::say!("[nothing to abort]");
            }
        }
        Line::Reset => apply(agent, Some(Op::Reset)).await,
        Line::Compact(text) => {
            let instructions = (!text.is_empty()).then(|| text.to_owned());
            apply(agent, Some(Op::Compact { instructions })).await
        }
        Line::State => state(agent, session).await,
        Line::Help => crate::say!("[{HELP}]"),
        Line::Unknown(command) => crate::say!("[unknown command {command}: {HELP}]"),
    }
    true
}

/// One line of input.
#[derive(Debug, PartialEq, Eq)]
enum Line<'a> {
    Empty,
    Prompt(&'a str),
    Follow(&'a str),
    File(&'a str),
    Abort,
    Reset,
    Compact(&'a str),
    State,
    Help,
    Quit,
    Unknown(&'a str),
}

impl<'a> Line<'a> {
    fn parse(line: &'a str) -> Line<'a> {
        let line = line.trim();
        let Some(command) = line.strip_prefix('/') else {
            return if line.is_empty() {
                Line::Empty
            } else {
                Line::Prompt(line)
            };
        };
        let (name, rest) = command
            .split_once(char::is_whitespace)
            .map_or((command, ""), |(name, rest)| (name, rest.trim()));
        match (name, rest) {
            ("follow", text) if !text.is_empty() => Line::Follow(text),
            ("file", path) if !path.is_empty() => Line::File(path),
            ("abort", "") => Line::Abort,
            ("reset", "") => Line::Reset,
            ("compact", text) => Line::Compact(text),
            ("state", "") => Line::State,
            ("help", "") => Line::Help,
            ("quit" | "exit", "") => Line::Quit,
            _ => Line::Unknown(line),
        }
    }
}

/// Standard input, line by line; the channel closes at the end of input.
fn read_lines() -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        loop {
            match lines.next_line().await {
                Ok(Some(line)) => {
                    if sender.send(line).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    crate::say!("tiller: cannot read standard input: {error}");
                    break;
                }
            }
        }
    });
    receiver
}

/// The oldest request the agent's parked run waits for.
async fn oldest_request(agent: &AgentHandle) -> Option<UserRequest> {
    let state = agent.state().await.ok()?;
    state.waiting.into_iter().next()
}

/// Shows what the parked run waits for.
async fn ask_user(agent: &AgentHandle) {
    let waiting = oldest_request(agent).await;
    match waiting {
        Some(UserRequest::Input {
            tool_name,
            question,
            ..
        }) => crate::say!("[{tool_name} asks] {question}"),
        Some(UserRequest::Approval {
            reason: Some(reason),
            ..
        }) => crate::say!("[{reason}? y/n]"),
        Some(UserRequest::Approval {
            tool_name, args, ..
        }) => crate::say!("[run {tool_name} {args}? y/n]"),
        None => {}
    }
}

/// The user's reply to what the parked run waits for: an answer, or y/n for an
/// approval.
async fn reply(agent: &AgentHandle, text: &str) -> Option<Op> {
    let Some(waiting) = oldest_request(agent).await else {
        crate::say!("[nothing waits for a reply]");
        return None;
    };
    let id = waiting.tool_call_id().to_owned();
    let reply = match (waiting, text.to_ascii_lowercase().as_str()) {
        (UserRequest::Approval { .. }, "y" | "yes") => Reply::approve(id),
        (UserRequest::Approval { .. }, "n" | "no") => Reply::deny(id, None),
        (UserRequest::Approval { .. }, _) => {
            crate::say!("[y runs the call, n refuses it, /abort gives it up]");
            return None;
        }
        (UserRequest::Input { .. }, _) => Reply::answer(id, text),
    };
    Some(Op::Reply(reply))
}

/// A prompt when the agent is idle, a steering message while it works (either
/// with the files attached), the reply when a tool call waits for the user.
async fn prompt_or_steer(
    agent: &AgentHandle,
    text: &str,
    attached: &mut Vec<FileContent>,
) -> Option<Op> {
    match agent.status() {
        AgentStatus::WaitingForInput => reply(agent, text).await,
        AgentStatus::Running => Some(Op::Steer {
            message: with_files(text, attached),
        }),
        _ => Some(Op::Prompt {
            messages: vec![with_files(text, attached)],
        }),
    }
}

/// A follow-up while the agent works; a prompt when it is idle.
async fn follow(agent: &AgentHandle, text: &str, attached: &mut Vec<FileContent>) -> Option<Op> {
    if matches!(
        agent.status(),
        AgentStatus::Running | AgentStatus::WaitingForInput
    ) {
        Some(Op::FollowUp {
            message: with_files(text, attached),
        })
    } else {
        prompt_or_steer(agent, text, attached).await
    }
}

/// The user's message of `text` and the files attached, which it takes.
fn with_files(text: &str, attached: &mut Vec<FileContent>) -> AgentMessage {
    let message = attached
        .drain(..)
        .fold(UserMessage::text(text), UserMessage::with_file);
    AgentMessage::Llm(message.into())
}

/// Carries out what a line asks, and says how it went. A prompt that finds the
/// agent busy (a run started meanwhile) steers it instead.
async fn apply(agent: &AgentHandle, op: Option<Op>) {
    let Some(op) = op else { return };
    let done = match (&op, agent.submit(op.clone()).await) {
        (Op::Prompt { messages }, Err(AgentError::Busy)) => {
            let steer = Op::Steer {
                message: messages[0].clone(),
            };
            agent.submit(steer.clone()).await.map(|()| steer)
        }
        (_, done) => done.map(|()| op),
    };
    match done {
        Ok(Op::Steer { .. }) => crate::say!("[steering queued]"),
        Ok(Op::FollowUp { .. }) => crate::say!("[follow-up queued]"),
        Ok(Op::Reset) => crate::say!("[reset: the conversation is empty]"),
        Ok(_) => {}
        Err(error) => crate::say!("[{error}]"),
    }
}

/// A one-line summary of the conversation.
async fn state(agent: &AgentHandle, session: Option<&str>) {
    let state = match agent.state().await {
        Ok(state) => state,
        Err(error) => {
            crate::say!("[{error}]");
            return;
        }
    };
    let usage = state.usage();
    let status = if state.is_streaming {
        "working"
    } else if !state.waiting.is_empty() {
        "waiting for your reply"
    } else {
        "idle"
    };
    let queued = if state.steering_queue.is_empty() && state.follow_up_queue.is_empty() {
        ""
    } else {
        ", messages queued"
    };
    crate::say!(
        "[{}{} messages · {} tokens in, {} out · ${:.4} · {status}{queued}{}]",
        session
            .map(|name| format!("session {name} · "))
            .unwrap_or_default(),
        state.messages.len(),
        usage
            .input
            .saturating_add(usage.cache_read)
            .saturating_add(usage.cache_write),
        usage.output,
        usage.cost.total,
        state
            .error
            .as_deref()
            .map(|error| format!(" · last error: {error}"))
            .unwrap_or_default()
    );
}

/// Whether the agent is done: no run going, and every event it published
/// written (`written` is the number after the last one).
fn finished(agent: &AgentHandle, written: u64) -> bool {
    agent.status() != AgentStatus::Running && written >= agent.next_seq()
}

/// Whether messages wait in the agent's queues.
async fn queued(agent: &AgentHandle) -> bool {
    agent.has_queued_messages().await.unwrap_or(false)
}

/// Shows that input is awaited.
fn ready() {
    crate::say_part!("> ");
}

#[cfg(test)]
mod tests {
    use super::Line;

    #[test]
    fn lines_are_prompts_or_commands() {
        assert_eq!(Line::parse("  hello there "), Line::Prompt("hello there"));
        assert_eq!(Line::parse("   "), Line::Empty);
        assert_eq!(Line::parse("/follow and then?"), Line::Follow("and then?"));
        assert_eq!(Line::parse("/follow"), Line::Unknown("/follow"));
        assert_eq!(Line::parse("/file  a b.pdf "), Line::File("a b.pdf"));
        assert_eq!(Line::parse("/file"), Line::Unknown("/file"));
        assert_eq!(Line::parse("/quit"), Line::Quit);
        assert_eq!(Line::parse("/state"), Line::State);
        assert_eq!(Line::parse("/compact"), Line::Compact(""));
        assert_eq!(
            Line::parse("/compact keep the numbers "),
            Line::Compact("keep the numbers")
        );
        assert_eq!(Line::parse("/reset now"), Line::Unknown("/reset now"));
        assert_eq!(Line::parse("/frobnicate"), Line::Unknown("/frobnicate"));
    }
}
