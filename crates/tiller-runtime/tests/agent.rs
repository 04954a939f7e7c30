//! An agent's API, case by case as pi-agent-core's agent tests specify it.

#![allow(clippy::unwrap_used)]

mod common;

use common::{agent, endless, idle, is_agent_end, last_user, roles, until};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use tiller::faux::FauxTurn;
use tiller::{
    AgentError, AgentEvent, AgentMessage, AgentSettings, AgentSpec, Delivered, RunEnd, Supervisor,
    ai::{Content, ImageContent, Message, ThinkingLevel, catalog},
    run::{ContinueError, RunHooks, hook},
    runtime::{AgentStatus, QueueMode},
};

#[tokio::test]
async fn default_state() {
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::default()))
        .await
        .unwrap();
    let state = agent.state().await.unwrap();
    assert_eq!(state.definition.system_prompt, None);
    assert_eq!(state.definition.model, None);
    assert_eq!(state.definition.run.stream.thinking, ThinkingLevel::Off);
    assert!(state.definition.tools.is_empty());
    assert!(state.messages.is_empty());
    assert!(!state.is_streaming);
    assert_eq!(state.streaming_message, None);
    assert!(state.pending_tool_calls.is_empty());
    assert_eq!(state.error, None);
    assert_eq!(agent.prompt("hi").await, Err(AgentError::NoModel));
}

#[tokio::test]
async fn custom_initial_state() {
    let supervisor = Supervisor::start().await.unwrap();
    let model = catalog::find("openai/gpt-4o-mini").unwrap();
    let settings = AgentSettings::new(model.clone())
        .with_system_prompt("You are a helpful assistant.")
        .with_thinking_level(ThinkingLevel::Low);
    let agent = supervisor
        .spawn(AgentSpec::new(settings).with_messages(vec![AgentMessage::user("earlier")]))
        .await
        .unwrap();
    let state = agent.state().await.unwrap();
    assert_eq!(
        state.definition.system_prompt.as_deref(),
        Some("You are a helpful assistant.")
    );
    assert_eq!(state.definition.model, Some(model));
    assert_eq!(state.definition.run.stream.thinking, ThinkingLevel::Low);
    assert_eq!(roles(&state.messages), ["user"]);
}

#[tokio::test]
async fn subscribing_sends_nothing_and_setters_emit_no_events() {
    let (_supervisor, agent, _faux) = agent(|s| s).await;
    let mut events = agent.subscribe();
    assert!(
        futures::poll!(events.next()).is_pending(),
        "no event on subscribing"
    );
    agent
        .update_settings(|s| {
            s.definition.system_prompt = Some("Test prompt".into());
            s.definition.run.stream.thinking = ThinkingLevel::High;
        })
        .await
        .unwrap();
    agent
        .set_messages(vec![AgentMessage::user("hello")])
        .await
        .unwrap();
    assert!(
        futures::poll!(events.next()).is_pending(),
        "setters emit nothing"
    );
    assert_eq!(
        agent
            .state()
            .await
            .unwrap()
            .definition
            .system_prompt
            .as_deref(),
        Some("Test prompt")
    );
}

#[tokio::test]
async fn a_dropped_subscription_no_longer_receives_and_others_still_do() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(FauxTurn::text("hi"));
    let dropped = agent.subscribe();
    let mut kept = agent.subscribe();
    drop(dropped);
    agent.prompt("hello").await.unwrap();
    let end = common::until(&mut kept, common::is_agent_end).await;
    assert!(end.seq > 0);
}

#[tokio::test]
async fn message_setters() {
    let (_supervisor, agent, _faux) = agent(|s| s).await;
    agent
        .set_messages(vec![AgentMessage::user("Hello")])
        .await
        .unwrap();
    assert_eq!(roles(&agent.state().await.unwrap().messages), ["user"]);
    let model = agent.state().await.unwrap().definition.model.unwrap();
    let answer = tiller::ai::AssistantMessage::empty(&model);
    agent
        .set_messages(vec![AgentMessage::user("Hello"), answer.into()])
        .await
        .unwrap();
    assert_eq!(
        roles(&agent.state().await.unwrap().messages),
        ["user", "assistant"]
    );
    agent.set_messages(Vec::new()).await.unwrap();
    assert!(agent.state().await.unwrap().messages.is_empty());
}

#[tokio::test]
async fn queued_messages_stay_out_of_the_transcript() {
    let (_supervisor, agent, _faux) = agent(|s| s).await;
    agent.steer("Steering message").await.unwrap();
    agent.follow_up("Follow-up message").await.unwrap();
    assert!(agent.state().await.unwrap().messages.is_empty());
    assert!(agent.has_queued_messages().await.unwrap());
    agent
        .clear_queues(tiller::runtime::Queues::Steering)
        .await
        .unwrap();
    assert!(agent.has_queued_messages().await.unwrap());
    agent
        .clear_queues(tiller::runtime::Queues::Both)
        .await
        .unwrap();
    assert!(!agent.has_queued_messages().await.unwrap());
}

