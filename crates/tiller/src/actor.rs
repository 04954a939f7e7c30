//! The agent's actor: it owns the agent's state — settings, transcript, the
//! streaming message, pending tool calls, both queues, idle waiters — and every
//! operation on the agent is a message to it.
//!
//! A run is a separate task (the mailbox never waits behind a model call or a
//! tool). The run's events reach the actor in batches through a queue; the actor
//! applies each to the state, hands finished messages to the session store, *then*
//! publishes the event, so a subscriber never sees an event the state does not
//! reflect. A run's `agent_end` is published once everything the run wrote is
//! committed: when a caller hears a run ended, its messages are durable.
//!
//! Changes a caller asks for (queueing, clearing, reset, settings, the transcript)
//! are answered once the store has committed them; the actor does not wait for
//! the store meanwhile. A response with tool calls (and an approval) is committed
//! before any call starts (write-ahead): the run asks, behind the message in its
//! queue, for what tells when the message's write is committed, and waits on it. Every write
//! carries the agent's claim on its session; a write refused because another
//! process took the session over stops the agent.

use std::collections::VecDeque;
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tiller_ai::PartialMessage;
use tiller_core::{
    AgentContext, AgentEvent, ContinueError, LoopConfig, LoopContext, MessageSource, Prompt, Start,
    WriteAhead, answer_open_calls, cancel_requests, check_start, open_requests, run_from,
};
use tiller_store::{Ack, Change, QueueKind, SessionWrite, StoreError, StoredSession};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::AgentMessage;
use crate::agent::{Agent, lock};
use crate::compress::compress;
use crate::error::AgentError;
use crate::message::{AgentMsg, Submission};
use crate::op::{Op, Queues};
use crate::overrides::RunOverrides;
use crate::settings::{AgentSettings, QueueMode};
use crate::state::{AgentState, RunOutcome};
use crate::subscription::Delivered;

/// The runtime's own messages to an agent's actor.
pub struct Internal(Signal);

pub(crate) enum Signal {
    /// A request routed through the agent's slot (counted, for hibernation).
    Routed(Box<AgentMsg>),
    /// The run has queued events.
    Events,
    /// The run `run` asks for what one delivery of a queue takes.
    Take {
        run: u64,
        queue: QueueKind,
        reply: oneshot::Sender<Vec<AgentMessage>>,
    },
    /// Everything the run `run` wrote is committed.
    Committed(u64),
    /// A write of the actor's was refused: its session was taken over.
    TakenOver(StoreError),
    /// Idle since activity number `activity`: time to hibernate if nothing happened since.
    Hibernate(u64),
    /// Abort the active run, if any, for a stop or a shutdown: unlike
    /// [`AgentMsg::Abort`], a request waiting for the user stays open, for whoever
    /// resumes the session.
    Halt,
}

impl Internal {
    pub(crate) fn routed(message: AgentMsg) -> Self {
        Internal(Signal::Routed(Box::new(message)))
    }

    /// See [`Signal::Halt`].
    pub(crate) fn halt() -> Self {
        Internal(Signal::Halt)
    }

    /// The request a routed message carries.
    pub(crate) fn unrouted(message: AgentMsg) -> AgentMsg {
        match message {
            AgentMsg::Internal(Internal(Signal::Routed(message))) => *message,
            other => other,
        }
    }
}

/// A session as an actor starts from.
pub(crate) struct Loaded {
    pub(crate) messages: Vec<Arc<AgentMessage>>,
    pub(crate) steering: VecDeque<(u64, AgentMessage)>,
    pub(crate) follow_up: VecDeque<(u64, AgentMessage)>,
    pub(crate) next_queue_seq: u64,
}

impl Loaded {
    /// A new session's state.
    pub(crate) fn new(messages: Vec<Arc<AgentMessage>>) -> Self {
        Loaded {
            messages,
            steering: VecDeque::new(),
            follow_up: VecDeque::new(),
            next_queue_seq: 0,
        }
    }

