//! The agent's actor: it starts runs and follows them.
//!
//! A run is a separate task (the actor's mailbox never waits behind a turn). The
//! run's events reach the actor in batches through a queue; the actor applies each
//! to the agent's state — the streaming message, pending tool calls, the transcript
//! (one message per `message_end`), the error — *then* publishes it, so a subscriber
//! never sees an event the state does not reflect. Once idle with every command
//! handled, the actor parks.

use std::future::ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef};
use tiller_ai::{PartialMessage, StreamOptions};
use tiller_core::{
    AgentContext, AgentEvent, LoopConfig, MessageSource, answer_open_calls, run_loop,
    run_loop_continue,
};
use tokio::sync::oneshot;
use tokio_util::task::AbortOnDropHandle;

use crate::AgentMessage;
use crate::cell::{AgentCell, Command, Queue, Start, lock, take};
use crate::error::AgentError;
use crate::settings::AgentSettings;
use crate::state::{AgentState, RunOutcome};
use crate::subscription::Delivered;

pub(crate) enum AgentMsg {
    /// A command routed through the cell (counted).
    Command(Command),
    /// The run has queued events.
    Events,
}

pub(crate) struct AgentActor;

pub(crate) struct ActorState {
    cell: Arc<AgentCell>,
    /// This actor's id, which tags its run's token and the messages it takes.
    me: ActorId,
    handled: u64,
    run: Option<ActiveRun>,
    /// A spare buffer swapped with the run's queue, so batches reuse memory.
    batch: Vec<AgentEvent>,
}

struct ActiveRun {
    events: Arc<RunEvents>,
    _task: AbortOnDropHandle<()>,
    streaming: Option<PartialMessage>,
    pending_tool_calls: Vec<String>,
    finished: Option<oneshot::Sender<RunOutcome>>,
    resets: Vec<oneshot::Sender<()>>,
}

/// Events of a run waiting for the actor; the actor is told when the queue stops
/// being empty.
struct RunEvents {
    queue: std::sync::Mutex<Vec<AgentEvent>>,
    actor: ActorRef<AgentMsg>,
}

impl RunEvents {
    fn push(&self, event: AgentEvent) {
        let was_empty = {
            let mut queue = lock(&self.queue);
            queue.push(event);
            queue.len() == 1
        };
        if was_empty {
            let _ = self.actor.send_message(AgentMsg::Events);
        }
    }

    fn swap(&self, buffer: &mut Vec<AgentEvent>) {
        std::mem::swap(&mut *lock(&self.queue), buffer);
    }
}

impl Actor for AgentActor {
    type Msg = AgentMsg;
    type State = ActorState;
    type Arguments = Arc<AgentCell>;

    async fn pre_start(
        &self,
        myself: ActorRef<AgentMsg>,
        cell: Arc<AgentCell>,
    ) -> Result<ActorState, ActorProcessingErr> {
        Ok(ActorState {
            cell,
            me: myself.get_id(),
            handled: 0,
            run: None,
            batch: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<AgentMsg>,
        message: AgentMsg,
        state: &mut ActorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            AgentMsg::Command(command) => {
                state.handled += 1;
                state.command(&myself, command);
            }
            AgentMsg::Events => state.drain_events(),
        }
        if state.run.is_none() && state.cell.park_if_quiet(&myself, state.handled) {
            myself.stop(None);
        }
        Ok(())
    }
}

impl ActorState {
    fn command(&mut self, myself: &ActorRef<AgentMsg>, command: Command) {
        match command {
            Command::Start {
                start,
                accepted,
                finished,
            } => {
                let result = self.start(myself, start, finished);
                let _ = accepted.send(result);
            }
            Command::Reset { done } => match self.run.as_mut() {
                Some(run) => {
                    if let Some((_, token)) = lock(&self.cell.run_cancel).as_ref() {
                        token.cancel();
                    }
                    run.resets.push(done);
                }
                None => {
                    lock(&self.cell.durable).clear();
                    let _ = done.send(());
                }
            },
            Command::State { reply } => {
                let mut snapshot = lock(&self.cell.durable).snapshot();
                if let Some(run) = &self.run {
                    snapshot.is_streaming = true;
                    snapshot.streaming_message =
                        run.streaming.as_ref().map(|p| p.message().clone());
                    snapshot.pending_tool_calls = run.pending_tool_calls.clone();
                }
                let _ = reply.send(snapshot);
            }
        }
    }