#[tokio::test]
async fn abort_while_idle_does_nothing() {
    let (_supervisor, agent, _faux) = agent(|s| s).await;
    agent.abort();
    assert_eq!(agent.status(), tiller::runtime::AgentStatus::Idle);
    assert!(agent.state().await.unwrap().messages.is_empty());
}

#[tokio::test]
async fn prompt_and_continue_while_a_run_streams_are_busy() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(endless());
    agent.prompt("First message").await.unwrap();
    assert!(agent.state().await.unwrap().is_streaming);
    let busy = agent.prompt("Second message").await.unwrap_err();
    assert_eq!(busy, AgentError::Busy);
    assert_eq!(
        busy.to_string(),
        "the agent is busy with a run: use steer() to redirect it or follow_up() to queue work for after it"
    );
    assert_eq!(
        agent.prompt(tiller::Prompt::Continue).await,
        Err(AgentError::Busy)
    );
    agent.abort();
    idle(&agent).await;
    assert_eq!(
        faux.requests().len(),
        1,
        "the refused prompt changed nothing"
    );
    assert_eq!(
        roles(&agent.state().await.unwrap().messages),
        ["user", "assistant"]
    );
}

#[tokio::test]
async fn continue_refuses_what_it_cannot_continue() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    assert_eq!(
        agent.prompt(tiller::Prompt::Continue).await,
        Err(AgentError::CannotStart(ContinueError::EmptyContext))
    );
    assert_eq!(
        agent.prompt(vec![]).await,
        Err(AgentError::CannotStart(ContinueError::EmptyPrompt))
    );
    faux.push(FauxTurn::text("answer"));
    agent.run("question").await.unwrap();
    assert_eq!(
        agent.prompt(tiller::Prompt::Continue).await,
        Err(AgentError::CannotStart(ContinueError::EndsWithAssistant))
    );
}

#[tokio::test]
async fn continue_runs_a_queued_follow_up_from_an_assistant_tail() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(FauxTurn::text("first"));
    faux.push(FauxTurn::text("second"));
    agent.run("hello").await.unwrap();
    agent.follow_up("and then?").await.unwrap();
    agent.prompt(tiller::Prompt::Continue).await.unwrap();
    idle(&agent).await;
    assert_eq!(last_user(&faux, 1), "and then?");
    assert!(!agent.has_queued_messages().await.unwrap());
    assert_eq!(
        roles(&agent.state().await.unwrap().messages),
        ["user", "assistant", "user", "assistant"]
    );
}

#[tokio::test]
async fn continue_runs_queued_steering_one_message_at_a_time() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(FauxTurn::text("first"));
    faux.respond_with(|request| {
        FauxTurn::text(format!(
            "re: {}",
            request.last_user_text().unwrap_or_default()
        ))
    });
    agent.run("hello").await.unwrap();
    agent
        .update_settings(|s| s.definition.steering_mode = QueueMode::OneAtATime)
        .await
        .unwrap();
    agent.steer("a").await.unwrap();
    agent.steer("b").await.unwrap();
    agent.prompt(tiller::Prompt::Continue).await.unwrap();
    idle(&agent).await;
    assert_eq!(
        (last_user(&faux, 1), last_user(&faux, 2)),
        ("a".to_owned(), "b".to_owned())
    );
    let transcript = agent.state().await.unwrap().messages;
    let texts: Vec<String> = transcript
        .iter()
        .map(|m| match m.as_assistant() {
            Some(a) => a.text(),
            None => m.role().to_owned(),
        })
        .collect();
    assert_eq!(texts, ["user", "first", "user", "re: a", "user", "re: b"]);
}

#[tokio::test]
async fn in_all_mode_every_queued_message_goes_to_one_response() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.respond_with(|request| FauxTurn::text(format!("seen {}", request.context.messages.len())));
    agent.run("hello").await.unwrap();
    agent
        .update_settings(|s| {
            s.definition.steering_mode = QueueMode::All;
            s.definition.follow_up_mode = QueueMode::All;
        })
        .await
        .unwrap();
    // Steering: both messages reach the next response together.
    agent.steer("a").await.unwrap();
    agent.steer("b").await.unwrap();
    agent.prompt(tiller::Prompt::Continue).await.unwrap();
    idle(&agent).await;
    // Follow-ups: both after the run would stop, in one response.
    agent.follow_up("c").await.unwrap();
    agent.follow_up("d").await.unwrap();
    agent.prompt(tiller::Prompt::Continue).await.unwrap();
    idle(&agent).await;
    let transcript = agent.state().await.unwrap().messages;
    let texts: Vec<String> = transcript
        .iter()
        .map(|m| match m.as_assistant() {
            Some(a) => a.text(),
            None => m.as_user().unwrap().text_content(),
        })
        .collect();
    assert_eq!(
        texts,
        ["hello", "seen 1", "a", "b", "seen 4", "c", "d", "seen 7"]
    );
    assert_eq!(faux.requests().len(), 3);
}

