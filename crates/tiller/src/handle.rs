//! [`AgentHandle`]: the typed client API of one agent.

use std::fmt;
use std::sync::Arc;

use tiller_ai::{Content, ImageContent, Model, ThinkingLevel, UserMessage};
use tiller_core::{SteeringDelivery, ToolExecutionMode, ToolSet};
use tokio::sync::oneshot;

use crate::AgentMessage;
use crate::actor::snapshot_request;
use crate::cell::{AgentCell, Command, Queue, Start, lock};
use crate::error::AgentError;
use crate::settings::{AgentHooks, AgentSettings, QueueMode};
use crate::state::{AgentState, AgentStatus, RunOutcome};
use crate::subscription::{AgentId, Subscription};

/// A handle to one agent: prompt it, steer it, queue follow-ups, watch it, abort and
/// reset it, change its settings. Cheap to clone, usable from any task or thread;
/// every clone talks to the same agent, across restarts.
///
/// Requests that start or inspect a run go through the agent's actor; queueing,
/// settings, abort and subscriptions are answered at once, even while a model
/// streams or a tool runs. Setters emit no events.
#[derive(Clone)]
pub struct AgentHandle {
    pub(crate) cell: Arc<AgentCell>,
}

impl AgentHandle {
    pub(crate) fn new(cell: Arc<AgentCell>) -> Self {
        AgentHandle { cell }
    }

    /// The agent's id.
    pub fn id(&self) -> &AgentId {
        &self.cell.id
    }

