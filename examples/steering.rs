//! Steering an agent mid-run from another task.
//!
//! ```text
//! cargo run --example steering                 # the steer interrupts the slow tool
//! cargo run --example steering -- --after-turn # the tool finishes; the steer follows
//! ```
//!
//! The agent starts two slow `research` calls, a short one and a long one. A second
//! task, watching the agent's events through its own subscription, sends a steering
//! message as soon as a call reports progress. With the default delivery
//! (`SteeringDelivery::Interrupt`) the loop takes the steering when the short call
//! finishes, cancels the long one and answers it "Skipped due to queued user
//! message."; with `--after-turn` both calls finish first. Either way the steering
//! message reaches the model in the next turn, and a follow-up queued meanwhile runs
//! after the answer. Ctrl-C aborts.
//!
//! With no provider configured the agent talks to Tiller's scripted `faux` model; set
//! `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` or `TILLER_BASE_URL` (see the README) to give
//! it a real one.

use std::error::Error;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentEvent, AgentHandle, AgentSettings, AgentSpec, AgentTool, Delivered, FnTool, Model, Prompt,
    Supervisor, ToolError, ToolOutput, ToolSet,
    ai::{AssistantEvent, Message},
    run::SteeringDelivery,
    runtime::Queues,
};

const STEER: &str = "Stop researching: one sentence is all I need.";
const FOLLOW_UP: &str = "Thanks. Who looks after Rust today?";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let delivery = if std::env::args().any(|arg| arg == "--after-turn") {
        SteeringDelivery::AfterTurn
    } else {
        SteeringDelivery::Interrupt
    };
    let mut settings = tiller::ai::env::from_env()?
        .map_or_else(|| AgentSettings::new(scripted_model()), AgentSettings::from)
        .with_system_prompt("You are a research assistant. Use the research tool before answering.")
        .with_tools(ToolSet::new([
            Arc::new(research_tool()) as Arc<dyn AgentTool>
        ])?);
    settings.definition.run.steering_delivery = delivery;

    let supervisor = Supervisor::start().await?;
    let agent = supervisor.spawn(AgentSpec::new(settings)).await?;
    abort_on_ctrl_c(agent.clone());

    // The steering task has its own subscription: any task holding a handle can.
    let steerer = tokio::spawn(steer_when_the_tool_reports(agent.clone()));

    let mut events = agent.subscribe();
    agent
        .prompt("Write me a detailed report on the history of Rust.")
        .await?;
    print_until_idle(&agent, &mut events).await;
    steerer.abort(); // a real model may answer without researching

    let state = agent.state().await?;
    eprintln!(
        "\n[{} messages in the transcript; error: {}]",
        state.messages.len(),
        state.error.as_deref().unwrap_or("none")
    );
    supervisor.shutdown().await;
    Ok(())
}

/// Waits for the first progress report of a tool, then steers the agent and queues a
/// follow-up.
async fn steer_when_the_tool_reports(agent: AgentHandle) {
    let mut events = agent.subscribe();
    while let Some(envelope) = events.next().await {
        if let Delivered::Event(AgentEvent::ToolExecutionUpdate { .. }) = envelope.event {
            eprintln!("\n[another task steers: {STEER:?}]");
            let steered = match agent.steer(STEER).await {
                Ok(()) => agent.follow_up(FOLLOW_UP).await,
                Err(error) => Err(error),
            };
            if let Err(error) = steered {
                eprintln!("[could not steer: {error}]");
            }
            return;
        }
    }
}

