//! A run, as its actor sees it: starting one (the checks, the first steering
//! read, the loop's configuration, its task), the events it hands back in
//! batches, each applied to the state before it is published, and its end, told
//! once everything it wrote is committed. Write-ahead: a response with tool calls
//! is committed before any call starts.

use std::collections::VecDeque;
use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use tiller_ai::StreamedMessage;
use tiller_core::{
    AgentContext, AgentEvent, BudgetExceeded, CompactionReport, ContextTokens, ContinueError,
    GuardrailTripped, LoopConfig, LoopContext, MessageSource, Prompt, RunEnd, Spending, Spent,
    Start, WriteAhead, check_start, open_requests, run_from,
};
use tiller_store::{Change, QueueKind, StoreError};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use super::ActorState;
use super::queues::deliver_from;
use super::session::{answer_open, appends};
use crate::AgentMessage;
use crate::error::AgentError;
use crate::message::AgentMsg;
use crate::message::{Internal, Signal};
use crate::patch::DefinitionPatch;
use crate::route::lock;
use crate::settings::AgentSettings;
use crate::state::RunOutcome;
use crate::subscription::Delivered;
use tiller_core::RunHooks;

/// What a run is started with besides its prompt.
pub(super) struct RunRequest {
    /// Hears the run's outcome.
    pub(super) finished: Option<oneshot::Sender<RunOutcome>>,
    /// Changes to the definition for this run.
    pub(super) patch: Option<Box<DefinitionPatch>>,
    /// Hooks for this run, each in place of the agent's.
    pub(super) hooks: Option<Box<RunHooks>>,
    /// The span the run's own span goes under.
    pub(super) caller: tracing::Span,
    /// Hears once the run started and the messages it starts from are stored, or
    /// why it did not start.
    pub(super) reply: Option<RpcReplyPort<Result<(), AgentError>>>,
    /// The idempotency key of the op that starts it.
    pub(super) key: Option<Arc<str>>,
}

/// The acknowledgement of the op that started a run, held until the run's first
/// message (the prompt, a reply's result) is committed, and the op's idempotency
/// key, written with that message.
pub(super) struct StartAck {
    reply: Option<RpcReplyPort<Result<(), AgentError>>>,
    key: Option<Arc<str>>,
}

pub(super) struct ActiveRun {
    pub(super) id: u64,
    /// The run's span: its task runs in it, and its end is told in it.
    pub(super) span: tracing::Span,
    pub(super) events: Arc<RunEvents>,
    pub(super) token: CancellationToken,
    /// Ends the run where its next turn would start ([`Signal::Pause`]).
    pub(super) pause: CancellationToken,
    /// The start's acknowledgement, until the run's first message is committed.
    pub(super) start_ack: Option<StartAck>,
    pub(super) _task: AbortOnDropHandle<()>,
    /// The response streaming, as of its last event.
    pub(super) streaming: Option<StreamedMessage>,
    pub(super) pending_tool_calls: Vec<String>,
    /// Messages taken from a queue and not yet in the transcript, oldest first.
    pub(super) in_flight: VecDeque<(QueueKind, u64, AgentMessage)>,
    pub(super) finished: Option<oneshot::Sender<RunOutcome>>,
    /// Whether the run ends in a reset (the transcript, queues and error cleared).
    pub(super) reset: bool,
    /// The idempotency keys of the resets asked during the run, written with the
    /// clearing.
    pub(super) reset_keys: Vec<Arc<str>>,
    /// Aborts and resets asked during the run, answered once it ended.
    pub(super) after_end: Vec<RpcReplyPort<Result<(), AgentError>>>,
    /// The run's `agent_end`, held until its writes are committed.
    pub(super) ending: Option<AgentEvent>,
    /// Whether the tenant's ledger writes the tenant's part of what the run
    /// spends ([`Tally::is_shared`](tiller_core::Tally::is_shared)): the run's
    /// writes then count its session alone.
    pub(super) tenant_ledger: bool,
    /// Tells when the write of the run's last finished message is committed,
    /// until the run's write-ahead request takes it: one agent's writes commit in
    /// order, so everything before it is then committed too.
    pub(super) last_write: Option<Committed>,
    /// What the run's compactions did, in order.
    pub(super) compactions: Vec<CompactionReport>,
    /// When it started, for its wall-clock spending.
    pub(super) started: tokio::time::Instant,
    /// The budget that ran out, or the guardrail that tripped, ending it.
    pub(super) budget_exceeded: Option<BudgetExceeded>,
    pub(super) guardrail_tripped: Option<GuardrailTripped>,
    /// Whether a message was queued while it ran: one its loop may not have
    /// seen (see [`ActorState::finish`]).
    pub(super) queued: bool,
}