    fn start(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        start: Start,
        finished: Option<oneshot::Sender<RunOutcome>>,
    ) -> Result<(), AgentError> {
        if self.run.is_some() {
            return Err(AgentError::Busy);
        }
        let cell = &self.cell;
        let me = myself.get_id();
        let mut durable = lock(&cell.durable);
        let settings = durable.settings.clone();
        let model = settings.model.clone().ok_or(AgentError::NoModel)?;
        // A transcript restored from elsewhere, or left by a run lost mid-turn, may
        // hold calls without results: they are answered before anything else.
        answer_open_calls(
            &mut durable.messages,
            "no result was recorded before the next run started.",
        );
        let (prompts, skip_first_steering) = match start {
            Start::Prompt(messages) => (Some(messages), false),
            Start::Continue => match durable.messages.last() {
                None => return Err(AgentError::NothingToContinue),
                Some(last) if last.as_assistant().is_some() => {
                    let steering = take(&mut durable, Queue::Steering, me);
                    if !steering.is_empty() {
                        (Some(steering), true)
                    } else {
                        let follow_up = take(&mut durable, Queue::FollowUp, me);
                        if follow_up.is_empty() {
                            return Err(AgentError::CannotContinueFromAssistant);
                        }
                        (Some(follow_up), false)
                    }
                }
                Some(_) => (None, false),
            },
        };
        let context = AgentContext {
            system_prompt: settings.system_prompt.clone(),
            messages: durable.messages.clone(),
            tools: settings.tools.clone(),
        };
        durable.error = None;
        drop(durable);

        let token = cell.runtime.root.child_token();
        *lock(&cell.run_cancel) = Some((me, token.clone()));
        let config = loop_config(cell, me, &settings, model, skip_first_steering);
        let events = Arc::new(RunEvents {
            queue: std::sync::Mutex::new(Vec::new()),
            actor: myself.clone(),
        });
        let sink = {
            let events = events.clone();
            Arc::new(move |event| events.push(event))
        };
        let task = tokio::spawn(async move {
            match prompts {
                Some(prompts) => {
                    run_loop(prompts, context, config, token, sink).await;
                }
                None => {
                    let _ = run_loop_continue(context, config, token, sink).await;
                }
            }
        });
        self.run = Some(ActiveRun {
            events,
            _task: AbortOnDropHandle::new(task),
            streaming: None,
            pending_tool_calls: Vec::new(),
            finished,
            resets: Vec::new(),
        });
        cell.set_running();
        Ok(())
    }

    fn drain_events(&mut self) {
        let Some(run) = &self.run else {
            return;
        };
        let mut batch = std::mem::take(&mut self.batch);
        run.events.swap(&mut batch);
        for event in batch.drain(..) {
            self.apply(event);
        }
        self.batch = batch;
    }

    /// Applies one event to the state, publishes it, and ends the run on `agent_end`.
    fn apply(&mut self, event: AgentEvent) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let cell = &self.cell;
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
                let hook = {
                    let mut durable = lock(&cell.durable);
                    durable.append((**message).clone());
                    durable.settings.hooks.on_message.clone()
                };
                if let Some(hook) = hook {
                    hook(&cell.id, message);
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
                    lock(&cell.durable).error = Some(error.clone());
                }
            }
            AgentEvent::AgentStart
            | AgentEvent::TurnStart
            | AgentEvent::ToolExecutionUpdate { .. }
            | AgentEvent::AgentEnd { .. } => {}
        }
        let AgentEvent::AgentEnd { messages, reason } = &event else {
            cell.hub.publish(&cell.id, Delivered::Event(event));
            return;
        };
        // The run is over: the state says so before anyone hears of it.
        let Some(run) = self.run.take() else {
            return;
        };
        let outcome = run.finished.map(|finished| {
            let outcome = RunOutcome {
                messages: messages.clone(),
                end: *reason,
            };
            (finished, outcome)
        });
        *lock(&cell.run_cancel) = None;
        {
            let mut durable = lock(&cell.durable);
            // A run delivers all it takes; this is a safety net.
            let requeued = durable.requeue_in_flight(self.me);
            if requeued > 0 {
                tracing::warn!(
                    requeued,
                    "queued messages a run took were not delivered; queued again"
                );
            }
            if !run.resets.is_empty() {
                durable.clear();
            }
        }
        cell.hub
            .publish_with(&cell.id, Delivered::Event(event), || cell.mark_idle());
        cell.notify_idle();
        for done in run.resets {
            let _ = done.send(());
        }
        if let Some((finished, outcome)) = outcome {
            let _ = finished.send(outcome);
        }
    }
}

/// The loop's configuration for one run of this agent.
fn loop_config(
    cell: &Arc<AgentCell>,
    actor: ActorId,
    settings: &AgentSettings,
    model: tiller_ai::Model,
    skip_first_steering: bool,
) -> LoopConfig {
    let hooks = &settings.hooks;
    let mut config = LoopConfig::new(model);
    config.options = StreamOptions {
        thinking: settings.thinking_level,
        session_id: settings.session_id.clone(),
        ..settings.stream.clone()
    };
    config.tool_choice_after_tools = settings.tool_choice_after_tools.clone();
    config.convert_to_llm = hooks.convert_to_llm.clone();
    config.transform_context = hooks.transform_context.clone();
    config.api_key_resolver = hooks.api_key_resolver.clone();
    config.before_tool_call = hooks.before_tool_call.clone();
    config.after_tool_call = hooks.after_tool_call.clone();
    config.stop_when = hooks.stop_when.clone();
    config.steering_delivery = settings.steering_delivery;
    config.tool_execution = settings.tool_execution;
    config.max_turns = settings.max_turns;
    config.steering = Some(queue_source(
        cell,
        actor,
        Queue::Steering,
        skip_first_steering,
    ));
    config.follow_up = Some(queue_source(cell, actor, Queue::FollowUp, false));
    config
}

/// Reads one of the agent's queues for the loop; `skip_first` answers the first
/// read with nothing (when the run's prompt was just taken from that queue, so the
/// next queued message gets its own response).
fn queue_source(
    cell: &Arc<AgentCell>,
    actor: ActorId,
    queue: Queue,
    skip_first: bool,
) -> MessageSource {
    let cell = cell.clone();
    let skip = AtomicBool::new(skip_first);
    Arc::new(move || {
        let taken: Vec<AgentMessage> = if skip.swap(false, Ordering::AcqRel) {
            Vec::new()
        } else {
            cell.take_queued(queue, actor)
        };
        Box::pin(ready(taken))
    })
}

/// A snapshot from the actor, for an agent that is up.
pub(crate) fn snapshot_request() -> (Command, oneshot::Receiver<AgentState>) {
    let (reply, receiver) = oneshot::channel();
    (Command::State { reply }, receiver)
}
