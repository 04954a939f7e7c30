//! Agents that hand work to each other with `ask_agent`: planner → researcher →
//! writer on a scripted model, the sub-agents' events in the planner's stream with
//! their paths and in order, the answer not streamed twice, the caller's context
//! inherited, an abort reaching every descendant, and cycles refused.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller::agents::agent_file::AgentFile;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    AgentContext, AgentEvent, AgentHandle, AgentTool, Definitions, Delivered, Envelope, FnTool,
    RunEnd, RunOutcome, Supervisor, ToolError, ToolOutput,
    agents::{AskAgentConfig, ToolRegistry},
    ai::AssistantEvent,
};

/// An agent file named `name` listing `tools`.
fn agent(name: &str, tools: &[&str]) -> AgentFile {
    let tools: String = tools
        .iter()
        .map(|tool| format!("\n    - name: {tool}"))
        .collect();
    let text = format!(
        "type: object\ndescription: You are the {name}.\njson_schema_extra:\n  kind: agent\n  name: {name}\n  tools:{tools}\n"
    );
    AgentFile::parse(format!("{name}.yaml"), &text).unwrap()
}

/// A `whoami` tool recording who it works for, and a `stall` tool that waits to be
/// cancelled and records it.
fn registry(seen: &Arc<Mutex<Vec<Value>>>) -> ToolRegistry {
    let whoami = {
        let seen = seen.clone();
        FnTool::new(
            "whoami",
            "Who am I working for?",
            json!({"type": "object"}),
            move |_, ctx| {
                let seen = seen.clone();
                async move {
                    let path = ctx.agent().agents().to_vec();
                    seen.lock().unwrap().push(json!({
                        "user": ctx.agent().user_id(),
                        "tenant": ctx.agent().tenant_id(),
                        "path": path,
                    }));
                    Ok(ToolOutput::text("u-7 of acme"))
                }
            },
        )
    };
    let stall = {
        let seen = seen.clone();
        FnTool::new(
            "stall",
            "Wait forever",
            json!({"type": "object"}),
            move |_, ctx| {
                let seen = seen.clone();
                async move {
                    ctx.cancel().cancelled().await;
                    seen.lock().unwrap().push(json!("stall cancelled"));
                    Ok(ToolOutput::text("cancelled"))
                }
            },
        )
    };
    let when = FnTool::new(
        "when",
        "Ask when",
        json!({"type": "object", "properties": {"due": {"type": "string"}}}),
        |args, _| async move {
            match args["due"].as_str() {
                Some(due) => Ok(ToolOutput::text(format!("due {due}"))),
                None => Err(ToolError::needs_input("due", "When?")),
            }
        },
    );
    ToolRegistry::new()
        .with(Arc::new(whoami) as Arc<dyn AgentTool>)
        .with(Arc::new(stall))
        .with(Arc::new(when))
}

/// Definitions of planner, researcher and writer on `faux`, with `ask_agent`.
fn definitions(
    faux: &FauxProvider,
    supervisor: &Supervisor,
    seen: &Arc<Mutex<Vec<Value>>>,
) -> Definitions {
    definitions_with(faux, supervisor, seen, AskAgentConfig::default())
}

fn definitions_with(
    faux: &FauxProvider,
    supervisor: &Supervisor,
    seen: &Arc<Mutex<Vec<Value>>>,
    config: AskAgentConfig,
) -> Definitions {
    let files = [
        agent("planner", &["ask_agent"]),
        agent("researcher", &["ask_agent"]),
        agent("writer", &["whoami", "stall", "when"]),
    ];
    of_files(faux, seen, files).with_ask_agent(supervisor, config)
}

/// Definitions of `files` on `faux`, with the registry's tools.
fn of_files(
    faux: &FauxProvider,
    seen: &Arc<Mutex<Vec<Value>>>,
    files: impl IntoIterator<Item = AgentFile>,
) -> Definitions {
    let mut definitions = Definitions::new()
        .with_tools(registry(seen))
        .with_default_model(faux.model());
    for file in files {
        definitions.insert(file).unwrap();
    }
    definitions
}