#[tokio::test]
async fn clearing_the_follow_ups_leaves_the_steering_queued() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(FauxTurn::text("first"));
    agent.run("hello").await.unwrap();
    agent.steer("keep me").await.unwrap();
    agent.follow_up("drop me").await.unwrap();
    agent
        .clear_queues(tiller::runtime::Queues::FollowUp)
        .await
        .unwrap();
    let state = agent.state().await.unwrap();
    assert_eq!(state.follow_up_queue, []);
    assert_eq!(
        state
            .steering_queue
            .iter()
            .map(|m| m.as_user().unwrap().text_content())
            .collect::<Vec<_>>(),
        ["keep me"]
    );
    agent
        .clear_queues(tiller::runtime::Queues::Steering)
        .await
        .unwrap();
    assert!(!agent.has_queued_messages().await.unwrap());
}

#[tokio::test]
async fn the_session_id_reaches_the_provider_and_can_change() {
    let (_supervisor, agent, faux) = agent(|mut s| {
        s.definition.run.stream.session_id = Some("session-abc".into());
        s
    })
    .await;
    faux.push(FauxTurn::text("ok")).push(FauxTurn::text("ok"));
    agent.run("hello").await.unwrap();
    agent
        .update_settings(|s| s.definition.run.stream.session_id = Some("session-def".into()))
        .await
        .unwrap();
    agent.run("hello again").await.unwrap();
    let ids: Vec<Option<String>> = faux.requests().into_iter().map(|r| r.session_id).collect();
    assert_eq!(
        ids,
        [
            Some("session-abc".to_owned()),
            Some("session-def".to_owned())
        ]
    );
}

#[tokio::test]
async fn run_reports_the_outcome() {
    let (_supervisor, agent, faux) =
        agent(|s| s.with_tools(common::tools(vec![common::echo()]))).await;
    faux.push(
        FauxTurn::tool_call("echo", serde_json::json!({"value": "pong"})).usage(
            tiller::ai::Usage {
                input: 10,
                output: 5,
                ..Default::default()
            },
        ),
    );
    faux.push(FauxTurn::text("got pong").usage(tiller::ai::Usage {
        input: 20,
        output: 3,
        ..Default::default()
    }));
    let outcome = agent.run("ping").await.unwrap();
    assert_eq!(
        roles(&outcome.messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
    assert_eq!(outcome.text(), "got pong");
    assert!(
        outcome.tool_calls().is_empty(),
        "the final turn called no tool"
    );
    assert_eq!((outcome.usage().input, outcome.usage().output), (30, 8));
    assert_eq!(outcome.stop_reason(), Some(tiller::ai::StopReason::Stop));
    assert_eq!(
        (outcome.error(), outcome.end),
        (None, tiller::RunEnd::Completed)
    );
    let summary = outcome.summary();
    assert!(!summary.has_error());
    // The run's own messages, and beside them the whole conversation.
    assert_eq!(summary.messages, outcome.messages);
    faux.push(FauxTurn::text("once more"));
    let second = agent.run("again").await.unwrap().summary();
    assert_eq!(roles(&second.messages), ["user", "assistant"]);
    assert_eq!(
        second.conversation,
        [&summary.messages[..], &second.messages[..]].concat()
    );
}

#[tokio::test]
async fn a_failed_model_call_becomes_state_and_the_next_run_clears_it() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(FauxTurn::text("half an ans").fail("upstream exploded"));
    let mut events = agent.subscribe();
    let outcome = agent.run("question").await.unwrap();
    assert_eq!(
        (
            outcome.stop_reason(),
            outcome.error(),
            outcome.text().as_str()
        ),
        (
            Some(tiller::ai::StopReason::Error),
            Some("faux reported an error: upstream exploded"),
            "half an ans"
        )
    );
    assert!(outcome.summary().has_error());
    let state = agent.state().await.unwrap();
    assert_eq!(roles(&state.messages), ["user", "assistant"]);
    assert_eq!(
        state.error.as_deref(),
        Some("faux reported an error: upstream exploded")
    );
    assert_eq!(
        (state.is_streaming, agent.status()),
        (false, AgentStatus::Idle)
    );
    let ended = until(&mut events, is_agent_end).await;
    let Delivered::Event(AgentEvent::AgentEnd { reason, .. }) = &ended.event else {
        unreachable!()
    };
    assert_eq!(*reason, RunEnd::Error);

    faux.push(FauxTurn::text("better now"));
    assert_eq!(agent.run("again").await.unwrap().text(), "better now");
    assert_eq!(agent.state().await.unwrap().error, None);
}

#[tokio::test]
async fn a_failing_or_panicking_hook_fails_the_run_not_the_agent() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    agent
        .update_settings(|s| {
            s.code.hooks = RunHooks {
                transform_context: Some(hook::transform_context(|_, _| async {
                    Err("the summariser is down".into())
                })),
                ..RunHooks::default()
            }
        })
        .await
        .unwrap();
    let outcome = agent.run("first").await.unwrap();
    assert_eq!(
        outcome.error(),
        Some("transform_context failed: the summariser is down")
    );

    agent
        .update_settings(|s| {
            s.code.hooks = RunHooks {
                transform_context: Some(hook::transform_context(|_, _| async {
                    panic!("compaction bug")
                })),
                ..RunHooks::default()
            }
        })
        .await
        .unwrap();
    let outcome = agent.run("second").await.unwrap();
    assert_eq!(
        outcome.error(),
        Some("transform_context panicked: compaction bug")
    );
    let state = agent.state().await.unwrap();
    assert_eq!(
        roles(&state.messages),
        ["user", "assistant", "user", "assistant"]
    );
    assert_eq!(
        state.error.as_deref(),
        Some("transform_context panicked: compaction bug")
    );
    assert!(faux.requests().is_empty(), "no model call was made");

    agent
        .update_settings(|s| s.code.hooks = RunHooks::default())
        .await
        .unwrap();
    faux.push(FauxTurn::text("fine"));
    assert_eq!(agent.run("third").await.unwrap().text(), "fine");
}

