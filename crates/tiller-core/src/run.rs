//! The loop: turns of model responses and tool calls, with steering, follow-ups,
//! stop conditions and abort.
//!
//! A run owns its copy of the context and never touches the caller's. It asks for
//! steering at the start, after tool calls (when steering interrupts) and after each
//! turn; for follow-ups only when it would otherwise stop. Every failure of a
//! callback or of the model becomes part of the transcript (an assistant message
//! with stop reason `error`) and the run still ends with `agent_end`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tiller_ai::{
    AssistantEvent, AssistantMessage, Content, ContextRef, ImageContent, Message, Model,
    RateLimitObserver, StopReason, StreamError, StreamOptions, StreamedMessage, ToolChoice,
    ToolResultMessage, UserMessage,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::budget::{BudgetExceeded, Meter, Spent};
use crate::compaction::{
    self, CompactionReason, CompactionSummary, ContextTokens, SummaryRequest, estimate_tokens,
};
use crate::config::{LoopConfig, MessageSource, RUN_UNTIL_NUDGE, StopWhen, TurnSummary};
use crate::event::{AgentEvent, RunEnd};
use crate::execute::{self, Batch};
use crate::guardrail::{GuardrailStage, GuardrailTripped};
use crate::message::{AgentMessage, default_convert_to_llm};
use crate::output::{self, Output, OutputCheck, OutputError};
use crate::repair::repair;
use crate::request::{self, Answers, Reply, UserRequest, open_requests};
use crate::restate::Restatements;
use crate::toolset::ToolSet;

/// Receives every event of a run, in order. It must not block.
pub type EventSink = Arc<dyn Fn(AgentEvent) + Send + Sync>;

/// What starts a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// New messages.
    Messages(Vec<AgentMessage>),
    /// The transcript as it stands.
    Continue,
    /// The user's reply to one of the requests a parked run left open (see
    /// [`crate::request`]).
    Reply(Reply),
    /// No model turn: compact the transcript (see [`crate::compaction`]), with
    /// these instructions for the summary added to the policy's.
    Compact {
        /// What the summary should keep or stress.
        instructions: Option<String>,
    },
}

impl Prompt {
    /// A user message of text and images.
    pub fn with_images(text: impl Into<String>, images: Vec<ImageContent>) -> Self {
        let mut message = UserMessage::text(text);
        message
            .content
            .extend(images.into_iter().map(Content::Image));
        Prompt::Messages(vec![message.into()])
    }
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        Prompt::Messages(vec![AgentMessage::user(text)])
    }
}

impl From<String> for Prompt {
    fn from(text: String) -> Self {
        Prompt::Messages(vec![AgentMessage::user(text)])
    }
}

impl From<AgentMessage> for Prompt {
    fn from(message: AgentMessage) -> Self {
        Prompt::Messages(vec![message])
    }
}

impl From<UserMessage> for Prompt {
    fn from(message: UserMessage) -> Self {
        Prompt::Messages(vec![message.into()])
    }
}

impl From<Vec<AgentMessage>> for Prompt {
    fn from(messages: Vec<AgentMessage>) -> Self {
        Prompt::Messages(messages)
    }
}

/// What a run starts from: the system prompt, the transcript and the tools.
#[derive(Debug, Clone, Default)]
pub struct LoopContext {
    /// Instructions sent ahead of the conversation.
    pub system_prompt: Option<String>,
    /// The transcript so far.
    pub messages: Vec<AgentMessage>,
    /// The tools the model may call.
    pub tools: ToolSet,
    /// The transcript's token count, when the caller keeps one; counted from the
    /// messages when not (see [`crate::compaction`]).
    pub tokens: Option<ContextTokens>,
    /// The place of the transcript's first message in the session's stored
    /// transcript (a compaction's summary says what it replaces by place).
    pub first_seq: u64,
}

/// Why a run cannot start from what it was given on the transcript it has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContinueError {
    /// A prompt without messages.
    #[error("a prompt needs at least one message")]
    EmptyPrompt,
    /// There is nothing to continue from.
    #[error("nothing to continue: the transcript is empty")]
    EmptyContext,
    /// The model already answered last; a new turn needs a new message first.
    #[error(
        "cannot continue from an assistant message: prompt, or queue a steering or follow-up message first"
    )]
    EndsWithAssistant,
    /// A reply was given, but no request waits for one.
    #[error("no tool call waits for a reply")]
    NothingToReply,
    /// A reply names a request that is not open (requests wait, but not this one).
    #[error("no open request has the id `{request_id}`; the open ones are {}", open.join(", "))]
    NoSuchRequest {
        /// The id the reply gave.
        request_id: String,
        /// The ids of the open requests, oldest first.
        open: Vec<String>,
    },
    /// The request the reply names wants another kind of reply (an answer for a
    /// question, approve or deny for an approval).
    #[error("the reply does not fit the waiting request ({})", waiting.describe())]
    ReplyDoesNotFit {
        /// What waits.
        waiting: Box<UserRequest>,
    },
    /// A request waits for the user's reply; only a reply goes on.
    #[error(
        "a tool call waits for the user's reply ({}): answer, approve or deny it first, or abort to give it up",
        waiting.describe()
    )]
    WaitingForReply {
        /// What waits.
        waiting: Box<UserRequest>,
    },
}

/// The request `reply` resolves in the transcript `messages`: the open one it
/// names, if the reply fits it.
pub fn check_reply<M: std::borrow::Borrow<AgentMessage>>(
    messages: &[M],
    reply: &Reply,
) -> Result<UserRequest, ContinueError> {
    let mut open = open_requests(messages);
    if open.is_empty() {
        return Err(ContinueError::NothingToReply);
    }
    let Some(position) = open
        .iter()
        .position(|request| request.tool_call_id() == reply.request_id())
    else {
        return Err(ContinueError::NoSuchRequest {
            request_id: reply.request_id().to_owned(),
            open: open
                .iter()
                .map(|request| request.tool_call_id().to_owned())
                .collect(),
        });
    };
    let waiting = open.swap_remove(position);
    if !reply.fits(&waiting) {
        return Err(ContinueError::ReplyDoesNotFit {
            waiting: Box::new(waiting),
        });
    }
    Ok(waiting)
}

/// Checks that a run can start from new messages on the transcript `messages`:
/// no request waits for the user's reply.
pub fn check_prompt<M: std::borrow::Borrow<AgentMessage>>(
    messages: &[M],
) -> Result<(), ContinueError> {
    match open_requests(messages).into_iter().next() {
        Some(waiting) => Err(ContinueError::WaitingForReply {
            waiting: Box::new(waiting),
        }),
        None => Ok(()),
    }
}

/// A run's beginning, checked against the transcript by [`check_start`]: new
/// messages, the transcript as it stands, or the user's reply to an open request.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Start {
    /// New messages, on a transcript where no request waits for the user.
    Messages(Vec<AgentMessage>),
    /// The transcript as it stands: not empty, not ending with the model's answer,
    /// no request open.
    Continue,
    /// The user's reply and the open request it resolves.
    Reply(UserRequest, Reply),
    /// A compaction and nothing else, with these instructions.
    Compact(Option<String>),
}