    /// The agent's unique name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.cell.name.as_deref()
    }

    /// Starts a run with a user message; returns once the run is accepted.
    pub async fn prompt(&self, text: impl Into<String>) -> Result<(), AgentError> {
        self.prompt_messages(vec![AgentMessage::user(text)]).await
    }

    /// Starts a run with a user message of text and images.
    pub async fn prompt_with_images(
        &self,
        text: impl Into<String>,
        images: Vec<ImageContent>,
    ) -> Result<(), AgentError> {
        let mut message = UserMessage::text(text);
        message
            .content
            .extend(images.into_iter().map(Content::Image));
        self.prompt_messages(vec![message.into()]).await
    }

    /// Starts a run with these messages.
    pub async fn prompt_messages(&self, messages: Vec<AgentMessage>) -> Result<(), AgentError> {
        if messages.is_empty() {
            return Err(AgentError::EmptyPrompt);
        }
        self.start(Start::Prompt(messages), None).await
    }

    /// Starts a run with a user message and waits for it to end.
    pub async fn run(&self, text: impl Into<String>) -> Result<RunOutcome, AgentError> {
        self.run_messages(vec![AgentMessage::user(text)]).await
    }

    /// Starts a run with these messages and waits for it to end.
    pub async fn run_messages(
        &self,
        messages: Vec<AgentMessage>,
    ) -> Result<RunOutcome, AgentError> {
        if messages.is_empty() {
            return Err(AgentError::EmptyPrompt);
        }
        let (finished, outcome) = oneshot::channel();
        self.start(Start::Prompt(messages), Some(finished)).await?;
        outcome.await.map_err(|_| self.lost())
    }

    /// Continues from the transcript: a run from a trailing user, tool-result or
    /// custom message; from a trailing assistant message, a run with the queued
    /// steering (else the queued follow-ups), else [`AgentError::CannotContinueFromAssistant`].
    pub async fn continue_run(&self) -> Result<(), AgentError> {
        self.start(Start::Continue, None).await
    }

    async fn start(
        &self,
        start: Start,
        finished: Option<oneshot::Sender<RunOutcome>>,
    ) -> Result<(), AgentError> {
        let (accepted, answer) = oneshot::channel();
        self.cell
            .command(Command::Start {
                start,
                accepted,
                finished,
            })
            .await?;
        answer.await.map_err(|_| self.lost())?
    }

    /// Why a request got no answer: the agent stopped or failed while handling it.
    fn lost(&self) -> AgentError {
        match self.cell.status() {
            AgentStatus::Stopped { reason } => AgentError::Stopped { reason },
            _ => AgentError::Failed {
                reason: self.cell.last_failure(),
            },
        }
    }

    /// Queues a message for the model to see as soon as possible: during a run, after
    /// the current tool call (interrupting the rest of the turn) or after the turn,
    /// as the steering delivery says. It joins the transcript only when delivered.
    pub fn steer(&self, message: impl Into<AgentMessage>) -> Result<(), AgentError> {
        self.enqueue(Queue::Steering, message.into())
    }

    /// Queues a message for when the agent would otherwise stop. It joins the
    /// transcript only when delivered; if the run ends first, it stays queued for
    /// [`AgentHandle::continue_run`].
    pub fn follow_up(&self, message: impl Into<AgentMessage>) -> Result<(), AgentError> {
        self.enqueue(Queue::FollowUp, message.into())
    }

    fn enqueue(&self, queue: Queue, message: AgentMessage) -> Result<(), AgentError> {
        if let AgentStatus::Stopped { reason } = self.cell.status() {
            return Err(AgentError::Stopped { reason });
        }
        self.cell.enqueue(queue, message);
        Ok(())
    }

    /// Drops the queued steering messages.
    pub fn clear_steering_queue(&self) {
        lock(&self.cell.durable).steering.clear();
    }

    /// Drops the queued follow-up messages.
    pub fn clear_follow_up_queue(&self) {
        lock(&self.cell.durable).follow_up.clear();
    }

    /// Drops both queues.
    pub fn clear_all_queues(&self) {
        let mut durable = lock(&self.cell.durable);
        durable.steering.clear();
        durable.follow_up.clear();
    }

    /// Whether any steering or follow-up message waits.
    pub fn has_queued_messages(&self) -> bool {
        let durable = lock(&self.cell.durable);
        !durable.steering.is_empty() || !durable.follow_up.is_empty()
    }

    /// Aborts the active run: the response stops, running tools are cancelled, every
    /// tool call gets a result, and the run ends with an aborted assistant message.
    /// Does nothing when idle. Returns at once; [`AgentHandle::wait_for_idle`] waits
    /// for the run to end.
    pub fn abort(&self) {
        if let Some((_, token)) = lock(&self.cell.run_cancel).as_ref() {
            token.cancel();
        }
    }

    /// Aborts any active run, then clears the transcript, both queues and the error.
    pub async fn reset(&self) -> Result<(), AgentError> {
        if self.cell.while_parked(|durable| durable.clear()).is_some() {
            return Ok(());
        }
        let (done, cleared) = oneshot::channel();
        self.cell.command(Command::Reset { done }).await?;
        cleared.await.map_err(|_| self.lost())
    }

    /// Returns once no run is active.
    pub async fn wait_for_idle(&self) {
        self.cell.wait_for_idle().await;
    }

    /// Whether a run is active, or the agent is stopped.
    pub fn status(&self) -> AgentStatus {
        self.cell.status()
    }

    /// Every event from now on, in order, with the supervisor's default buffer. No
    /// event is sent on subscribing; dropping the subscription unsubscribes.
    pub fn subscribe(&self) -> Subscription {
        self.subscribe_with_buffer(self.cell.runtime.config.subscriber_buffer)
    }

    /// [`AgentHandle::subscribe`] holding up to `buffer` unread events before the
    /// oldest are dropped (and reported with a `lagged` notice).
    pub fn subscribe_with_buffer(&self, buffer: usize) -> Subscription {
        self.cell.hub.subscribe(&self.cell.id, buffer)
    }

    /// A snapshot of the agent's state.
    pub async fn state(&self) -> Result<AgentState, AgentError> {
        if let Some(snapshot) = self.cell.while_parked(|durable| durable.snapshot()) {
            return Ok(snapshot);
        }
        let (command, reply) = snapshot_request();
        self.cell.command(command).await?;
        reply.await.map_err(|_| self.lost())
    }

    /// The agent's settings.
    pub fn settings(&self) -> Arc<AgentSettings> {
        lock(&self.cell.durable).settings.clone()
    }

    /// Changes settings; runs already started keep the settings they started with.
    pub fn update_settings(&self, change: impl FnOnce(&mut AgentSettings)) {
        change(Arc::make_mut(&mut lock(&self.cell.durable).settings));
    }

    /// Sets the system prompt.
    pub fn set_system_prompt(&self, prompt: impl Into<String>) {
        let prompt = prompt.into();
        self.update_settings(|s| s.system_prompt = Some(prompt));
    }

    /// Sets the model.
    pub fn set_model(&self, model: Model) {
        self.update_settings(|s| s.model = Some(model));
    }

    /// Sets the thinking level.
    pub fn set_thinking_level(&self, level: ThinkingLevel) {
        self.update_settings(|s| s.thinking_level = level);
    }

    /// Sets the tools.
    pub fn set_tools(&self, tools: ToolSet) {
        self.update_settings(|s| s.tools = tools);
    }

    /// Sets the session id forwarded to the provider.
    pub fn set_session_id(&self, session_id: Option<String>) {
        self.update_settings(|s| s.session_id = session_id);
    }

    /// Sets how a turn's tool calls run.
    pub fn set_tool_execution(&self, mode: ToolExecutionMode) {
        self.update_settings(|s| s.tool_execution = mode);
    }

    /// Sets the hooks.
    pub fn set_hooks(&self, hooks: AgentHooks) {
        self.update_settings(|s| s.hooks = hooks);
    }

    /// Sets how many steering messages one delivery takes.
    pub fn set_steering_mode(&self, mode: QueueMode) {
        self.update_settings(|s| s.steering_mode = mode);
    }

    /// Sets how many follow-up messages one delivery takes.
    pub fn set_follow_up_mode(&self, mode: QueueMode) {
        self.update_settings(|s| s.follow_up_mode = mode);
    }

    /// Sets when steering reaches the model.
    pub fn set_steering_delivery(&self, delivery: SteeringDelivery) {
        self.update_settings(|s| s.steering_delivery = delivery);
    }

    /// Replaces the transcript.
    pub fn set_messages(&self, messages: Vec<AgentMessage>) {
        lock(&self.cell.durable).messages = messages;
    }

    /// Appends a message to the transcript.
    pub fn append_message(&self, message: impl Into<AgentMessage>) {
        lock(&self.cell.durable).messages.push(message.into());
    }

    /// Empties the transcript.
    pub fn clear_messages(&self) {
        lock(&self.cell.durable).messages.clear();
    }
}

impl fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentHandle")
            .field("id", &self.cell.id)
            .field("name", &self.cell.name)
            .field("status", &self.cell.status())
            .finish()
    }
}
