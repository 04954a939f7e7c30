//! Runs that wait for the user: a tool that asks for what it lacks, calls that wait
//! for approval, and the replies that resume them — exact events, exact transcripts,
//! the cap on asks, and the typed refusals.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::{assert_valid, config, context, describe, log, logged};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_core::{
    AgentEvent, AgentMessage, AgentTool, Answers, Approval, ContinueError, FnTool, LoopConfig,
    LoopContext, Prompt, Reply, RunEnd, RunOptions, ToolError, ToolOutput, UserRequest,
    open_requests, run_loop,
};
use tiller_test_support::tools::remind;

/// Runs the loop from `prompt` on `messages`: its events and the transcript after it.
async fn run(
    prompt: Prompt,
    messages: Vec<AgentMessage>,
    tools: Vec<Arc<dyn AgentTool>>,
    config: LoopConfig,
) -> Result<(Vec<AgentEvent>, Vec<AgentMessage>), ContinueError> {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let events = events.clone();
        Arc::new(move |event| events.lock().unwrap().push(event))
    };
    let mut transcript = messages.clone();
    let added = run_loop(
        prompt,
        context(tools, messages),
        config,
        Default::default(),
        sink,
    )
    .await?;
    transcript.extend(added);
    assert_valid(&transcript);
    let events = events.lock().unwrap().clone();
    Ok((events, transcript))
}

fn remind_call(id: &str, args: serde_json::Value) -> FauxTurn {
    FauxTurn::new().with_tool_call_id(id, "remind", args)
}

/// With `Answers::ToModel`, the answer is the call's result and the model calls
/// the tool again.
#[tokio::test]
async fn a_tool_that_asks_parks_the_run_and_the_answer_makes_the_model_call_it_again() {
    let faux = FauxProvider::new();
    let config = |faux: &FauxProvider| {
        let mut options = config(faux);
        options.run.answers = Answers::ToModel;
        options
    };
    faux.push(remind_call("c1", json!({"what": "call Juan"})));
    faux.push(remind_call(
        "c2",
        json!({"what": "call Juan", "due": "tomorrow 9:00"}),
    ));
    faux.push(FauxTurn::text("Done: I will remind you tomorrow at 9:00."));
    let done = log();

    let (events, transcript) = run(
        "remind me to call Juan".into(),
        vec![],
        vec![remind(&done, "When should I remind you?")],
        config(&faux),
    )
    .await
    .unwrap();
    assert_eq!(
        describe(&events),
        [
            "agent_start",
            "turn_start",
            "message_start user:remind me to call Juan",
            "message_end user:remind me to call Juan",
            "message_start assistant",
            "message_update tool_call_start",
            "message_update tool_call_delta",
            "message_update tool_call_end",
            "message_end assistant",
            "tool_execution_start c1",
            "message_start custom:input_request",
            "message_end custom:input_request",
            "input_requested c1 due",
            "turn_end ToolUse []",
            "agent_end Parked 3",
        ]
    );
    let request = UserRequest::Input {
        tool_call_id: "c1".into(),
        tool_name: "remind".into(),
        field: "due".into(),
        question: "When should I remind you?".into(),
        current_data: json!({"what": "call Juan"}),
    };
    assert_eq!(open_requests(&transcript), vec![request.clone()]);
    assert!(logged(&done).is_empty());

    // A new prompt is refused while the question waits, and so is an approval.
    let refused = run(
        "hello".into(),
        transcript.clone(),
        vec![remind(&done, "When should I remind you?")],
        config(&faux),
    )
    .await;
    assert_eq!(
        refused.unwrap_err(),
        ContinueError::WaitingForReply {
            waiting: Box::new(request.clone())
        }
    );
    let refused = run(
        Prompt::Reply(Reply::approve("c1")),
        transcript.clone(),
        vec![remind(&done, "When should I remind you?")],
        config(&faux),
    )
    .await;
    assert_eq!(
        refused.unwrap_err(),
        ContinueError::ReplyDoesNotFit {
            waiting: Box::new(request)
        }
    );

    let (events, transcript) = run(
        Prompt::Reply(Reply::answer("c1", "tomorrow 9:00")),
        transcript,
        vec![remind(&done, "When should I remind you?")],
        config(&faux),
    )
    .await
    .unwrap();
    assert_eq!(
        describe(&events)
            .iter()
            .filter(|line| !line.starts_with("message_update"))
            .collect::<Vec<_>>(),
        [
            "agent_start",
            "turn_start",
            "tool_execution_start c1",
            "tool_execution_end c1 error",
            "message_start tool_result:c1",
            "message_end tool_result:c1",
            "turn_end ToolUse [\"c1\"]",
            "turn_start",
            "message_start assistant",
            "message_end assistant",
            "tool_execution_start c2",
            "tool_execution_end c2",
            "message_start tool_result:c2",
            "message_end tool_result:c2",
            "turn_end ToolUse [\"c2\"]",
            "turn_start",
            "message_start assistant",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 4",
        ]
    );
    assert_eq!(logged(&done), ["call Juan @ tomorrow 9:00"]);
    let answer = transcript[3].as_tool_result().unwrap();
    assert_eq!(
        answer.text_content(),
        "The tool needs `due` and asked the user: When should I remind you?\nThe user answered: tomorrow 9:00\nCall the tool again with this."
    );
    assert!(answer.is_error);
    // The model saw the question and the answer as the call's result.
    let request = faux.requests()[1].clone();
    let sent = serde_json::to_string(&request.context.messages).unwrap();
    assert!(sent.contains("The user answered: tomorrow 9:00"), "{sent}");
    assert!(
        !sent.contains("input_request"),
        "requests stay out of the model's view"
    );
}