/// The `instructions` hook is asked once a run, with the run's context; its
/// text follows the system prompt in every model call of that run, and a
/// failure fails the run before any model call.
#[tokio::test]
async fn instructions_are_written_once_a_run_after_the_system_prompt() {
    let (_supervisor, agent, faux) = agent(|s| s.with_system_prompt("Be brief.")).await;
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = asked.clone();
    agent
        .update_settings(move |s| {
            s.code.hooks.instructions = Some(hook::instructions(move |context| {
                let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                let user = context.user_id().unwrap_or("nobody").to_owned();
                async move { Ok(Some(format!("Run {n} works for {user}."))) }
            }))
        })
        .await
        .unwrap();
    faux.push(FauxTurn::tool_call("missing", serde_json::json!({})));
    faux.push(FauxTurn::text("done"));
    agent.run("go").await.unwrap();
    let prompts: Vec<Option<String>> = faux
        .requests()
        .iter()
        .map(|request| request.context.system_prompt.clone())
        .collect();
    let first = Some("Be brief.\n\nRun 1 works for nobody.".to_owned());
    assert_eq!(prompts, [first.clone(), first]);
    faux.push(FauxTurn::text("again"));
    agent.run("next").await.unwrap();
    assert_eq!(
        faux.requests()[2].context.system_prompt.as_deref(),
        Some("Be brief.\n\nRun 2 works for nobody.")
    );

    agent
        .update_settings(|s| {
            s.code.hooks.instructions = Some(hook::instructions(|_| async {
                Err("the memory store is down".into())
            }))
        })
        .await
        .unwrap();
    let outcome = agent.run("third").await.unwrap();
    assert_eq!(
        outcome.error(),
        Some("instructions failed: the memory store is down")
    );
    assert_eq!(faux.requests().len(), 3, "no model call was made");
}

#[tokio::test]
async fn prompt_with_images_sends_text_and_images() {
    let (_supervisor, agent, faux) = agent(|s| s).await;
    faux.push(FauxTurn::text("a red dot"));
    let dot = ImageContent {
        data: "iVBORw0KGgo=".into(),
        mime_type: "image/png".into(),
    };
    agent
        .prompt(tiller::Prompt::with_images(
            "What is this?",
            vec![dot.clone()],
        ))
        .await
        .unwrap();
    idle(&agent).await;
    let sent = &faux.requests()[0].context.messages;
    let Some(Message::User(user)) = sent.last() else {
        panic!("the request ends with {sent:?}")
    };
    assert_eq!(
        user.content,
        [Content::text("What is this?"), Content::Image(dot)]
    );
}