/// Decides whether a run can start from `prompt` on the transcript `messages`,
/// and how: the one place the checks before a run are made.
pub fn check_start<M: std::borrow::Borrow<AgentMessage>>(
    prompt: Prompt,
    messages: &[M],
) -> Result<Start, ContinueError> {
    match prompt {
        Prompt::Messages(new) if new.is_empty() => Err(ContinueError::EmptyPrompt),
        Prompt::Messages(new) => {
            check_prompt(messages)?;
            Ok(Start::Messages(new))
        }
        Prompt::Continue => {
            check_prompt(messages)?;
            match messages.last() {
                None => Err(ContinueError::EmptyContext),
                Some(message) if message.borrow().as_assistant().is_some() => {
                    Err(ContinueError::EndsWithAssistant)
                }
                Some(_) => Ok(Start::Continue),
            }
        }
        Prompt::Reply(reply) => Ok(Start::Reply(check_reply(messages, &reply)?, reply)),
        Prompt::Compact { .. } if messages.is_empty() => Err(ContinueError::EmptyContext),
        Prompt::Compact { instructions } => Ok(Start::Compact(instructions)),
    }
}

/// Checks that a run can continue from `context`.
pub fn check_continue(context: &LoopContext) -> Result<(), ContinueError> {
    check_start(Prompt::Continue, &context.messages).map(|_| ())
}

/// Runs the loop to its end from `prompt`, sending every event to `sink`, and
/// returns only the messages this run added. A caller keeping its own transcript
/// applies a `compaction_end` with a summary to it: the summary in place of all
/// but its last `kept` messages (the agents of `tiller-runtime` do). [`Prompt::Continue`] runs from the
/// context as it stands (its last message must not be the assistant's), without
/// events for the messages already there; [`Prompt::Reply`] resolves the open
/// request it names first. New messages are refused while a request is open.
pub async fn run_loop(
    prompt: Prompt,
    context: LoopContext,
    config: LoopConfig,
    cancel: CancellationToken,
    sink: EventSink,
) -> Result<Vec<AgentMessage>, ContinueError> {
    let start = check_start(prompt, &context.messages)?;
    Ok(run_from(start, context, config, cancel, sink).await)
}

/// Runs the loop to its end from `start`, which [`check_start`] decided on
/// `context`'s transcript; like [`run_loop`] otherwise. Should the loop itself
/// panic, the run still ends with an error message and `agent_end`.
pub async fn run_from(
    start: Start,
    context: LoopContext,
    config: LoopConfig,
    cancel: CancellationToken,
    sink: EventSink,
) -> Vec<AgentMessage> {
    let span = tracing::info_span!(
        "agent_run",
        provider = %config.model.provider,
        model = %config.model.id,
        otel.name = "invoke_agent",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.provider.name = %config.model.provider,
        gen_ai.request.model = %config.model.id,
    );
    let mut failure = AssistantMessage::empty(&config.model);
    let run = Run::new(context, config, cancel, sink.clone());
    match AssertUnwindSafe(run.run(start))
        .catch_unwind()
        .instrument(span)
        .await
    {
        Ok(messages) => messages,
        Err(panic) => {
            failure.stop_reason = StopReason::Error;
            failure.timestamp = tiller_ai::now_ms();
            failure.error_message = Some(format!("the agent loop failed: {}", panic_text(panic)));
            let message = AgentMessage::from(failure);
            sink(AgentEvent::MessageStart {
                message: Box::new(message.clone()),
            });
            sink(AgentEvent::MessageEnd {
                message: Box::new(message.clone()),
            });
            sink(AgentEvent::AgentEnd {
                messages: vec![message.clone()],
                reason: RunEnd::Error,
                output: None,
            });
            vec![message]
        }
    }
}

/// Why a compaction left the transcript as it was.
#[derive(Debug)]
enum Unfinished {
    /// No place to cut.
    NothingToCut,
    /// The summary could not be written, for this reason (announced in
    /// `compaction_end`).
    Failed(String),
}

/// Why an application callback gave no answer.
pub(crate) enum Interrupted {
    /// It panicked, with this message.
    Panicked(String),
    /// The run was aborted and it did not return within the grace period.
    Aborted,
}

/// One run's state.
pub(crate) struct Run {
    pub(crate) config: LoopConfig,
    pub(crate) cancel: CancellationToken,
    /// The request options of every model call: the config's, with this run's token.
    options: StreamOptions,
    sink: EventSink,
    system_prompt: Option<String>,
    messages: Vec<AgentMessage>,
    pub(crate) tools: ToolSet,
    first_new: usize,
    /// This run's messages a compaction replaced with its summary.
    compacted_new: Vec<AgentMessage>,
    /// The transcript's token count.
    tokens: ContextTokens,
    /// The estimate of the system prompt and the tools, which a count that is
    /// not the provider's lacks.
    overhead: u64,
    /// The model's context window as far as the run knows it (a provider's
    /// refusal may name a smaller one).
    window: u32,
    /// The place of the transcript's first message in the stored transcript.
    first_seq: u64,
    /// Whether the last response failed because the request did not fit the window.
    overflowed: bool,
    turns: u32,
    /// What came of the structured output, when the run has a schema.
    output: Option<Output>,
    /// The call the user approved in this run's reply, which runs without asking.
    approved: Option<String>,
    /// The call the user's answer was merged into in this run's reply.
    answered: Option<String>,
    /// The agent state this run's calls set, by name (their results store it).
    pub(crate) state: crate::tool::SharedState,
    /// What the last tool round streamed that the next response need not stream
    /// again ([`crate::restate`]).
    echoes: Vec<String>,
    /// The run's budgets and spending.
    meter: Meter,
    /// The budget that ran out, ending the run.
    exceeded: Option<BudgetExceeded>,
    /// The guardrail that tripped, ending the run.
    tripped: OnceLock<GuardrailTripped>,
}

/// The input guardrails' verdict, awaited beside the first model call.
type Beside = Option<BoxFuture<'static, Option<GuardrailTripped>>>;

impl Run {
    fn new(
        context: LoopContext,
        config: LoopConfig,
        cancel: CancellationToken,
        sink: EventSink,
    ) -> Self {
        let mut options = StreamOptions {
            cancel: cancel.clone(),
            ..config.run.stream.clone()
        };
        if options.rate_limits.is_some() {
            let sink = sink.clone();
            options.on_rate_limited = Some(RateLimitObserver::new(move |wait| {
                sink(AgentEvent::RateLimited {
                    account: wait.account.to_string(),
                    wait_ms: u64::try_from(wait.wait.as_millis()).unwrap_or(u64::MAX),
                    cause: wait.cause,
                });
            }));
        }
        let meter = Meter::new(config.run.budget, config.spending.clone());
        let tokens = context
            .tokens
            .unwrap_or_else(|| ContextTokens::of(&context.messages));
        let overhead = compaction::overhead_tokens(
            context.system_prompt.as_deref(),
            context.tools.definitions(),
        );
        Run {
            window: config.model.context_window,
            config,
            cancel,
            options,
            sink,
            system_prompt: context.system_prompt,
            first_new: context.messages.len(),
            messages: context.messages,
            tools: context.tools,
            compacted_new: Vec::new(),
            tokens,
            overhead,
            first_seq: context.first_seq,
            overflowed: false,
            turns: 0,
            output: None,
            approved: None,
            answered: None,
            state: Default::default(),
            echoes: Vec::new(),
            meter,
            exceeded: None,
            tripped: OnceLock::new(),
        }
    }

    /// Ends the run at the end of this turn: `tripped` failed (the first
    /// guardrail to fail is the one reported).
    pub(crate) fn trip(&self, tripped: GuardrailTripped) {
        let _ = self.tripped.set(tripped);
    }