    /// A stored session's state. Tool calls a lost run left without results (a
    /// crash, a failure) are answered with an "interrupted" error result, written to
    /// the store too.
    pub(crate) fn from_store(agent: &Agent, stored: StoredSession) -> Self {
        let mut messages = stored.messages;
        if let Some(compression) = agent.settings().compression {
            compress(&mut messages, compression.max_chars);
        }
        let answered = answer_open(
            agent,
            &mut messages,
            "the agent stopped before it finished and was brought back from its session.",
        );
        if !answered.is_empty() {
            agent.runtime.writer.submit(answered, None);
        }
        let next_queue_seq = stored
            .steering
            .iter()
            .chain(&stored.follow_up)
            .map(|queued| queued.seq + 1)
            .max()
            .unwrap_or(0);
        let queue = |queued: Vec<tiller_store::Queued>| {
            queued
                .into_iter()
                .map(|queued| (queued.seq, queued.message))
                .collect()
        };
        Loaded {
            messages,
            steering: queue(stored.steering),
            follow_up: queue(stored.follow_up),
            next_queue_seq,
        }
    }
}

/// The writes that store `messages` at their places from `from` on in `agent`'s
/// session.
pub(crate) fn appends(
    agent: &Agent,
    from: usize,
    messages: &[Arc<AgentMessage>],
) -> Vec<SessionWrite> {
    messages
        .iter()
        .enumerate()
        .map(|(n, message)| {
            agent.write(Change::Append {
                seq: (from + n) as u64,
                message: message.clone(),
                dequeued: None,
            })
        })
        .collect()
}

/// Answers, with error results saying `reason`, the calls of the transcript's last
/// response that have none (a lost run made them); answers the writes that store
/// the results. Only the messages from that response on are copied.
fn answer_open(
    agent: &Agent,
    messages: &mut Vec<Arc<AgentMessage>>,
    reason: &str,
) -> Vec<SessionWrite> {
    let Some(last) = messages.iter().rposition(|m| m.as_assistant().is_some()) else {
        return Vec::new();
    };
    let mut tail: Vec<AgentMessage> = messages[last..].iter().map(|m| (**m).clone()).collect();
    let before = tail.len();
    answer_open_calls(&mut tail, reason);
    let from = messages.len();
    messages.extend(tail.drain(before..).map(Arc::new));
    appends(agent, from, &messages[from..])
}

/// What one delivery of `queue` takes from `source` under `mode`, each message
/// recorded in `in_flight` until it joins the transcript.
fn deliver_from(
    source: &mut VecDeque<(u64, AgentMessage)>,
    queue: QueueKind,
    mode: QueueMode,
    in_flight: &mut VecDeque<(QueueKind, u64, AgentMessage)>,
) -> Vec<AgentMessage> {
    let count = match mode {
        QueueMode::OneAtATime => source.len().min(1),
        QueueMode::All => source.len(),
    };
    source
        .drain(..count)
        .map(|(seq, message)| {
            in_flight.push_back((queue, seq, message.clone()));
            message
        })
        .collect()
}

/// Sends `result` to `reply`, if anyone waits for it.
fn answer(reply: Option<RpcReplyPort<Result<(), AgentError>>>, result: Result<(), AgentError>) {
    if let Some(reply) = reply {
        let _ = reply.send(result);
    }
}

/// What an actor is started with.
pub(crate) struct Boot {
    pub(crate) agent: Arc<Agent>,
    pub(crate) settings: Arc<AgentSettings>,
    pub(crate) loaded: Loaded,
}

pub(crate) struct AgentActor;

impl AgentActor {
    /// Spawns an actor for `boot`, linked to `supervisor`.
    pub(crate) async fn spawn(
        boot: Boot,
        supervisor: ActorCell,
    ) -> Result<ActorRef<AgentMsg>, SpawnErr> {
        let (actor, _) = Actor::spawn_linked(None, AgentActor, boot, supervisor).await?;
        Ok(actor)
    }
}