#[tokio::test]
async fn a_tool_asking_past_the_cap_is_an_error_result_for_the_model() {
    let faux = FauxProvider::new();
    for n in 1..=3 {
        faux.push(remind_call(&format!("c{n}"), json!({"what": "x"})));
    }
    faux.push(FauxTurn::text("I could not set it."));
    let mut options = config(&faux);
    options.run.max_asks_per_tool = 2;
    options.run.answers = Answers::ToModel;
    let done = log();
    let (_, mut transcript) = run(
        "remind me".into(),
        vec![],
        vec![remind(&done, "When should I remind you?")],
        options.clone(),
    )
    .await
    .unwrap();
    for answer in ["soon", "later"] {
        let asking = open_requests(&transcript)[0].tool_call_id().to_owned();
        let (events, after) = run(
            Prompt::Reply(Reply::answer(asking, answer)),
            transcript,
            vec![remind(&done, "When should I remind you?")],
            options.clone(),
        )
        .await
        .unwrap();
        transcript = after;
        let end = describe(&events).last().cloned().unwrap();
        if answer == "soon" {
            assert_eq!(end, "agent_end Parked 3", "asked a second time");
        } else {
            assert_eq!(end, "agent_end Completed 4", "the third ask is an error");
        }
    }
    let capped = transcript[transcript.len() - 2].as_tool_result().unwrap();
    assert_eq!(capped.tool_call_id, "c3");
    assert!(capped.is_error);
    assert_eq!(
        capped.text_content(),
        "Tool \"remind\" still needs `due` (When should I remind you?) after asking the user 2 times; it gives up."
    );
    assert!(open_requests(&transcript).is_empty());
}

/// The seed's flow: the answer goes straight into the waiting call, which runs
/// again with it — no model turn between — and the model answers after it.
#[tokio::test]
async fn an_answer_goes_into_the_waiting_call_which_runs_again_at_once() {
    let faux = FauxProvider::new();
    faux.push(remind_call("c1", json!({"what": "call Juan"})));
    faux.push(FauxTurn::text("Done: I will remind you tomorrow at 9:00."));
    let done = log();
    let (_, transcript) = run(
        "remind me to call Juan".into(),
        vec![],
        vec![remind(&done, "When should I remind you?")],
        config(&faux),
    )
    .await
    .unwrap();
    // The request carries the call's arguments as they stand.
    assert_eq!(
        open_requests(&transcript),
        [UserRequest::Input {
            tool_call_id: "c1".into(),
            tool_name: "remind".into(),
            field: "due".into(),
            question: "When should I remind you?".into(),
            current_data: json!({"what": "call Juan"}),
        }]
    );

    let (events, transcript) = run(
        Prompt::Reply(Reply::answer("c1", "tomorrow 9:00")),
        transcript,
        vec![remind(&done, "When should I remind you?")],
        config(&faux),
    )
    .await
    .unwrap();
    assert_eq!(
        describe(&events)
            .iter()
            .filter(|line| !line.starts_with("message_update"))
            .collect::<Vec<_>>(),
        [
            "agent_start",
            "turn_start",
            "message_start custom:input_answered",
            "message_end custom:input_answered",
            "tool_execution_start c1",
            "tool_execution_end c1",
            "message_start tool_result:c1",
            "message_end tool_result:c1",
            "turn_end ToolUse [\"c1\"]",
            "turn_start",
            "message_start assistant",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 3",
        ]
    );
    assert_eq!(logged(&done), ["call Juan @ tomorrow 9:00"]);
    assert_eq!(
        transcript[4].as_tool_result().unwrap().text_content(),
        "Reminder set for tomorrow 9:00."
    );
    // Two model calls in all: the one that asked, the one after the answer.
    assert_eq!(faux.requests().len(), 2);
    let sent = serde_json::to_string(&faux.requests()[1].context.messages).unwrap();
    assert!(
        !sent.contains("input_answered"),
        "records stay out of the model's view"
    );
}

