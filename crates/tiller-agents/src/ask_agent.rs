//! [`AskAgent`]: the built-in `ask_agent` tool, with which an agent hands work to
//! another agent by definition name.
//!
//! Each call runs a sub-agent of the named definition under the same supervisor:
//! - it works for the caller's context ([`AgentContext::child_context`]: user,
//!   tenant, client, evaluation flag; another user of the tenant when the model
//!   names one and [`AskAgentConfig::allow_user_override`] allows it) and keeps a
//!   session of its own per caller session and definition (`{caller
//!   session}/{definition}`), so a second call in the same conversation finds what
//!   the first one said (a call made while another call holds that session gets
//!   `…/{definition}#{call id}`, beside it, and goes back there when the user
//!   approves what it asked);
//! - every event it publishes reaches the caller's subscribers as a
//!   [`AgentEvent::ChildEvent`] with the path of agents it came through
//!   ([`AgentContext::agents`]), in order, among the caller's own events;
//! - its final answer is the call's result (structured output in the details),
//!   marked [`ToolOutput::streamed`]: the caller's `tool_execution_end` does not
//!   repeat what the sub-agent streamed, while the transcript keeps it for the model;
//! - aborting the caller aborts it (and, through its own `ask_agent` calls, every
//!   descendant); it has [`AskAgentConfig::timeout`] to answer; a failure is the
//!   call's error;
//! - a question it asks the user ([`ToolError::NeedsInput`]) becomes the caller's
//!   question, for the call's `text`: the caller parks, and the user's answer,
//!   merged into the call, goes to the sub-agent's own question; a call
//!   it wants approved becomes the caller's approval request
//!   ([`ToolError::NeedsApproval`]): approved, the same sub-agent goes on with it;
//! - delegation is at most [`AskAgentConfig::max_depth`] levels deep, and a
//!   definition already on the path is refused (a cycle).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tiller_core::{
    AgentContext, AgentEvent, AgentTool, ContextOverrides, Prompt, Reply, RunEnd, ToolContext,
    ToolError, ToolOutput, UserRequest,
};

use crate::agent_tool::answer;
use crate::definitions::Definitions;
use crate::{AgentHandle, Supervisor};
use tiller_runtime::Delivered;
use tiller_runtime::{AgentError, SpawnError};
use tiller_store::SessionFilter;

/// The tool's name, as agent files list it.
pub const ASK_AGENT_TOOL: &str = "ask_agent";

/// The bounds of `ask_agent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskAgentConfig {
    /// How long a sub-agent has to answer; past it, it is aborted and the call
    /// fails. Default 300 s.
    pub timeout: Duration,
    /// How many levels deep agents may delegate (a root's sub-agent is level 1).
    /// Default 3.
    pub max_depth: usize,
    /// Whether the model may name another user (`user_id`) for the sub-agent to
    /// work for, in the caller's tenant. Default `false`: it works for the caller's.
    pub allow_user_override: bool,
    /// How many sub-agents this tool runs at once, over every agent that has it
    /// (a response may make many calls, each of which may delegate again); a call
    /// past it fails at once. Default 64.
    pub max_running: usize,
    /// Whether the caller's restatement of a sub-agent's streamed answer is kept
    /// from the caller's subscribers (REMLight's child content deduplication): a
    /// text block of the caller's next response that only repeats the answer is
    /// not streamed again, and stays in the transcript. Default `false`; `tiller
    /// serve` turns it on.
    pub quiet_restatements: bool,
}

impl Default for AskAgentConfig {
    fn default() -> Self {
        AskAgentConfig {
            timeout: Duration::from_secs(300),
            max_depth: 3,
            allow_user_override: false,
            max_running: 64,
            quiet_restatements: false,
        }
    }
}

/// The `ask_agent` tool (see the module docs). Made by
/// [`Definitions::with_ask_agent`], which gives it the definitions it runs.
pub struct AskAgent {
    supervisor: Supervisor,
    definitions: Arc<OnceLock<Definitions>>,
    config: AskAgentConfig,
    /// One permit per sub-agent running ([`AskAgentConfig::max_running`]).
    running: Arc<tokio::sync::Semaphore>,
    /// Made once the definitions are known: their names are the `agent` values.
    parameters: OnceLock<Value>,
    description: OnceLock<String>,
}

impl AskAgent {
    pub(crate) fn new(
        supervisor: Supervisor,
        definitions: Arc<OnceLock<Definitions>>,
        config: AskAgentConfig,
    ) -> Self {
        AskAgent {
            supervisor,
            definitions,
            running: Arc::new(tokio::sync::Semaphore::new(config.max_running)),
            config,
            parameters: OnceLock::new(),
            description: OnceLock::new(),
        }
    }

