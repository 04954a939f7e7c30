//! Tools made with `#[tool]`, and the agent's context as tools, hooks and the
//! system-prompt function see it.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::run::RUN_UNTIL_NUDGE;
use tiller::{
    AgentContext, AgentError, AgentMessage, AgentSettings, AgentSpec, AgentTool, RunEnd,
    Supervisor, ToolContext, ToolError, ToolOutput, ToolSet,
    ai::{Message, OutputSchema},
    run::{ContextIds, RunHooks, ToolExecution, hook},
    runtime::{DefinitionPatch, PatchError},
    tool,
};
use tokio_util::sync::CancellationToken;

/// Add two numbers.
///
/// Both may be fractions.
#[tool(params(a = "The first number", b = "The second number"))]
async fn add(a: f64, b: f64) -> Result<String, ToolError> {
    Ok((a + b).to_string())
}

/// The host's own data, carried by the agent's context.
#[derive(Debug, PartialEq)]
struct Plan(&'static str);

/// Say who is asking.
#[tool(name = "whoami", sequential)]
fn who_am_i(ctx: &ToolContext, greeting: Option<String>) -> Result<serde_json::Value, ToolError> {
    let agent = ctx.agent();
    Ok(json!({
        "greeting": greeting.unwrap_or_else(|| "hello".into()),
        "user": agent.user_id(),
        "session": agent.session_id(),
        "plan": agent.extension::<Plan>().map(|plan| plan.0),
    }))
}

/// Fail on purpose.
#[tool]
async fn refuse(reason: String) -> Result<ToolOutput, ToolError> {
    Err(ToolError::new(format!("refused: {reason}")))
}

#[test]
fn a_tool_takes_its_name_description_and_schema_from_the_function() {
    assert_eq!(AddTool.name(), "add");
    assert_eq!(
        AddTool.description(),
        "Add two numbers.\n\nBoth may be fractions."
    );
    assert_eq!(AddTool.execution(), ToolExecution::Parallel);
    assert_eq!(
        AddTool.parameters(),
        &json!({
            "type": "object",
            "properties": {
                "a": {"type": "number", "format": "double", "description": "The first number"},
                "b": {"type": "number", "format": "double", "description": "The second number"},
            },
            "required": ["a", "b"],
        })
    );
    assert_eq!(WhoAmITool.name(), "whoami");
    assert_eq!(WhoAmITool.execution(), ToolExecution::Sequential);
    assert_eq!(
        WhoAmITool.parameters(),
        &json!({
            "type": "object",
            "properties": {"greeting": {"type": ["string", "null"]}},
        })
    );
    // The function itself is untouched.
    assert!(
        futures::executor::block_on(add(1.0, 2.0)).is_ok_and(|sum| sum == "3"),
        "add is still a function"
    );
}

#[tokio::test]
async fn arguments_are_decoded_and_errors_name_the_field() {
    let ctx = ToolContext::detached("call_1", CancellationToken::new(), |_| {});
    let sum = AddTool
        .execute(json!({"a": 1.5, "b": 2}), ctx.clone())
        .await
        .unwrap();
    assert_eq!(sum, ToolOutput::text("3.5"));
    let error = AddTool
        .execute(json!({"a": "one", "b": 2}), ctx.clone())
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "invalid arguments for `add`: invalid type: string \"one\", expected f64"
    );
    let error = RefuseTool
        .execute(json!({"reason": "no"}), ctx)
        .await
        .unwrap_err();
    assert_eq!(error.message(), "refused: no");
}

