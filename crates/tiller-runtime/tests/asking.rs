//! Agents that wait for the user: a tool's question and a call's approval park the
//! run; `answer`, `approve` and `deny` resume it; the parked run survives the
//! process (a new supervisor on the same SQLite file) and an abort gives it up.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::{assert_valid, remind, roles, tools};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::SqlStore;
use tiller::{
    AgentError, AgentEvent, AgentSettings, AgentSpec, AgentTool, Delivered, FnTool, RunEnd,
    Supervisor, SupervisorConfig, ToolOutput,
    run::{Approval, ContinueError, UserRequest},
    runtime::AgentStatus,
    store::SessionStore,
};
use tiller_test_support::sqlite::TempSqlite;

fn question() -> UserRequest {
    UserRequest::Input {
        tool_call_id: "c1".into(),
        tool_name: "remind".into(),
        field: "due".into(),
        question: "When?".into(),
        current_data: json!({"what": "call Juan"}),
    }
}

/// The seeds' flow: "remind me to call Juan" → "When?" → the answer → done.
#[tokio::test]
async fn the_tool_asks_the_user_answers_and_the_tool_succeeds() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("c1", "remind", json!({"what": "call Juan"})));
    faux.push(FauxTurn::text("I'll remind you on Friday at 10:00."));
    let done = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(
            AgentSettings::new(faux.model()).with_tools(tools(vec![remind(&done, "When?")])),
        ))
        .await
        .unwrap();
    let mut events = agent.subscribe();

    let outcome = agent.run("remind me to call Juan").await.unwrap();
    assert_eq!(outcome.end, RunEnd::Parked);
    assert_eq!(agent.status(), AgentStatus::WaitingForInput);
    assert_eq!(agent.state().await.unwrap().waiting, vec![question()]);
    let mut requested = None;
    while let Some(envelope) = events.next().await {
        match &envelope.event {
            Delivered::Event(AgentEvent::InputRequested { question, .. }) => {
                requested = Some(question.clone());
            }
            Delivered::Event(AgentEvent::AgentEnd { .. }) => break,
            _ => {}
        }
    }
    assert_eq!(requested.as_deref(), Some("When?"));

    // Anything but the answer is refused, with what waits.
    assert_eq!(
        agent.prompt("something else").await.unwrap_err(),
        AgentError::CannotStart(ContinueError::WaitingForReply {
            waiting: Box::new(question())
        })
    );
    assert_eq!(
        agent.approve("c1").await.unwrap_err(),
        AgentError::CannotStart(ContinueError::ReplyDoesNotFit {
            waiting: Box::new(question())
        })
    );

    agent.answer("c1", "Friday 10:00").await.unwrap();
    agent.wait_for_idle().await;
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert_eq!(*done.lock().unwrap(), ["call Juan @ Friday 10:00"]);
    let state = agent.state().await.unwrap();
    assert_valid(&state.messages);
    // The answer went into the waiting call, which ran again: no model turn
    // between the question and the result.
    assert_eq!(
        roles(&state.messages),
        [
            "user",
            "assistant",
            "custom",
            "custom",
            "tool_result",
            "assistant"
        ]
    );
    assert_eq!(faux.requests().len(), 2);
    assert_eq!(
        agent.answer("c1", "again").await.unwrap_err(),
        AgentError::CannotStart(ContinueError::NothingToReply)
    );
    supervisor.shutdown().await;
}