pub(crate) struct ActorState {
    agent: Arc<Agent>,
    myself: ActorRef<AgentMsg>,
    settings: Arc<AgentSettings>,
    messages: Vec<Arc<AgentMessage>>,
    steering: VecDeque<(u64, AgentMessage)>,
    follow_up: VecDeque<(u64, AgentMessage)>,
    next_queue_seq: u64,
    error: Option<String>,
    run: Option<ActiveRun>,
    runs: u64,
    idle_waiters: Vec<RpcReplyPort<()>>,
    /// Requests routed through the agent's slot and handled.
    handled: u64,
    /// Counts requests, so a hibernation timer knows whether anything happened since.
    activity: u64,
    /// A spare buffer swapped with the run's queue, so batches reuse memory.
    batch: Vec<RunItem>,
}

struct ActiveRun {
    id: u64,
    /// The run's span: its task runs in it, and its end is told in it.
    span: tracing::Span,
    events: Arc<RunEvents>,
    token: CancellationToken,
    _task: AbortOnDropHandle<()>,
    streaming: Option<PartialMessage>,
    pending_tool_calls: Vec<String>,
    /// Messages taken from a queue and not yet in the transcript, oldest first.
    in_flight: VecDeque<(QueueKind, u64, AgentMessage)>,
    finished: Option<oneshot::Sender<RunOutcome>>,
    /// Whether the run ends in a reset (the transcript, queues and error cleared).
    reset: bool,
    /// Aborts and resets asked during the run, answered once it ended.
    after_end: Vec<RpcReplyPort<Result<(), AgentError>>>,
    /// The run's `agent_end`, held until its writes are committed.
    ending: Option<AgentEvent>,
    /// Tells when the write of the run's last finished message is committed,
    /// until the run's write-ahead request takes it: one agent's writes commit in
    /// order, so everything before it is then committed too.
    last_write: Option<Committed>,
}

/// Tells when a write is committed, or why it is not.
type Committed = oneshot::Receiver<Result<(), StoreError>>;

/// What a run hands its actor, in order.
enum RunItem {
    /// An event.
    Event(AgentEvent),
    /// Write-ahead: the run wants what tells when the message it just ended is
    /// committed (see [`ActiveRun::last_write`]).
    WriteAhead(oneshot::Sender<Committed>),
}

/// What a run hands its actor, waiting for it; the actor is told when the queue
/// stops being empty.
struct RunEvents {
    queue: std::sync::Mutex<Vec<RunItem>>,
    actor: ActorRef<AgentMsg>,
}

impl RunEvents {
    fn push(&self, item: RunItem) {
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

    fn swap(&self, buffer: &mut Vec<RunItem>) {
        std::mem::swap(&mut *lock(&self.queue), buffer);
    }
}

impl Actor for AgentActor {
    type Msg = AgentMsg;
    type State = ActorState;
    type Arguments = Boot;

    async fn pre_start(
        &self,
        myself: ActorRef<AgentMsg>,
        boot: Boot,
    ) -> Result<ActorState, ActorProcessingErr> {
        let Boot {
            agent,
            settings,
            loaded,
        } = boot;
        agent
            .runtime
            .actors
            .insert(myself.get_id(), Arc::downgrade(&agent));
        let state = ActorState {
            agent,
            myself,
            settings,
            messages: loaded.messages,
            steering: loaded.steering,
            follow_up: loaded.follow_up,
            next_queue_seq: loaded.next_queue_seq,
            error: None,
            run: None,
            runs: 0,
            idle_waiters: Vec::new(),
            handled: 0,
            activity: 0,
            batch: Vec::new(),
        };
        state.sync_waiting();
        state.schedule_hibernation();
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<AgentMsg>,
        message: AgentMsg,
        state: &mut ActorState,
    ) -> Result<(), ActorProcessingErr> {
        state.handle(message);
        Ok(())
    }
}

impl ActorState {
    fn handle(&mut self, message: AgentMsg) {
        let request = match message {
            AgentMsg::Internal(Internal(signal)) => match signal {
                Signal::Routed(request) => {
                    self.handled += 1;
                    *request
                }
                Signal::Events => return self.drain_events(),
                Signal::Take { run, queue, reply } => {
                    let _ = reply.send(self.take(run, queue));
                    return;
                }
                Signal::Committed(run) => return self.finish(run),
                Signal::TakenOver(error) => return self.taken_over(error),
                Signal::Hibernate(activity) => return self.hibernate(activity),
                Signal::Halt => {
                    if let Some(run) = &self.run {
                        run.token.cancel();
                    }
                    return;
                }
            },
            request => request,
        };
        self.request(request);
        self.activity += 1;
        self.schedule_hibernation();
    }

