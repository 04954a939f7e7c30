//! An agent's cell: what outlives any one actor process of the agent.
//!
//! The cell holds the agent's durable state (settings, transcript, queues, last
//! error), its publisher and its status, and routes commands to its actor. The
//! actor exists while the agent has work: the first command that needs it starts it
//! (linked to the supervisor), and it parks again once idle with nothing in its
//! mailbox. Parking is exact: every command is counted under the route lock, and the
//! actor parks only when it has handled as many as were sent, so no command is ever
//! left behind in a stopping mailbox. When the actor fails, the supervisor parks the
//! cell again; the durable state is as of the last finished message, and handles and
//! subscriptions, which point at the cell, keep working.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use ractor::{ActorId, ActorRef, MessagingErr};
use tiller_core::answer_open_calls;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::AgentMessage;
use crate::actor::{AgentActor, AgentMsg};
use crate::error::AgentError;
use crate::runtime::Runtime;
use crate::settings::{AgentSettings, QueueMode};
use crate::state::{AgentState, AgentStatus, RunOutcome};
use crate::subscription::{AgentId, Delivered, Hub, Notice};

/// A request that needs the agent's actor.
pub(crate) enum Command {
    /// Start a run.
    Start {
        start: Start,
        accepted: oneshot::Sender<Result<(), AgentError>>,
        finished: Option<oneshot::Sender<RunOutcome>>,
    },
    /// Abort any run, then clear the transcript, queues and error.
    Reset { done: oneshot::Sender<()> },
    /// A snapshot of the state.
    State { reply: oneshot::Sender<AgentState> },
}

/// How a run starts.
pub(crate) enum Start {
    /// With new messages.
    Prompt(Vec<AgentMessage>),
    /// From the transcript as it stands.
    Continue,
}

/// How to reach the agent's actor.
enum Route {
    /// No actor; the next command starts one.
    Parked,
    /// An actor is starting; commands wait here, in order.
    Starting(Vec<Command>),
    /// An actor runs; `sent` counts the commands given to it.
    Live {
        actor: ActorRef<AgentMsg>,
        sent: u64,
    },
    /// Stopped for good.
    Stopped(String),
}

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const STOPPED: u8 = 2;

/// What survives the agent's actor.
pub(crate) struct Durable {
    pub(crate) settings: Arc<AgentSettings>,
    pub(crate) messages: Vec<AgentMessage>,
    pub(crate) steering: VecDeque<AgentMessage>,
    pub(crate) follow_up: VecDeque<AgentMessage>,
    /// Messages taken from a queue by a run and not yet in the transcript, oldest
    /// first, with the actor whose run took them: if that actor fails, they go back
    /// to the front of their queues.
    pub(crate) in_flight: VecDeque<(ActorId, Queue, AgentMessage)>,
    pub(crate) error: Option<String>,
}

/// One of the two queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queue {
    Steering,
    FollowUp,
}