/// A parked question outlives its process: a new supervisor on the same SQLite
/// file finds the agent waiting, and the answer resumes the same call.
#[tokio::test]
async fn a_parked_run_survives_a_restart_on_sqlite() {
    let db = TempSqlite::new();
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("c1", "remind", json!({"what": "call Juan"})));
    let done = Arc::new(Mutex::new(Vec::new()));
    let settings = AgentSettings::new(faux.model()).with_tools(tools(vec![remind(&done, "When?")]));

    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let first = Supervisor::with_store(SupervisorConfig::default(), store)
        .await
        .unwrap();
    let agent = first
        .spawn(AgentSpec::new(settings.clone()).with_session("juan"))
        .await
        .unwrap();
    assert_eq!(
        agent.run("remind me to call Juan").await.unwrap().end,
        RunEnd::Parked
    );
    first.shutdown().await;

    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let second = Supervisor::with_store(SupervisorConfig::default(), store)
        .await
        .unwrap();
    let resumed = second.resume(|_| Some(settings.clone())).await.unwrap();
    let agent = &resumed[0];
    assert_eq!(agent.status(), AgentStatus::WaitingForInput);
    assert_eq!(agent.state().await.unwrap().waiting, vec![question()]);

    faux.push(FauxTurn::text("Done."));
    agent.answer("c1", "Friday").await.unwrap();
    agent.wait_for_idle().await;
    // The answer went into the call parked before the restart.
    assert_eq!(*done.lock().unwrap(), ["call Juan @ Friday"]);
    let sent = serde_json::to_string(&faux.requests()[1].context.messages).unwrap();
    assert!(sent.contains("Reminder set for Friday"), "{sent}");
    second.shutdown().await;
}

/// An abort while parked gives the question up: the call is answered as cancelled
/// and the agent takes prompts again.
#[tokio::test]
async fn an_abort_gives_up_a_waiting_question() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("c1", "remind", json!({"what": "x"})));
    let done = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(
            AgentSettings::new(faux.model()).with_tools(tools(vec![remind(&done, "When?")])),
        ))
        .await
        .unwrap();
    agent.run("remind me").await.unwrap();
    agent.abort();
    faux.push(FauxTurn::text("Fine."));
    let outcome = agent.run("never mind").await.unwrap();
    assert_eq!(outcome.end, RunEnd::Completed);
    let state = agent.state().await.unwrap();
    assert_valid(&state.messages);
    assert_eq!(
        state.messages[3].as_tool_result().unwrap().text_content(),
        "Tool call \"remind\" was not executed: the user gave up on the request."
    );
    supervisor.shutdown().await;
}

/// A call that needs approval waits; `deny` answers it with the reason, `approve`
/// runs it.
#[tokio::test]
async fn approvals_park_the_call_until_approved_or_denied() {
    let faux = FauxProvider::new();
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let delete = {
        let deleted = deleted.clone();
        Arc::new(FnTool::new(
            "delete",
            "Delete a file",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            move |args, _ctx| {
                let deleted = deleted.clone();
                async move {
                    deleted
                        .lock()
                        .unwrap()
                        .push(args["path"].as_str().unwrap().to_owned());
                    Ok(ToolOutput::text("deleted"))
                }
            },
        )) as Arc<dyn AgentTool>
    };
    let mut settings = AgentSettings::new(faux.model()).with_tools(tools(vec![delete]));
    settings
        .definition
        .run
        .approvals
        .insert("delete".into(), Approval::Ask);
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor.spawn(AgentSpec::new(settings)).await.unwrap();

    faux.push(FauxTurn::new().with_tool_call_id("a", "delete", json!({"path": "/a"})));
    assert_eq!(agent.run("delete /a").await.unwrap().end, RunEnd::Parked);
    assert_eq!(
        agent.state().await.unwrap().waiting,
        vec![UserRequest::Approval {
            tool_call_id: "a".into(),
            tool_name: "delete".into(),
            args: json!({"path": "/a"}),
            reason: None,
        }]
    );
    faux.push(FauxTurn::text("Kept it."));
    agent.deny("a", Some("keep it".into())).await.unwrap();
    agent.wait_for_idle().await;
    assert!(deleted.lock().unwrap().is_empty());

    faux.push(FauxTurn::new().with_tool_call_id("b", "delete", json!({"path": "/b"})));
    agent.run("delete /b").await.unwrap();
    faux.push(FauxTurn::text("Deleted."));
    agent.approve("b").await.unwrap();
    agent.wait_for_idle().await;
    assert_eq!(*deleted.lock().unwrap(), ["/b"]);
    let state = agent.state().await.unwrap();
    assert_valid(&state.messages);
    assert_eq!(
        state.messages[3].as_tool_result().unwrap().text_content(),
        "The user denied this call: keep it"
    );
    supervisor.shutdown().await;
}
