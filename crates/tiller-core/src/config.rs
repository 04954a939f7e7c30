//! How a run behaves: the model and its options, what the model sees, where
//! steering and follow-ups come from, how tools run, hooks around tool calls, and
//! when to stop.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller_ai::{
    ApiKey, AssistantMessage, Content, Message, Model, StreamOptions, ToolCall, ToolChoice,
    ToolResultMessage,
};
use tokio_util::sync::CancellationToken;

use crate::budget::{Budgets, Spending};
use crate::compaction::{CompactionPolicy, Summarize};
use crate::context::AgentContext;
use crate::failure::BoxError;
use crate::guardrail::Guardrails;
use crate::hook;
use crate::message::AgentMessage;
use crate::request::{Answers, Approval};
use crate::tool::ToolOutput;

/// Turns the transcript into the messages the model sees. One of your own
/// should show a compaction's summary as the default does
/// ([`crate::compaction::summary_as_llm`]), or the model loses what it replaced.
pub type ConvertToLlm =
    Arc<dyn for<'a> Fn(&'a [AgentMessage]) -> Vec<Cow<'a, Message>> + Send + Sync>;
/// Rewrites the transcript before each model call (pruning, compaction); the full
/// history is kept regardless.
pub type TransformContext = Arc<
    dyn Fn(
            &[AgentMessage],
            CancellationToken,
        ) -> BoxFuture<'static, Result<Vec<AgentMessage>, BoxError>>
        + Send
        + Sync,
>;
/// Writes instructions for one run from who it works for (a user's working
/// memory, say): asked once, before the run's first model call; its text goes
/// after the system prompt for that run alone.
pub type Instructions = Arc<
    dyn Fn(&AgentContext) -> BoxFuture<'static, Result<Option<String>, BoxError>> + Send + Sync,
>;
/// Answers the API key for a provider, asked before every model call.
pub type ApiKeyResolver = Arc<dyn Fn(&str) -> BoxFuture<'static, Option<ApiKey>> + Send + Sync>;
/// Hands over queued messages (steering or follow-ups), removing them from the queue.
pub type MessageSource = Arc<dyn Fn() -> BoxFuture<'static, Vec<AgentMessage>> + Send + Sync>;
/// Returns once every event the run has emitted so far is durable, or why it cannot
/// be (see [`LoopConfig::write_ahead`]).
pub type WriteAhead = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;
/// Runs before a validated tool call: lets it proceed, rewrites its arguments, or blocks it.
pub type BeforeToolCallHook =
    Arc<dyn Fn(ToolCallInfo) -> BoxFuture<'static, Result<BeforeToolCall, BoxError>> + Send + Sync>;
/// Runs after a tool call: may replace its content, details, error flag or terminate flag.
pub type AfterToolCallHook = Arc<
    dyn Fn(ToolCallInfo, ToolOutput, bool) -> BoxFuture<'static, Result<AfterToolCall, BoxError>>
        + Send
        + Sync,
>;
/// Decides after each turn whether the run should stop.
pub type StopWhen = Arc<dyn Fn(&TurnSummary<'_>) -> bool + Send + Sync>;

/// When steering messages reach the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SteeringDelivery {
    /// As soon as possible: steering that arrives while tools run skips the calls
    /// not yet finished (each gets the result "Skipped due to queued user
    /// message.") and is delivered in the next turn.
    #[default]
    Interrupt,
    /// After the turn: every tool call runs; steering enters after `turn_end`.
    AfterTurn,
}

/// How the tool calls of one turn run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolExecutionMode {
    /// All at once; they finish in any order, results are kept in call order. A
    /// turn calling a tool that must run alone runs sequentially.
    #[default]
    Parallel,
    /// One after another, in call order.
    Sequential,
}

/// A tool call as the hooks see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallInfo {
    /// The call as the model made it.
    pub call: ToolCall,
    /// The arguments after coercion and validation.
    pub args: Value,
    /// Who the agent works for.
    pub context: AgentContext,
}

