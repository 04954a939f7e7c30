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
//!
//! This file holds the actor and what it does with each message; `run.rs` the
//! runs, `queues.rs` the steering and follow-up queues, `session.rs` the store.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tiller_core::{ContextTokens, Prompt, open_requests, panic_text};
use tiller_store::{Change, QueueKind, SessionWrite};

use crate::AgentMessage;
use crate::agent::Agent;
use crate::error::AgentError;
use crate::message::{AgentMsg, Internal, Signal, Submission};
use crate::op::{Op, Queues};
use crate::settings::AgentSettings;
use crate::state::{AgentState, AgentStatus, Workload};

mod dormant;
mod keys;
mod queues;
mod run;
mod session;
mod start;

pub(crate) use dormant::{Dormant, PutAway};
pub(crate) use run::stored_context;
use run::{ActiveRun, RunItem, RunRequest};
use session::from_last_summary;
pub(crate) use session::{Loaded, appends};

/// Why an agent's actor failed: the error its handler returns, which reaches the
/// supervisor with the agent and the settings to restart it with.
pub(crate) struct Failure {
    pub(crate) agent: Arc<Agent>,
    pub(crate) settings: Arc<AgentSettings>,
    pub(crate) reason: String,
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failure")
            .field("agent", &self.agent.id)
            .field("reason", &self.reason)
            .finish()
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Failure {}

/// Sends `result` to `reply`, if anyone waits for it.
fn answer(reply: Option<RpcReplyPort<Result<(), AgentError>>>, result: Result<(), AgentError>) {
    if let Some(reply) = reply {
        let _ = reply.send(result);
    }
}

/// What an actor is started with: its agent, and the agent's state.
pub(crate) struct Boot {
    pub(crate) agent: Arc<Agent>,
    pub(crate) state: Box<Dormant>,
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
    /// Who the agent works for and the state its tools keep: what it was spawned
    /// with, over what its session stored; stored again when a tool changes it.
    context: tiller_core::AgentContext,
    /// The transcript the model sees: the stored transcript from `base` on (from
    /// the last compaction's summary, when there was one).
    messages: Vec<Arc<AgentMessage>>,
    /// The place of `messages`' first message in the stored transcript.
    base: u64,
    /// The transcript's token count, kept up to date message by message.
    tokens: ContextTokens,
    steering: VecDeque<(u64, AgentMessage)>,
    follow_up: VecDeque<(u64, AgentMessage)>,
    next_queue_seq: u64,
    error: Option<String>,
    run: Option<ActiveRun>,
    runs: u64,
    idle_waiters: Vec<RpcReplyPort<()>>,
    /// Requests routed through the agent's slot and handled.
    handled: u64,
    /// Counts requests, so a timer putting the agent away knows whether anything
    /// happened since.
    activity: u64,
    /// A spare buffer swapped with the run's queue, so batches reuse memory.
    batch: Vec<RunItem>,
    /// The idempotency keys of the ops applied last.
    keys: keys::OpKeys,
    /// What the agent's session spent over all its runs (counted from the store
    /// when the agent has a budget of its own).
    spent: tiller_core::Spent,
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
        let Boot { agent, state } = boot;
        let Dormant {
            settings,
            context,
            messages,
            base,
            tokens,
            held,
            spent,
            hibernating: _,
        } = *state;
        let dormant::Held {
            steering,
            follow_up,
            next_queue_seq,
            error,
            keys,
        } = held.map(|held| *held).unwrap_or_default();
        let spent = spent.map(|spent| *spent).unwrap_or_default();
        let state = ActorState {
            agent,
            myself,
            settings,
            context,
            messages,
            base,
            tokens,
            steering,
            follow_up,
            next_queue_seq,
            error,
            run: None,
            runs: 0,
            idle_waiters: Vec::new(),
            handled: 0,
            activity: 0,
            batch: Vec::new(),
            keys,
            spent,
        };
        state.sync_waiting();
        state.schedule_put_away();
        Ok(state)
    }