fn ask(id: &str, agent: &str, text: &str) -> FauxTurn {
    FauxTurn::new().with_tool_call_id(id, "ask_agent", json!({"agent": agent, "text": text}))
}

async fn planner(definitions: &Definitions, supervisor: &Supervisor) -> AgentHandle {
    let context = AgentContext::new()
        .with_user_id("u-7")
        .with_tenant_id("acme");
    let spec = definitions
        .spec("planner", None)
        .unwrap()
        .with_name("planner")
        .with_context(context);
    supervisor.spawn(spec).await.unwrap()
}

/// A planner and a writer whose `whoami` calls wait for the user's approval.
fn approving_writer(
    faux: &FauxProvider,
    supervisor: &Supervisor,
    seen: &Arc<Mutex<Vec<Value>>>,
) -> Definitions {
    let writer = "type: object\ndescription: You write.\njson_schema_extra:\n  kind: agent\n  name: writer\n  tools: [{name: whoami}]\n  approvals: {whoami: ask}\n";
    let files = [
        agent("planner", &["ask_agent"]),
        AgentFile::parse("writer.yaml", writer).unwrap(),
    ];
    of_files(faux, seen, files).with_ask_agent(supervisor, AskAgentConfig::default())
}

/// What the planner's researcher was answered when it asked the writer.
async fn researchers_answer(supervisor: &Supervisor, planner: &AgentHandle) -> String {
    let researcher = supervisor
        .store()
        .load(&format!("{}/researcher", planner.session_id()))
        .await
        .unwrap()
        .unwrap();
    researcher.messages[2]
        .as_tool_result()
        .unwrap()
        .text_content()
}

/// The texts of a run's tool results, in order.
fn tool_results(outcome: &RunOutcome) -> Vec<String> {
    outcome
        .messages
        .iter()
        .filter_map(|m| m.as_tool_result())
        .map(|r| r.text_content())
        .collect()
}

/// A child event as `path type [call]`, message updates left out.
fn line(envelope: &Envelope) -> Option<String> {
    let Delivered::Event(AgentEvent::ChildEvent { path, event, .. }) = &envelope.event else {
        return None;
    };
    let value = serde_json::to_value(&**event).unwrap();
    let kind = value["type"].as_str().unwrap().to_owned();
    if kind == "message_update" {
        return None;
    }
    let detail = match &**event {
        AgentEvent::ToolExecutionStart { tool_name, .. }
        | AgentEvent::ToolExecutionEnd { tool_name, .. } => format!(" {tool_name}"),
        AgentEvent::MessageStart { message } | AgentEvent::MessageEnd { message } => {
            format!(" {}", message.role())
        }
        _ => String::new(),
    };
    Some(format!("{} {kind}{detail}", path.join("/")))
}