/// What `before_tool_call` decides.
#[derive(Debug, Clone, PartialEq)]
pub enum BeforeToolCall {
    /// Run the tool as called.
    Proceed,
    /// Run the tool with these arguments instead (not validated again).
    Rewrite(Value),
    /// Do not run the tool; the model reads `reason` as an error result.
    Block {
        /// What the model is told.
        reason: String,
        /// Ask the run to stop after this turn.
        terminate: bool,
    },
}

/// What `after_tool_call` replaces; `None` keeps the tool's own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AfterToolCall {
    /// New content for the model.
    pub content: Option<Vec<Content>>,
    /// New details.
    pub details: Option<Value>,
    /// A new error flag.
    pub is_error: Option<bool>,
    /// A new terminate flag.
    pub terminate: Option<bool>,
}

/// One finished turn, for the stop condition.
#[derive(Debug, Clone, Copy)]
pub struct TurnSummary<'a> {
    /// The turn's number in this run, from 1.
    pub turn: u32,
    /// The assistant's response.
    pub message: &'a AssistantMessage,
    /// The results of its tool calls.
    pub tool_results: &'a [ToolResultMessage],
    /// Who the agent works for.
    pub context: &'a AgentContext,
}

impl TurnSummary<'_> {
    /// The response's text.
    pub fn text(&self) -> String {
        self.message.text()
    }

    /// The response's tool calls.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.message.tool_calls()
    }

    /// Whether the turn called the tool `name`.
    pub fn called(&self, name: &str) -> bool {
        self.tool_calls().any(|call| call.name == name)
    }

    /// Whether the response called any tool.
    pub fn has_tool_calls(&self) -> bool {
        self.tool_calls().next().is_some()
    }

    /// The result of the turn's first call of the tool `name`, if it made one.
    pub fn get_result(&self, name: &str) -> Option<&ToolResultMessage> {
        self.tool_results
            .iter()
            .find(|result| result.tool_name == name)
    }
}

/// The application's callbacks around a run. Cheap to clone.
#[derive(Clone, Default)]
pub struct RunHooks {
    /// What the model sees of the transcript; by default every LLM message,
    /// custom messages dropped.
    pub convert_to_llm: Option<ConvertToLlm>,
    /// Applied to the transcript before `convert_to_llm` on every model call.
    pub transform_context: Option<TransformContext>,
    /// Adds to the system prompt for a run, asked once before its first model
    /// call; a failure ends the run as a failed response does.
    pub instructions: Option<Instructions>,
    /// Asked for the key before every model call; falls back to `stream.transport.api_key`.
    pub api_key_resolver: Option<ApiKeyResolver>,
    /// Runs before each validated tool call.
    pub before_tool_call: Option<BeforeToolCallHook>,
    /// Runs after each tool call.
    pub after_tool_call: Option<AfterToolCallHook>,
    /// Stops the run after a turn when it answers `true`.
    pub stop_when: Option<StopWhen>,
    /// Keeps the run going until it answers `true`: an answer without tool calls
    /// that it does not accept gets [`RUN_UNTIL_NUDGE`] as the next user message,
    /// within the turn limit.
    pub run_until: Option<StopWhen>,
    /// Writes a compaction's summary in place of the run's model (see
    /// [`crate::compaction`]).
    pub summarize: Option<Summarize>,
    /// Checks of the run's input, its final answer and its tool calls (see
    /// [`crate::guardrail`]).
    pub guardrails: Guardrails,
}

/// The user message a run gets when `run_until` does not accept its answer.
pub const RUN_UNTIL_NUDGE: &str = "The task is not finished yet: keep going.";

