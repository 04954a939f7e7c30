//! Sessions that branch: a conversation forked before its second question and
//! carried on from there with another, the original left as it was. On the
//! scripted `faux` model, so it runs anywhere:
//!
//! ```text
//! cargo run --example branches
//! ```

use std::sync::Arc;

use tiller::{AgentHandle, AgentSettings, AgentSpec, Supervisor, SupervisorConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // In SQLite or PostgreSQL (`sqlite://…`, `postgres://…`) a branch shares
    // the rows of the messages it begins with; here, in memory.
    let store = tiller::store::open("memory:").await?;
    let supervisor = Supervisor::with_store(SupervisorConfig::default(), store).await?;
    let settings = Arc::new(AgentSettings::new(tiller::faux::demo_model()));
    let spawn =
        |session: &str| supervisor.spawn(AgentSpec::new(settings.clone()).with_session(session));
    let trip = spawn("trip").await?;
    trip.run("Plan a day in Lyon.").await?;
    trip.run("Now one in Paris.").await?;
    // The second question again, edited: a branch of the first two messages.
    trip.fork(2, "trip-nice").await?;
    let nice = spawn("trip-nice").await?;
    println!("{}", nice.run("Now one in Nice.").await?.text());
    for agent in [&trip, &nice] {
        println!("{}: {}", agent.session_id(), questions(agent).await?);
    }
    supervisor.shutdown().await;
    Ok(())
}

/// The user's messages of `agent`'s transcript, in order.
async fn questions(agent: &AgentHandle) -> Result<String, tiller::AgentError> {
    let state = agent.state().await?;
    let asked: Vec<String> = state
        .messages
        .iter()
        .filter_map(|message| Some(message.as_user()?.text_content()))
        .collect();
    Ok(asked.join(" | "))
}