    /// The definitions' names, each once.
    fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .definitions
            .get()
            .map(|definitions| definitions.iter().map(|file| file.name.as_str()).collect())
            .unwrap_or_default();
        names.dedup();
        names
    }

    async fn ask(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let name = args["agent"].as_str().unwrap_or_default();
        let mut text = args["text"].as_str().unwrap_or_default().to_owned();
        // Merged into `text` (the field a sub-agent's question asks for), the
        // user's answer to that question.
        let user_answer = ctx.answered().then(|| text.clone());
        if let Some(input) = args.get("input").filter(|input| !input.is_null()) {
            text.push_str(&format!("\n\nInput:\n{input}"));
        }
        let definitions = self
            .definitions
            .get()
            .ok_or_else(|| ToolError::new("ask_agent has no definitions to run"))?;
        let caller = match ctx.agent().agents() {
            [] => vec!["agent".to_owned()],
            agents => agents.to_vec(),
        };
        if caller.len() > self.config.max_depth {
            return Err(ToolError::new(format!(
                "cannot ask `{name}`: agents may delegate at most {} levels deep ({})",
                self.config.max_depth,
                caller.join(" → ")
            )));
        }
        let _running = self.running.clone().try_acquire_owned().map_err(|_| {
            ToolError::new(format!(
                "cannot ask `{name}`: {} sub-agents are running already, the most at once",
                self.config.max_running
            ))
        })?;
        if caller.iter().any(|agent| agent == name) {
            return Err(ToolError::new(format!(
                "cannot ask `{name}`: it is already working on this request ({} → {name}), which would be a cycle",
                caller.join(" → ")
            )));
        }
        let spec = definitions.spec(name, None).map_err(|error| {
            let known: Vec<&str> = definitions.iter().map(|file| file.name.as_str()).collect();
            ToolError::new(format!("{error} (known agents: {})", known.join(", ")))
        })?;
        let mut path = caller;
        path.push(name.to_owned());
        let mut session = format!(
            "{}/{name}",
            ctx.agent().session_id().unwrap_or(ctx.call_id())
        );
        let mut context: AgentContext = ctx
            .agent()
            .child_context(ContextOverrides::default())
            .through(name);
        if let Some(user) = args["user_id"]
            .as_str()
            .filter(|_| self.config.allow_user_override)
        {
            context = context.with_user_id(user);
            // Each user's conversation with the sub-agent is a session of its
            // own, which only that user's calls bring up.
            session = format!("{session}@{user}");
        }
        let spec = spec.with_context(context);
        let cannot = |error: SpawnError| ToolError::new(format!("cannot start `{name}`: {error}"));
        // A call's own session, beside the conversation's (not under it: stopping
        // one does not stop the other).
        let own = format!("{session}#{}", ctx.call_id());
        // An approved or answered call goes back to the session it asked in: its
        // own, when it had to take one.
        let first = if (ctx.approved() || user_answer.is_some()) && self.stored(&own).await {
            own.clone()
        } else {
            session
        };
        let child = match self
            .supervisor
            .spawn(spec.clone().with_session(first))
            .await
        {
            Ok(child) => child,
            // The conversation's sub-agent is busy with another call of the same
            // turn: this call gets a session of its own.
            Err(SpawnError::IdTaken(_)) => self
                .supervisor
                .spawn(spec.with_session(own))
                .await
                .map_err(cannot)?,
            Err(error) => return Err(cannot(error)),
        };
        let outcome = self
            .run_child(&child, name, path, text, user_answer, &ctx)
            .await;
        self.supervisor.stop(child.id().as_str()).await;
        outcome
    }

    /// Whether the store keeps the session `id`.
    async fn stored(&self, id: &str) -> bool {
        self.supervisor
            .store()
            .list(&SessionFilter::only(id))
            .await
            .is_ok_and(|found| !found.is_empty())
    }

    /// Runs `child` on `text` (or gives its open question `user_answer`),
    /// its events relayed to `ctx`, and makes its outcome the call's.
    async fn run_child(
        &self,
        child: &AgentHandle,
        name: &str,
        path: Vec<String>,
        text: String,
        user_answer: Option<String>,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let failed = |error: AgentError| ToolError::new(format!("`{name}`: {error}"));
        let waiting = child.state().await.map_err(failed)?.waiting;
        let prompt = match waiting.first() {
            // The user approved what the sub-agent asked for: it goes on.
            Some(request @ UserRequest::Approval { .. }) if ctx.approved() => {
                Prompt::Reply(Reply::approve(request.tool_call_id()))
            }
            // The user answered what it asked: the answer goes to its question.
            Some(request @ UserRequest::Input { .. }) if user_answer.is_some() => Prompt::Reply(
                Reply::answer(request.tool_call_id(), user_answer.unwrap_or_default()),
            ),
            // A request the sub-agent left open last time is moot now.
            Some(_) => {
                child.abort();
                Prompt::from(text)
            }
            None => Prompt::from(text),
        };
        let _relay = {
            let ctx = ctx.clone();
            child.relay(move |envelope| match &envelope.event {
                // Already named by the path of the agent that emitted it.
                Delivered::Event(AgentEvent::ChildEvent { path, event, .. }) => {
                    ctx.child_event(path.clone(), (**event).clone())
                }
                Delivered::Event(event) => ctx.child_event(path.clone(), event.clone()),
                Delivered::Notice(_) => {}
            })
        };
        // Stopped here rather than by the supervisor, so that its last events
        // still reach the caller's subscribers.
        let halt = |why: String| async move {
            child.abort();
            child.wait_for_idle().await;
            Err(ToolError::new(why))
        };
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(self.config.timeout, child.run(prompt)) => outcome,
            () = ctx.cancel().cancelled() => return halt(format!("`{name}` was aborted")).await,
        };
        let outcome = match outcome {
            Err(_) => {
                let timeout = self.config.timeout;
                return halt(format!("`{name}` did not answer within {timeout:?}")).await;
            }
            Ok(outcome) => outcome.map_err(failed)?,
        };
        if outcome.end != RunEnd::Parked {
            return answer(&outcome, &format!("`{name}`")).map(|mut output| {
                output.streamed = true;
                output.quiet_restatement = self.config.quiet_restatements;
                output
            });
        }
        let state = child.state().await.map_err(failed)?;
        match state.waiting.into_iter().next() {
            // Asked as the call's `text`: merged into the call, the answer
            // reaches the sub-agent's own question.
            Some(UserRequest::Input {
                field, question, ..
            }) => Err(ToolError::needs_input(
                "text",
                format!("({name} asks for `{field}`) {question}"),
            )),
            Some(UserRequest::Approval {
                tool_name,
                args,
                reason,
                ..
            }) => Err(ToolError::needs_approval(match reason {
                Some(reason) => format!("({name} asks) {reason}"),
                None => format!("({name} asks) run {tool_name} {args}"),
            })),
            None => Err(ToolError::new(format!(
                "`{name}` stopped waiting for the user"
            ))),
        }
    }
}