/// Tells when a write is committed, or why it is not.
pub(super) type Committed = oneshot::Receiver<Result<(), StoreError>>;

/// What a run hands its actor, in order.
pub(super) enum RunItem {
    /// An event.
    Event(AgentEvent),
    /// Write-ahead: the run wants what tells when the message it just ended is
    /// committed (see [`ActiveRun::last_write`]).
    WriteAhead(oneshot::Sender<Committed>),
}

/// What a run hands its actor, waiting for it; the actor is told when the queue
/// stops being empty.
pub(super) struct RunEvents {
    queue: std::sync::Mutex<Vec<RunItem>>,
    actor: ActorRef<AgentMsg>,
}

impl RunEvents {
    pub(super) fn push(&self, item: RunItem) {
        let was_empty = {
            let mut queue = lock(&self.queue);
            queue.push(item);
            queue.len() == 1
        };
        if was_empty {
            let _ = self
                .actor
                .send_message(AgentMsg::Internal(Internal(Signal::Events)));
        }
    }

    pub(super) fn swap(&self, buffer: &mut Vec<RunItem>) {
        std::mem::swap(&mut *lock(&self.queue), buffer);
    }
}

impl ActorState {
    /// Starts a run from `prompt`. Its reply hears once the messages it starts
    /// from (a prompt's, a queued message, a reply's result) are committed, or at
    /// once when it starts from the transcript as it stands; or why it did not
    /// start.
    pub(super) fn start(&mut self, prompt: Prompt, mut request: RunRequest) {
        let reply = request.reply.take();
        let key = request.key.take();
        match self.start_run(prompt, request) {
            Err(error) => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(error));
                }
            }
            Ok(true) => {
                if let Some(key) = &key {
                    self.keys.remember(key.clone());
                }
                if let Some(run) = self.run.as_mut() {
                    run.start_ack = Some(StartAck { reply, key });
                }
            }
            Ok(false) => {
                let writes = self.keyed(Vec::new(), key);
                match (writes.is_empty(), reply) {
                    (true, Some(reply)) => {
                        let _ = reply.send(Ok(()));
                    }
                    (_, reply) => self.commit(writes, reply),
                }
            }
        }
    }

    /// Starts a run; whether it starts from messages to store first.
    fn start_run(&mut self, prompt: Prompt, request: RunRequest) -> Result<bool, AgentError> {
        if self.run.is_some() {
            return Err(AgentError::Busy);
        }
        let RunRequest {
            finished,
            patch,
            hooks,
            caller,
            ..
        } = request;
        let settings = self.run_settings(patch, hooks)?;
        let model = settings
            .definition
            .model
            .clone()
            .ok_or(AgentError::NoModel)?;
        let mut in_flight = VecDeque::new();
        let (start, first_steering) = self.opening(prompt, &mut in_flight)?;
        let brings_messages = match &start {
            Start::Messages(messages) => !messages.is_empty(),
            Start::Continue | Start::Compact(_) => false,
            _ => true,
        };
        self.answer_open_calls();
        let agent_context = self.agent.run_context(&self.context);
        let context = self.loop_context(&settings, &agent_context);
        self.error = None;
        self.runs += 1;
        let run_id = self.runs;
        let events = Arc::new(RunEvents {
            queue: std::sync::Mutex::new(Vec::new()),
            actor: self.myself.clone(),
        });
        let pause = CancellationToken::new();
        let current = agent_context.clone();
        let config = LoopConfig {
            pause: Some(pause.clone()),
            first_steering,
            ..self.loop_config(&events, run_id, &settings, model, agent_context)
        };
        let tenant_ledger = config
            .spending
            .tenant
            .as_ref()
            .is_some_and(|tally| tally.is_shared());
        let token = self.agent.runtime.root.child_token();
        let sink = {
            let events = events.clone();
            Arc::new(move |event| events.push(RunItem::Event(event)))
        };
        let span = tracing::info_span!(
            parent: &caller,
            "run",
            agent = %self.agent.id,
            session = %self.agent.session,
            run = run_id
        );
        // The run's context is `AgentContext::current()` for all its work.
        let run_token = token.clone();
        let task = tokio::spawn(
            current
                .scope(async move {
                    run_from(start, context, config, run_token, sink).await;
                })
                .instrument(span.clone()),
        );
        self.run = Some(ActiveRun {
            id: run_id,
            span,
            events,
            token,
            pause,
            start_ack: None,
            _task: AbortOnDropHandle::new(task),
            streaming: None,
            pending_tool_calls: Vec::new(),
            in_flight,
            finished,
            reset: false,
            reset_keys: Vec::new(),
            after_end: Vec::new(),
            ending: None,
            tenant_ledger,
            last_write: None,
            compactions: Vec::new(),
            started: tokio::time::Instant::now(),
            budget_exceeded: None,
            guardrail_tripped: None,
            queued: false,
        });
        self.agent.route.mark_running();
        Ok(brings_messages)
    }

    /// What the run starts from: the system prompt (written for `context` when
    /// the code writes it), a copy of the transcript, the tools.
    fn loop_context(&self, settings: &AgentSettings, context: &AgentContext) -> LoopContext {
        LoopContext {
            system_prompt: match &settings.code.system_prompt_fn {
                Some(write) => Some(write(context)),
                None => settings.definition.system_prompt.clone(),
            },
            messages: self.messages.iter().map(|m| (**m).clone()).collect(),
            tools: settings.code.tools.clone(),
            tokens: Some(self.tokens),
            first_seq: self.base,
        }
    }

    /// The agent's settings with a run's `patch` and `hooks` over them.
    fn run_settings(
        &self,
        patch: Option<Box<DefinitionPatch>>,
        hooks: Option<Box<RunHooks>>,
    ) -> Result<Arc<AgentSettings>, AgentError> {
        if patch.is_none() && hooks.is_none() {
            return Ok(self.settings.clone());
        }
        let mut settings = (*self.settings).clone();
        if let Some(patch) = patch {
            patch.apply(&mut settings.definition)?;
            if patch.system_prompt.is_some() {
                settings.code.system_prompt_fn = None;
            }
        }
        if let Some(hooks) = hooks {
            settings.code.hooks = settings.code.hooks.merged(&hooks);
        }
        Ok(Arc::new(settings))
    }

    /// How a run of `prompt` starts, and the run's first read of the steering
    /// queue, done here: nothing when the run starts from steering (the next
    /// message gets its own response) or compacts; left to the run after a
    /// reply, whose call runs first. What it takes from the queues goes to
    /// `in_flight`. When the model answered last, the oldest queued message
    /// starts the run.
    fn opening(
        &mut self,
        prompt: Prompt,
        in_flight: &mut VecDeque<(QueueKind, u64, AgentMessage)>,
    ) -> Result<(Start, Option<Vec<AgentMessage>>), AgentError> {
        let replying = matches!(prompt, Prompt::Reply(_));
        let compacting = matches!(prompt, Prompt::Compact { .. });
        let (start, from_steering) = match check_start(prompt, &self.messages) {
            Ok(start) => (start, false),
            Err(ContinueError::EndsWithAssistant) => {
                let queue = if !self.steering.is_empty() {
                    QueueKind::Steering
                } else if !self.follow_up.is_empty() {
                    QueueKind::FollowUp
                } else {
                    return Err(ContinueError::EndsWithAssistant.into());
                };
                let mode = self.mode(queue);
                let taken = deliver_from(self.queue_mut(queue), queue, mode, in_flight);
                (Start::Messages(taken), queue == QueueKind::Steering)
            }
            Err(error) => return Err(error.into()),
        };
        let first_steering = match (from_steering || compacting, replying) {
            (true, _) => Some(Vec::new()),
            (false, true) => None,
            (false, false) => {
                let mode = self.mode(QueueKind::Steering);
                let steering = &mut self.steering;
                Some(deliver_from(steering, QueueKind::Steering, mode, in_flight))
            }
        };
        Ok((start, first_steering))
    }

    /// Answers the calls without results of a transcript restored from
    /// elsewhere, before anything else.
    fn answer_open_calls(&mut self) {
        let answered = answer_open(
            &self.agent,
            self.base,
            &mut self.messages,
            "no result was recorded before the next run started.",
        );
        if !answered.is_empty() {
            let from = self.messages.len() - answered.len();
            self.count_from(from);
            self.commit(answered, None);
        }
    }

    /// The loop's configuration for run `run`: the settings', with the agent's
    /// queues, its write-ahead and the runtime's shared parts (rate limits,
    /// breakers, the spending so far and the tenant's tally).
    fn loop_config(
        &self,
        events: &Arc<RunEvents>,
        run: u64,
        settings: &AgentSettings,
        model: tiller_ai::Model,
        context: AgentContext,
    ) -> LoopConfig {
        let runtime = &self.agent.runtime;
        let tenant = context.tenant_id();
        let mut options = settings.definition.run.clone();
        options
            .stream
            .transport
            .rate_limits
            .clone_from(&runtime.rate_limits);
        options.stream.transport.breakers = Some(runtime.breakers.clone());
        options.stream.transport.tenant = tenant.map(Arc::from);
        let spending = Spending {
            agent_before: self.spent,
            tenant: tenant
                .and_then(|tenant| runtime.tallies.get(tenant))
                .map(|tally| tally.clone()),
        };
        LoopConfig {
            model,
            fallbacks: settings.definition.fallbacks.clone(),
            spending,
            run: options,
            hooks: settings.code.hooks.clone(),
            steering: Some(queue_source(&self.myself, run, QueueKind::Steering)),
            first_steering: None,
            follow_up: Some(queue_source(&self.myself, run, QueueKind::FollowUp)),
            write_ahead: Some(write_ahead(events)),
            pause: None,
            context,
        }
    }

    pub(super) fn drain_events(&mut self) {
        let Some(run) = &self.run else {
            return;
        };
        let mut batch = std::mem::take(&mut self.batch);
        run.events.swap(&mut batch);
        // One wake per subscriber for the batch, not one per event.
        let hold = batch.len() > 1;
        if hold {
            self.agent.hub.hold_wakes();
        }
        for item in batch.drain(..) {
            match item {
                RunItem::Event(event) => self.apply(event),
                RunItem::WriteAhead(reply) => self.write_ahead(reply),
            }
        }
        if hold {
            self.agent.hub.release_wakes();
        }
        self.batch = batch;
    }

    /// Applies one event to the state and publishes it; `agent_end` waits for the
    /// run's writes to be committed.
    pub(super) fn apply(&mut self, event: AgentEvent) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        match &event {
            AgentEvent::MessageStart { message } => {
                if let Some(assistant) = message.as_assistant() {
                    run.streaming = Some(StreamedMessage::start(assistant.clone()));
                }
            }
            AgentEvent::MessageUpdate { message, .. } => {
                run.streaming = Some(message.clone());
            }
            AgentEvent::MessageEnd { message } => {
                run.streaming = None;
                self.message_ended(message);
            }
            AgentEvent::ToolExecutionStart { tool_call_id, .. } => {
                run.pending_tool_calls.push(tool_call_id.clone())
            }
            AgentEvent::ToolExecutionEnd { tool_call_id, .. } => {
                run.pending_tool_calls.retain(|id| id != tool_call_id)
            }
            AgentEvent::CompactionEnd {
                summary: Some(summary),
                summary_id: Some(summary_id),
                kept,
                ..
            } => {
                let report = event.compaction_report();
                self.compacted(summary, *summary_id, *kept as usize, report);
            }
            AgentEvent::CompactionEnd { .. } => {
                run.compactions.extend(event.compaction_report());
            }
            AgentEvent::TurnEnd { message, .. } => {
                if let Some(error) = &message.error_message {
                    self.error = Some(error.clone());
                }
            }
            AgentEvent::BudgetExceeded { .. } => run.budget_exceeded = event.budget_exceeded(),
            AgentEvent::GuardrailTripped { .. } => {
                run.guardrail_tripped = event.guardrail_tripped();
            }
            AgentEvent::AgentEnd { .. } => {
                self.ended(event);
                return;
            }
            // These change nothing the actor keeps; a kind of event added later
            // is published as it is until it is named here.
            AgentEvent::AgentStart
            | AgentEvent::CompactionStart { .. }
            | AgentEvent::TurnStart
            | AgentEvent::ToolExecutionUpdate { .. }
            | AgentEvent::Action { .. }
            | AgentEvent::InputRequested { .. }
            | AgentEvent::ApprovalRequested { .. }
            | AgentEvent::ChildEvent { .. }
            | AgentEvent::RateLimited { .. }
            | AgentEvent::ModelFallback { .. } => {}
            _ => {}
        }
        self.agent
            .hub
            .publish(&self.agent.id, Delivered::Event(event));
    }

    /// A message the run ended: in the transcript, written with what it
    /// spent, the queue entry it came from and the op key it acknowledges (the
    /// run's write-ahead may wait on this write).
    fn message_ended(&mut self, message: &AgentMessage) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let spent = match message {
            AgentMessage::Llm(tiller_ai::Message::Assistant(answer)) => {
                Some(Spent::response(answer)).filter(|spent| !spent.is_zero())
            }
            AgentMessage::Llm(tiller_ai::Message::ToolResult(_)) => Some(Spent::tool_calls(1)),
            _ => None,
        };
        let dequeued = match run.in_flight.front() {
            Some((_, seq, taken)) if taken == message => {
                let seq = *seq;
                run.in_flight.pop_front();
                Some(seq)
            }
            _ => None,
        };
        let seq = self.base + self.messages.len() as u64;
        let shared = Arc::new(message.clone());
        self.tokens = self.tokens.after(&shared);
        self.messages.push(shared.clone());
        let state = shared
            .as_tool_result()
            .map(|result| &result.state)
            .filter(|state| !state.is_empty());
        let context = state.map(|state| {
            self.context = self.context.clone().with_states(state);
            self.agent
                .write(Change::SetContext(stored_context(&self.context)))
        });
        // A tool's state is stored in the write of its result.
        let mut writes = vec![self.agent.write(Change::Append {
            seq,
            message: shared,
            dequeued,
        })];
        writes.extend(context);
        // What it spent, counted in the same write.
        let tenant_ledger = run.tenant_ledger;
        writes.extend(spent.map(|spent| {
            self.spent += &spent;
            spend_write(&self.agent, &self.context, spent, tenant_ledger)
        }));
        // The run's write-ahead may wait on this one.
        let (done, committed) = oneshot::channel();
        run.last_write = Some(committed);
        // The run's first message acknowledges the op that started it.
        let start_ack = run.start_ack.take();
        if let Some(key) = start_ack.as_ref().and_then(|ack| ack.key.clone()) {
            writes.push(self.agent.write(Change::OpKey(key)));
        }
        let ack = self.ack(move |result| {
            if let Some(StartAck {
                reply: Some(reply), ..
            }) = start_ack
            {
                let _ = reply.send(result.clone().map_err(AgentError::from));
            }
            let _ = done.send(result);
        });
        self.agent.runtime.writer.submit(writes, Some(ack));
        if let Some(hook) = &self.settings.code.on_message {
            hook(&self.agent.id, message);
        }
    }

    /// A compaction the run made: its summary in place of all but the last
    /// `kept` messages, stored in one transaction, when it fits the transcript.
    fn compacted(
        &mut self,
        summary: &AgentMessage,
        summary_id: u64,
        kept: usize,
        mut report: Option<CompactionReport>,
    ) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let seq = self.base + self.messages.len() as u64;
        let fits = summary_id == seq && kept <= self.messages.len();
        if !fits {
            // The run's transcript and this one differ: never written.
            tracing::error!(agent = %self.agent.id, summary_id, seq, "a compaction does not fit the transcript; not applied");
            if let Some(report) = report.as_mut() {
                report.summary_id = None;
                report.error = Some("the compaction did not fit the agent's transcript".to_owned());
            }
        }
        run.compactions.extend(report);
        if fits {
            let mut compacted = Vec::with_capacity(1 + kept);
            compacted.push(Arc::new(summary.clone()));
            compacted.extend(self.messages.drain(self.messages.len() - kept..));
            // The summary and the copies of the kept messages, in one
            // transaction: the compaction is stored whole or not at all.
            let writes = appends(&self.agent, seq, &compacted);
            let agent = self.agent.id.clone();
            let ack = self.ack(move |result| {
                if let Err(error) = result {
                    tracing::error!(%agent, %error, "a compaction could not be stored");
                }
            });
            self.agent.runtime.writer.submit(writes, Some(ack));
            self.tokens = ContextTokens::of(&compacted);
            self.messages = compacted;
            self.base = seq;
        }
    }

    /// The run's `agent_end`: its wall clock spent, what it took from the queues
    /// and never delivered put back (or dropped, when an input guardrail refused
    /// it), a reset's clearing; the end is told once all of it is committed.
    fn ended(&mut self, event: AgentEvent) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let ms = u64::try_from(run.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let spent = Spent::wall_clock(ms);
        self.spent += &spent;
        let wall_clock = spend_write(&self.agent, &self.context, spent, run.tenant_ledger);
        // Taken and never delivered (an abort): back to the front of its queue,
        // where the store still has it; refused by an input guardrail: gone.
        let refused = run
            .guardrail_tripped
            .as_ref()
            .is_some_and(|tripped| tripped.stage == tiller_core::GuardrailStage::Input);
        let mut dropped = Vec::new();
        while let Some((queue, seq, message)) = run.in_flight.pop_back() {
            if refused {
                dropped.push(seq);
                continue;
            }
            match queue {
                QueueKind::Steering => self.steering.push_front((seq, message)),
                QueueKind::FollowUp => self.follow_up.push_front((seq, message)),
            }
        }
        let reset = run.reset;
        let run_id = run.id;
        run.ending = Some(event);
        let reset_keys = std::mem::take(&mut run.reset_keys);
        let mut writes = if reset { self.clear() } else { Vec::new() };
        writes.push(wall_clock);
        writes.extend(
            dropped
                .into_iter()
                .map(|seq| self.agent.write(Change::Dequeue(seq))),
        );
        writes.extend(
            reset_keys
                .into_iter()
                .map(|key| self.agent.write(Change::OpKey(key))),
        );
        let actor = self.myself.clone();
        let ack = self.ack(move |_| {
            let _ = actor.send_message(AgentMsg::Internal(Internal(Signal::Committed(run_id))));
        });
        self.agent.runtime.writer.submit(writes, Some(ack));
    }

    /// The run `run` ended and its writes are committed: the state says so, then
    /// subscribers and waiters hear of it.
    pub(super) fn finish(&mut self, run: u64) {
        if self.run.as_ref().is_none_or(|active| active.id != run) {
            return;
        }
        let Some(run) = self.run.take() else {
            return;
        };
        let span = run.span;
        let Some(event) = run.ending else {
            return;
        };
        if let AgentEvent::AgentEnd { reason, .. } = &event {
            tracing::info!(parent: &span, end = ?reason, "run ended");
        }
        let outcome = match (&event, run.finished) {
            (
                AgentEvent::AgentEnd {
                    messages,
                    reason,
                    output,
                },
                Some(finished),
            ) => Some((
                finished,
                RunOutcome {
                    messages: messages.clone(),
                    end: *reason,
                    output: output.clone(),
                    compactions: run.compactions,
                    conversation: self.messages.clone(),
                    budget_exceeded: run.budget_exceeded,
                    guardrail_tripped: run.guardrail_tripped,
                },
            )),
            _ => None,
        };
        // A message queued while the run was ending, after its loop last
        // looked: a run of its own, as the run would have given it one.
        let stranded = run.queued
            && !run.reset
            && !run.token.is_cancelled()
            && matches!(
                &event,
                AgentEvent::AgentEnd {
                    reason: RunEnd::Completed,
                    ..
                }
            )
            && !(self.steering.is_empty() && self.follow_up.is_empty());
        let agent = &self.agent;
        let waiting = !open_requests(&self.messages).is_empty();
        agent
            .hub
            .publish_with(&agent.id, Delivered::Event(event), || {
                // Busy on, through the end, when another run follows.
                if !stranded {
                    agent.route.mark_idle(waiting);
                }
            });
        for ended in run.after_end {
            let _ = ended.send(Ok(()));
        }
        // A run that ended before its first message was stored: its start is
        // acknowledged with its end.
        if let Some(StartAck {
            reply: Some(reply), ..
        }) = run.start_ack
        {
            let _ = reply.send(Ok(()));
        }
        if let Some((finished, outcome)) = outcome {
            let _ = finished.send(outcome);
        }
        self.activity += 1;
        if stranded {
            let request = RunRequest {
                finished: None,
                patch: None,
                hooks: None,
                caller: span,
                reply: None,
                key: None,
            };
            self.start(Prompt::Continue, request);
            if self.run.is_some() {
                return;
            }
            // It could not start: idle after all.
            let waiting = !open_requests(&self.messages).is_empty();
            self.agent.route.mark_idle(waiting);
        }
        for waiter in self.idle_waiters.drain(..) {
            let _ = waiter.send(());
        }
        self.schedule_put_away();
    }

    /// Answers the run's write-ahead request with what tells when its last
    /// finished message is committed.
    pub(super) fn write_ahead(&mut self, reply: oneshot::Sender<Committed>) {
        let committed = self
            .run
            .as_mut()
            .and_then(|run| run.last_write.take())
            .unwrap_or_else(|| {
                // Asked twice since the last message: nothing more to wait for.
                let (done, committed) = oneshot::channel();
                let _ = done.send(Ok(()));
                committed
            });
        let _ = reply.send(committed);
    }
}