    fn request(&mut self, request: AgentMsg) {
        match request {
            AgentMsg::Submit(submission) => self.submit(*submission),
            AgentMsg::UpdateSettings(change, reply) => {
                change(Arc::make_mut(&mut self.settings));
                self.agent.keep_settings(self.settings.clone());
                let definition = self.agent.runtime.definition_of(&self.settings);
                let write = self.agent.write(Change::SetDefinition(definition));
                self.commit(vec![write], Some(reply));
            }
            AgentMsg::State(reply) => {
                let _ = reply.send(self.snapshot());
            }
            AgentMsg::WaitForIdle(reply) => match &self.run {
                Some(_) => self.idle_waiters.push(reply),
                None => {
                    let _ = reply.send(());
                }
            },
            AgentMsg::Subscribe(buffer, reply) => {
                let _ = reply.send(self.agent.hub.subscribe(&self.agent.id, buffer));
            }
            AgentMsg::Internal(_) => {}
        }
    }

    /// Carries out an op; its reply hears once it is done (and durable).
    fn submit(&mut self, submission: Submission) {
        let Submission {
            op,
            reply,
            finished,
            overrides,
            span,
        } = submission;
        match op {
            Op::Prompt { messages } => {
                let started = self.start(Prompt::Messages(messages), finished, overrides, &span);
                answer(reply, started);
            }
            Op::Continue => {
                let started = self.start(Prompt::Continue, finished, overrides, &span);
                answer(reply, started);
            }
            Op::Reply(given) => {
                let started = self.start(Prompt::Reply(given), finished, overrides, &span);
                answer(reply, started);
            }
            Op::Steer { message } => self.enqueue(QueueKind::Steering, message, reply),
            Op::FollowUp { message } => self.enqueue(QueueKind::FollowUp, message, reply),
            Op::ClearQueues { queues } => {
                let mut writes = Vec::new();
                if queues != Queues::FollowUp {
                    self.steering.clear();
                    writes.push(self.agent.write(Change::ClearQueue(QueueKind::Steering)));
                }
                if queues != Queues::Steering {
                    self.follow_up.clear();
                    writes.push(self.agent.write(Change::ClearQueue(QueueKind::FollowUp)));
                }
                self.commit(writes, reply);
            }
            Op::Abort => match self.run.as_mut() {
                Some(run) => {
                    run.token.cancel();
                    run.after_end.extend(reply);
                }
                None => self.give_up_requests(reply),
            },
            Op::Reset => match self.run.as_mut() {
                Some(run) => {
                    run.token.cancel();
                    run.reset = true;
                    run.after_end.extend(reply);
                }
                None => {
                    let writes = self.clear();
                    self.sync_waiting();
                    self.commit(writes, reply);
                }
            },
            Op::SetMessages { messages } => {
                if self.run.is_some() {
                    return answer(reply, Err(AgentError::Busy));
                }
                let messages: Vec<Arc<AgentMessage>> = messages.into_iter().map(Arc::new).collect();
                let mut writes = vec![self.agent.write(Change::Truncate { from: 0 })];
                writes.extend(appends(&self.agent, 0, &messages));
                self.messages = messages;
                self.error = None;
                self.sync_waiting();
                self.commit(writes, reply);
            }
        }
    }

    /// Whether a request waits for the user, told to the agent's status (no run
    /// is active).
    fn sync_waiting(&self) {
        self.agent
            .mark_idle(!open_requests(&self.messages).is_empty());
    }

    /// Answers the requests waiting for the user with "cancelled" error results
    /// (an abort while parked), so that the agent takes prompts again; `reply`
    /// hears once they are stored.
    fn give_up_requests(&mut self, reply: Option<RpcReplyPort<Result<(), AgentError>>>) {
        let results = cancel_requests(&self.messages, "the user gave up on the request.");
        let from = self.messages.len();
        self.messages.extend(results.into_iter().map(Arc::new));
        let writes = appends(&self.agent, from, &self.messages[from..]);
        self.commit(writes, reply);
        self.sync_waiting();
    }