impl AgentTool for AskAgent {
    fn name(&self) -> &str {
        ASK_AGENT_TOOL
    }

    fn description(&self) -> &str {
        self.description.get_or_init(|| {
            format!(
                "Asks another agent, by name, to do a task, and answers with its final answer. Agents: {}.",
                self.names().join(", ")
            )
        })
    }

    fn parameters(&self) -> &Value {
        self.parameters.get_or_init(|| {
            let mut parameters = json!({
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "enum": self.names(), "description": "The agent to ask."},
                    "text": {"type": "string", "description": "What to ask it."},
                    "input": {"type": "object", "description": "Structured input for it, if it takes any."}
                },
                "required": ["agent", "text"],
                "additionalProperties": false
            });
            if self.config.allow_user_override {
                parameters["properties"]["user_id"] = json!({
                    "type": "string",
                    "description": "The user it works for, when not the caller's."
                });
            }
            parameters
        })
    }

    fn execute<'a>(
        &'a self,
        args: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(self.ask(args, ctx))
    }
}

impl Definitions {
    /// The same definitions with the built-in `ask_agent` tool ([`AskAgent`]) in
    /// their registry, running these definitions' agents under `supervisor`:
    /// agent files list it (`- name: ask_agent`) to hand work to each other. Call
    /// it last: the tool runs the definitions as they are then (and keeps them
    /// alive as long as it lives).
    pub fn with_ask_agent(mut self, supervisor: &Supervisor, config: AskAgentConfig) -> Self {
        let definitions = Arc::new(OnceLock::new());
        self.tools.register(Arc::new(AskAgent::new(
            supervisor.clone(),
            definitions.clone(),
            config,
        )));
        // The tool keeps these definitions (with itself) for as long as it lives.
        let _ = definitions.set(self.clone());
        self
    }
}