#[tokio::test]
async fn three_agents_delegate_with_nested_events_in_order_and_inherited_context() {
    let faux = FauxProvider::new();
    faux.push(ask("p1", "researcher", "find facts"));
    faux.push(ask("r1", "writer", "write it up"));
    faux.push(FauxTurn::new().with_tool_call_id("w1", "whoami", json!({})));
    faux.push(FauxTurn::text("The draft."));
    faux.push(FauxTurn::text("Research: The draft."));
    faux.push(FauxTurn::text("All done."));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = definitions(&faux, &supervisor, &seen);
    let planner = planner(&definitions, &supervisor).await;
    let mut events = planner.subscribe();

    let outcome = planner.run("plan it").await.unwrap();
    assert_eq!(outcome.text(), "All done.");
    assert_eq!(
        *seen.lock().unwrap(),
        [json!({"user": "u-7", "tenant": "acme", "path": ["planner", "researcher", "writer"]})]
    );

    let mut envelopes = Vec::new();
    while let Some(envelope) = events.next().await {
        let end = matches!(
            envelope.event,
            Delivered::Event(AgentEvent::AgentEnd { .. })
        );
        envelopes.push(envelope);
        if end {
            break;
        }
    }
    let nested: Vec<String> = envelopes.iter().filter_map(|e| line(e)).collect();
    let r = "planner/researcher";
    let w = "planner/researcher/writer";
    let expected: Vec<String> = [
        format!("{r} agent_start"),
        format!("{r} turn_start"),
        format!("{r} message_start user"),
        format!("{r} message_end user"),
        format!("{r} message_start assistant"),
        format!("{r} message_end assistant"),
        format!("{r} tool_execution_start ask_agent"),
        format!("{w} agent_start"),
        format!("{w} turn_start"),
        format!("{w} message_start user"),
        format!("{w} message_end user"),
        format!("{w} message_start assistant"),
        format!("{w} message_end assistant"),
        format!("{w} tool_execution_start whoami"),
        format!("{w} tool_execution_end whoami"),
        format!("{w} message_start tool_result"),
        format!("{w} message_end tool_result"),
        format!("{w} turn_end"),
        format!("{w} turn_start"),
        format!("{w} message_start assistant"),
        format!("{w} message_end assistant"),
        format!("{w} turn_end"),
        format!("{w} agent_end"),
        format!("{r} tool_execution_end ask_agent"),
        format!("{r} message_start tool_result"),
        format!("{r} message_end tool_result"),
        format!("{r} turn_end"),
        format!("{r} turn_start"),
        format!("{r} message_start assistant"),
        format!("{r} message_end assistant"),
        format!("{r} turn_end"),
        format!("{r} agent_end"),
    ]
    .into();
    assert_eq!(nested, expected);

    // The nested events sit between the planner's own start and end of the call.
    let position = |wanted: &dyn Fn(&AgentEvent) -> bool| {
        envelopes
            .iter()
            .position(|e| matches!(&e.event, Delivered::Event(event) if wanted(event)))
            .unwrap()
    };
    let started = position(
        &|e| matches!(e, AgentEvent::ToolExecutionStart { tool_call_id, .. } if tool_call_id == "p1"),
    );
    let ended = position(
        &|e| matches!(e, AgentEvent::ToolExecutionEnd { tool_call_id, .. } if tool_call_id == "p1"),
    );
    let first_child = position(&|e| matches!(e, AgentEvent::ChildEvent { .. }));
    assert!(started < first_child && first_child < ended);

    // The researcher's answer streamed once, as its own events: the planner's end
    // of the call does not repeat it, and its transcript keeps it for the model.
    let Delivered::Event(AgentEvent::ToolExecutionEnd {
        result, is_error, ..
    }) = &envelopes[ended].event
    else {
        unreachable!()
    };
    assert!(!is_error);
    assert!(result.content.is_empty() && result.streamed);
    let state = planner.state().await.unwrap();
    assert_eq!(
        state.messages[2].as_tool_result().unwrap().text_content(),
        "Research: The draft."
    );
    let texts = envelopes
        .iter()
        .filter(|e| {
            serde_json::to_string(&e.event)
                .unwrap()
                .contains("Research: The draft.")
        })
        .filter(|e| {
            !matches!(
                &e.event,
                Delivered::Event(
                    AgentEvent::MessageEnd { .. }
                        | AgentEvent::TurnEnd { .. }
                        | AgentEvent::AgentEnd { .. }
                        | AgentEvent::ChildEvent { .. }
                )
            )
        })
        .count();
    assert_eq!(
        texts, 0,
        "the planner's own events do not stream the answer again"
    );
    // The sub-agents are gone once they answered.
    assert_eq!(supervisor.list().len(), 1);
    supervisor.shutdown().await;
}

#[tokio::test]
async fn aborting_the_planner_aborts_every_descendant() {
    let faux = FauxProvider::new();
    faux.push(ask("p1", "researcher", "find facts"));
    faux.push(ask("r1", "writer", "write it up"));
    faux.push(FauxTurn::new().with_tool_call_id("w1", "stall", json!({})));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = definitions(&faux, &supervisor, &seen);
    let planner = planner(&definitions, &supervisor).await;
    let mut events = planner.subscribe();
    planner.prompt("plan it").await.unwrap();
    while let Some(envelope) = events.next().await {
        if let Delivered::Event(AgentEvent::ChildEvent { event, path, .. }) = &envelope.event
            && matches!(&**event, AgentEvent::ToolExecutionStart { tool_name, .. } if tool_name == "stall")
        {
            assert_eq!(path, &["planner", "researcher", "writer"]);
            break;
        }
    }
    planner.abort();
    planner.wait_for_idle().await;
    assert_eq!(*seen.lock().unwrap(), [json!("stall cancelled")]);
    let state = planner.state().await.unwrap();
    let result = state.messages[2].as_tool_result().unwrap();
    assert!(result.is_error);
    assert_eq!(result.text_content(), "`researcher` was aborted");
    assert_eq!(supervisor.list().len(), 1, "the sub-agents are stopped");
    supervisor.shutdown().await;
}