/// Prints the run as it happens, until the agent is idle with nothing queued.
async fn print_until_idle(agent: &AgentHandle, events: &mut tiller::runtime::Subscription) {
    while let Some(envelope) = events.next().await {
        let Delivered::Event(event) = &envelope.event else {
            continue;
        };
        match event {
            AgentEvent::MessageStart { message } => {
                if let Some(user) = message.as_user() {
                    eprintln!("\n> {}", user.text_content());
                }
            }
            AgentEvent::MessageUpdate {
                assistant_message_event: AssistantEvent::TextDelta { delta, .. },
                ..
            } => {
                print!("{delta}");
                let _ = std::io::stdout().flush();
            }
            AgentEvent::ToolExecutionStart {
                tool_name, args, ..
            } => eprintln!("[{tool_name} {args}]"),
            AgentEvent::ToolExecutionUpdate { partial_result, .. } => {
                eprintln!("[... {}]", partial_result.text_content());
            }
            AgentEvent::ToolExecutionEnd {
                result, is_error, ..
            } => eprintln!(
                "[{} {}]",
                if *is_error { "failed:" } else { "done:" },
                result.text_content()
            ),
            AgentEvent::AgentEnd { reason, .. } => {
                println!();
                eprintln!("[run ended: {reason:?}]");
                // A follow-up that arrived as the run was ending waits for us.
                if !agent.has_queued_messages().await.unwrap_or(false)
                    || agent.prompt(Prompt::Continue).await.is_err()
                {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// A pretend research tool: one slow step per source, each reported, stopping when
/// cancelled.
fn research_tool() -> FnTool {
    let parameters = json!({
        "type": "object",
        "properties": {
            "topic": {"type": "string"},
            "sources": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3}
        },
        "required": ["topic"]
    });
    FnTool::new(
        "research",
        "Research a topic by reading some sources (slow).",
        parameters,
        |args, ctx| async move {
            let topic = args["topic"].as_str().unwrap_or_default().to_owned();
            let sources = args["sources"].as_u64().unwrap_or(3);
            for read in 1..=sources {
                tokio::select! {
                    () = ctx.cancel().cancelled() => return Err(ToolError::new("research cancelled")),
                    () = tokio::time::sleep(Duration::from_millis(400)) => {}
                }
                ctx.update(ToolOutput::text(format!(
                    "{topic}: {read}/{sources} sources read"
                )));
            }
            Ok(ToolOutput::text(format!(
                "Notes on {topic}: {}",
                notes(&topic)
            )))
        },
    )
}

fn notes(topic: &str) -> &'static str {
    if topic.contains("origin") {
        "begun by Graydon Hoare in 2006; sponsored by Mozilla from 2009."
    } else {
        "1.0 in May 2015; editions in 2018, 2021 and 2024; the Rust Foundation since 2021."
    }
}

/// A scripted model that researches first, answers at length unless steered, and
/// answers the follow-up.
fn scripted_model() -> Model {
    eprintln!("No provider configured (see the README): using the scripted faux model.");
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        let reply = match request.context.messages.last() {
            Some(Message::ToolResult(_)) => {
                "Rust began in 2006 as Graydon Hoare's side project. Mozilla sponsored it from \
                 2009, and after years of redesign, with the borrow checker at its heart, it \
                 reached 1.0 in May 2015. Since 2021 the Rust Foundation has supported it."
            }
            Some(Message::User(user)) if user.text_content() == STEER => {
                "Rust is a systems language begun in 2006 that reached 1.0 in 2015."
            }
            Some(Message::User(user)) if user.text_content() == FOLLOW_UP => {
                "The Rust Project's teams, with the Rust Foundation's support."
            }
            _ => {
                return FauxTurn::tool_call(
                    "research",
                    json!({"topic": "Rust's origins", "sources": 2}),
                )
                .with_tool_call("research", json!({"topic": "Rust since 1.0", "sources": 5}));
            }
        };
        FauxTurn::text(reply)
            .chunk_size(6)
            .delay(Duration::from_millis(20))
    });
    faux.model()
}

fn abort_on_ctrl_c(agent: AgentHandle) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            // Nothing more to do if the agent is already gone.
            let _ = agent.clear_queues(Queues::Both).await;
            agent.abort();
        }
    });
}
