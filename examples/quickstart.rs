//! One agent, one tool, its answer streamed to the terminal.
//!
//! ```text
//! cargo run --example quickstart -- "What is 1234.5 plus 678.9?"
//! ```
//!
//! With no provider configured the agent talks to Tiller's scripted `faux` model, so
//! this runs anywhere; set `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` or `TILLER_BASE_URL`
//! (see the README) to give it a real one.

use std::error::Error;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentEvent, AgentSettings, AgentSpec, AgentTool, Delivered, FnTool, Model, Supervisor,
    ToolOutput, ToolSet,
    ai::{AssistantEvent, Message},
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let question = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let question = if question.is_empty() {
        "What is 1234.5 plus 678.9?".to_owned()
    } else {
        question
    };

    // A tool is a name, a description, a JSON Schema for its arguments and an async
    // function. Arguments are validated against the schema before it runs.
    let add = FnTool::new(
        "add",
        "Add two numbers.",
        json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"]
        }),
        |args, _ctx| async move {
            let sum: f64 = ["a", "b"].iter().filter_map(|k| args[k].as_f64()).sum();
            Ok(ToolOutput::text(sum.to_string()))
        },
    );
    let settings = tiller::ai::env::from_env()?
        .map_or_else(|| AgentSettings::new(scripted_model()), AgentSettings::from)
        .with_system_prompt("You are a careful assistant. Use the add tool for arithmetic.")
        .with_tools(ToolSet::new([Arc::new(add) as Arc<dyn AgentTool>])?);

    let supervisor = Supervisor::start().await?;
    let agent = supervisor
        .spawn(AgentSpec::new(settings).with_name("calculator"))
        .await?;

    let mut events = agent.subscribe();
    agent.prompt(question).await?;
    while let Some(envelope) = events.next().await {
        let Delivered::Event(event) = &envelope.event else {
            continue;
        };
        match event {
            AgentEvent::MessageUpdate {
                assistant_message_event: AssistantEvent::TextDelta { delta, .. },
                ..
            } => {
                print!("{delta}");
                std::io::stdout().flush()?;
            }
            AgentEvent::ToolExecutionStart {
                tool_name, args, ..
            } => eprintln!("[{tool_name} {args}]"),
            AgentEvent::ToolExecutionEnd { result, .. } => {
                eprintln!("[= {}]", result.text_content());
            }
            AgentEvent::AgentEnd { .. } => break,
            _ => {}
        }
    }
    println!();

    let state = agent.state().await?;
    if let Some(error) = state.error {
        eprintln!("error: {error}");
    }
    supervisor.shutdown().await;
    Ok(())
}

/// A scripted model: it hands the first two numbers of the question to `add`, then
/// reports the tool's answer, streamed a few characters at a time.
fn scripted_model() -> Model {
    eprintln!("No provider configured (see the README): using the scripted faux model.");
    let faux = FauxProvider::new();
    faux.respond_with(|request| match request.context.messages.last() {
        Some(Message::ToolResult(result)) => {
            FauxTurn::text(format!("The sum is {}.", result.text_content()))
                .chunk_size(4)
                .delay(Duration::from_millis(30))
        }
        _ => {
            let question = request.last_user_text().unwrap_or_default();
            let numbers: Vec<f64> = question
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .filter_map(|word| word.parse().ok())
                .collect();
            match numbers[..] {
                [a, b, ..] => FauxTurn::tool_call("add", json!({"a": a, "b": b})),
                _ => FauxTurn::text("Give me two numbers and I will add them."),
            }
        }
    });
    faux.model()
}