    /// Hands `writes` to the store; `reply` hears once they are committed.
    fn commit(
        &self,
        writes: Vec<SessionWrite>,
        reply: Option<RpcReplyPort<Result<(), AgentError>>>,
    ) {
        let ack = self.ack(move |result| {
            if let Some(reply) = reply {
                let _ = reply.send(result.map_err(AgentError::from));
            }
        });
        self.agent.runtime.writer.submit(writes, Some(ack));
    }

    /// The acknowledgement of the actor's writes: a write refused because the
    /// session was taken over is told to the actor first (see
    /// [`ActorState::taken_over`]), then `then` hears the result.
    fn ack(&self, then: impl FnOnce(Result<(), StoreError>) + Send + 'static) -> Ack {
        let actor = self.myself.clone();
        Box::new(move |result| {
            if let Err(error @ StoreError::TakenOver { .. }) = &result {
                let _ = actor.send_message(AgentMsg::Internal(Internal(Signal::TakenOver(
                    error.clone(),
                ))));
            }
            then(result);
        })
    }

    /// Another process took the session over: this agent may no longer act for it,
    /// and stops.
    fn taken_over(&mut self, error: StoreError) {
        let reason = error.to_string();
        tracing::warn!(agent = %self.agent.id, %reason, "agent stopped");
        if let Some(run) = &self.run {
            run.token.cancel();
        }
        self.agent.stop(reason);
    }

