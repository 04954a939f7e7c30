//! [`AgentHandle`]: the typed client API of one agent, sugar over [`Op`]s and the
//! other messages of [`AgentMsg`].

use std::fmt;
use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::AgentMessage;
use crate::agent::Agent;
use crate::error::AgentError;
use crate::message::{AgentMsg, Submission};
use crate::op::{Op, Queues};
use crate::patch::DefinitionPatch;
use crate::settings::AgentSettings;
use crate::state::{AgentInfo, AgentState, AgentStatus, RunOutcome, Workload};
use crate::subscription::{AgentId, Relay, Subscription};
use tiller_core::{Prompt, Reply, RunHooks};

/// A handle to one agent: prompt it, steer it, queue follow-ups, watch it, abort and
/// reset it, change its settings. Cheap to clone, usable from any task or thread;
/// every clone talks to the same agent, across restarts and hibernation.
///
/// Each method sends one message to the agent's actor (thawing a hibernated agent,
/// or waiting for a restart), so requests from one task are handled in the order
/// sent, even while a model streams or a tool runs. Methods that change durable
/// state return once the session store has the change.
#[derive(Clone)]
pub struct AgentHandle {
    pub(crate) agent: Arc<Agent>,
}

impl AgentHandle {
    pub(crate) fn new(agent: Arc<Agent>) -> Self {
        AgentHandle { agent }
    }

    /// The agent's id.
    pub fn id(&self) -> &AgentId {
        &self.agent.id
    }