#[tokio::test]
async fn tools_hooks_and_the_system_prompt_see_the_agents_context() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("whoami", json!({"greeting": "hi"})));
    faux.push(FauxTurn::tool_call("add", json!({"a": 2, "b": 3})));
    faux.push(FauxTurn::text("done"));
    let seen_by_hooks = Arc::new(Mutex::new(Vec::new()));
    let seen = seen_by_hooks.clone();
    let settings = AgentSettings::new(faux.model())
        .with_system_prompt("stored instructions")
        .with_system_prompt_fn(|context: &AgentContext| {
            format!(
                "You help {} of {}.",
                context.user_id().unwrap_or("nobody"),
                context.tenant_id().unwrap_or("no tenant")
            )
        })
        .with_tools(
            ToolSet::new([
                Arc::new(AddTool) as Arc<dyn AgentTool>,
                Arc::new(WhoAmITool),
            ])
            .unwrap(),
        )
        .with_hooks(RunHooks {
            before_tool_call: Some(hook::before_tool_call(move |info| {
                seen.lock().unwrap().push((
                    info.call.name.clone(),
                    info.context.user_id().map(str::to_owned),
                ));
                async { Ok(tiller::run::BeforeToolCall::Proceed) }
            })),
            ..RunHooks::default()
        });
    let context = AgentContext::new()
        .with_user_id("u-1")
        .with_tenant_id("acme")
        .with_extension(Plan("pro"));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings)
                .with_id("helper")
                .with_context(context),
        )
        .await
        .unwrap();
    let outcome = agent.run("who am I?").await.unwrap();
    assert_eq!(outcome.text(), "done");

    let results = tool_results(&outcome.messages);
    assert_eq!(
        results,
        [
            json!({"greeting": "hi", "user": "u-1", "session": "helper", "plan": "pro"})
                .to_string(),
            "5".to_owned(),
        ]
    );
    assert_eq!(
        *seen_by_hooks.lock().unwrap(),
        [
            ("whoami".to_owned(), Some("u-1".to_owned())),
            ("add".to_owned(), Some("u-1".to_owned())),
        ]
    );
    let requests = faux.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        assert_eq!(
            request.context.system_prompt.as_deref(),
            Some("You help u-1 of acme.")
        );
    }
    let state = agent.state().await.unwrap();
    assert_eq!(
        state.definition.system_prompt.as_deref(),
        Some("stored instructions")
    );
    assert_eq!(
        state.context,
        ContextIds {
            user_id: Some("u-1".into()),
            tenant_id: Some("acme".into()),
            session_id: Some("helper".into()),
            ..ContextIds::default()
        }
    );
    // The session keeps the owner.
    let stored = supervisor.store().load("helper").await.unwrap().unwrap();
    assert_eq!(stored.record.tenant_id.as_deref(), Some("acme"));
    assert_eq!(stored.record.user_id.as_deref(), Some("u-1"));
    supervisor.shutdown().await;
}