/// At the default cap a tool asks three times in a row, each answer merged into
/// the call; its fourth question is an error result the model reads.
#[tokio::test]
async fn at_the_default_cap_a_tool_asks_three_times_then_gives_up() {
    assert_eq!(RunOptions::default().max_asks_per_tool, 3);
    // A form that wants one more field after each answer.
    let form: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "form",
        "Fill a form",
        json!({"type": "object"}),
        |args, _ctx| async move {
            let filled = args.as_object().map_or(0, serde_json::Map::len);
            Err::<ToolOutput, _>(ToolError::needs_input(
                format!("field{}", filled + 1),
                "And then?",
            ))
        },
    ));
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("f1", "form", json!({})));
    faux.push(FauxTurn::text("The form never ends."));
    let (_, mut transcript) = run("fill it".into(), vec![], vec![form.clone()], config(&faux))
        .await
        .unwrap();
    let mut asked = Vec::new();
    for answer in ["one", "two", "three"] {
        let [
            UserRequest::Input {
                field,
                current_data,
                ..
            },
        ] = &open_requests(&transcript)[..]
        else {
            panic!("one question waits")
        };
        asked.push((field.clone(), current_data.clone()));
        let (_, after) = run(
            Prompt::Reply(Reply::answer("f1", answer)),
            transcript,
            vec![form.clone()],
            config(&faux),
        )
        .await
        .unwrap();
        transcript = after;
    }
    assert_eq!(
        asked,
        [
            ("field1".to_owned(), json!({})),
            ("field2".to_owned(), json!({"field1": "one"})),
            (
                "field3".to_owned(),
                json!({"field1": "one", "field2": "two"})
            ),
        ]
    );
    assert!(open_requests(&transcript).is_empty());
    let gave_up = transcript[transcript.len() - 2].as_tool_result().unwrap();
    assert_eq!(
        gave_up.text_content(),
        "Tool \"form\" still needs `field4` (And then?) after asking the user 3 times; it gives up."
    );
    assert_eq!(faux.requests().len(), 2, "one model call before, one after");
}

/// A `delete` tool that records what it deleted.
fn delete(log: &Arc<Mutex<Vec<String>>>) -> Arc<dyn AgentTool> {
    let log = log.clone();
    Arc::new(FnTool::new(
        "delete",
        "Delete a file",
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        move |args, _ctx| {
            let log = log.clone();
            async move {
                let path = args["path"].as_str().unwrap().to_owned();
                log.lock().unwrap().push(path.clone());
                Ok(ToolOutput::text(format!("deleted {path}")))
            }
        },
    ))
}

fn approvals(policy: Approval) -> BTreeMap<String, Approval> {
    BTreeMap::from([("delete".to_owned(), policy)])
}

#[tokio::test]
async fn calls_wait_for_approval_and_run_only_when_approved() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::new()
            .with_tool_call_id("a", "delete", json!({"path": "/tmp/a"}))
            .with_tool_call_id("b", "delete", json!({"path": "/home/b"})),
    );
    faux.push(FauxTurn::text("One deleted, one refused."));
    let mut options = config(&faux);
    // Only paths outside /tmp need the user's approval.
    options.run.approvals = approvals(Approval::ask_if(|args| {
        !args["path"]
            .as_str()
            .unwrap_or_default()
            .starts_with("/tmp/")
    }));
    let deleted = log();

    let (events, transcript) = run(
        "clean up".into(),
        vec![],
        vec![delete(&deleted)],
        options.clone(),
    )
    .await
    .unwrap();
    let lines = describe(&events);
    let first_call = lines
        .iter()
        .position(|l| l == "tool_execution_start a")
        .unwrap();
    assert_eq!(
        lines[first_call..],
        [
            "tool_execution_start a",
            "tool_execution_start b",
            "tool_execution_end a",
            "message_start tool_result:a",
            "message_end tool_result:a",
            "message_start custom:approval_request",
            "message_end custom:approval_request",
            "approval_requested b",
            "turn_end ToolUse [\"a\"]",
            "agent_end Parked 4",
        ]
    );
    assert_eq!(logged(&deleted), ["/tmp/a"]);
    assert!(events.contains(&AgentEvent::ApprovalRequested {
        tool_call_id: "b".into(),
        tool_name: "delete".into(),
        args: json!({"path": "/home/b"}),
        reason: None,
    }));

    // Denied: the call's result is the refusal, and the model goes on.
    let (_, denied) = run(
        Prompt::Reply(Reply::deny("b", Some("keep my home".into()))),
        transcript.clone(),
        vec![delete(&deleted)],
        options.clone(),
    )
    .await
    .unwrap();
    let result = denied[4].as_tool_result().unwrap();
    assert_eq!(
        (
            result.tool_call_id.as_str(),
            result.is_error,
            result.text_content()
        ),
        (
            "b",
            true,
            "The user denied this call: keep my home".to_owned()
        )
    );
    assert_eq!(logged(&deleted), ["/tmp/a"]);

    // Approved (from the same parked transcript): the call runs as the model made it.
    faux.push(FauxTurn::text("Both deleted."));
    let (events, approved) = run(
        Prompt::Reply(Reply::approve("b")),
        transcript,
        vec![delete(&deleted)],
        options,
    )
    .await
    .unwrap();
    assert_eq!(logged(&deleted), ["/tmp/a", "/home/b"]);
    // The approval is recorded (and durable, with write-ahead) before the call runs.
    let AgentMessage::Custom(granted) = &approved[4] else {
        panic!("not the approval: {:?}", approved[4]);
    };
    assert_eq!(
        (granted.kind.as_str(), &granted.payload),
        (
            tiller_core::request::APPROVAL_GRANTED,
            &json!({"tool_call_id": "b"})
        )
    );
    assert_eq!(
        approved[5].as_tool_result().unwrap().text_content(),
        "deleted /home/b"
    );
    assert_eq!(
        describe(&events)[2..6],
        [
            "message_start custom:approval_granted",
            "message_end custom:approval_granted",
            "tool_execution_start b",
            "tool_execution_end b",
        ]
    );
    assert_eq!(describe(&events).last().unwrap(), "agent_end Completed 3");
}