    /// Answers the run's write-ahead request with what tells when its last
    /// finished message is committed.
    fn write_ahead(&mut self, reply: oneshot::Sender<Committed>) {
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

    fn enqueue(
        &mut self,
        queue: QueueKind,
        message: AgentMessage,
        reply: Option<RpcReplyPort<Result<(), AgentError>>>,
    ) {
        if let Err(full) = self.room_for(queue, &message) {
            match reply {
                Some(reply) => {
                    let _ = reply.send(Err(full));
                }
                None => {
                    tracing::warn!(agent = %self.agent.id, error = %full, "a message was not queued")
                }
            }
            return;
        }
        let seq = self.next_queue_seq;
        self.next_queue_seq += 1;
        let write = self.agent.write(Change::Enqueue {
            queue,
            seq,
            message: message.clone(),
        });
        self.queue_mut(queue).push_back((seq, message));
        self.commit(vec![write], reply);
    }

    /// Whether `queue` has room for `message` under the settings' limits.
    fn room_for(&self, queue: QueueKind, message: &AgentMessage) -> Result<(), AgentError> {
        let limits = self.settings.queue_limits;
        let (held, name) = match queue {
            QueueKind::Steering => (&self.steering, "steering"),
            QueueKind::FollowUp => (&self.follow_up, "follow-up"),
        };
        let bytes = held
            .iter()
            .map(|(_, queued)| tiller_core::json_len(queued))
            .sum::<usize>()
            + tiller_core::json_len(message);
        if held.len() < limits.max_messages && bytes <= limits.max_bytes {
            return Ok(());
        }
        Err(AgentError::QueueFull {
            queue: name,
            max_messages: limits.max_messages,
            max_bytes: limits.max_bytes,
        })
    }

    fn queue_mut(&mut self, queue: QueueKind) -> &mut VecDeque<(u64, AgentMessage)> {
        match queue {
            QueueKind::Steering => &mut self.steering,
            QueueKind::FollowUp => &mut self.follow_up,
        }
    }

    /// Forgets the transcript, both queues and the error; the writes that say so.
    fn clear(&mut self) -> Vec<SessionWrite> {
        self.messages.clear();
        self.steering.clear();
        self.follow_up.clear();
        self.error = None;
        vec![
            self.agent.write(Change::Truncate { from: 0 }),
            self.agent.write(Change::ClearQueue(QueueKind::Steering)),
            self.agent.write(Change::ClearQueue(QueueKind::FollowUp)),
        ]
    }

    fn snapshot(&self) -> AgentState {
        let settings = &self.settings;
        let queued = |queue: &VecDeque<(u64, AgentMessage)>| {
            queue.iter().map(|(_, message)| message.clone()).collect()
        };
        AgentState {
            system_prompt: settings.system_prompt.clone(),
            model: settings.model.clone(),
            thinking_level: settings.run.stream.thinking,
            tools: settings.tools.clone(),
            session_id: self.agent.session.to_string(),
            context: self.agent.context_ids(),
            llm: crate::LlmConfig::of(settings),
            messages: self.messages.iter().map(|m| (**m).clone()).collect(),
            steering_queue: queued(&self.steering),
            follow_up_queue: queued(&self.follow_up),
            is_streaming: self.run.is_some(),
            streaming_message: self
                .run
                .as_ref()
                .and_then(|run| run.streaming.as_ref())
                .map(|partial| partial.message().clone()),
            pending_tool_calls: self
                .run
                .as_ref()
                .map(|run| run.pending_tool_calls.clone())
                .unwrap_or_default(),
            error: self.error.clone(),
            waiting: open_requests(&self.messages),
        }
    }

    /// Takes what one delivery of `queue` takes, under its mode, for the run `run`,
    /// which holds it in flight until it joins the transcript.
    fn take(&mut self, run: u64, queue: QueueKind) -> Vec<AgentMessage> {
        let mode = self.mode(queue);
        let Some(active) = self.run.as_mut().filter(|active| active.id == run) else {
            return Vec::new();
        };
        let source = match queue {
            QueueKind::Steering => &mut self.steering,
            QueueKind::FollowUp => &mut self.follow_up,
        };
        deliver_from(source, queue, mode, &mut active.in_flight)
    }

    /// How many messages one delivery of `queue` takes.
    fn mode(&self, queue: QueueKind) -> QueueMode {
        match queue {
            QueueKind::Steering => self.settings.steering_mode,
            QueueKind::FollowUp => self.settings.follow_up_mode,
        }
    }

    fn start(
        &mut self,
        prompt: Prompt,
        finished: Option<oneshot::Sender<RunOutcome>>,
        overrides: Option<Box<RunOverrides>>,
        caller: &tracing::Span,
    ) -> Result<(), AgentError> {
        if self.run.is_some() {
            return Err(AgentError::Busy);
        }
        let settings = match overrides {
            Some(overrides) => Arc::new(
                overrides
                    .applied_to(&self.settings)
                    .map_err(|error| AgentError::InvalidOverrides(error.to_string()))?,
            ),
            None => self.settings.clone(),
        };
        let model = settings.model.clone().ok_or(AgentError::NoModel)?;
        let run_id = self.runs + 1;
        let mut in_flight = VecDeque::new();
        let replying = matches!(prompt, Prompt::Reply(_));
        let (start, from_steering) = match check_start(prompt, &self.messages) {
            Ok(start) => (start, false),
            // The model answered last: the oldest queued message starts the run.
            Err(ContinueError::EndsWithAssistant) => {
                let queue = if !self.steering.is_empty() {
                    QueueKind::Steering
                } else if !self.follow_up.is_empty() {
                    QueueKind::FollowUp
                } else {
                    return Err(ContinueError::EndsWithAssistant.into());
                };
                let mode = self.mode(queue);
                let taken = deliver_from(self.queue_mut(queue), queue, mode, &mut in_flight);
                (Start::Messages(taken), queue == QueueKind::Steering)
            }
            Err(error) => return Err(error.into()),
        };
        // The run's first read of the steering queue, done here: nothing when the
        // run starts from steering (the next message gets its own response); left
        // to the run after a reply, whose call runs first.
        let first_steering = match (from_steering, replying) {
            (true, _) => Some(Vec::new()),
            (false, true) => None,
            (false, false) => {
                let mode = self.mode(QueueKind::Steering);
                Some(deliver_from(
                    &mut self.steering,
                    QueueKind::Steering,
                    mode,
                    &mut in_flight,
                ))
            }
        };
        // A transcript restored from elsewhere may hold calls without results: they
        // are answered before anything else.
        let answered = answer_open(
            &self.agent,
            &mut self.messages,
            "no result was recorded before the next run started.",
        );
        if !answered.is_empty() {
            self.commit(answered, None);
        }
        let agent_context = self.agent.run_context();
        let context = LoopContext {
            system_prompt: match &settings.system_prompt_fn {
                Some(write) => Some(write(&agent_context)),
                None => settings.system_prompt.clone(),
            },
            messages: self.messages.iter().map(|m| (**m).clone()).collect(),
            tools: settings.tools.clone(),
        };
        self.error = None;
        self.runs = run_id;

        let token = self.agent.runtime.root.child_token();
        let events = Arc::new(RunEvents {
            queue: std::sync::Mutex::new(Vec::new()),
            actor: self.myself.clone(),
        });
        let config = loop_config(
            &self.myself,
            &events,
            run_id,
            &settings,
            model,
            agent_context,
            first_steering,
        );
        let sink = {
            let events = events.clone();
            Arc::new(move |event| events.push(RunItem::Event(event)))
        };
        let run_token = token.clone();
        let span = tracing::info_span!(
            parent: caller,
            "run",
            agent = %self.agent.id,
            session = %self.agent.session,
            run = run_id
        );
        let task = tokio::spawn(
            async move {
                run_from(start, context, config, run_token, sink).await;
            }
            .instrument(span.clone()),
        );
        self.run = Some(ActiveRun {
            id: run_id,
            span,
            events,
            token,
            _task: AbortOnDropHandle::new(task),
            streaming: None,
            pending_tool_calls: Vec::new(),
            in_flight,
            finished,
            reset: false,
            after_end: Vec::new(),
            ending: None,
            last_write: None,
        });
        self.agent.mark_running();
        Ok(())
    }

    fn drain_events(&mut self) {
        let Some(run) = &self.run else {
            return;
        };
        let mut batch = std::mem::take(&mut self.batch);
        run.events.swap(&mut batch);
        for item in batch.drain(..) {
            match item {
                RunItem::Event(event) => self.apply(event),
                RunItem::WriteAhead(reply) => self.write_ahead(reply),
            }
        }
        self.batch = batch;
    }

    /// Applies one event to the state and publishes it; `agent_end` waits for the
    /// run's writes to be committed.
    fn apply(&mut self, event: AgentEvent) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        match &event {
            AgentEvent::MessageStart { message } => {
                if let Some(assistant) = message.as_assistant() {
                    run.streaming = Some(PartialMessage::new(assistant.clone()));
                }
            }
            AgentEvent::MessageUpdate {
                assistant_message_event,
            } => {
                if let Some(partial) = run.streaming.as_mut() {
                    partial.apply(assistant_message_event);
                }
            }
            AgentEvent::MessageEnd { message } => {
                run.streaming = None;
                let dequeued = match run.in_flight.front() {
                    Some((_, seq, taken)) if taken == &**message => {
                        let seq = *seq;
                        run.in_flight.pop_front();
                        Some(seq)
                    }
                    _ => None,
                };
                let seq = self.messages.len() as u64;
                let shared = Arc::new((**message).clone());
                self.messages.push(shared.clone());
                let write = self.agent.write(Change::Append {
                    seq,
                    message: shared,
                    dequeued,
                });
                // The run's write-ahead may wait on this one.
                let (done, committed) = oneshot::channel();
                run.last_write = Some(committed);
                let ack = self.ack(move |result| {
                    let _ = done.send(result);
                });
                self.agent.runtime.writer.submit(vec![write], Some(ack));
                if let Some(hook) = &self.settings.on_message {
                    hook(&self.agent.id, message);
                }
            }
            AgentEvent::ToolExecutionStart { tool_call_id, .. } => {
                run.pending_tool_calls.push(tool_call_id.clone())
            }
            AgentEvent::ToolExecutionEnd { tool_call_id, .. } => {
                run.pending_tool_calls.retain(|id| id != tool_call_id)
            }
            AgentEvent::TurnEnd { message, .. } => {
                if let Some(error) = &message.error_message {
                    self.error = Some(error.clone());
                }
            }
            AgentEvent::AgentEnd { .. } => {
                // Taken and never delivered (an abort): back to the front of its queue,
                // where the store still has it.
                while let Some((queue, seq, message)) = run.in_flight.pop_back() {
                    match queue {
                        QueueKind::Steering => self.steering.push_front((seq, message)),
                        QueueKind::FollowUp => self.follow_up.push_front((seq, message)),
                    }
                }
                let reset = run.reset;
                let run_id = run.id;
                run.ending = Some(event);
                let writes = if reset { self.clear() } else { Vec::new() };
                let actor = self.myself.clone();
                let ack = self.ack(move |_| {
                    let _ =
                        actor.send_message(AgentMsg::Internal(Internal(Signal::Committed(run_id))));
                });
                self.agent.runtime.writer.submit(writes, Some(ack));
                return;
            }
            AgentEvent::AgentStart
            | AgentEvent::TurnStart
            | AgentEvent::ToolExecutionUpdate { .. }
            | AgentEvent::Action { .. }
            | AgentEvent::InputRequested { .. }
            | AgentEvent::ApprovalRequested { .. }
            | AgentEvent::ChildEvent { .. } => {}
        }
        self.agent
            .hub
            .publish(&self.agent.id, Delivered::Event(event));
    }