#[tokio::test]
async fn a_run_takes_overrides_for_itself_alone() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text(r#"{"city": "Oslo"}"#));
    faux.push(FauxTurn::text("Plain again."));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(
            AgentSettings::new(faux.model()).with_system_prompt("Be helpful."),
        ))
        .await
        .unwrap();
    let schema = OutputSchema::new(
        "city",
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    );
    let outcome = agent
        .run_with(
            "Capital of Norway?",
            DefinitionPatch {
                system_prompt: Some("Answer in JSON.".into()),
                output_schema: Some(schema.clone()),
                temperature: Some(0.0),
                ..DefinitionPatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome.structured(), Some(&json!({"city": "Oslo"})));
    assert_eq!(
        serde_json::to_value(outcome.summary()).unwrap(),
        json!({
            "end": "completed",
            "text": "{\"city\": \"Oslo\"}",
            "output": {"city": "Oslo"},
            "usage": serde_json::to_value(outcome.usage()).unwrap(),
            "stop_reason": "stop",
            "messages": serde_json::to_value(&outcome.messages).unwrap(),
            "conversation": serde_json::to_value(&outcome.messages).unwrap(),
        })
    );
    // The next run has the agent's own settings again.
    let plain = agent.run("And now?").await.unwrap();
    assert_eq!(plain.output, None);
    let requests = faux.requests();
    assert_eq!(
        (
            requests[0].context.system_prompt.clone(),
            requests[0].temperature
        ),
        (
            Some(format!("Answer in JSON.\n\n{}", schema.instructions())),
            Some(0.0)
        )
    );
    assert_eq!(
        (
            requests[1].context.system_prompt.as_deref(),
            requests[1].temperature
        ),
        (Some("Be helpful."), None)
    );
    let state = agent.state().await.unwrap();
    assert_eq!(
        state.definition.system_prompt.as_deref(),
        Some("Be helpful.")
    );

    let error = agent
        .run_with(
            "hi",
            DefinitionPatch {
                api_key_env: Some("TILLER_TEST_NO_SUCH_KEY".into()),
                ..DefinitionPatch::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        error,
        AgentError::InvalidPatch(PatchError::MissingKey("TILLER_TEST_NO_SUCH_KEY".into()))
    );
    supervisor.shutdown().await;
}

#[tokio::test]
async fn run_until_keeps_the_run_going_within_the_turn_limit() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Step one."));
    faux.push(FauxTurn::text("Step two."));
    faux.push(FauxTurn::text("DONE."));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())))
        .await
        .unwrap();
    let until_done = || RunHooks {
        run_until: Some(hook::stop_when(|turn| turn.text().contains("DONE"))),
        ..RunHooks::default()
    };
    let outcome = agent
        .run_with_hooks("Do the task.", DefinitionPatch::default(), until_done())
        .await
        .unwrap();
    assert_eq!(outcome.end, RunEnd::Completed);
    let texts: Vec<String> = outcome
        .messages
        .iter()
        .map(|message| match message {
            AgentMessage::Llm(Message::User(user)) => format!("user: {}", user.text_content()),
            AgentMessage::Llm(Message::Assistant(answer)) => {
                format!("assistant: {}", answer.text())
            }
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        texts,
        [
            "user: Do the task.".to_owned(),
            "assistant: Step one.".to_owned(),
            format!("user: {RUN_UNTIL_NUDGE}"),
            "assistant: Step two.".to_owned(),
            format!("user: {RUN_UNTIL_NUDGE}"),
            "assistant: DONE.".to_owned(),
        ]
    );

    faux.push(FauxTurn::text("Still going."));
    faux.push(FauxTurn::text("Still going."));
    let limited = agent
        .run_with_hooks(
            "Again.",
            DefinitionPatch {
                max_turns: Some(2),
                ..DefinitionPatch::default()
            },
            until_done(),
        )
        .await
        .unwrap();
    assert_eq!(limited.end, RunEnd::TurnLimit);
    assert_eq!(faux.remaining(), 0);
    supervisor.shutdown().await;
}

/// Notes an agent keeps.
#[derive(Default)]
struct Notes {
    items: Mutex<Vec<String>>,
}

#[tool]
impl Notes {
    /// Add a note.
    async fn add(&self, text: String) -> Result<String, ToolError> {
        let mut items = self.items.lock().unwrap();
        items.push(text);
        Ok(format!("{} notes", items.len()))
    }

    /// List the notes.
    #[tool(name = "list_notes", sequential)]
    fn list(&self) -> Result<serde_json::Value, ToolError> {
        Ok(json!(*self.items.lock().unwrap()))
    }
}

#[tokio::test]
async fn an_impl_block_makes_a_tool_of_each_method_sharing_the_value() {
    let notes = Arc::new(Notes::default());
    let tools = notes.tools();
    let described: Vec<(&str, &str, ToolExecution)> = tools
        .iter()
        .map(|tool| (tool.name(), tool.description(), tool.execution()))
        .collect();
    assert_eq!(
        described,
        [
            ("add", "Add a note.", ToolExecution::Parallel),
            ("list_notes", "List the notes.", ToolExecution::Sequential),
        ]
    );
    assert_eq!(
        tools[0].parameters(),
        &json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        })
    );
    let ctx = || ToolContext::detached("call_1", CancellationToken::new(), |_| {});
    assert_eq!(
        tools[0]
            .execute(json!({"text": "milk"}), ctx())
            .await
            .unwrap(),
        ToolOutput::text("1 notes")
    );
    assert_eq!(
        tools[1].execute(json!({}), ctx()).await.unwrap().details,
        json!(["milk"])
    );
    assert_eq!(notes.items.lock().unwrap().len(), 1);
}

/// Book a table.
#[tool]
async fn book(day: Option<String>) -> Result<String, ToolError> {
    let day = day.ok_or_else(|| ToolError::needs_input("day", "Which day?"))?;
    Ok(format!("booked for {day}"))
}