#[tokio::test]
async fn a_tool_never_allowed_is_refused_without_asking() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("a", "delete", json!({"path": "/x"})));
    faux.push(FauxTurn::text("Not allowed."));
    let mut options = config(&faux);
    options.run.approvals = approvals(Approval::Never);
    let deleted = log();
    let (events, transcript) = run("delete /x".into(), vec![], vec![delete(&deleted)], options)
        .await
        .unwrap();
    assert!(logged(&deleted).is_empty());
    assert_eq!(
        transcript[2].as_tool_result().unwrap().text_content(),
        "Tool \"delete\" was not executed: it is not allowed to run."
    );
    assert_eq!(describe(&events).last().unwrap(), "agent_end Completed 4");
}

#[tokio::test]
async fn an_aborted_run_does_not_park() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("a", "delete", json!({"path": "/x"})));
    let mut options = config(&faux);
    options.run.approvals = approvals(Approval::Ask);
    let cancel = tokio_util::sync::CancellationToken::new();
    // Aborted while the model streams: the call is answered as not run, no request.
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let events = events.clone();
        let cancel = cancel.clone();
        Arc::new(move |event: AgentEvent| {
            if matches!(event, AgentEvent::ToolExecutionStart { .. }) {
                cancel.cancel();
            }
            events.lock().unwrap().push(event);
        })
    };
    let added = run_loop(
        "delete /x".into(),
        LoopContext {
            tools: tiller_core::ToolSet::new(vec![delete(&log())]).unwrap(),
            ..LoopContext::default()
        },
        options,
        cancel,
        sink,
    )
    .await
    .unwrap();
    assert_valid(&added);
    assert!(open_requests(&added).is_empty());
    let events = events.lock().unwrap();
    assert!(matches!(
        events.last(),
        Some(AgentEvent::AgentEnd {
            reason: RunEnd::Aborted,
            ..
        })
    ));
}

#[tokio::test]
async fn a_tool_asks_for_approval_itself_and_runs_again_once_approved() {
    let runs = log();
    let purge = {
        let runs = runs.clone();
        Arc::new(FnTool::new(
            "purge",
            "Purge old files",
            json!({"type": "object"}),
            move |_, ctx| {
                let runs = runs.clone();
                async move {
                    runs.lock()
                        .unwrap()
                        .push(format!("approved={}", ctx.approved()));
                    if !ctx.approved() {
                        return Err(ToolError::needs_approval("purge 512 files"));
                    }
                    Ok(ToolOutput::text("purged"))
                }
            },
        )) as Arc<dyn AgentTool>
    };
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("p", "purge", json!({})));
    faux.push(FauxTurn::text("Purged."));
    let (events, transcript) = run("purge".into(), vec![], vec![purge.clone()], config(&faux))
        .await
        .unwrap();
    assert!(events.contains(&AgentEvent::ApprovalRequested {
        tool_call_id: "p".into(),
        tool_name: "purge".into(),
        args: json!({}),
        reason: Some("purge 512 files".into()),
    }));
    let (_, transcript) = run(
        Prompt::Reply(Reply::approve("p")),
        transcript,
        vec![purge],
        config(&faux),
    )
    .await
    .unwrap();
    assert_eq!(logged(&runs), ["approved=false", "approved=true"]);
    assert_eq!(
        transcript[4].as_tool_result().unwrap().text_content(),
        "purged"
    );
}