#[tokio::test]
async fn a_cycle_and_an_unknown_agent_are_refused_as_error_results_the_model_reads() {
    let faux = FauxProvider::new();
    faux.push(ask("p1", "planner", "ask yourself"));
    faux.push(ask("p2", "nobody", "hello"));
    faux.push(FauxTurn::text("I give up."));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = definitions(&faux, &supervisor, &seen);
    let planner = planner(&definitions, &supervisor).await;
    let outcome = planner.run("plan it").await.unwrap();
    assert_eq!(outcome.end, RunEnd::Completed);
    let results = tool_results(&outcome);
    assert_eq!(
        results,
        [
            "cannot ask `planner`: it is already working on this request (planner → planner), which would be a cycle",
            "Validation failed for tool \"ask_agent\":\n  - /agent: \"nobody\" is not one of \"planner\", \"researcher\" or \"writer\"\n\nReceived arguments:\n{\n  \"agent\": \"nobody\",\n  \"text\": \"hello\"\n}",
        ]
    );
    supervisor.shutdown().await;
}

/// A sub-agent's question becomes the caller's: the planner parks with it (asking
/// for its call's `text`), and the user's answer, merged into the planner's
/// call, goes to the writer's own question: the writer's call runs again with it,
/// no model turn of the planner's between.
#[tokio::test]
async fn a_sub_agents_question_parks_the_caller_until_the_user_answers() {
    let faux = FauxProvider::new();
    faux.push(ask("p1", "writer", "remind me"));
    faux.push(FauxTurn::new().with_tool_call_id("w1", "when", json!({})));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = definitions(&faux, &supervisor, &seen);
    let planner = planner(&definitions, &supervisor).await;
    let outcome = planner.run("plan it").await.unwrap();
    assert_eq!(outcome.end, RunEnd::Parked);
    assert_eq!(
        planner.state().await.unwrap().waiting,
        vec![tiller::run::UserRequest::Input {
            tool_call_id: "p1".into(),
            tool_name: "ask_agent".into(),
            field: "text".into(),
            question: "(writer asks for `due`) When?".into(),
            current_data: json!({"agent": "writer", "text": "remind me"}),
        }]
    );

    faux.push(FauxTurn::text("Reminder on Friday."));
    faux.push(FauxTurn::text("Done."));
    planner.answer("p1", "Friday").await.unwrap();
    planner.wait_for_idle().await;
    let state = planner.state().await.unwrap();
    let last = state.messages.last().unwrap().as_assistant().unwrap();
    assert_eq!(last.text(), "Done.");
    // The writer kept its session: its question, the answer merged into its call,
    // the call's result and its answer.
    let writer = supervisor
        .store()
        .load(&format!("{}/writer", planner.session_id()))
        .await
        .unwrap()
        .unwrap();
    let roles: Vec<&str> = writer.messages.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "custom",
            "custom",
            "tool_result",
            "assistant"
        ]
    );
    assert_eq!(
        writer.messages[4].as_tool_result().unwrap().text_content(),
        "due Friday"
    );
    supervisor.shutdown().await;
}