impl RunHooks {
    /// These hooks with each one `over` sets in place of this one's; the
    /// guardrails of both.
    pub fn merged(&self, over: &RunHooks) -> RunHooks {
        fn pick<T: Clone>(mine: &Option<T>, theirs: &Option<T>) -> Option<T> {
            theirs.as_ref().or(mine.as_ref()).cloned()
        }
        RunHooks {
            convert_to_llm: pick(&self.convert_to_llm, &over.convert_to_llm),
            transform_context: pick(&self.transform_context, &over.transform_context),
            instructions: pick(&self.instructions, &over.instructions),
            api_key_resolver: pick(&self.api_key_resolver, &over.api_key_resolver),
            before_tool_call: pick(&self.before_tool_call, &over.before_tool_call),
            after_tool_call: pick(&self.after_tool_call, &over.after_tool_call),
            stop_when: pick(&self.stop_when, &over.stop_when),
            run_until: pick(&self.run_until, &over.run_until),
            summarize: pick(&self.summarize, &over.summarize),
            guardrails: self.guardrails.clone().and(&over.guardrails),
        }
    }
}

impl fmt::Debug for RunHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set: Vec<&str> = [
            ("convert_to_llm", self.convert_to_llm.is_some()),
            ("transform_context", self.transform_context.is_some()),
            ("instructions", self.instructions.is_some()),
            ("api_key_resolver", self.api_key_resolver.is_some()),
            ("before_tool_call", self.before_tool_call.is_some()),
            ("after_tool_call", self.after_tool_call.is_some()),
            ("stop_when", self.stop_when.is_some()),
            ("run_until", self.run_until.is_some()),
            ("summarize", self.summarize.is_some()),
            ("guardrails", !self.guardrails.is_empty()),
        ]
        .into_iter()
        .filter_map(|(name, present)| present.then_some(name))
        .collect();
        f.debug_tuple("RunHooks").field(&set).finish()
    }
}

/// How a run behaves, apart from its model, its hooks and where its queued
/// messages come from: the one place these settings live. An agent's definition
/// holds one, and each of its runs takes it whole. Cheap to clone.
///
/// It serializes as settings (durations in milliseconds), without the approvals,
/// which may be code ([`Approval::AskIf`]) and come with the agent's tools.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct RunOptions {
    /// Request options (thinking level, session id, temperature, token limit, tool
    /// choice, retries, timeouts, headers, API key); the run supplies the
    /// cancellation token and, through `api_key_resolver`, the key.
    pub stream: StreamOptions,
    /// The tool choice of a run's model calls after the model has called a tool, in
    /// place of `stream.tool_choice` when that one forces a call (`required` or a
    /// named tool): forced on every turn, the model could never answer. `None`
    /// leaves the choice to the provider.
    pub tool_choice_after_tools: Option<ToolChoice>,
    /// When steering reaches the model.
    pub steering_delivery: SteeringDelivery,
    /// How a turn's tool calls run.
    pub tool_execution: ToolExecutionMode,
    /// The most turns (model calls) a run makes.
    pub max_turns: u32,
    /// How long running tools and callbacks (hooks, the key resolver, the
    /// transform) get to return after an abort or a skip before they are dropped.
    #[serde(rename = "cancel_grace_ms", with = "tiller_ai::millis")]
    pub cancel_grace: Duration,
    /// The longest a call of a tool may run when the tool sets no
    /// [`AgentTool::timeout`](crate::AgentTool::timeout) of its own (command,
    /// MCP and sub-agent tools included, besides their own bounds); past it the
    /// call is cancelled, then dropped after `cancel_grace`, and its result is an
    /// error saying so. `None` (the default): no limit.
    #[serde(
        rename = "tool_timeout_ms",
        with = "tiller_ai::millis::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_timeout: Option<Duration>,
    /// REMLight's child-content rule: once a tool's result streamed to the
    /// run's subscribers as it was made (a sub-agent's answer), the text of the
    /// responses after it in the run is not streamed again: each text block's
    /// `text_start` and `text_end` go out (its place stays known) without its
    /// deltas, no update carries its text, and `message_end` (the transcript)
    /// has it whole. Off by default; `tiller serve` turns it on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quiet_after_child_content: bool,
    /// The most content bytes a tool result (and each partial result) keeps; the
    /// rest is cut, with a last text block saying how much (see
    /// [`ToolOutput::cut_to`]). Default 256 KiB.
    pub max_tool_output_bytes: usize,
    /// How many times an answer that fails the output schema
    /// (`stream.output_schema`) is sent back to the model with the errors before
    /// the run ends with [`RunEnd::InvalidOutput`](crate::RunEnd::InvalidOutput).
    /// Default 2.
    pub output_retries: u32,
    /// Which tools' calls wait for the user's approval, by tool name; a tool not
    /// named runs without asking (see [`crate::request`]).
    #[serde(skip)]
    pub approvals: BTreeMap<String, Approval>,
    /// How many times in a row a tool may ask the user for input
    /// ([`ToolError::NeedsInput`](crate::ToolError::NeedsInput)) before its ask is
    /// an ordinary error result. Default 3.
    pub max_asks_per_tool: u32,
    /// Where the user's answer to a tool's question goes: into the waiting call's
    /// arguments, which runs again at once (the default), or to the model as the
    /// call's result (see [`crate::request`]).
    pub answers: Answers,
    /// When the transcript is compacted to stay inside the model's context
    /// window (see [`crate::compaction`]).
    pub compaction: CompactionPolicy,
    /// What a run and its agent may spend (see [`crate::budget`]); unbounded by
    /// default.
    #[serde(skip_serializing_if = "Budgets::is_unbounded")]
    pub budget: Budgets,
}