    /// Awaits the guardrails' `check` of `stage` as a callback is awaited:
    /// `Err` once the run is aborted and the check does not answer within the
    /// grace. (A check that panics has failed already: see
    /// [`Guardrails::check`](crate::Guardrails::check).)
    pub(crate) async fn verdict(
        &self,
        stage: GuardrailStage,
        check: impl Future<Output = Option<GuardrailTripped>>,
    ) -> Result<Option<GuardrailTripped>, Interrupted> {
        match self.call_back(check).await {
            Err(Interrupted::Panicked(panic)) => Ok(Some(GuardrailTripped {
                stage,
                guardrail: stage.as_str().to_owned(),
                reason: format!("the guardrail panicked: {panic}"),
            })),
            verdict => verdict,
        }
    }

    /// Whether a guardrail tripped.
    pub(crate) fn is_tripped(&self) -> bool {
        self.tripped.get().is_some()
    }

    /// `turn_end` for `message` and its results.
    fn end_turn(&self, message: AssistantMessage, tool_results: Vec<ToolResultMessage>) {
        self.emit(AgentEvent::TurnEnd {
            message: Box::new(message),
            tool_results,
        });
    }

    pub(crate) fn emit(&self, event: AgentEvent) {
        (self.sink)(event);
    }

    /// Awaits a callback of the application (a hook, a resolver, a transform) the
    /// way a tool is awaited: a panic is caught, and once the run is aborted the
    /// callback gets `cancel_grace` to return before it is dropped.
    pub(crate) async fn call_back<F: Future>(&self, callback: F) -> Result<F::Output, Interrupted> {
        let callback = AssertUnwindSafe(callback).catch_unwind();
        tokio::pin!(callback);
        let done = tokio::select! {
            biased;
            done = &mut callback => done,
            () = self.cancel.cancelled() => {
                tokio::time::timeout(self.config.run.cancel_grace, &mut callback)
                    .await
                    .map_err(|_| Interrupted::Aborted)?
            }
        };
        done.map_err(|panic| Interrupted::Panicked(panic_text(panic)))
    }

    /// Takes the queued messages of `source`, unless the run was aborted: after
    /// the cancel point no queue is drained, so what waits there stays queued.
    pub(crate) async fn take(&self, source: &Option<MessageSource>) -> Vec<AgentMessage> {
        if self.cancel.is_cancelled() {
            return Vec::new();
        }
        take(source).await
    }

    pub(crate) fn sink(&self) -> &EventSink {
        &self.sink
    }

    /// The transcript as the run has it.
    pub(crate) fn messages(&self) -> &[AgentMessage] {
        &self.messages
    }

    /// Whether the user approved `call_id` in this run's reply.
    pub(crate) fn is_approved(&self, call_id: &str) -> bool {
        self.approved.as_deref() == Some(call_id)
    }

    /// Whether the user's answer was merged into `call_id` in this run's reply.
    pub(crate) fn is_answered(&self, call_id: &str) -> bool {
        self.answered.as_deref() == Some(call_id)
    }

    async fn run(mut self, start: Start) -> Vec<AgentMessage> {
        self.emit(AgentEvent::AgentStart);
        if let Start::Compact(instructions) = start {
            let compacted = match self.resolve_key().await {
                Ok(()) => self.compact(CompactionReason::Manual, instructions).await,
                Err(interrupted) => {
                    let error = match interrupted {
                        Interrupted::Panicked(panic) => {
                            format!("the API key resolver panicked: {panic}")
                        }
                        Interrupted::Aborted => StreamError::Aborted.to_string(),
                    };
                    Err(self.compaction_refused(CompactionReason::Manual, error))
                }
            };
            let reason = match compacted {
                // Nothing to cut is nothing to do: `compaction_end` says so.
                Ok(()) | Err(Unfinished::NothingToCut) => RunEnd::Completed,
                Err(_) if self.cancel.is_cancelled() => RunEnd::Aborted,
                Err(Unfinished::Failed(_)) => RunEnd::Error,
            };
            self.emit(AgentEvent::AgentEnd {
                messages: Vec::new(),
                reason,
                output: None,
            });
            return Vec::new();
        }
        // The prompt's checks and the budgets come before the first turn.
        let mut beside = None;
        let before = match &start {
            Start::Messages(_) if self.config.hooks.guardrails.input.is_empty() => None,
            // The steering taken for the run's start is checked with the prompt.
            Start::Messages(prompts) => match self.input_check(
                &prompts
                    .iter()
                    .chain(self.config.first_steering.iter().flatten())
                    .cloned()
                    .collect::<Vec<_>>(),
            ) {
                Some(check) if self.config.hooks.guardrails.input_beside => {
                    beside = Some(check.boxed());
                    None
                }
                // Kept out of the transcript: the model never sees it.
                Some(check) => match self.verdict(GuardrailStage::Input, check).await {
                    Ok(None) => None,
                    Ok(Some(tripped)) => {
                        self.trip(tripped);
                        Some(RunEnd::GuardrailTripped)
                    }
                    Err(_) => Some(RunEnd::Aborted),
                },
                None => None,
            },
            _ => None,
        };
        // A reply resolves its request first whatever the budgets say; the turn
        // after it is checked as every other.
        let before = before.or_else(|| {
            if matches!(start, Start::Reply(..)) {
                return None;
            }
            let exceeded = self.meter.exceeded(&Spent::default())?;
            self.exceeded = Some(exceeded);
            Some(RunEnd::BudgetExceeded)
        });
        let reason = if let Some(reason) = before {
            // Nothing is lost: a prompt the guardrails let through joins the
            // transcript though no turn runs (its check, had it to run beside
            // the first model call, is awaited now).
            if let (Start::Messages(prompts), RunEnd::BudgetExceeded) = (start, reason) {
                let checked = match beside {
                    Some(check) => self.verdict(GuardrailStage::Input, check).await,
                    None => Ok(None),
                };
                match checked {
                    Ok(None) => self.deliver_all(Some(prompts)),
                    Ok(Some(tripped)) => self.trip(tripped),
                    // Unchecked, it is not kept.
                    Err(_) => {}
                }
            }
            reason
        } else {
            self.started(start, beside).await
        };
        self.finish(reason)
    }