/// A sub-agent that does not answer in time is aborted, and the call fails; one
/// past the depth limit is refused.
#[tokio::test]
async fn a_slow_sub_agent_times_out_and_delegation_stops_at_the_depth_limit() {
    let faux = FauxProvider::new();
    faux.push(ask("p1", "writer", "stall"));
    faux.push(FauxTurn::new().with_tool_call_id("w1", "stall", json!({})));
    faux.push(ask("p2", "researcher", "go deeper"));
    faux.push(ask("r1", "writer", "too deep"));
    faux.push(FauxTurn::text("The writer cannot be reached."));
    faux.push(FauxTurn::text("Gave up."));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let config = AskAgentConfig {
        timeout: std::time::Duration::from_millis(50),
        max_depth: 1,
        ..AskAgentConfig::default()
    };
    let definitions = definitions_with(&faux, &supervisor, &seen, config);
    let planner = planner(&definitions, &supervisor).await;
    let outcome = planner.run("plan it").await.unwrap();
    let results = tool_results(&outcome);
    assert_eq!(
        results,
        [
            "`writer` did not answer within 50ms",
            "The writer cannot be reached.",
        ]
    );
    assert_eq!(outcome.text(), "Gave up.");
    // The researcher, one level down, was refused the writer.
    assert_eq!(
        researchers_answer(&supervisor, &planner).await,
        "cannot ask `writer`: agents may delegate at most 1 levels deep (planner → researcher)"
    );
    assert_eq!(*seen.lock().unwrap(), [json!("stall cancelled")]);
    assert_eq!(supervisor.list().len(), 1);
    supervisor.shutdown().await;
}

/// Sub-agents running at once are capped over every agent: a sub-agent asking
/// for one more past the cap is refused, as an error result it reads.
#[tokio::test]
async fn sub_agents_running_at_once_are_capped() {
    let faux = FauxProvider::new();
    faux.push(ask("p1", "researcher", "go deeper"));
    faux.push(ask("r1", "writer", "write it"));
    faux.push(FauxTurn::text("The writer is busy."));
    faux.push(FauxTurn::text("Done."));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let config = AskAgentConfig {
        max_running: 1,
        ..AskAgentConfig::default()
    };
    let definitions = definitions_with(&faux, &supervisor, &seen, config);
    let planner = planner(&definitions, &supervisor).await;
    let outcome = planner.run("plan it").await.unwrap();
    assert_eq!(tool_results(&outcome), ["The writer is busy."]);
    assert_eq!(
        researchers_answer(&supervisor, &planner).await,
        "cannot ask `writer`: 1 sub-agents are running already, the most at once"
    );
    supervisor.shutdown().await;
}

/// Where allowed, the caller may name another user of its tenant for the sub-agent;
/// elsewhere the argument is refused like any unknown one.
#[tokio::test]
async fn a_sub_agent_works_for_another_user_only_where_allowed() {
    let faux = FauxProvider::new();
    let for_u9 = || {
        FauxTurn::new().with_tool_call_id(
            "p1",
            "ask_agent",
            json!({"agent": "writer", "text": "who?", "user_id": "u-9"}),
        )
    };
    faux.push(for_u9());
    faux.push(FauxTurn::new().with_tool_call_id("w1", "whoami", json!({})));
    faux.push(FauxTurn::text("u-9 it is."));
    faux.push(FauxTurn::text("Done."));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let config = AskAgentConfig {
        allow_user_override: true,
        ..AskAgentConfig::default()
    };
    let allowing = definitions_with(&faux, &supervisor, &seen, config);
    let agent = planner(&allowing, &supervisor).await;
    assert_eq!(agent.run("plan it").await.unwrap().text(), "Done.");
    assert_eq!(
        *seen.lock().unwrap(),
        [json!({"user": "u-9", "tenant": "acme", "path": ["planner", "writer"]})]
    );
    supervisor.shutdown().await;

    faux.push(for_u9());
    faux.push(FauxTurn::text("Refused."));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = definitions(&faux, &supervisor, &seen);
    let planner = planner(&definitions, &supervisor).await;
    let outcome = planner.run("plan it").await.unwrap();
    let refused = outcome.messages[2].as_tool_result().unwrap();
    assert!(refused.is_error);
    assert!(
        refused
            .text_content()
            .contains("Additional properties are not allowed ('user_id' was unexpected)"),
        "{}",
        refused.text_content()
    );
    supervisor.shutdown().await;
}