impl Default for RunOptions {
    /// Interrupting steering, parallel tools, at most 50 turns, 100 ms of grace.
    fn default() -> Self {
        RunOptions {
            stream: StreamOptions::default(),
            tool_choice_after_tools: None,
            steering_delivery: SteeringDelivery::Interrupt,
            tool_execution: ToolExecutionMode::Parallel,
            max_turns: 50,
            cancel_grace: Duration::from_millis(100),
            tool_timeout: None,
            quiet_after_child_content: false,
            max_tool_output_bytes: 256 * 1024,
            output_retries: 2,
            approvals: BTreeMap::new(),
            max_asks_per_tool: 3,
            answers: Answers::default(),
            compaction: CompactionPolicy::default(),
            budget: Budgets::default(),
        }
    }
}

/// Everything a run needs besides its messages. Cheap to clone.
#[derive(Clone)]
pub struct LoopConfig {
    /// The model to call.
    pub model: Model,
    /// The models asked, in order, when the one before fails in a way retrying
    /// did not fix, before it streamed anything (see [`AgentEvent::ModelFallback`](crate::AgentEvent::ModelFallback)).
    pub fallbacks: Vec<Model>,
    /// What the run counts against besides its own budget: its agent's spending
    /// before it, its tenant's tally (see [`crate::budget`]).
    pub spending: Spending,
    /// How the run behaves.
    pub run: RunOptions,
    /// The application's callbacks.
    pub hooks: RunHooks,
    /// Where steering messages come from.
    pub steering: Option<MessageSource>,
    /// Steering messages the caller took for the run's start: read in place of
    /// `steering`'s first read, so the first turn waits on no round trip. Not
    /// delivered when the run is aborted before its first turn; the caller keeps
    /// them.
    pub first_steering: Option<Vec<AgentMessage>>,
    /// Where follow-up messages come from.
    pub follow_up: Option<MessageSource>,
    /// Write-ahead: returns once every event the run emitted so far is durable.
    /// Awaited after a response with tool calls to run has ended (its
    /// `message_end` emitted), and after an approval's `approval_granted` message,
    /// before any call starts — before its `tool_execution_start`, hooks and tool —
    /// so that a call is durable before anything it causes happens. An error
    /// answers the calls with error results saying they did not run, and ends the
    /// run with an error. An abort meanwhile stops the wait (the calls are then
    /// answered "aborted").
    pub write_ahead: Option<WriteAhead>,
    /// Once cancelled, the run ends where its next turn would start, with
    /// [`RunEnd::Paused`](crate::RunEnd::Paused): the turn in progress finishes
    /// (its tool results included), messages already taken from a queue join the
    /// transcript, and a later run goes on from there as if nothing had stopped.
    /// A host moving the agent elsewhere between two turns uses it.
    pub pause: Option<CancellationToken>,
    /// Who the run works for; tools and hooks see it.
    pub context: AgentContext,
}

