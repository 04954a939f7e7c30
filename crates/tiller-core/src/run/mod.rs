//! The loop: turns of model responses and tool calls, with steering, follow-ups,
//! stop conditions and abort.
//!
//! A run owns its copy of the context and never touches the caller's. It asks for
//! steering at the start, after tool calls (when steering interrupts) and after each
//! turn; for follow-ups only when it would otherwise stop. Every failure of a
//! callback or of the model becomes part of the transcript (an assistant message
//! with stop reason `error`) and the run still ends with `agent_end`.
//!
//! A run ([`Run`]) calls its stages at fixed points, one file each:
//! - [`start`]: what a run starts from, checked once ([`check_start`]);
//! - [`gate`]: input guardrails and budgets before a call ([`Gate`] keeps the
//!   verdicts that end the run);
//! - [`respond`]: the model call, with compaction on overflow, fallbacks and the
//!   budgets' holds;
//! - [`execute`]: the turn's tool calls, run once the response is durable;
//!   [`reply`]: the user's reply to a parked call;
//! - [`finish`]: the turn's one `turn_end`, the answer's checks, and `agent_end`;
//! - [`compact`]: summaries in place of the oldest messages, kept in the run's
//!   [`history`].

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tiller_ai::{
    AssistantMessage, RateLimitObserver, StopReason, StreamError, StreamOptions, ToolResultMessage,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::budget::Meter;
use crate::compaction;
use crate::config::{LoopConfig, MessageSource};
use crate::event::{AgentEvent, RunEnd};
use crate::failure::panic_text;
use crate::message::AgentMessage;
use crate::output::{Output, OutputCheck};
use crate::toolset::ToolSet;

mod compact;
mod execute;
mod finish;
mod gate;
mod history;
mod reply;
mod respond;
mod start;

use finish::Next;
use gate::{Beside, Gate};
use history::History;
pub use start::{
    ContinueError, LoopContext, Prompt, Start, check_continue, check_prompt, check_reply,
    check_start,
};

/// Receives every event of a run, in order. It must not block.
pub type EventSink = Arc<dyn Fn(AgentEvent) + Send + Sync>;

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

/// Why an application callback gave no answer.
pub(crate) enum Interrupted {
    /// It panicked, with this message.
    Panicked(String),
    /// The run was aborted and it did not return within the grace period.
    Aborted,
}

/// One run's state; its stages are its methods, one file each.
pub(crate) struct Run {
    config: LoopConfig,
    cancel: CancellationToken,
    /// The request options of every model call: the config's, with this run's token.
    options: StreamOptions,
    sink: EventSink,
    system_prompt: Option<String>,
    history: History,
    tools: ToolSet,
    /// The model's context window as far as the run knows it (a provider's
    /// refusal may name a smaller one).
    window: u32,
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
    state: crate::tool::SharedState,
    /// What the last tool round streamed that the next response need not stream
    /// again ([`crate::restate`]).
    echoes: Vec<String>,
    /// Whether a tool's result streamed to subscribers in this run (see
    /// [`crate::RunOptions::quiet_after_child_content`]).
    child_streamed: bool,
    /// The budgets and the verdicts that end the run.
    gate: Gate,
}

impl Run {
    fn new(
        context: LoopContext,
        config: LoopConfig,
        cancel: CancellationToken,
        sink: EventSink,
    ) -> Self {
        let mut options = config.run.stream.clone();
        options.transport.cancel = cancel.clone();
        if options.transport.rate_limits.is_some() {
            let sink = sink.clone();
            options.transport.on_rate_limited = Some(RateLimitObserver::new(move |wait| {
                sink(AgentEvent::RateLimited {
                    account: wait.account.to_string(),
                    wait_ms: u64::try_from(wait.wait.as_millis()).unwrap_or(u64::MAX),
                    cause: wait.cause,
                });
            }));
        }
        let gate = Gate::new(Meter::new(config.run.budget, config.spending.clone()));
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
            history: History::new(
                context.messages,
                context.tokens,
                overhead,
                context.first_seq,
            ),
            tools: context.tools,
            overflowed: false,
            turns: 0,
            output: None,
            approved: None,
            answered: None,
            state: Default::default(),
            echoes: Vec::new(),
            child_streamed: false,
            gate,
        }
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
        self.history.messages()
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
            return self.compact_only(instructions).await;
        }
        let reason = match self.open_gate(&start).await {
            Ok(beside) => self.started(start, beside).await,
            Err((reason, beside)) => self.stopped_at_gate(start, reason, beside).await,
        };
        self.finish(reason)
    }

    /// The run from its first turn on.
    async fn started(&mut self, start: Start, beside: Beside) -> RunEnd {
        // The steering taken for the start was checked with the prompt.
        let checked = matches!(start, Start::Messages(_)) && self.config.first_steering.is_some();
        self.emit(AgentEvent::TurnStart);
        let parked = match start {
            Start::Messages(prompts) => {
                self.deliver_all(Some(prompts));
                false
            }
            Start::Reply(request, reply) => self.reply(request, reply).await,
            Start::Continue | Start::Compact(_) => false,
        };
        if parked {
            return RunEnd::Parked;
        }
        let pending = match self.config.first_steering.take() {
            // Aborted already: nothing taken is delivered (the caller keeps it).
            Some(_) if self.cancel.is_cancelled() => Vec::new(),
            Some(taken) => taken,
            None => self.take(&self.config.steering).await,
        };
        let schema = self.options.output_schema.as_ref();
        match schema
            .map(|output| OutputCheck::new(&output.schema))
            .transpose()
        {
            Err(failure) => {
                self.leave(Some(pending));
                self.fail(failure);
                RunEnd::Error
            }
            Ok(check) => self.turns(pending, check, beside, checked).await,
        }
    }

    /// Turn after turn until one ends the run: the pending messages admitted
    /// (the gate), the model's response and its tool calls, the turn settled.
    async fn turns(
        &mut self,
        mut pending: Vec<AgentMessage>,
        mut check: Option<OutputCheck>,
        mut beside: Beside,
        mut checked: bool,
    ) -> RunEnd {
        loop {
            let (message, batch) = match self.admit(pending, std::mem::take(&mut checked)).await {
                Ok(()) => {
                    let span = tracing::info_span!("turn", turn = self.turns + 1);
                    self.turn(beside.take()).instrument(span).await
                }
                Err(refused) => (refused, execute::Batch::default()),
            };
            pending = match self.settle(message, batch, check.as_mut()).await {
                Next::Turn(pending) => pending,
                Next::End(reason) => return reason,
            };
            self.emit(AgentEvent::TurnStart);
        }
    }

    /// One model response and its tool calls, which start once the response is
    /// durable (write-ahead).
    async fn turn(&mut self, beside: Beside) -> (AssistantMessage, execute::Batch) {
        let message = match beside {
            Some(verdict) => self.respond_beside(verdict).await,
            None => self.respond().await,
        };
        let batch = self.batch(&message).await;
        self.turns += 1;
        (message, batch)
    }

    /// Adds a message to the transcript with its start and end events.
    fn deliver(&mut self, message: AgentMessage) {
        self.emit(AgentEvent::MessageStart {
            message: Box::new(message.clone()),
        });
        self.emit(AgentEvent::MessageEnd {
            message: Box::new(message.clone()),
        });
        self.history.push(message);
    }

    fn deliver_all(&mut self, messages: Option<Vec<AgentMessage>>) {
        for message in messages.into_iter().flatten() {
            self.deliver(message);
        }
    }

    /// Adds an assistant message saying why the run failed.
    fn fail(&mut self, reason: String) -> AssistantMessage {
        let message = failed_message(&self.config.model, reason);
        self.finish_response(Some(message.clone()), message)
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
        self.history.push(message.clone().into());
        message
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