/// A sub-agent's session of the same id as one another tenant keeps (`p/writer`
/// of its own `p`) is not brought up for this tenant: the call fails, and the
/// other tenant's conversation is left as it was.
#[tokio::test]
async fn a_sub_agent_never_takes_up_another_tenants_session() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Theirs."));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = definitions(&faux, &supervisor, &seen);
    let theirs = supervisor
        .spawn(
            definitions
                .spec("writer", None)
                .unwrap()
                .with_context(AgentContext::new().with_tenant_id("other"))
                .with_session("p/writer"),
        )
        .await
        .unwrap();
    theirs.run("the code is 4217").await.unwrap();
    supervisor.stop("p/writer").await;
    let kept = supervisor.store().load("p/writer").await.unwrap().unwrap();

    faux.push(ask("p1", "writer", "what was the code?"));
    faux.push(FauxTurn::text("Could not ask."));
    let planner = supervisor
        .spawn(
            definitions
                .spec("planner", None)
                .unwrap()
                .with_id("p")
                .with_context(AgentContext::new().with_tenant_id("acme")),
        )
        .await
        .unwrap();
    let outcome = planner.run("plan it").await.unwrap();
    assert_eq!(
        tool_results(&outcome),
        ["cannot start `writer`: session `p/writer` belongs to another tenant or user"]
    );
    let after = supervisor.store().load("p/writer").await.unwrap().unwrap();
    assert_eq!(
        (
            after.messages.len(),
            after.record.epoch,
            after.record.tenant_id
        ),
        (
            kept.messages.len(),
            kept.record.epoch,
            Some("other".to_owned())
        )
    );
    supervisor.shutdown().await;
}

/// Two calls of one turn to the same definition run side by side, the second in a
/// session of its own.
#[tokio::test]
async fn two_calls_to_one_definition_in_one_turn_both_answer() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("p1", "ask_agent", json!({"agent": "writer", "text": "one"}))
            .with_tool_call_id("p2", "ask_agent", json!({"agent": "writer", "text": "two"})),
    );
    faux.push(FauxTurn::text("An answer."));
    faux.push(FauxTurn::text("An answer."));
    faux.push(FauxTurn::text("Both done."));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = definitions(&faux, &supervisor, &seen);
    let planner = planner(&definitions, &supervisor).await;
    let outcome = planner.run("plan it").await.unwrap();
    assert_eq!(tool_results(&outcome), ["An answer.", "An answer."]);
    assert_eq!(outcome.text(), "Both done.");
    let session = planner.session_id();
    let mut stored = Vec::new();
    for id in [
        format!("{session}/writer"),
        format!("{session}/writer#p2"),
        format!("{session}/writer#p1"),
    ] {
        if supervisor.store().load(&id).await.unwrap().is_some() {
            stored.push(id);
        }
    }
    assert_eq!(stored.len(), 2, "one session each: {stored:?}");
    supervisor.shutdown().await;
}

/// A call a sub-agent must have approved becomes the caller's approval request;
/// approved, the same sub-agent runs it and answers.
#[tokio::test]
async fn a_sub_agents_approval_is_asked_of_the_user_through_the_caller() {
    let faux = FauxProvider::new();
    faux.push(ask("p1", "writer", "who am I?"));
    faux.push(FauxTurn::new().with_tool_call_id("w1", "whoami", json!({})));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = approving_writer(&faux, &supervisor, &seen);
    let planner = planner(&definitions, &supervisor).await;
    assert_eq!(planner.run("plan it").await.unwrap().end, RunEnd::Parked);
    assert_eq!(
        planner.state().await.unwrap().waiting,
        vec![tiller::run::UserRequest::Approval {
            tool_call_id: "p1".into(),
            tool_name: "ask_agent".into(),
            args: json!({"agent": "writer", "text": "who am I?"}),
            reason: Some("(writer asks) run whoami {}".into()),
        }]
    );
    assert!(seen.lock().unwrap().is_empty());

    faux.push(FauxTurn::text("You are u-7."));
    faux.push(FauxTurn::text("Done."));
    let outcome = planner
        .run(tiller::Prompt::Reply(tiller::run::Reply::approve("p1")))
        .await
        .unwrap();
    assert_eq!(outcome.text(), "Done.");
    assert_eq!(tool_results(&outcome), ["You are u-7."]);
    assert_eq!(seen.lock().unwrap().len(), 1, "the writer ran whoami once");
    supervisor.shutdown().await;
}