    /// Handles one message. A panic (in an `on_message` hook, say) fails the
    /// actor: the route holds requests from then on, and the supervisor hears
    /// of it with what to restart the agent with.
    async fn handle(
        &self,
        _myself: ActorRef<AgentMsg>,
        message: AgentMsg,
        state: &mut ActorState,
    ) -> Result<(), ActorProcessingErr> {
        std::panic::catch_unwind(AssertUnwindSafe(|| state.handle(message))).map_err(|panic| {
            let reason = panic_text(panic);
            state.agent.route.failing(state.myself.get_id(), &reason);
            Box::new(Failure {
                agent: state.agent.clone(),
                settings: state.settings.clone(),
                reason,
            }) as ActorProcessingErr
        })
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
                Signal::Applied(key) => return self.keys.remember(key),
                Signal::TakenOver(error) => return self.taken_over(error),
                Signal::PutAway(activity) => return self.put_away(activity),
                Signal::Halt => {
                    if let Some(run) = &self.run {
                        run.token.cancel();
                    }
                    return;
                }
                Signal::Pause => {
                    if let Some(run) = &self.run {
                        run.pause.cancel();
                    }
                    return;
                }
                Signal::Evict => {
                    // No tool starts after this; what the run sends back is
                    // never applied, so nothing more is written.
                    if let Some(run) = self.run.take() {
                        run.token.cancel();
                    }
                    self.myself.stop(None);
                    return;
                }
            },
            request => request,
        };
        match request {
            AgentMsg::Submit(submission) => self.submit(*submission),
            AgentMsg::UpdateSettings(change, reply) => {
                // Changed on a copy: a change that panics leaves the settings whole.
                let mut changed = (*self.settings).clone();
                change(&mut changed);
                self.settings = Arc::new(changed);
                self.store_definition(Some(reply), None);
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
            AgentMsg::Workload(reply) => {
                let _ = reply.send(Workload {
                    running: self.run.is_some(),
                    waiting: self.run.is_none() && !open_requests(&self.messages).is_empty(),
                    queued: self.steering.len() + self.follow_up.len(),
                });
            }
            // A routed request is never one of the runtime's own signals.
            AgentMsg::Internal(_) => {}
        }
        self.activity += 1;
        self.schedule_put_away();
    }

    /// Carries out an op; its reply hears once it is done (and durable). An op
    /// whose idempotency key was applied already is acknowledged once everything
    /// before it is committed, and not applied again.
    fn submit(&mut self, submission: Submission) {
        let Submission {
            op,
            reply,
            finished,
            patch,
            hooks,
            span,
            key,
        } = submission;
        if let Some(key) = key.as_ref().filter(|key| self.keys.seen(key)) {
            if finished.is_some() {
                // Its run's outcome went to whoever sent it first.
                return answer(
                    reply,
                    Err(AgentError::Duplicate {
                        key: key.to_string(),
                    }),
                );
            }
            return self.commit(Vec::new(), reply);
        }
        let run = RunRequest {
            finished,
            patch,
            hooks,
            caller: span,
            reply,
            key,
        };
        match op {
            Op::Prompt { messages } => self.start(Prompt::Messages(messages), run),
            Op::Continue => self.start(Prompt::Continue, run),
            Op::Reply(given) => self.start(Prompt::Reply(given), run),
            Op::Compact { instructions } => self.start(Prompt::Compact { instructions }, run),
            op => self.apply_op(op, run.reply, run.key),
        }
    }

    /// Carries out an op that starts no run; `key`, its idempotency key, is
    /// written with its change.
    fn apply_op(
        &mut self,
        op: Op,
        reply: Option<RpcReplyPort<Result<(), AgentError>>>,
        key: Option<Arc<str>>,
    ) {
        match op {
            Op::Prompt { .. } | Op::Continue | Op::Reply(_) | Op::Compact { .. } => {}
            Op::Steer { message } => self.enqueue(QueueKind::Steering, message, reply, key),
            Op::FollowUp { message } => self.enqueue(QueueKind::FollowUp, message, reply, key),
            Op::Fork { at, session } => self.fork(at, session, reply, key),
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
                let writes = self.keyed(writes, key);
                self.commit(writes, reply);
            }
            Op::Abort => {
                // Written at once: a retry must not abort a run started since.
                let writes = self.keyed(Vec::new(), key);
                match self.run.as_mut() {
                    Some(run) => {
                        run.token.cancel();
                        run.after_end.extend(reply);
                        if !writes.is_empty() {
                            self.commit(writes, None);
                        }
                    }
                    None => self.give_up_requests(writes, reply),
                }
            }
            Op::Reset => match self.run.as_mut() {
                Some(run) => {
                    run.token.cancel();
                    run.reset = true;
                    run.after_end.extend(reply);
                    if let Some(key) = key {
                        // Written with the clearing, once the run has ended.
                        run.reset_keys.push(key.clone());
                        self.keys.remember(key);
                    }
                }
                None => {
                    let writes = self.clear();
                    let writes = self.keyed(writes, key);
                    self.sync_waiting();
                    self.commit(writes, reply);
                }
            },
            Op::UpdateSettings { patch } => {
                let mut definition = self.settings.definition.clone();
                if let Err(error) = patch.apply(&mut definition) {
                    return answer(reply, Err(error.into()));
                }
                Arc::make_mut(&mut self.settings).definition = definition;
                self.store_definition(reply, key);
            }
            Op::SetMessages { messages } => {
                if self.run.is_some() {
                    return answer(reply, Err(AgentError::Busy));
                }
                let mut messages: Vec<Arc<AgentMessage>> =
                    messages.into_iter().map(Arc::new).collect();
                let mut writes = vec![self.agent.write(Change::Truncate { from: 0 })];
                writes.extend(appends(&self.agent, 0, &messages));
                let writes = self.keyed(writes, key);
                // A transcript with a summary in it is seen from there, as on a load.
                self.base = from_last_summary(&mut messages);
                self.tokens = ContextTokens::of(&messages);
                self.messages = messages;
                self.error = None;
                self.sync_waiting();
                self.commit(writes, reply);
            }
        }
    }

    /// `writes` with the write that records `key`, the idempotency key of the op
    /// they carry out (remembered from now on), when there is one.
    fn keyed(&mut self, mut writes: Vec<SessionWrite>, key: Option<Arc<str>>) -> Vec<SessionWrite> {
        if let Some(key) = key {
            writes.push(self.agent.write(Change::OpKey(key.clone())));
            self.keys.remember(key);
        }
        writes
    }

    /// Stores the definition as it now stands (with the idempotency key of the
    /// op that changed it); `reply` hears once it is committed.
    fn store_definition(
        &mut self,
        reply: Option<RpcReplyPort<Result<(), AgentError>>>,
        key: Option<Arc<str>>,
    ) {
        let definition = self.agent.runtime.definition_of(&self.settings);
        let writes = vec![self.agent.write(Change::SetDefinition(definition))];
        let writes = self.keyed(writes, key);
        self.commit(writes, reply);
    }

    /// Whether a request waits for the user, told to the agent's status (no run
    /// is active).
    fn sync_waiting(&self) {
        self.agent
            .route
            .mark_idle(!open_requests(&self.messages).is_empty());
    }

    fn snapshot(&self) -> AgentState {
        let queued = |queue: &VecDeque<(u64, AgentMessage)>| {
            queue.iter().map(|(_, message)| message.clone()).collect()
        };
        let waiting = open_requests(&self.messages);
        let agent = &self.agent;
        AgentState {
            id: agent.id.clone(),
            name: agent.name.as_deref().map(str::to_owned),
            status: if self.run.is_some() {
                AgentStatus::Running
            } else if !waiting.is_empty() {
                AgentStatus::WaitingForInput
            } else {
                AgentStatus::Idle
            },
            session_id: agent.session.to_string(),
            context: agent.context_ids(&self.context),
            definition: self.settings.definition.clone(),
            messages: self.messages.iter().map(|m| (**m).clone()).collect(),
            messages_from: self.base,
            steering_queue: queued(&self.steering),
            follow_up_queue: queued(&self.follow_up),
            is_streaming: self.run.is_some(),
            streaming_message: self
                .run
                .as_ref()
                .and_then(|run| run.streaming.as_ref())
                .map(tiller_ai::StreamedMessage::get),
            pending_tool_calls: self
                .run
                .as_ref()
                .map(|run| run.pending_tool_calls.clone())
                .unwrap_or_default(),
            error: self.error.clone(),
            waiting,
            next_seq: agent.hub.next_seq(),
        }
    }
}