    /// The run `run` ended and its writes are committed: the state says so, then
    /// subscribers and waiters hear of it.
    fn finish(&mut self, run: u64) {
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
                },
            )),
            _ => None,
        };
        let agent = &self.agent;
        let waiting = !open_requests(&self.messages).is_empty();
        agent
            .hub
            .publish_with(&agent.id, Delivered::Event(event), || {
                agent.mark_idle(waiting)
            });
        for waiter in self.idle_waiters.drain(..) {
            let _ = waiter.send(());
        }
        for ended in run.after_end {
            let _ = ended.send(Ok(()));
        }
        if let Some((finished, outcome)) = outcome {
            let _ = finished.send(outcome);
        }
        self.activity += 1;
        self.schedule_hibernation();
    }

    /// Asks to be told, once `hibernate_after` has passed, whether to hibernate.
    fn schedule_hibernation(&self) {
        let Some(after) = self.agent.runtime.config.hibernate_after else {
            return;
        };
        if self.run.is_some() {
            return;
        }
        let activity = self.activity;
        self.myself.send_after(after, move || {
            AgentMsg::Internal(Internal(Signal::Hibernate(activity)))
        });
    }

    fn hibernate(&mut self, activity: u64) {
        if activity != self.activity || self.run.is_some() {
            return;
        }
        if self
            .agent
            .hibernate_if_quiet(self.myself.get_id(), self.handled)
        {
            self.myself.stop(None);
        } else {
            // Not yet live, or requests on their way: they will count as activity;
            // if none does (the actor was just being started), ask again later.
            self.schedule_hibernation();
        }
    }
}

/// The loop's configuration for one run of this agent: the agent's run options
/// whole, its queues (with the first steering read already done, when it was),
/// and write-ahead through the run's `events`.
fn loop_config(
    actor: &ActorRef<AgentMsg>,
    events: &Arc<RunEvents>,
    run: u64,
    settings: &AgentSettings,
    model: tiller_ai::Model,
    context: AgentContext,
    first_steering: Option<Vec<AgentMessage>>,
) -> LoopConfig {
    LoopConfig {
        model,
        run: settings.run.clone(),
        steering: Some(queue_source(actor, run, QueueKind::Steering)),
        first_steering,
        follow_up: Some(queue_source(actor, run, QueueKind::FollowUp)),
        write_ahead: Some(write_ahead(events)),
        context,
    }
}

/// Write-ahead for the loop: a request behind the response in the run's queue,
/// answered by the actor with what tells when its write of the response is
/// committed.
fn write_ahead(events: &Arc<RunEvents>) -> WriteAhead {
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
fn queue_source(actor: &ActorRef<AgentMsg>, run: u64, queue: QueueKind) -> MessageSource {
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