    /// The input guardrails' check of the user messages among `messages`, if
    /// the run has input guardrails and `messages` a user message.
    fn input_check(
        &self,
        messages: &[AgentMessage],
    ) -> Option<impl Future<Output = Option<GuardrailTripped>> + Send + 'static> {
        let guardrails = &self.config.hooks.guardrails;
        if guardrails.input.is_empty() {
            return None;
        }
        let users: Vec<String> = messages
            .iter()
            .filter_map(AgentMessage::as_user)
            .map(UserMessage::text_content)
            .collect();
        if users.is_empty() {
            return None;
        }
        let text = users.join("\n\n");
        Some(guardrails.check(GuardrailStage::Input, text, &self.config.context))
    }

    /// The run from its first turn on.
    async fn started(&mut self, start: Start, beside: Beside) -> RunEnd {
        // The steering taken for the start was checked with the prompt.
        let checked = matches!(start, Start::Messages(_)) && self.config.first_steering.is_some();
        self.emit(AgentEvent::TurnStart);
        let parked = match start {
            Start::Messages(prompts) => {
                for prompt in prompts {
                    self.deliver(prompt);
                }
                false
            }
            Start::Continue => false,
            Start::Reply(request, reply) => self.reply(request, reply).await,
            Start::Compact(_) => false,
        };
        if parked {
            RunEnd::Parked
        } else {
            let pending = match self.config.first_steering.take() {
                // Aborted already: nothing taken is delivered (the caller keeps it).
                Some(_) if self.cancel.is_cancelled() => Vec::new(),
                Some(taken) => taken,
                None => self.take(&self.config.steering).await,
            };
            match self
                .options
                .output_schema
                .as_ref()
                .map(|output| OutputCheck::new(&output.schema))
            {
                Some(Err(failure)) => {
                    self.leave(Some(pending));
                    self.fail(failure);
                    RunEnd::Error
                }
                Some(Ok(check)) => self.turns(pending, Some(check), beside, checked).await,
                None => self.turns(pending, None, beside, checked).await,
            }
        }
    }

    /// Ends the run: the budget or guardrail that ended it, then `agent_end`
    /// with the run's messages.
    fn finish(mut self, reason: RunEnd) -> Vec<AgentMessage> {
        self.meter.stop();
        let reason = match (self.tripped.take(), self.exceeded.take()) {
            (Some(tripped), _) => {
                self.emit(tripped.into());
                RunEnd::GuardrailTripped
            }
            (None, Some(exceeded)) => {
                self.emit(exceeded.into());
                RunEnd::BudgetExceeded
            }
            (None, None) => reason,
        };
        let mut messages = std::mem::take(&mut self.compacted_new);
        messages.extend(self.messages.split_off(self.first_new));
        let output = self.output.take();
        self.emit(AgentEvent::AgentEnd {
            messages: messages.clone(),
            reason,
            output,
        });
        messages
    }

    async fn turns(
        &mut self,
        mut pending: Vec<AgentMessage>,
        mut check: Option<OutputCheck>,
        mut beside: Beside,
        mut checked: bool,
    ) -> RunEnd {
        loop {
            // Steering and follow-ups pass the input guardrails before they join
            // the transcript; refused, they never do, and the turn ends saying so.
            let unchecked = !std::mem::take(&mut checked);
            if let Some(check) = self.input_check(&pending).filter(|_| unchecked) {
                let Ok(refused) = self.verdict(GuardrailStage::Input, check).await else {
                    let message = self.aborted();
                    self.end_turn(message, Vec::new());
                    return RunEnd::Aborted;
                };
                if let Some(tripped) = refused {
                    let message = self.fail(tripped.to_string());
                    self.trip(tripped);
                    self.end_turn(message, Vec::new());
                    return RunEnd::GuardrailTripped;
                }
            }
            for message in pending.drain(..) {
                self.deliver(message);
            }
            let turn = self.turns + 1;
            let span = tracing::info_span!("turn", turn);
            let (message, batch) = self.turn(beside.take()).instrument(span).await;
            self.turns = turn;
            if self.is_tripped() || self.exceeded.is_some() {
                self.end_turn(message, batch.results);
                self.leave(batch.steering);
                return if self.exceeded.is_some() {
                    RunEnd::BudgetExceeded
                } else {
                    RunEnd::GuardrailTripped
                };
            }
            if matches!(message.stop_reason, StopReason::Error | StopReason::Aborted) {
                let reason = match message.stop_reason {
                    StopReason::Aborted => RunEnd::Aborted,
                    _ if self.overflowed => RunEnd::ContextOverflow,
                    _ => RunEnd::Error,
                };
                self.emit(AgentEvent::TurnEnd {
                    message: Box::new(message),
                    tool_results: batch.results,
                });
                return reason;
            }
            if !batch.parked.is_empty() {
                self.emit(AgentEvent::TurnEnd {
                    message: Box::new(message),
                    tool_results: batch.results,
                });
                return RunEnd::Parked;
            }
            if let Some(failure) = batch.failure {
                self.emit(AgentEvent::TurnEnd {
                    message: Box::new(message),
                    tool_results: batch.results,
                });
                self.fail(failure);
                return RunEnd::Error;
            }
            let called_tools = message.tool_calls().next().is_some();
            // A final answer of a run with an output schema, to check.
            let answer = (!called_tools && check.is_some()).then(|| message.text());
            let guardrails = &self.config.hooks.guardrails;
            let guarded = (!called_tools && !guardrails.output.is_empty()).then(|| {
                guardrails.check(GuardrailStage::Output, message.text(), &self.config.context)
            });
            if called_tools
                && self
                    .options
                    .tool_choice
                    .as_ref()
                    .is_some_and(ToolChoice::forces_a_call)
            {
                self.options.tool_choice = self.config.run.tool_choice_after_tools.clone();
            }
            let summary = TurnSummary {
                turn,
                message: &message,
                tool_results: &batch.results,
                context: &self.config.context,
            };
            let hooks = &self.config.hooks;
            let ask =
                |hook: &StopWhen| std::panic::catch_unwind(AssertUnwindSafe(|| hook(&summary)));
            let stop = hooks.stop_when.as_ref().map(ask);
            // Asked of a plain answer only: a run with work left goes on anyway.
            let until = hooks.run_until.as_ref().filter(|_| !called_tools).map(ask);
            self.emit(AgentEvent::TurnEnd {
                message: Box::new(message),
                tool_results: batch.results,
            });
            if let Some(guarded) = guarded {
                match self.verdict(GuardrailStage::Output, guarded).await {
                    Ok(None) => {}
                    Ok(Some(tripped)) => {
                        self.trip(tripped);
                        return RunEnd::GuardrailTripped;
                    }
                    Err(_) => return RunEnd::Aborted,
                }
            }
            let keep_going = matches!(until, Some(Ok(false)));
            match (stop, until) {
                (Some(Err(panic)), _) | (_, Some(Err(panic))) => {
                    self.leave(batch.steering);
                    self.fail(format!(
                        "the stop condition panicked: {}",
                        panic_text(panic)
                    ));
                    return RunEnd::Error;
                }
                (Some(Ok(true)), _) => {
                    self.leave(batch.steering);
                    return RunEnd::StopCondition;
                }
                _ => {}
            }
            let mut correction = None;
            if let (Some(answer), Some(check)) = (answer, check.as_mut()) {
                match check.check(&answer) {
                    Ok(value) => self.output = Some(Output::Valid { value }),
                    Err(errors) if check.attempts <= self.config.run.output_retries => {
                        self.output = None;
                        correction = Some(AgentMessage::user(output::correction(&errors)));
                    }
                    Err(errors) => {
                        self.output = Some(Output::Invalid(OutputError {
                            answer,
                            errors,
                            attempts: check.attempts,
                        }));
                        self.leave(batch.steering);
                        return RunEnd::InvalidOutput;
                    }
                }
            }
            let wants_model = (called_tools && !batch.terminate) || correction.is_some();
            pending = match batch.steering {
                Some(steering) => steering,
                None => self.take(&self.config.steering).await,
            };
            pending.extend(correction);
            if !wants_model && pending.is_empty() {
                pending = self.take(&self.config.follow_up).await;
                if pending.is_empty() {
                    if !keep_going {
                        return if called_tools {
                            RunEnd::ToolsTerminated
                        } else {
                            RunEnd::Completed
                        };
                    }
                    pending.push(AgentMessage::user(RUN_UNTIL_NUDGE));
                }
            }
            if self.turns >= self.config.run.max_turns {
                self.leave(Some(pending));
                return RunEnd::TurnLimit;
            }
            // Past a budget, what was taken from the queues is not delivered:
            // it goes back to them for a later run.
            if let Some(exceeded) = self.meter.exceeded(&Spent::default()) {
                self.exceeded = Some(exceeded);
                return RunEnd::BudgetExceeded;
            }
            if self
                .config
                .pause
                .as_ref()
                .is_some_and(CancellationToken::is_cancelled)
            {
                self.leave(Some(pending));
                return RunEnd::Paused;
            }
            self.emit(AgentEvent::TurnStart);
        }
    }

    /// One model response and its tool calls, which start once the response is
    /// durable (write-ahead).
    async fn turn(&mut self, beside: Beside) -> (AssistantMessage, Batch) {
        let message = match beside {
            Some(verdict) => self.respond_beside(verdict).await,
            None => self.respond().await,
        };
        let calls: Vec<_> = message.tool_calls().cloned().collect();
        let more = Spent::tool_calls(calls.len() as u64);
        let batch = if calls.is_empty() {
            Batch::default()
        } else if let Err(failure) = self.write_ahead(&message).await {
            execute::not_durable(self, &calls, failure)
        } else if let Some(tripped) = self.tripped.get() {
            let why = format!("the guardrail `{}` tripped.", tripped.guardrail);
            execute::refused(self, &calls, &why)
        } else if let Some(exceeded) = self.meter.exceeded(&more) {
            let batch = execute::refused(self, &calls, &format!("{exceeded}."));
            self.exceeded = Some(exceeded);
            batch
        } else {
            execute::run_batch(self, &message, calls).await
        };
        // Every call the model made counts, answered however it was (as the
        // agent's stored spending counts its results).
        self.meter.spend(more);
        self.record_batch(&batch);
        (message, batch)
    }

    /// The first response, asked while the input guardrails decide: a failure
    /// cancels it.
    async fn respond_beside(
        &mut self,
        verdict: BoxFuture<'static, Option<GuardrailTripped>>,
    ) -> AssistantMessage {
        let call = self.cancel.child_token();
        let run = std::mem::replace(&mut self.options.cancel, call.clone());
        let mut verdict = verdict;
        let (message, decided) = {
            let respond = self.respond();
            tokio::pin!(respond);
            tokio::select! {
                message = &mut respond => (message, None),
                tripped = &mut verdict => {
                    if tripped.is_some() {
                        call.cancel();
                    }
                    (respond.await, Some(tripped))
                }
            }
        };
        self.options.cancel = run;
        // Tools wait for the verdict, as an aborted run waits for a callback.
        let tripped = match decided {
            Some(tripped) => tripped,
            None => self
                .verdict(GuardrailStage::Input, verdict)
                .await
                .ok()
                .flatten(),
        };
        if let Some(tripped) = tripped {
            self.trip(tripped);
        }
        message
    }

    /// Waits until `message`, whose calls are about to run, is durable (see
    /// [`LoopConfig::write_ahead`]). Calls that will not run need no wait.
    async fn write_ahead(&self, message: &AssistantMessage) -> Result<(), String> {
        if execute::not_run_because(message).is_some() {
            return Ok(());
        }
        self.durable().await
    }

    /// Waits until everything the run emitted is durable (see
    /// [`LoopConfig::write_ahead`]), as a callback is waited for; an aborted run
    /// stops waiting: its calls are answered without running.
    async fn durable(&self) -> Result<(), String> {
        let Some(write_ahead) = &self.config.write_ahead else {
            return Ok(());
        };
        match self.call_back(write_ahead()).await {
            Ok(durable) => durable,
            Err(Interrupted::Panicked(panic)) => {
                Err(format!("the write-ahead wait panicked: {panic}"))
            }
            Err(Interrupted::Aborted) => Ok(()),
        }
    }

    /// Adds a batch's results to the transcript, then its requests to the user,
    /// each announced.
    fn record_batch(&mut self, batch: &Batch) {
        self.echoes.clone_from(&batch.echoes);
        for result in batch
            .results
            .iter()
            .filter(|result| !result.state.is_empty())
        {
            crate::tool::lock(&self.state).extend(result.state.clone());
        }
        for result in &batch.results {
            self.push(result.clone().into());
        }
        for request in &batch.parked {
            self.deliver(request.to_message());
            self.emit(AgentEvent::requested(request));
        }
    }

    /// Resolves `request` with the user's `reply` — the turn the run parked in,
    /// finished — and says whether the run must park again (a request of that
    /// turn is still open).
    async fn reply(&mut self, request: UserRequest, reply: Reply) -> bool {
        let (message, call) = {
            let message = self
                .messages
                .iter()
                .rev()
                .find_map(AgentMessage::as_assistant)
                .cloned()
                .unwrap_or_else(|| AssistantMessage::empty(&self.config.model));
            let call = message
                .tool_calls()
                .find(|call| call.id == request.tool_call_id())
                .cloned();
            (message, call)
        };
        let batch = match (call, request, reply) {
            (None, request, _) => {
                self.fail(format!(
                    "the call {} the request was for is not in the transcript",
                    request.tool_call_id()
                ));
                return false;
            }
            (
                Some(call),
                UserRequest::Input {
                    field,
                    question,
                    current_data,
                    ..
                },
                Reply::Answer { text, .. },
            ) => match request::merged(&call, &current_data, &field, &text)
                .filter(|_| self.config.run.answers == Answers::ToTool)
            {
                // Straight into the waiting call, committed before it runs again.
                Some(merged) => {
                    self.answered = Some(call.id.clone());
                    self.deliver(request::answer_merged(&call, &field, &text));
                    match self.durable().await {
                        Ok(()) => execute::run_batch(self, &message, vec![merged]).await,
                        Err(failure) => execute::not_durable(self, &[call], failure),
                    }
                }
                None => {
                    let result = request::answered(&call, &field, &question, &text);
                    execute::answer(self, &call, result)
                }
            },
            (Some(mut call), request, Reply::Approve { .. }) => {
                // It runs with the arguments the user approved (an answer merged
                // into them, it may be).
                if let UserRequest::Approval { args, .. } = request {
                    call.arguments = args;
                }
                self.approved = Some(call.id.clone());
                // The approval is durable before the call runs (write-ahead): after
                // a crash the call is answered "interrupted", not asked again.
                self.deliver(request::granted(&call));
                match self.durable().await {
                    Ok(()) => execute::run_batch(self, &message, vec![call]).await,
                    Err(failure) => execute::not_durable(self, &[call], failure),
                }
            }
            (Some(call), _, Reply::Deny { reason, .. }) => {
                let text = match reason {
                    Some(reason) => format!("The user denied this call: {reason}"),
                    None => "The user denied this call.".to_owned(),
                };
                execute::answer(self, &call, ToolResultMessage::text(&call, text, true))
            }
            // `check_reply` let only fitting replies through.
            (Some(call), _, Reply::Answer { .. }) => {
                let text = "The user's reply did not fit the request.";
                execute::answer(self, &call, ToolResultMessage::text(&call, text, true))
            }
        };
        self.record_batch(&batch);
        self.turns += 1;
        self.emit(AgentEvent::TurnEnd {
            message: Box::new(message),
            tool_results: batch.results,
        });
        let parked = !open_requests(&self.messages).is_empty();
        if !parked {
            self.emit(AgentEvent::TurnStart);
        }
        parked
    }

    /// Adds a message to the transcript with its start and end events.
    fn deliver(&mut self, message: AgentMessage) {
        self.emit(AgentEvent::MessageStart {
            message: Box::new(message.clone()),
        });
        self.emit(AgentEvent::MessageEnd {
            message: Box::new(message.clone()),
        });
        self.push(message);
    }

    /// Adds a message to the transcript, and its tokens to the count.
    fn push(&mut self, message: AgentMessage) {
        self.tokens = self.tokens.after(&message);
        self.messages.push(message);
    }

    fn deliver_all(&mut self, messages: Option<Vec<AgentMessage>>) {
        for message in messages.into_iter().flatten() {
            self.deliver(message);
        }
    }

    /// Steering and follow-ups taken for a turn that will not come: delivered,
    /// unless the run has input guardrails, which they have not passed (then
    /// they go back to their queues, and a later run checks them).
    fn leave(&mut self, messages: Option<Vec<AgentMessage>>) {
        if self.config.hooks.guardrails.input.is_empty() {
            self.deliver_all(messages);
        }
    }

    /// A model call the budgets leave no room for: never made, its response an
    /// error saying so, and the run ends after the turn.
    fn refuse(&mut self, exceeded: BudgetExceeded) -> AssistantMessage {
        self.exceeded = Some(exceeded);
        self.fail(format!("not asked: {exceeded}"))
    }

    /// Adds an assistant message saying why the run failed.
    fn fail(&mut self, reason: String) -> AssistantMessage {
        let message = failed_message(&self.config.model, reason);
        self.finish_response(Some(message.clone()), message)
    }

    /// Streams the model's response to the transcript as it stands: compacted
    /// first when it passed the policy's threshold, and asked once more, after a
    /// compaction, when the provider refused it as too long.
    async fn respond(&mut self) -> AssistantMessage {
        let compacting = self.config.run.compaction.enabled;
        let mut compacted_once = false;
        loop {
            if self.cancel.is_cancelled() {
                return self.aborted();
            }
            match self.resolve_key().await {
                Ok(()) => {}
                Err(Interrupted::Panicked(panic)) => {
                    return self.fail(format!("the API key resolver panicked: {panic}"));
                }
                Err(Interrupted::Aborted) => return self.aborted(),
            }
            let threshold = self.config.run.compaction.threshold(self.window);
            if compacting && !compacted_once && self.context_tokens() > threshold {
                // Nothing to cut is no failure here: the provider has the last word.
                let _ = self.compact(CompactionReason::Threshold, None).await;
                if self.cancel.is_cancelled() {
                    return self.aborted();
                }
            }
            let (start, mut message) = match self.ask_model().await {
                Ok(message) => return message,
                Err(refused) => refused,
            };
            let overflow = message
                .error_message
                .clone()
                .unwrap_or_else(|| "the request is longer than the context window".to_owned());
            let why = if !compacting {
                "compaction is off".to_owned()
            } else if compacted_once {
                "the context was compacted once and still does not fit".to_owned()
            } else {
                // The provider named no window: it is at most what was sent.
                let sent = u32::try_from(self.context_tokens()).unwrap_or(u32::MAX);
                self.window = self.window.min(sent);
                match self.compact(CompactionReason::Overflow, None).await {
                    _ if self.cancel.is_cancelled() => return self.aborted(),
                    Ok(()) => {
                        compacted_once = true;
                        continue;
                    }
                    Err(Unfinished::NothingToCut) => "nothing could be compacted".to_owned(),
                    Err(Unfinished::Failed(error)) => format!("the compaction failed: {error}"),
                }
            };
            message.error_message = Some(format!("{overflow}; {why}"));
            self.overflowed = true;
            return self.finish_response(Some(start), message);
        }
    }

    /// Asks the API key resolver, if the run has one, for the key of the next
    /// model call (a summary's too).
    async fn resolve_key(&mut self) -> Result<(), Interrupted> {
        if let Some(resolve) = &self.config.hooks.api_key_resolver {
            let key = self.call_back(resolve(&self.config.model.provider)).await?;
            self.options.api_key = key.or_else(|| self.config.run.stream.api_key.clone());
        }
        Ok(())
    }

    /// The transcript's token count as the next request would have it.
    fn context_tokens(&self) -> u64 {
        self.tokens.total
            + if self.tokens.measured {
                0
            } else {
                self.overhead
            }
    }

    /// Asks the model once. A refusal of the request as longer than the window,
    /// before anything streamed, comes back unannounced (no `message_start`),
    /// with the held start message and the failed one.
    async fn ask_model(
        &mut self,
    ) -> Result<AssistantMessage, (AssistantMessage, AssistantMessage)> {
        let transformed = match &self.config.hooks.transform_context {
            None => None,
            Some(transform) => {
                let pending = transform(&self.messages, self.cancel.child_token());
                match self.call_back(pending).await {
                    Ok(Ok(messages)) => Some(messages),
                    Ok(Err(error)) => {
                        return Ok(self.fail(format!("transform_context failed: {error}")));
                    }
                    Err(Interrupted::Panicked(panic)) => {
                        return Ok(self.fail(format!("transform_context panicked: {panic}")));
                    }
                    Err(Interrupted::Aborted) => return Ok(self.aborted()),
                }
            }
        };
        let view = transformed.as_deref().unwrap_or(&self.messages);
        let converted = match &self.config.hooks.convert_to_llm {
            None => Ok(default_convert_to_llm(view)),
            Some(convert) => std::panic::catch_unwind(AssertUnwindSafe(|| convert(view))),
        };
        let llm = match converted {
            Ok(llm) => llm,
            Err(panic) => {
                return Ok(self.fail(format!("convert_to_llm panicked: {}", panic_text(panic))));
            }
        };
        let (llm, repaired) = repair(llm, &self.config.model);
        if repaired > 0 {
            tracing::warn!(
                repaired,
                "repaired orphaned tool calls or results before the model call"
            );
        }
        let messages: Vec<&Message> = llm.iter().map(AsRef::as_ref).collect();
        let context = ContextRef {
            system_prompt: self.system_prompt.as_deref(),
            messages: &messages,
            tools: self.tools.definitions(),
        };
        let mut echoes = std::mem::take(&mut self.echoes);
        // The models in order: the agent's, then its fallbacks, each asked only
        // when the one before failed before it streamed anything; each call
        // holds the most it may spend against the budgets until it ends.
        let input = self.context_tokens();
        let mut candidate = 0;
        let mut reservation = match self
            .meter
            .reserve(input, &self.config.model, &self.options)
            .await
        {
            Ok(reservation) => reservation,
            Err(exceeded) => {
                drop(messages);
                drop(llm);
                return Ok(self.refuse(exceeded));
            }
        };
        let mut attempt = self.stream_to(&self.config.model, context, None, reservation.max_tokens);
        let (outcome, message, spent) = loop {
            let span = attempt.span.clone();
            let mut answered = self.answer(attempt, &echoes).instrument(span).await;
            let failed = match &answered.outcome {
                Answered::Ended {
                    error: Some(error), ..
                } if error.is_unavailable() && !answered.streamed => error,
                _ => break (answered.outcome, answered.message, answered.spent),
            };
            let Some(next) = self.config.fallbacks.get(candidate) else {
                break (answered.outcome, answered.message, answered.spent);
            };
            let failed = failed.to_string();
            self.meter
                .settle(reservation, std::mem::take(&mut answered.spent))
                .await;
            reservation = match self.meter.reserve(input, next, &self.options).await {
                Ok(reservation) => reservation,
                Err(exceeded) => {
                    self.exceeded = Some(exceeded);
                    reservation = Default::default();
                    break (answered.outcome, answered.message, answered.spent);
                }
            };
            candidate += 1;
            let from = self.model_at(candidate - 1);
            self.emit(AgentEvent::ModelFallback {
                from: model_name(from),
                to: model_name(next),
                error: failed,
            });
            let key = self.fallback_key(next).await;
            attempt = self.stream_to(next, context, Some(key), reservation.max_tokens);
            echoes = Vec::new();
        };
        drop(messages);
        drop(llm);
        self.meter.settle(reservation, spent).await;
        match outcome {
            Answered::Refused { start, window } => {
                if let Some(window) = window {
                    self.window = self.window.min(window);
                }
                Err((start, message))
            }
            Answered::Ended { start, error } => {
                if let Some(overflow) = error.as_ref().and_then(StreamError::context_overflow) {
                    if let Some(window) = overflow.context_window {
                        self.window = self.window.min(window);
                    }
                    self.overflowed = true;
                }
                Ok(self.finish_response(start, message))
            }
        }
    }

    /// The model at `index` of the agent's list (0 is the agent's own).
    fn model_at(&self, index: usize) -> &Model {
        match index {
            0 => &self.config.model,
            _ => &self.config.fallbacks[index - 1],
        }
    }

    /// The key a fallback model is asked with: the resolver's for its provider,
    /// else the run's when it is the same provider at the same address, else
    /// none (its provider's environment variable).
    async fn fallback_key(&self, model: &Model) -> Option<tiller_ai::ApiKey> {
        if let Some(resolve) = &self.config.hooks.api_key_resolver
            && let Ok(Some(key)) = self.call_back(resolve(&model.provider)).await
        {
            return Some(key);
        }
        let own = &self.config.model;
        (own.provider == model.provider && own.base_url == model.base_url)
            .then(|| self.options.api_key.clone())
            .flatten()
    }

    /// Sends the request to `model` (with `key` in place of the run's, for a
    /// fallback), in a span of its own.
    fn stream_to(
        &self,
        model: &Model,
        context: ContextRef<'_>,
        key: Option<Option<tiller_ai::ApiKey>>,
        max_tokens: Option<u32>,
    ) -> Attempt {
        let span = tracing::info_span!(
            "chat",
            otel.name = %format_args!("chat {}", model.id),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %model.provider,
            gen_ai.request.model = %model.id,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        // Held to what a budget leaves it.
        let capped = max_tokens.and_then(|most| self.options.capped(model, most));
        let options = capped.as_ref().unwrap_or(&self.options);
        let stream = span.in_scope(|| match key {
            None => tiller_ai::stream_ref(model, context, options),
            Some(api_key) => {
                let options = StreamOptions {
                    api_key,
                    ..options.clone()
                };
                tiller_ai::stream_ref(model, context, &options)
            }
        });
        Attempt { stream, span }
    }

    /// Reads a response to its end, streaming its updates. The start is held
    /// until something else arrives, so that a refusal of the request (before any
    /// content) can be answered by compacting, and a failure by the next model.
    async fn answer(&self, attempt: Attempt, echoes: &[String]) -> Answer {
        let Attempt { mut stream, span } = attempt;
        let mut held = None;
        let mut last = None;
        let mut streamed = None;
        let mut failed = None;
        let mut refused = None;
        let mut quiet = Restatements::new(echoes);
        while let Some(event) = stream.next().await {
            match event {
                AssistantEvent::Start { message } => {
                    streamed = Some(StreamedMessage::start((*message).clone()));
                    held = Some(message);
                }
                AssistantEvent::Error { message, error, .. } => {
                    if let Some(overflow) = error.context_overflow()
                        && let Some(start) = held.take()
                    {
                        refused = Some(Answered::Refused {
                            start: *start,
                            window: overflow.context_window,
                        });
                    } else {
                        failed = Some(error);
                    }
                    last = Some(*message);
                    break;
                }
                AssistantEvent::Done { message, .. } => {
                    last = Some(*message);
                    break;
                }
                event => {
                    if let Some(start) = held.take() {
                        self.emit(AgentEvent::MessageStart {
                            message: Box::new((*start).into()),
                        });
                    }
                    let message = match &streamed {
                        Some(before) => before.then(event.clone()),
                        None => StreamedMessage::start(stream.partial().clone()),
                    };
                    streamed = Some(message.clone());
                    if quiet.is_empty() {
                        self.update(event, message);
                    } else {
                        for (event, message) in quiet.pass(event, message) {
                            self.update(event, message);
                        }
                    }
                }
            }
        }
        for (event, message) in quiet.release() {
            self.update(event, message);
        }
        let message = last.unwrap_or_else(|| stream.partial().clone());
        if !span.is_disabled() {
            record_answer(&span, &message, failed.as_ref());
        }
        let spent = Spent::response(&message);
        // Whether anything went out: the start is announced with the first update.
        let streamed = held.is_none() && streamed.is_some();
        let outcome = refused.unwrap_or(Answered::Ended {
            start: held.map(|start| *start),
            error: failed,
        });
        Answer {
            outcome,
            message,
            spent,
            streamed,
        }
    }

    /// The `message_update` of one event of the response streaming.
    fn update(&self, event: AssistantEvent, message: StreamedMessage) {
        self.emit(AgentEvent::MessageUpdate {
            assistant_message_event: event,
            message,
        });
    }

    /// Ends a response, announcing its start first when it was held (nothing
    /// streamed), and adds it to the transcript.
    fn finish_response(
        &mut self,
        start: Option<AssistantMessage>,
        message: AssistantMessage,
    ) -> AssistantMessage {
        if let Some(start) = start {
            self.emit(AgentEvent::MessageStart {
                message: Box::new(start.into()),
            });
        }
        self.emit(AgentEvent::MessageEnd {
            message: Box::new(message.clone().into()),
        });
        self.push(message.clone().into());
        message
    }

    /// Replaces the oldest messages with a summary (see [`crate::compaction`]),
    /// announced by `compaction_start` and `compaction_end`; a manual compaction
    /// is announced also when there is nothing to cut.
    async fn compact(
        &mut self,
        reason: CompactionReason,
        instructions: Option<String>,
    ) -> Result<(), Unfinished> {
        let policy = &self.config.run.compaction;
        let keep = policy.keep_tokens(self.window);
        let tokens_before = self.context_tokens();
        let Some(cut) = compaction::cut_point(&self.messages, keep) else {
            if reason == CompactionReason::Manual {
                let error =
                    "nothing to compact: the transcript is within the tokens kept as they are";
                self.compaction_refused(reason, error.to_owned());
            }
            return Err(Unfinished::NothingToCut);
        };
        self.emit(AgentEvent::CompactionStart {
            reason,
            tokens_before,
        });
        let max_tokens = policy.summary_tokens(self.window);
        // A manual compaction's words add to the summarizer's instructions: the
        // summary stays a summary, and keeps what the user asked besides.
        let base = policy
            .instructions
            .as_deref()
            .unwrap_or(compaction::DEFAULT_INSTRUCTIONS);
        let instructions = match instructions.filter(|asked| !asked.trim().is_empty()) {
            Some(asked) => compaction::with_request(base, &asked),
            None => base.to_owned(),
        };
        let budget = u64::from(self.window)
            .saturating_sub(u64::from(max_tokens) + (instructions.len() as u64).div_ceil(4) + 64);
        let summarize = self.config.hooks.summarize.clone().unwrap_or_else(|| {
            if let Some(llm) = &policy.llm {
                tracing::warn!(
                    llm,
                    "the compaction policy names an LLM configuration the host did not resolve into RunHooks::summarize; the run's own model writes the summary"
                );
            }
            compaction::model_summarizer(self.config.model.clone(), self.options.clone())
        });
        let request = SummaryRequest {
            instructions,
            conversation: compaction::render(&self.messages[..cut], budget),
            messages: self.messages[..cut].to_vec(),
            max_tokens,
        };
        let summary = match self
            .call_back(summarize(request, self.cancel.child_token()))
            .await
        {
            Ok(Ok(summary)) => compaction::cut_to_tokens(summary, max_tokens),
            Ok(Err(error)) => {
                return Err(self.compaction_failed(reason, tokens_before, error.to_string()));
            }
            Err(Interrupted::Panicked(panic)) => {
                let error = format!("the summarizer panicked: {panic}");
                return Err(self.compaction_failed(reason, tokens_before, error));
            }
            Err(Interrupted::Aborted) => {
                let error = StreamError::Aborted.to_string();
                return Err(self.compaction_failed(reason, tokens_before, error));
            }
        };
        let summary_id = self.first_seq + self.messages.len() as u64;
        let kept = self.messages.len() - cut;
        let kept_tokens: u64 = self.messages[cut..].iter().map(estimate_tokens).sum();
        let mut payload = CompactionSummary {
            summary,
            first_seq: self.first_seq,
            last_seq: self.first_seq + cut as u64 - 1,
            kept: kept as u64,
            tokens_before,
            tokens_after: 0,
        };
        let summary_tokens = compaction::text_tokens(payload.for_model().len());
        let after = ContextTokens {
            total: summary_tokens + kept_tokens,
            measured: false,
        };
        let tokens_after = after.total + self.overhead;
        if tokens_after >= tokens_before {
            let error = format!(
                "the summary would not make the transcript shorter ({tokens_before} → {tokens_after} tokens)"
            );
            return Err(self.compaction_failed(reason, tokens_before, error));
        }
        self.tokens = after;
        payload.tokens_after = tokens_after;
        let summary = compaction::summary_message(payload);
        let mut earlier = std::mem::take(&mut self.messages);
        let kept_messages = earlier.split_off(cut);
        if self.first_new < cut {
            self.compacted_new.extend(earlier.drain(self.first_new..));
            self.first_new = 1;
        } else {
            self.first_new = 1 + self.first_new - cut;
        }
        self.messages = Vec::with_capacity(1 + kept_messages.len());
        self.messages.push(summary.clone());
        self.messages.extend(kept_messages);
        self.first_seq = summary_id;
        self.emit(AgentEvent::CompactionEnd {
            reason,
            tokens_before,
            tokens_after,
            summary_id: Some(summary_id),
            summary: Some(Box::new(summary)),
            kept: kept as u64,
            error: None,
        });
        Ok(())
    }

    /// Announces a compaction that could not start, with both its events.
    fn compaction_refused(&self, reason: CompactionReason, error: String) -> Unfinished {
        let tokens_before = self.context_tokens();
        self.emit(AgentEvent::CompactionStart {
            reason,
            tokens_before,
        });
        self.compaction_failed(reason, tokens_before, error)
    }

    /// Announces a compaction that failed, the transcript left as it was.
    fn compaction_failed(
        &self,
        reason: CompactionReason,
        tokens_before: u64,
        error: String,
    ) -> Unfinished {
        tracing::warn!(?reason, %error, "compaction failed");
        self.emit(AgentEvent::CompactionEnd {
            reason,
            tokens_before,
            tokens_after: tokens_before,
            summary_id: None,
            summary: None,
            kept: 0,
            error: Some(error.clone()),
        });
        Unfinished::Failed(error)
    }

    /// Adds an empty assistant message saying the run was aborted before the model
    /// answered.
    fn aborted(&mut self) -> AssistantMessage {
        let mut message = AssistantMessage::empty(&self.config.model);
        message.stop_reason = StopReason::Aborted;
        message.error_message = Some(StreamError::Aborted.to_string());
        self.record(message)
    }

    /// Adds an assistant message that did not come from the model.
    fn record(&mut self, message: AssistantMessage) -> AssistantMessage {
        let mut start = message.clone();
        start.content.clear();
        self.finish_response(Some(start), message)
    }
}