/// Two calls of one turn to one definition both wait for the user's approval of
/// what their sub-agents asked. Denying one and approving the other runs what the
/// approved call's sub-agent asked, in its own session, and nothing of the other's.
#[tokio::test]
async fn approving_one_of_two_delegated_requests_runs_that_one_only() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("p1", "ask_agent", json!({"agent": "writer", "text": "one"}))
            .with_tool_call_id("p2", "ask_agent", json!({"agent": "writer", "text": "two"})),
    );
    faux.push(FauxTurn::tool_call("whoami", json!({})));
    faux.push(FauxTurn::tool_call("whoami", json!({})));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let supervisor = Supervisor::start().await.unwrap();
    let definitions = approving_writer(&faux, &supervisor, &seen);
    let planner = planner(&definitions, &supervisor).await;
    assert_eq!(planner.run("plan it").await.unwrap().end, RunEnd::Parked);
    let waiting: Vec<String> = planner
        .state()
        .await
        .unwrap()
        .waiting
        .iter()
        .map(|request| request.tool_call_id().to_owned())
        .collect();
    assert_eq!(waiting, ["p1", "p2"]);

    let denied = planner
        .run(tiller::Prompt::Reply(tiller::run::Reply::deny("p1", None)))
        .await
        .unwrap();
    assert_eq!(denied.end, RunEnd::Parked);
    faux.push(FauxTurn::text("You are u-7."));
    faux.push(FauxTurn::text("Done."));
    let approved = planner
        .run(tiller::Prompt::Reply(tiller::run::Reply::approve("p2")))
        .await
        .unwrap();
    assert_eq!(approved.text(), "Done.");
    assert_eq!(seen.lock().unwrap().len(), 1, "whoami ran once");
    // It ran in the session of the call asked "two".
    let session = planner.session_id();
    for id in [
        format!("{session}/writer"),
        format!("{session}/writer#p1"),
        format!("{session}/writer#p2"),
    ] {
        let Some(stored) = supervisor.store().load(&id).await.unwrap() else {
            continue;
        };
        let asked = stored.messages[0].as_user().unwrap();
        let ran = stored.messages.iter().any(|message| {
            message
                .as_tool_result()
                .is_some_and(|result| !result.is_error && result.tool_name == "whoami")
        });
        let text = serde_json::to_value(asked).unwrap()["content"][0]["text"].clone();
        assert_eq!(ran, text == "two", "{id}: {text}");
    }
    supervisor.shutdown().await;
}

/// With `quiet_restatements` (on in `tiller serve`), the caller's answer that only
/// restates the sub-agent's streamed answer is not streamed to its subscribers
/// again — the transcript keeps it; an answer of its own streams, and so does the
/// restatement with the option off.
#[tokio::test]
async fn a_callers_restatement_of_a_streamed_answer_is_not_streamed_again() {
    for (quiet, restated, streams) in [
        (true, "The draft is ready.", false),
        (true, "In short: the draft is ready.", true),
        (false, "The draft is ready.", true),
    ] {
        let faux = FauxProvider::new();
        faux.push(ask("p1", "writer", "draft it"));
        faux.push(FauxTurn::text("The draft is ready.").chunk_size(4));
        faux.push(FauxTurn::text(restated).chunk_size(4));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let supervisor = Supervisor::start().await.unwrap();
        let config = AskAgentConfig {
            quiet_restatements: quiet,
            ..AskAgentConfig::default()
        };
        let definitions = definitions_with(&faux, &supervisor, &seen, config);
        let planner = planner(&definitions, &supervisor).await;
        let mut events = planner.subscribe();
        let outcome = planner.run("write a draft").await.unwrap();
        assert_eq!(outcome.text(), restated);
        let mut own = String::new();
        let mut childs = String::new();
        while let Some(envelope) = events.next().await {
            match &envelope.event {
                Delivered::Event(AgentEvent::MessageUpdate {
                    assistant_message_event: AssistantEvent::TextDelta { delta, .. },
                    ..
                }) => own.push_str(delta),
                Delivered::Event(AgentEvent::ChildEvent { event, .. }) => {
                    if let AgentEvent::MessageUpdate {
                        assistant_message_event: AssistantEvent::TextDelta { delta, .. },
                        ..
                    } = &**event
                    {
                        childs.push_str(delta);
                    }
                }
                Delivered::Event(AgentEvent::AgentEnd { .. }) => break,
                _ => {}
            }
        }
        assert_eq!(
            childs, "The draft is ready.",
            "the sub-agent's answer streams once"
        );
        let expected = if streams { restated } else { "" };
        assert_eq!(own, expected, "quiet {quiet}, restated {restated:?}");
        supervisor.shutdown().await;
    }
}