#[tokio::test]
async fn a_tool_function_asks_the_user_through_its_error() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::new().with_tool_call_id("b1", "book", json!({})));
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor
        .spawn(AgentSpec::new(
            AgentSettings::new(faux.model())
                .with_tools(ToolSet::new([Arc::new(BookTool) as _]).unwrap()),
        ))
        .await
        .unwrap();
    assert_eq!(
        agent.run("book a table").await.unwrap().end,
        tiller::RunEnd::Parked
    );
    assert_eq!(
        agent.state().await.unwrap().waiting,
        [tiller::run::UserRequest::Input {
            tool_call_id: "b1".into(),
            tool_name: "book".into(),
            field: "day".into(),
            question: "Which day?".into(),
            current_data: json!({}),
        }]
    );
    supervisor.shutdown().await;
}

/// Say whose work this is, from `AgentContext::current()` alone (the tool is not
/// handed a context).
#[tool(timeout_ms = 5000)]
async fn whose() -> Result<String, ToolError> {
    let current = AgentContext::current().ok_or_else(|| ToolError::new("no current context"))?;
    Ok(format!(
        "user {} in session {}",
        current.user_id().unwrap_or("none"),
        current.session_id().unwrap_or("none")
    ))
}

#[tokio::test]
async fn agent_context_current_is_the_agents_in_a_tool_a_hook_and_a_sub_agent() {
    assert_eq!(
        WhoseTool.timeout(),
        Some(std::time::Duration::from_millis(5000))
    );
    assert_eq!(AddTool.timeout(), None);

    // The sub-agent: one call of `whose`, then its answer is what it said.
    let child_model = FauxProvider::new();
    child_model.push(FauxTurn::tool_call("whose", json!({})));
    child_model.respond_with(|request| {
        let said = match request.context.messages.last() {
            Some(Message::ToolResult(result)) => result.text_content(),
            _ => String::new(),
        };
        FauxTurn::text(said)
    });
    let child = AgentSpec::new(
        AgentSettings::new(child_model.model())
            .with_tools(ToolSet::new([Arc::new(WhoseTool) as Arc<dyn AgentTool>]).unwrap()),
    )
    .with_id("helper.child");

    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("whose", json!({})));
    faux.push(FauxTurn::tool_call("child", json!({"text": "whose work?"})));
    faux.push(FauxTurn::text("done"));
    let seen_by_hook = Arc::new(Mutex::new(Vec::new()));
    let seen = seen_by_hook.clone();
    let supervisor = Supervisor::start().await.unwrap();
    let sub_agent =
        tiller::agents::AgentAsTool::new(supervisor.clone(), child, "child", "Asks a child");
    let settings = AgentSettings::new(faux.model())
        .with_tools(
            ToolSet::new([
                Arc::new(WhoseTool) as Arc<dyn AgentTool>,
                Arc::new(sub_agent),
            ])
            .unwrap(),
        )
        .with_hooks(RunHooks {
            before_tool_call: Some(hook::before_tool_call(move |info| {
                let current = AgentContext::current().unwrap();
                seen.lock().unwrap().push(format!(
                    "{} for {}",
                    info.call.name,
                    current.user_id().unwrap()
                ));
                async { Ok(tiller::run::BeforeToolCall::Proceed) }
            })),
            ..RunHooks::default()
        });
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings)
                .with_id("helper")
                .with_context(AgentContext::new().with_user_id("u-7")),
        )
        .await
        .unwrap();
    let outcome = agent.run("who?").await.unwrap();
    let results = tool_results(&outcome.messages);
    assert_eq!(
        results,
        [
            "user u-7 in session helper",
            "user u-7 in session helper.child"
        ]
    );
    assert_eq!(
        *seen_by_hook.lock().unwrap(),
        ["whose for u-7", "child for u-7"]
    );
    supervisor.shutdown().await;
}

/// The text of each tool result among `messages`, in order.
fn tool_results(messages: &[AgentMessage]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|message| match message {
            AgentMessage::Llm(Message::ToolResult(result)) => Some(result.text_content()),
            _ => None,
        })
        .collect()
}