    /// The agent's unique name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.agent.name.as_deref()
    }

    /// The id of the session the store keeps the agent in.
    pub fn session_id(&self) -> &str {
        &self.agent.session
    }

    /// The agent's actor, for a host's own actors to message or link to (waking
    /// the agent if it is dormant, thawing it if it hibernates). A restart, a
    /// wake or a thaw replaces the actor; the handle follows, a kept `ActorRef`
    /// does not (a message sent to an actor put away since is dropped).
    pub async fn actor(&self) -> Result<ActorRef<AgentMsg>, AgentError> {
        self.agent.actor().await
    }

    /// Sends a request and waits for its answer.
    async fn ask<T>(
        &self,
        request: impl FnOnce(RpcReplyPort<T>) -> AgentMsg,
    ) -> Result<T, AgentError> {
        let (reply, answer) = oneshot::channel();
        self.agent.send(request(reply.into()))?;
        answer.await.map_err(|_| self.lost())
    }

    /// Carries out `op` and returns once it is done: a run started, a message
    /// queued and stored, an abort's run ended. Every other method that changes
    /// the agent is sugar over this one.
    pub async fn submit(&self, op: Op) -> Result<(), AgentError> {
        if op != Op::Abort {
            return self.submit_with(Submission::new(op, None)).await;
        }
        if !self.agent.route.is_running() && !self.agent.route.is_waiting() {
            // Nothing to abort: an idle or hibernated agent is not woken for it.
            return Ok(());
        }
        match self.submit_with(Submission::new(op, None)).await {
            // Stopped or failed meanwhile: its run is over all the same.
            Err(AgentError::Stopped { .. } | AgentError::Failed { .. }) => Ok(()),
            done => done,
        }
    }

    /// [`AgentHandle::submit`] with an idempotency key (see [`Submission::key`]):
    /// sent again with the same key — after a timeout, to whichever process holds
    /// the agent then — the op is acknowledged without being applied twice.
    pub async fn submit_keyed(&self, op: Op, key: impl Into<Arc<str>>) -> Result<(), AgentError> {
        self.submit_with(Submission::new(op, None).with_key(key))
            .await
    }

    /// Carries out `op`, one that starts a run ([`Op::starts_run`]), and waits for
    /// the run to end, as [`AgentHandle::run`] does; with an idempotency key, as
    /// [`AgentHandle::submit_keyed`] takes it ([`AgentError::Duplicate`] when an
    /// op with that key started a run already). An op that starts no run is
    /// refused with [`ContinueError::EmptyPrompt`](tiller_core::ContinueError::EmptyPrompt).
    pub async fn run_op(&self, op: Op, key: Option<Arc<str>>) -> Result<RunOutcome, AgentError> {
        if !op.starts_run() {
            return Err(tiller_core::ContinueError::EmptyPrompt.into());
        }
        let (finished, outcome) = oneshot::channel();
        let mut submission = Submission::new(op, None);
        submission.finished = Some(finished);
        submission.key = key;
        self.submit_with(submission).await?;
        outcome.await.map_err(|_| self.lost())
    }

    /// Sends `submission`, acknowledged to this call.
    async fn submit_with(&self, mut submission: Submission) -> Result<(), AgentError> {
        let (reply, answer) = oneshot::channel();
        submission.reply = Some(reply.into());
        self.agent.send(AgentMsg::Submit(Box::new(submission)))?;
        answer.await.map_err(|_| self.lost())?
    }

    /// Starts a run and returns once it is accepted: from text, a message, messages,
    /// or [`Prompt::Continue`] (the transcript as it stands).
    pub async fn prompt(&self, prompt: impl Into<Prompt>) -> Result<(), AgentError> {
        self.submit_with(Submission::new(Op::from(prompt.into()), None))
            .await
    }

    /// Starts a run with its own settings: `patch` over the agent's definition
    /// for this run alone.
    pub async fn prompt_with(
        &self,
        prompt: impl Into<Prompt>,
        patch: DefinitionPatch,
    ) -> Result<(), AgentError> {
        let mut submission = Submission::new(Op::from(prompt.into()), None);
        submission.patch = Some(Box::new(patch));
        self.submit_with(submission).await
    }

    /// Starts a run and waits for it to end (and its messages to be stored).
    pub async fn run(&self, prompt: impl Into<Prompt>) -> Result<RunOutcome, AgentError> {
        self.run_inner(prompt.into(), None, None).await
    }

    /// [`AgentHandle::run`] with `patch` over the agent's definition for this run
    /// alone.
    pub async fn run_with(
        &self,
        prompt: impl Into<Prompt>,
        patch: DefinitionPatch,
    ) -> Result<RunOutcome, AgentError> {
        self.run_inner(prompt.into(), Some(patch), None).await
    }

    /// [`AgentHandle::run_with`] with hooks for this run alone, each one set in
    /// place of the agent's: a stop condition, say, or `run_until` — the run
    /// keeps going until it answers `true` (or the turn limit ends it).
    pub async fn run_with_hooks(
        &self,
        prompt: impl Into<Prompt>,
        patch: DefinitionPatch,
        hooks: RunHooks,
    ) -> Result<RunOutcome, AgentError> {
        self.run_inner(prompt.into(), Some(patch), Some(hooks))
            .await
    }

    async fn run_inner(
        &self,
        prompt: Prompt,
        patch: Option<DefinitionPatch>,
        hooks: Option<RunHooks>,
    ) -> Result<RunOutcome, AgentError> {
        let (finished, outcome) = oneshot::channel();
        let mut submission = Submission::new(Op::from(prompt), None);
        submission.finished = Some(finished);
        submission.patch = patch.map(Box::new);
        submission.hooks = hooks.map(Box::new);
        self.submit_with(submission).await?;
        outcome.await.map_err(|_| self.lost())
    }

    /// Why a request got no answer: the agent stopped or failed while handling it.
    fn lost(&self) -> AgentError {
        match self.agent.route.status() {
            AgentStatus::Stopped { reason } => AgentError::Stopped { reason },
            _ => AgentError::Failed {
                reason: self.agent.route.last_failure(),
            },
        }
    }

    /// Queues a message for the model to see as soon as possible: during a run, after
    /// the current tool call (interrupting the rest of the turn) or after the turn,
    /// as the steering delivery says. It joins the transcript only when delivered.
    /// Returns once it is stored.
    pub async fn steer(&self, message: impl Into<AgentMessage>) -> Result<(), AgentError> {
        self.submit(Op::Steer {
            message: message.into(),
        })
        .await
    }

    /// Queues a message for when the agent would otherwise stop. It joins the
    /// transcript only when delivered: by the run, or by a run of its own that
    /// starts as the run ends; queued while no run is active, it waits for the
    /// next one (a prompt, or [`Prompt::Continue`]). Returns once it is stored.
    pub async fn follow_up(&self, message: impl Into<AgentMessage>) -> Result<(), AgentError> {
        self.submit(Op::FollowUp {
            message: message.into(),
        })
        .await
    }

    /// Forks the session into session `branch`, which begins with the first
    /// `at` messages of the transcript (shared in the store) and the context
    /// as it stood there (see [`Op::Fork`]): fork at a user message and
    /// prompt the branch to try that turn again. Returns once the branch is
    /// stored; spawn an agent with
    /// [`AgentSpec::with_session`](crate::AgentSpec::with_session)`(branch)` to
    /// carry it on.
    pub async fn fork(&self, at: u64, branch: impl Into<String>) -> Result<(), AgentError> {
        self.submit(Op::Fork {
            at,
            session: branch.into(),
        })
        .await
    }

    /// Drops queued messages.
    pub async fn clear_queues(&self, which: Queues) -> Result<(), AgentError> {
        self.submit(Op::ClearQueues { queues: which }).await
    }

    /// Whether any steering or follow-up message waits.
    pub async fn has_queued_messages(&self) -> Result<bool, AgentError> {
        let state = self.state().await?;
        Ok(!state.steering_queue.is_empty() || !state.follow_up_queue.is_empty())
    }

    /// Answers the question the call `request_id` asked
    /// ([`ToolError::NeedsInput`](tiller_core::ToolError::NeedsInput)): a run starts
    /// that puts the answer into the call's arguments and runs it again (or, with
    /// `Answers::ToModel`, gives it to the model, which calls the tool again). Returns once
    /// the run is accepted; [`ContinueError::NothingToReply`](tiller_core::ContinueError::NothingToReply) when no request waits,
    /// [`ContinueError::NoSuchRequest`](tiller_core::ContinueError::NoSuchRequest) when none has that id,
    /// [`ContinueError::ReplyDoesNotFit`](tiller_core::ContinueError::ReplyDoesNotFit) when it is an approval (each within
    /// [`AgentError::CannotStart`]).
    pub async fn answer(
        &self,
        request_id: impl Into<String>,
        text: impl Into<String>,
    ) -> Result<(), AgentError> {
        self.prompt(Prompt::Reply(Reply::answer(request_id, text)))
            .await
    }

    /// Approves the call `request_id`, waiting for approval: a run starts that runs
    /// it and goes on (or parks again while other requests of its turn are open).
    /// Returns once the run is accepted.
    pub async fn approve(&self, request_id: impl Into<String>) -> Result<(), AgentError> {
        self.prompt(Prompt::Reply(Reply::approve(request_id))).await
    }

    /// Denies the call `request_id`, waiting for approval: a run starts in which the
    /// call's result is an error saying so (and `reason`), and goes on. Returns once
    /// the run is accepted.
    pub async fn deny(
        &self,
        request_id: impl Into<String>,
        reason: Option<String>,
    ) -> Result<(), AgentError> {
        self.prompt(Prompt::Reply(Reply::deny(request_id, reason)))
            .await
    }

    /// Aborts the active run: the response stops, running tools are cancelled, every
    /// tool call gets a result, and the run ends with an aborted assistant message.
    /// With no run but a call waiting for the user, gives that up: each waiting call
    /// gets an error result and the agent takes prompts again. Does nothing when
    /// idle. Returns at once; [`AgentHandle::wait_for_idle`] waits for the run to end.
    pub fn abort(&self) {
        if self.agent.route.is_running() || self.agent.route.is_waiting() {
            let _ = self.agent.send(AgentMsg::from(Op::Abort));
        }
    }

    /// The sequence number the agent's next event will get: every event numbered
    /// below it is published, and in the queues of the subscriptions that were
    /// there (a subscriber that has read up to here has seen them all).
    pub fn next_seq(&self) -> u64 {
        self.agent.hub.next_seq()
    }

    /// Publishes `notice` to the agent's subscribers, numbered among its events:
    /// for a host that adds to the agent's story, such as a cluster saying that
    /// the agent's owner changed.
    pub fn notify(&self, notice: crate::Notice) {
        self.agent
            .hub
            .publish(&self.agent.id, crate::Delivered::Notice(notice));
    }

    /// What the agent has to do, in brief: whether a run is active or a request
    /// waits for the user, and how many messages are queued. Unlike
    /// [`AgentHandle::state`], it copies no transcript.
    pub async fn workload(&self) -> Result<Workload, AgentError> {
        self.ask(AgentMsg::Workload).await
    }

    /// Calls `relay` with every delivery of the agent from now on — on the thread
    /// that publishes it, in order, with no queue between, so nothing is lost
    /// and nothing waits to be woken — until the returned [`Relay`] is dropped.
    /// `relay` must be quick and must not block (nor drop its own [`Relay`]): the
    /// agent waits for it. For work that may take time, [`AgentHandle::subscribe`].
    pub fn relay(&self, relay: impl FnMut(&Arc<crate::Envelope>) + Send + 'static) -> Relay {
        self.agent.hub.relay(relay)
    }

    /// Compacts the transcript now (see [`tiller_core::compaction`]), with
    /// `instructions` for the summary in place of the policy's, and returns what
    /// the compaction did once it is stored. Refused with [`AgentError::Busy`]
    /// during a run; [`AgentError::NotCompacted`] when the transcript stayed as
    /// it was.
    pub async fn compact(
        &self,
        instructions: Option<String>,
    ) -> Result<tiller_core::CompactionReport, AgentError> {
        let outcome = self.run_op(Op::Compact { instructions }, None).await?;
        match outcome.compactions.into_iter().last() {
            Some(report) if report.error.is_none() => Ok(report),
            Some(report) => Err(AgentError::NotCompacted {
                reason: report.error.unwrap_or_default(),
            }),
            None => Err(AgentError::NotCompacted {
                reason: "the compaction did not run".to_owned(),
            }),
        }
    }

    /// Aborts any active run, then clears the transcript, both queues and the error.
    pub async fn reset(&self) -> Result<(), AgentError> {
        self.submit(Op::Reset).await
    }

    /// Replaces the transcript; refused with [`AgentError::Busy`] during a run.
    pub async fn set_messages(&self, messages: Vec<AgentMessage>) -> Result<(), AgentError> {
        self.submit(Op::SetMessages { messages }).await
    }

    /// Returns once no run is active (at once for an idle, hibernated or stopped agent).
    pub async fn wait_for_idle(&self) {
        while self.agent.route.is_running() {
            if self.ask(AgentMsg::WaitForIdle).await.is_ok() {
                return;
            }
        }
    }

    /// Whether a run is active, the agent hibernates, or it is stopped.
    pub fn status(&self) -> AgentStatus {
        self.agent.route.status()
    }

    /// Whether the agent's actor runs now: false while one is being started, and
    /// while the agent is dormant (see [`crate::SupervisorConfig::dormant_after`]),
    /// hibernated or stopped.
    pub fn has_actor(&self) -> bool {
        self.agent.route.live().is_some()
    }

    /// Its id, name and status, as [`crate::Supervisor::list`] shows them.
    pub fn info(&self) -> AgentInfo {
        AgentInfo {
            id: self.agent.id.clone(),
            name: self.agent.name.as_deref().map(str::to_owned),
            status: self.agent.route.status(),
        }
    }

    /// Every event from now on, in order, with the supervisor's default buffer. No
    /// event is sent on subscribing; dropping the subscription unsubscribes.
    /// Subscriptions belong to the agent, not to its actor: they go on across
    /// restarts and hibernation (so subscribing never thaws an agent).
    pub fn subscribe(&self) -> Subscription {
        self.subscribe_with_buffer(self.agent.runtime.config.subscriber_buffer)
    }

    /// [`AgentHandle::subscribe`] holding up to `buffer` unread events before the
    /// oldest are dropped (and reported with a `lagged` notice).
    pub fn subscribe_with_buffer(&self, buffer: usize) -> Subscription {
        self.agent.hub.subscribe(&self.agent.id, buffer)
    }

    /// Runs `future` on the agent's shard, the thread its actor and run live on
    /// (on the current runtime when the supervisor has no shards). A subscription
    /// read there is woken without crossing threads: the cheapest place to
    /// consume an agent's events. See `docs/runtime-semantics.md`, "Shards".
    pub fn spawn_beside<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.agent
            .runtime
            .shards
            .spawn(self.agent.id.as_str(), future)
    }

    /// A snapshot of the agent's state.
    pub async fn state(&self) -> Result<AgentState, AgentError> {
        self.ask(AgentMsg::State).await
    }

    /// Changes the agent's definition by `patch`; runs already started keep the
    /// settings they started with. Returns once the new definition is stored;
    /// [`AgentError::InvalidPatch`] (and nothing changed) when it cannot be used.
    pub async fn patch(&self, patch: DefinitionPatch) -> Result<(), AgentError> {
        self.submit(Op::UpdateSettings {
            patch: Box::new(patch),
        })
        .await
    }

    /// Changes settings with code (tools, hooks, anything of the definition);
    /// runs already started keep the settings they started with.
    /// Returns once the new definition is stored.
    pub async fn update_settings(
        &self,
        change: impl FnOnce(&mut AgentSettings) + Send + 'static,
    ) -> Result<(), AgentError> {
        self.ask(|reply| AgentMsg::UpdateSettings(Box::new(change), reply))
            .await?
    }
}

impl fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentHandle")
            .field("id", &self.agent.id)
            .field("name", &self.agent.name)
            .field("status", &self.agent.route.status())
            .finish()
    }
}