/// Takes the queued messages of `source`; a source that panics has none.
pub(crate) async fn take(source: &Option<MessageSource>) -> Vec<AgentMessage> {
    let Some(source) = source else {
        return Vec::new();
    };
    match AssertUnwindSafe(source()).catch_unwind().await {
        Ok(messages) => messages,
        Err(panic) => {
            tracing::error!(panic = %panic_text(panic), "a message source panicked; treating it as empty");
            Vec::new()
        }
    }
}

fn failed_message(model: &tiller_ai::Model, reason: String) -> AssistantMessage {
    let mut message = AssistantMessage::empty(model);
    message.stop_reason = StopReason::Error;
    message.error_message = Some(reason);
    message
}

/// A request sent to one model, and its span.
struct Attempt {
    stream: tiller_ai::AssistantStream,
    span: tracing::Span,
}

/// A response read to its end.
struct Answer {
    outcome: Answered,
    /// The final message.
    message: AssistantMessage,
    /// What the call spent.
    spent: Spent,
    /// Whether any of it streamed (its start announced).
    streamed: bool,
}

/// How a response ended.
enum Answered {
    /// Refused as longer than the window before anything streamed, with the
    /// held start and the window the provider named.
    Refused {
        start: AssistantMessage,
        window: Option<u32>,
    },
    /// Done or failed: the start still held when nothing streamed.
    Ended {
        start: Option<AssistantMessage>,
        error: Option<StreamError>,
    },
}