/// The write that stores what the agent spent, for its session and (unless
/// the tenant's ledger writes it) its tenant.
fn spend_write(
    agent: &crate::agent::Agent,
    context: &AgentContext,
    spent: Spent,
    tenant_ledger: bool,
) -> tiller_store::SessionWrite {
    let tenant = context
        .tenant_id()
        .filter(|_| !tenant_ledger)
        .map(Arc::from);
    agent.write(Change::Spend { spent, tenant })
}

/// Write-ahead for the loop: a request behind the response in the run's queue,
/// answered by the actor with what tells when its write of the response is
/// committed.
pub(super) fn write_ahead(events: &Arc<RunEvents>) -> WriteAhead {
    let events = events.clone();
    Arc::new(move || {
        let (reply, answer) = oneshot::channel();
        events.push(RunItem::WriteAhead(reply));
        Box::pin(async move {
            let stopped = || Err("the agent's actor stopped".to_owned());
            let Ok(committed) = answer.await else {
                return stopped();
            };
            match committed.await {
                Ok(result) => result.map_err(|error| error.to_string()),
                Err(_) => stopped(),
            }
        })
    })
}

/// Reads one of the agent's queues for the loop, by asking the actor.
pub(super) fn queue_source(
    actor: &ActorRef<AgentMsg>,
    run: u64,
    queue: QueueKind,
) -> MessageSource {
    let actor = actor.clone();
    Arc::new(move || {
        let (reply, taken) = oneshot::channel();
        let asked = actor.send_message(AgentMsg::Internal(Internal(Signal::Take {
            run,
            queue,
            reply,
        })));
        Box::pin(async move {
            if asked.is_err() {
                return Vec::new();
            }
            taken.await.unwrap_or_default()
        })
    })
}

/// `context` as a session stores it.
pub(crate) fn stored_context(context: &tiller_core::AgentContext) -> tiller_store::Definition {
    /// An empty context's text, shared by every session that has one.
    static EMPTY: std::sync::LazyLock<tiller_store::Definition> = std::sync::LazyLock::new(|| {
        tiller_store::Definition::new(&tiller_core::StoredContext::default()).unwrap_or_default()
    });
    let stored = context.to_stored();
    if stored == tiller_core::StoredContext::default() {
        return EMPTY.clone();
    }
    tiller_store::Definition::new(&stored).unwrap_or_default()
}