/// REMLight's child-content rule (`quiet_after_child_content`, on in `tiller
/// serve`): once the sub-agent streamed its answer, the caller's own text of
/// that run is not streamed — its blocks' start and end go out, no delta, and
/// no update carries the text — while the transcript keeps it. Off, it streams.
/// A whole restatement held back under `quiet_restatements` is in no update
/// either.
#[tokio::test]
async fn after_a_sub_agent_streamed_the_callers_own_text_is_held_from_every_update() {
    for (rule, quiet, said, streams) in [
        (true, false, "In short: the draft is ready.", false),
        (false, false, "In short: the draft is ready.", true),
        (false, true, "The draft is ready.", false),
    ] {
        let faux = FauxProvider::new();
        faux.push(ask("p1", "writer", "draft it"));
        faux.push(FauxTurn::text("The draft is ready.").chunk_size(4));
        faux.push(FauxTurn::text(said).chunk_size(4));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let supervisor = Supervisor::start().await.unwrap();
        let config = AskAgentConfig {
            quiet_restatements: quiet,
            ..AskAgentConfig::default()
        };
        let definitions = definitions_with(&faux, &supervisor, &seen, config);
        let planner = planner(&definitions, &supervisor).await;
        planner
            .update_settings(move |s| s.definition.run.quiet_after_child_content = rule)
            .await
            .unwrap();
        let mut events = planner.subscribe();
        let outcome = planner.run("write a draft").await.unwrap();
        assert_eq!(outcome.text(), said);
        // The updates of the caller's last response: their kinds, and whether
        // any message they carry holds its text.
        let mut responses: Vec<Vec<&'static str>> = Vec::new();
        let mut carried = false;
        let mut ended = String::new();
        while let Some(envelope) = events.next().await {
            match &envelope.event {
                Delivered::Event(AgentEvent::MessageStart { message })
                    if message.as_assistant().is_some() =>
                {
                    responses.push(Vec::new())
                }
                Delivered::Event(AgentEvent::MessageUpdate {
                    assistant_message_event,
                    message,
                }) => {
                    responses
                        .last_mut()
                        .unwrap()
                        .push(match assistant_message_event {
                            AssistantEvent::TextStart { .. } => "text_start",
                            AssistantEvent::TextDelta { .. } => "text_delta",
                            AssistantEvent::TextEnd { .. } => "text_end",
                            _ => "other",
                        });
                    carried |= message.get().text().contains(said);
                }
                Delivered::Event(AgentEvent::MessageEnd { message }) => {
                    if let Some(assistant) = message.as_assistant() {
                        ended = assistant.text();
                    }
                }
                Delivered::Event(AgentEvent::AgentEnd { .. }) => break,
                _ => {}
            }
        }
        assert_eq!(ended, said, "the transcript keeps it");
        let last = responses.last().unwrap();
        if streams {
            assert!(last.contains(&"text_delta"), "{last:?}");
            assert!(carried);
        } else {
            assert_eq!(
                last,
                &["text_start", "text_end"],
                "rule {rule}, quiet {quiet}"
            );
            assert!(
                !carried,
                "rule {rule}, quiet {quiet}: an update carried held text"
            );
        }
        supervisor.shutdown().await;
    }
}