pub(crate) struct AgentCell {
    pub(crate) id: AgentId,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) durable: Mutex<Durable>,
    route: Mutex<Route>,
    status: AtomicU8,
    idle: Notify,
    pub(crate) hub: Hub,
    /// The active run's token, with the actor whose run it is; cancelling it
    /// aborts the run.
    pub(crate) run_cancel: Mutex<Option<(ActorId, CancellationToken)>>,
    pub(crate) runtime: Arc<Runtime>,
    /// When the actor failed lately, and why it failed last.
    failures: Mutex<(Vec<Instant>, Option<String>)>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AgentCell {
    pub(crate) fn new(
        id: AgentId,
        name: Option<Arc<str>>,
        settings: Arc<AgentSettings>,
        messages: Vec<AgentMessage>,
        runtime: Arc<Runtime>,
    ) -> Self {
        AgentCell {
            id,
            name,
            durable: Mutex::new(Durable {
                settings,
                messages,
                steering: VecDeque::new(),
                follow_up: VecDeque::new(),
                in_flight: VecDeque::new(),
                error: None,
            }),
            route: Mutex::new(Route::Parked),
            status: AtomicU8::new(IDLE),
            idle: Notify::new(),
            hub: Hub::new(),
            run_cancel: Mutex::new(None),
            runtime,
            failures: Mutex::new((Vec::new(), None)),
        }
    }

    /// Gives `command` to the agent's actor, starting one if none runs.
    pub(crate) async fn command(self: &Arc<Self>, command: Command) -> Result<(), AgentError> {
        let start = {
            let mut route = lock(&self.route);
            match &mut *route {
                Route::Live { actor, sent } => match actor.send_message(AgentMsg::Command(command))
                {
                    Ok(()) => {
                        *sent += 1;
                        return Ok(());
                    }
                    // The actor died before the supervisor noticed: start a new one.
                    Err(MessagingErr::SendErr(AgentMsg::Command(command))) => {
                        *route = Route::Starting(vec![command]);
                        true
                    }
                    Err(_) => {
                        *route = Route::Parked;
                        return Err(AgentError::Failed {
                            reason: "the agent's actor could not be reached".to_owned(),
                        });
                    }
                },
                Route::Starting(waiting) => {
                    waiting.push(command);
                    false
                }
                Route::Parked => {
                    *route = Route::Starting(vec![command]);
                    true
                }
                Route::Stopped(reason) => {
                    return Err(AgentError::Stopped {
                        reason: reason.clone(),
                    });
                }
            }
        };
        if start {
            self.start_actor().await;
        }
        Ok(())
    }

    async fn start_actor(self: &Arc<Self>) {
        let supervisor = self.runtime.supervisor.clone();
        let spawned = supervisor
            .spawn_linked(None, AgentActor, self.clone())
            .await;
        let mut route = lock(&self.route);
        let waiting = match std::mem::replace(&mut *route, Route::Parked) {
            Route::Starting(waiting) => waiting,
            // Stopped while starting: the waiting commands were answered.
            other => {
                *route = other;
                if let Ok((actor, _)) = spawned {
                    actor.stop(None);
                }
                return;
            }
        };
        match spawned {
            Ok((actor, _)) => {
                self.runtime.watch(actor.get_id(), self);
                let sent = waiting.len() as u64;
                for command in waiting {
                    let _ = actor.send_message(AgentMsg::Command(command));
                }
                *route = Route::Live { actor, sent };
            }
            Err(error) => {
                *route = Route::Stopped(format!("the agent could not be started: {error}"));
            }
        }
    }

    /// Called by the actor once idle: parks it if every command sent was handled.
    pub(crate) fn park_if_quiet(&self, actor: &ActorRef<AgentMsg>, handled: u64) -> bool {
        let mut route = lock(&self.route);
        let quiet = matches!(&*route, Route::Live { actor: live, sent } if live.get_id() == actor.get_id() && *sent == handled);
        if quiet {
            *route = Route::Parked;
        }
        quiet
    }

    /// Runs `f` on the durable state only if no actor is up (so nothing races it);
    /// `None` when one is.
    pub(crate) fn while_parked<T>(&self, f: impl FnOnce(&mut Durable) -> T) -> Option<T> {
        let route = lock(&self.route);
        match &*route {
            Route::Parked | Route::Stopped(_) => Some(f(&mut lock(&self.durable))),
            Route::Starting(_) | Route::Live { .. } => None,
        }
    }

    /// The actor `actor` failed: count it against the restart budget, answer for
    /// its lost run, and tell subscribers. A report that arrives after a newer actor
    /// took over (a caller retried at once) touches only what was the failed
    /// actor's: its run's token, its messages in flight; never the newer run.
    pub(crate) fn failed(&self, actor: ActorId, reason: String) {
        let now = Instant::now();
        let window = self.runtime.config.restart_window;
        let exceeded = {
            let mut failures = lock(&self.failures);
            failures.0.retain(|at| now.duration_since(*at) < window);
            failures.0.push(now);
            failures.1 = Some(reason.clone());
            failures.0.len() > self.runtime.config.max_restarts as usize
        };
        let lost_run = {
            let mut run = lock(&self.run_cancel);
            match &*run {
                Some((owner, _)) if *owner == actor => run.take(),
                _ => None,
            }
        };
        if let Some((_, token)) = &lost_run {
            token.cancel();
        }
        self.recover(actor, lost_run.is_some());
        if exceeded {
            let reason = format!(
                "it failed {} times within {:?}, more than its restart budget of {}; last failure: {reason}",
                self.runtime.config.max_restarts + 1,
                window,
                self.runtime.config.max_restarts
            );
            tracing::error!(agent = %self.id, %reason, "agent stopped");
            self.stop(reason);
            return;
        }
        tracing::warn!(agent = %self.id, %reason, "agent failed; restarting from its last finished message");
        {
            let mut route = lock(&self.route);
            if matches!(&*route, Route::Live { actor: live, .. } if live.get_id() == actor) {
                *route = Route::Parked;
            }
        }
        self.hub.publish(
            &self.id,
            Delivered::Notice(Notice::AgentRestarted { reason }),
        );
        if lost_run.is_some() {
            self.set_idle();
        }
    }

    /// After `actor` failed: the messages its run took from the queues and never
    /// delivered go back to the front of their queues, in order; and when its run
    /// was the agent's last, tool calls left without results are answered, so the
    /// stored transcript stays valid.
    fn recover(&self, actor: ActorId, lost_run: bool) {
        let mut durable = lock(&self.durable);
        durable.requeue_in_flight(actor);
        if lost_run {
            answer_open_calls(
                &mut durable.messages,
                "the agent failed before it finished and was restarted.",
            );
        }
    }

    /// Why the actor failed last.
    pub(crate) fn last_failure(&self) -> String {
        lock(&self.failures)
            .1
            .clone()
            .unwrap_or_else(|| "the agent's actor stopped".to_owned())
    }

    /// Stops the agent for good; commands get [`AgentError::Stopped`].
    pub(crate) fn stop(&self, reason: String) {
        let live = {
            let mut route = lock(&self.route);
            match std::mem::replace(&mut *route, Route::Stopped(reason.clone())) {
                Route::Live { actor, .. } => Some(actor),
                _ => None,
            }
        };
        if let Some(actor) = live {
            actor.stop(None);
        }
        if let Some((_, token)) = lock(&self.run_cancel).take() {
            token.cancel();
        }
        self.status.store(STOPPED, Ordering::Release);
        self.hub
            .publish(&self.id, Delivered::Notice(Notice::AgentStopped { reason }));
        self.idle.notify_waiters();
    }

    pub(crate) fn status(&self) -> AgentStatus {
        match self.status.load(Ordering::Acquire) {
            RUNNING => AgentStatus::Running,
            STOPPED => match &*lock(&self.route) {
                Route::Stopped(reason) => AgentStatus::Stopped {
                    reason: reason.clone(),
                },
                _ => AgentStatus::Stopped {
                    reason: "stopped".to_owned(),
                },
            },
            _ => AgentStatus::Idle,
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.status.load(Ordering::Acquire) == RUNNING
    }

    pub(crate) fn set_running(&self) {
        let _ = self
            .status
            .compare_exchange(IDLE, RUNNING, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Marks the agent idle (unless stopped) and wakes everyone waiting for that.
    pub(crate) fn set_idle(&self) {
        self.mark_idle();
        self.notify_idle();
    }

    /// Marks the agent idle, unless stopped.
    pub(crate) fn mark_idle(&self) {
        let _ = self
            .status
            .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Wakes everyone waiting for the agent to be idle.
    pub(crate) fn notify_idle(&self) {
        self.idle.notify_waiters();
    }

    /// Returns once no run is active.
    pub(crate) async fn wait_for_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.is_running() {
                return;
            }
            notified.await;
        }
    }

    /// Adds a message to a queue.
    pub(crate) fn enqueue(&self, queue: Queue, message: AgentMessage) {
        lock(&self.durable).queue_mut(queue).push_back(message);
    }

    /// Takes what one delivery of `queue` takes, for the run of `actor`.
    pub(crate) fn take_queued(&self, queue: Queue, actor: ActorId) -> Vec<AgentMessage> {
        take(&mut lock(&self.durable), queue, actor)
    }
}

/// Takes what one delivery of `queue` takes, under the queue's mode, recording it
/// as in flight for the run of `actor` until it joins the transcript.
pub(crate) fn take(durable: &mut Durable, queue: Queue, actor: ActorId) -> Vec<AgentMessage> {
    let mode = match queue {
        Queue::Steering => durable.settings.steering_mode,
        Queue::FollowUp => durable.settings.follow_up_mode,
    };
    let messages = durable.queue_mut(queue);
    let taken: Vec<AgentMessage> = match mode {
        QueueMode::OneAtATime => messages.pop_front().into_iter().collect(),
        QueueMode::All => messages.drain(..).collect(),
    };
    durable
        .in_flight
        .extend(taken.iter().map(|message| (actor, queue, message.clone())));
    taken
}

impl Durable {
    /// Forgets the transcript, both queues and the error.
    pub(crate) fn clear(&mut self) {
        self.messages.clear();
        self.steering.clear();
        self.follow_up.clear();
        self.in_flight.clear();
        self.error = None;
    }

    /// Adds a message that ended to the transcript; it is no longer in flight.
    pub(crate) fn append(&mut self, message: AgentMessage) {
        if self
            .in_flight
            .front()
            .is_some_and(|(_, _, taken)| *taken == message)
        {
            self.in_flight.pop_front();
        }
        self.messages.push(message);
    }

    /// One of the two queues.
    pub(crate) fn queue_mut(&mut self, queue: Queue) -> &mut VecDeque<AgentMessage> {
        match queue {
            Queue::Steering => &mut self.steering,
            Queue::FollowUp => &mut self.follow_up,
        }
    }

    /// What the run of `actor` took and never delivered goes back to the front of
    /// its queue, in order, ahead of anything queued since; answers how many.
    pub(crate) fn requeue_in_flight(&mut self, actor: ActorId) -> usize {
        let mut requeued = 0;
        while let Some(at) = self
            .in_flight
            .iter()
            .rposition(|(owner, _, _)| *owner == actor)
        {
            if let Some((_, queue, message)) = self.in_flight.remove(at) {
                self.queue_mut(queue).push_front(message);
                requeued += 1;
            }
        }
        requeued
    }

    /// The state as stored, with nothing running.
    pub(crate) fn snapshot(&self) -> AgentState {
        let settings = &self.settings;
        AgentState {
            system_prompt: settings.system_prompt.clone(),
            model: settings.model.clone(),
            thinking_level: settings.thinking_level,
            tools: settings.tools.clone(),
            messages: self.messages.clone(),
            is_streaming: false,
            streaming_message: None,
            pending_tool_calls: Vec::new(),
            error: self.error.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use futures::StreamExt;

    use crate::faux::{FauxProvider, FauxTurn};
    use crate::{AgentSettings, AgentSpec, AgentStatus, Delivered, Notice, Supervisor};

    /// The supervisor's report of an actor that already failed may arrive after a
    /// caller retried at once and a new actor started a run: the report must leave
    /// that run alone. Replayed here exactly, with a report naming an actor id that
    /// is not the live one.
    #[tokio::test]
    async fn a_late_failure_report_never_touches_a_newer_actors_run() {
        let faux = FauxProvider::new();
        faux.push(FauxTurn::text("slow").delay(Duration::from_secs(3600)));
        let supervisor = Supervisor::start().await.unwrap();
        let agent = supervisor
            .spawn(AgentSpec::new(AgentSettings::new(faux.model())))
            .unwrap();
        let mut events = agent.subscribe();
        agent.prompt("go").await.unwrap();
        let stale = ractor::ActorId::Local(u64::MAX);
        agent
            .cell
            .failed(stale, "an earlier actor panicked".to_owned());

        loop {
            let envelope = events.next().await.unwrap();
            match &envelope.event {
                Delivered::Notice(Notice::AgentRestarted { .. }) => break,
                Delivered::Event(crate::AgentEvent::AgentEnd { .. }) => {
                    panic!("the run ended: {envelope:?}")
                }
                _ => {}
            }
        }
        assert_eq!(agent.status(), AgentStatus::Running);
        let run = crate::cell::lock(&agent.cell.run_cancel).clone().unwrap();
        assert!(!run.1.is_cancelled(), "the newer run goes on");
        assert!(agent.state().await.unwrap().is_streaming);
        agent.abort();
        agent.wait_for_idle().await;
        supervisor.shutdown().await;
    }
}
