//! A tool that asks the user for what it lacks, and a call that waits for approval.
//!
//! ```text
//! cargo run --example ask_user                   # answers typed on standard input
//! echo "Friday at 10" | cargo run --example ask_user
//! ```
//!
//! The agent sets reminders with a `remind` tool that needs a `due` time; asked to
//! "remind me to call Juan", the model calls it without one, the tool answers
//! `ToolError::needs_input`, and the run parks (`RunEnd::Parked`) with the question.
//! The example reads the answer from standard input and hands it to
//! `AgentHandle::answer`; it goes straight into the waiting call's arguments, and the
//! call runs again with it, no model turn between (`RunOptions::answers` set to
//! `Answers::ToModel` gives the answer to the model instead). The tool's calls also
//! wait for approval (`Approval::Ask`), the arguments the answer completed included:
//! `y` runs the call, anything else denies it.
//!
//! With no provider configured the agent talks to Tiller's scripted `faux` model; set
//! `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` or `TILLER_BASE_URL` (see the README) to give
//! it a real one.

use std::error::Error;
use std::sync::Arc;

use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentSettings, AgentSpec, Model, Prompt, RunEnd, Supervisor, ToolError, ToolSet,
    ai::Message,
    run::{Approval, Reply, UserRequest},
    tool,
};

/// Set a reminder.
#[tool]
async fn remind(what: String, due: Option<String>) -> Result<String, ToolError> {
    let due = due.ok_or_else(|| ToolError::needs_input("due", "When should I remind you?"))?;
    Ok(format!("Reminder set: {what}, {due}."))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut settings = tiller::ai::env::from_env()?
        .map_or_else(|| AgentSettings::new(scripted_model()), AgentSettings::from)
        .with_system_prompt("You set reminders with the remind tool.")
        .with_tools(ToolSet::new([Arc::new(RemindTool) as _])?);
    settings
        .definition
        .run
        .approvals
        .insert("remind".into(), Approval::Ask);
    let supervisor = Supervisor::start().await?;
    let agent = supervisor.spawn(AgentSpec::new(settings)).await?;

    let mut outcome = agent.run("Remind me to call Juan.").await?;
    let mut lines = std::io::stdin().lines();
    // Each reply is a run of its own, which may park again.
    while outcome.end == RunEnd::Parked {
        let Some(request) = agent.state().await?.waiting.into_iter().next() else {
            break;
        };
        // A reply names the request it answers: the waiting call's id.
        let id = request.tool_call_id().to_owned();
        let reply = match request {
            UserRequest::Input { question, .. } => {
                println!("{question}");
                let text = lines
                    .next()
                    .transpose()?
                    .unwrap_or_else(|| "Friday at 10".into());
                Reply::answer(id, text)
            }
            UserRequest::Approval {
                tool_name, args, ..
            } => {
                println!("Run {tool_name} {args}? (y/n)");
                match lines.next().transpose()?.as_deref().map(str::trim) {
                    Some("y") | None => Reply::approve(id),
                    Some(_) => Reply::deny(id, Some("the user said no".into())),
                }
            }
        };
        outcome = agent.run(Prompt::Reply(reply)).await?;
    }
    println!("{}", outcome.text());
    supervisor.shutdown().await;
    Ok(())
}

/// The faux model: it calls `remind` without a time, then says what the tool did
/// (or, were the answer given to it, calls `remind` again with it).
fn scripted_model() -> Model {
    eprintln!("No provider configured (see the README): using the scripted faux model.");
    let faux = FauxProvider::new();
    faux.respond_with(|request| match request.context.messages.last() {
        Some(Message::ToolResult(result)) => {
            match result.text_content().split_once("The user answered: ") {
                Some((_, answer)) => FauxTurn::tool_call(
                    "remind",
                    json!({"what": "call Juan", "due": answer.lines().next().unwrap_or_default()}),
                ),
                None => FauxTurn::text(result.text_content()),
            }
        }
        _ => FauxTurn::tool_call("remind", json!({"what": "call Juan"})),
    });
    faux.model()
}