/// The GenAI attributes of a model call's span, once its response ended.
fn record_answer(span: &tracing::Span, message: &AssistantMessage, failed: Option<&StreamError>) {
    span.record("gen_ai.response.model", message.model.as_str());
    let finish = format!("[\"{}\"]", stop_reason_name(message.stop_reason));
    span.record("gen_ai.response.finish_reasons", finish.as_str());
    let tokens = |count: u64| i64::try_from(count).unwrap_or(i64::MAX);
    span.record("gen_ai.usage.input_tokens", tokens(message.usage.input));
    span.record("gen_ai.usage.output_tokens", tokens(message.usage.output));
    if let Some(error) = failed {
        span.record("error.type", error_kind(error));
    }
}

/// A model as events name it: `provider/id`.
fn model_name(model: &Model) -> String {
    format!("{}/{}", model.provider, model.id)
}

/// A stop reason as the GenAI conventions write finish reasons.
fn stop_reason_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Stop => "stop",
        StopReason::Length => "length",
        StopReason::ToolUse => "tool_call",
        StopReason::Error => "error",
        StopReason::Aborted => "aborted",
    }
}

/// The kind of a stream error, as its JSON names it.
fn error_kind(error: &StreamError) -> String {
    serde_json::to_value(error)
        .ok()
        .and_then(|value| value.get("kind")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "error".to_owned())
}

/// The message of a panic payload.
pub fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload.downcast_ref::<&str>().map_or_else(
            || "a panic without a message".to_owned(),
            |s| (*s).to_owned(),
        ),
    }
}