impl LoopConfig {
    /// Defaults for `model`: no callbacks, interrupting steering, parallel tools,
    /// at most 50 turns.
    pub fn new(model: Model) -> Self {
        LoopConfig {
            model,
            fallbacks: Vec::new(),
            spending: Spending::default(),
            run: RunOptions::default(),
            hooks: RunHooks::default(),
            steering: None,
            first_steering: None,
            follow_up: None,
            write_ahead: None,
            pause: None,
            context: AgentContext::default(),
        }
    }

    /// Sets what the model sees of the transcript.
    pub fn with_convert_to_llm(
        mut self,
        convert: impl for<'a> Fn(&'a [AgentMessage]) -> Vec<Cow<'a, Message>> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.convert_to_llm = Some(hook::convert_to_llm(convert));
        self
    }

    /// Sets the transform applied before each model call.
    pub fn with_transform_context<F, Fut>(mut self, transform: F) -> Self
    where
        F: Fn(&[AgentMessage], CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<AgentMessage>, BoxError>> + Send + 'static,
    {
        self.hooks.transform_context = Some(hook::transform_context(transform));
        self
    }

    /// Sets the API key resolver.
    pub fn with_api_key_resolver<F, Fut>(mut self, resolve: F) -> Self
    where
        F: Fn(&str) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<ApiKey>> + Send + 'static,
    {
        self.hooks.api_key_resolver = Some(hook::api_key_resolver(resolve));
        self
    }

    /// Sets where steering messages come from.
    pub fn with_steering<F, Fut>(mut self, source: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<AgentMessage>> + Send + 'static,
    {
        self.steering = Some(hook::message_source(source));
        self
    }

    /// Sets where follow-up messages come from.
    pub fn with_follow_up<F, Fut>(mut self, source: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<AgentMessage>> + Send + 'static,
    {
        self.follow_up = Some(hook::message_source(source));
        self
    }

    /// Sets the write-ahead wait (see [`LoopConfig::write_ahead`]).
    pub fn with_write_ahead<F, Fut>(mut self, write_ahead: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        self.write_ahead = Some(Arc::new(move || Box::pin(write_ahead())));
        self
    }

    /// Sets the hook run before each validated tool call.
    pub fn with_before_tool_call<F, Fut>(mut self, before: F) -> Self
    where
        F: Fn(ToolCallInfo) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<BeforeToolCall, BoxError>> + Send + 'static,
    {
        self.hooks.before_tool_call = Some(hook::before_tool_call(before));
        self
    }

    /// Sets the hook run after each tool call.
    pub fn with_after_tool_call<F, Fut>(mut self, after: F) -> Self
    where
        F: Fn(ToolCallInfo, ToolOutput, bool) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<AfterToolCall, BoxError>> + Send + 'static,
    {
        self.hooks.after_tool_call = Some(hook::after_tool_call(after));
        self
    }

    /// Asks the model for `choice` on a run's first call, and for `after` once it
    /// has called a tool when `choice` forces a call (see `tool_choice_after_tools`).
    pub fn with_tool_choice(mut self, choice: ToolChoice, after: Option<ToolChoice>) -> Self {
        self.run.stream.tool_choice = Some(choice);
        self.run.tool_choice_after_tools = after;
        self
    }

    /// Sets the stop condition.
    pub fn with_stop_when(
        mut self,
        stop: impl Fn(&TurnSummary<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.hooks.stop_when = Some(hook::stop_when(stop));
        self
    }
}

impl fmt::Debug for LoopConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |present: bool| if present { "set" } else { "none" };
        f.debug_struct("LoopConfig")
            .field(
                "model",
                &format_args!("{}/{}", self.model.provider, self.model.id),
            )
            .field("run", &self.run)
            .field("hooks", &self.hooks)
            .field("steering", &set(self.steering.is_some()))
            .field("follow_up", &set(self.follow_up.is_some()))
            .field("write_ahead", &set(self.write_ahead.is_some()))
            .field("context", &self.context)
            .finish()
    }
}
