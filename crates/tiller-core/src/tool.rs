//! Tools: what an agent can do besides talk.
//!
//! A tool has a name, a description and a JSON Schema for its arguments; the loop
//! validates the model's arguments against the schema before [`AgentTool::execute`]
//! runs, so a tool only ever sees arguments that match it. A tool reports progress
//! through [`ToolContext::update`] and must stop soon after
//! [`ToolContext::cancel`] fires. Its output is text and images for the model plus
//! JSON details for the application; an `Err` becomes an error result the model
//! reads — no tool outcome, not even a panic, ends the run.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller_ai::Content;
use tokio_util::sync::CancellationToken;

use crate::context::{AgentContext, ContextState};
use crate::event::AgentEvent;

/// A tool an agent can call.
///
/// ```
/// use futures::future::BoxFuture;
/// use serde_json::{Value, json};
/// use tiller_core::{AgentTool, ToolContext, ToolError, ToolOutput};
///
/// struct Add {
///     schema: Value,
/// }
///
/// impl AgentTool for Add {
///     fn name(&self) -> &str { "add" }
///     fn description(&self) -> &str { "Add two integers" }
///     fn parameters(&self) -> &Value { &self.schema }
///     fn execute<'a>(&'a self, args: Value, _ctx: ToolContext) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
///         Box::pin(async move {
///             let (a, b) = (args["a"].as_i64().unwrap_or(0), args["b"].as_i64().unwrap_or(0));
///             Ok(ToolOutput::text((a + b).to_string()))
///         })
///     }
/// }
/// # let _ = Add { schema: json!({"type": "object"}) };
/// ```
pub trait AgentTool: Send + Sync + 'static {
    /// The name the model calls it by.
    fn name(&self) -> &str;

    /// A human-readable label for interfaces; the name by default.
    fn label(&self) -> &str {
        self.name()
    }

    /// What the tool does, for the model.
    fn description(&self) -> &str;

    /// The JSON Schema of the arguments (an object schema).
    fn parameters(&self) -> &Value;

    /// Whether the tool may run beside others of the same turn.
    fn execution(&self) -> ToolExecution {
        ToolExecution::Parallel
    }

    /// The longest a call may run: past it the call is cancelled (its
    /// [`ToolContext::cancel`] token), given the run's `cancel_grace` to return,
    /// then dropped, as an abort does; its result is an error, `Tool "NAME" timed
    /// out after N ms`. `None` (the default) takes the run's
    /// [`RunOptions::tool_timeout`](crate::RunOptions::tool_timeout).
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Runs the tool with validated arguments.
    fn execute<'a>(
        &'a self,
        args: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
}

/// Whether a tool may run beside other tools of the same turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolExecution {
    /// It may run at the same time as the turn's other tools.
    #[default]
    Parallel,
    /// It must run alone: a turn that calls it runs all its tools one at a time.
    Sequential,
}

/// What a tool returns to the model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// What the model sees: text and images.
    pub content: Vec<Content>,
    /// Structured details for the application; never sent to the model.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub details: Value,
    /// Asks the run to stop after this turn; it stops when every result of the
    /// turn asks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminate: bool,
    /// Says the content already reached the run's subscribers as it was made (a
    /// sub-agent's answer, streamed as `child_event`s): the call's
    /// `tool_execution_end` and its result's `message_start` then carry no
    /// content, so interfaces do not show it twice; the result's `message_end` (the
    /// transcript) keeps it for the model.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streamed: bool,
    /// With `streamed`: the caller's next response, where a text block of it only
    /// restates this content, does not stream that block to subscribers again
    /// (see [`crate::restate`]); the transcript keeps it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quiet_restatement: bool,
    /// The agent's state the call set, by name ([`ToolContext::set_state`]):
    /// stored with the result, and the agent's from then on.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub state: serde_json::Map<String, Value>,
}

impl ToolOutput {
    /// An output of one text block.
    pub fn text(text: impl Into<String>) -> Self {
        ToolOutput {
            content: vec![Content::text(text)],
            ..ToolOutput::default()
        }
    }

    /// The same output with these details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// The same output, asking the run to stop after this turn.
    pub fn terminating(mut self) -> Self {
        self.terminate = true;
        self
    }

    /// The text blocks joined.
    pub fn text_content(&self) -> String {
        self.content.iter().filter_map(Content::as_text).collect()
    }

    /// Keeps at most `max_bytes` of content (text, and images by their encoded size),
    /// cutting text at a character boundary and dropping what follows, then says so
    /// in a last text block: `[… 1234 more bytes cut: the output exceeded the limit
    /// of 1000 bytes]`. Details longer than `max_bytes` as JSON are replaced by
    /// `{"cut": "…"}` saying so. Returns how many bytes of content were dropped (0
    /// leaves the content untouched).
    pub fn cut_to(&mut self, max_bytes: usize) -> usize {
        if !self.details.is_null() && json_len(&self.details) > max_bytes {
            self.details = serde_json::json!({
                "cut": format!("the details exceeded the limit of {max_bytes} bytes")
            });
        }
        let size = |content: &Content| match content {
            Content::Text(text) => text.text.len(),
            Content::Image(image) => image.data.len(),
            Content::File(file) => file.data.len(),
        };
        let total: usize = self.content.iter().map(size).sum();
        if total <= max_bytes {
            return 0;
        }
        let mut kept_bytes = 0;
        let mut kept_blocks = 0;
        for content in &mut self.content {
            let len = size(content);
            if kept_bytes + len <= max_bytes {
                kept_bytes += len;
                kept_blocks += 1;
                continue;
            }
            if let Content::Text(text) = content {
                let mut end = max_bytes - kept_bytes;
                while !text.text.is_char_boundary(end) {
                    end -= 1;
                }
                text.text.truncate(end);
                kept_bytes += end;
                kept_blocks += 1;
            }
            break;
        }
        self.content.truncate(kept_blocks);
        let dropped = total - kept_bytes;
        self.content
            .push(Content::text(cut_note(dropped as u64, max_bytes)));
        dropped
    }

    /// The same output, saying in a last text block that `dropped` bytes past a
    /// limit of `max_bytes` were cut (for tools that bound what they read, such as
    /// a program's output).
    pub fn with_cut_note(mut self, dropped: u64, max_bytes: usize) -> Self {
        self.content
            .push(Content::text(cut_note(dropped, max_bytes)));
        self
    }
}

/// The length of `value` as JSON, counted without writing it anywhere.
pub fn json_len(value: &impl Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Counting cannot fail, and what is counted serializes.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// How a cut is shown to the model and the user.
fn cut_note(dropped: u64, max_bytes: usize) -> String {
    format!("[… {dropped} more bytes cut: the output exceeded the limit of {max_bytes} bytes]")
}

/// A tool's failure. [`ToolError::Failed`] becomes an error result with its
/// message and the run goes on; [`ToolError::NeedsInput`] parks the run until the
/// user answers (see [`crate::request`]).
///
/// Any error type converts into a `Failed`, so `?` works inside tools.
#[non_exhaustive]
pub enum ToolError {
    /// The call failed; the model reads this message.
    Failed(String),
    /// The call cannot go on without something only the user knows: the run parks
    /// with `question` (an `input_requested` event) until the user answers; the
    /// answer goes into the call's arguments under `field` and the call runs
    /// again (or, with [`Answers::ToModel`](crate::Answers::ToModel), to the
    /// model, which calls the tool again). Past
    /// [`RunOptions::max_asks_per_tool`](crate::RunOptions::max_asks_per_tool)
    /// asks in a row it is an ordinary error result.
    NeedsInput {
        /// The argument that is missing or unclear, such as `due`.
        field: String,
        /// What to ask the user, such as "When is it due?".
        question: String,
    },
    /// The call must not go on without the user's approval (it found it would
    /// delete more than it was told, say): the run parks with `reason` (an
    /// `approval_requested` event); approved, the tool runs again with
    /// [`ToolContext::approved`] set; denied, the denial is its result.
    NeedsApproval {
        /// What the user is asked to approve.
        reason: String,
    },
}

impl ToolError {
    /// A failure with this message.
    pub fn new(message: impl Into<String>) -> Self {
        ToolError::Failed(message.into())
    }

    /// A request for `field`, asking the user `question`.
    pub fn needs_input(field: impl Into<String>, question: impl Into<String>) -> Self {
        ToolError::NeedsInput {
            field: field.into(),
            question: question.into(),
        }
    }

    /// A request for the user's approval of `reason`.
    pub fn needs_approval(reason: impl Into<String>) -> Self {
        ToolError::NeedsApproval {
            reason: reason.into(),
        }
    }

    /// The message (for a request for input, its question; for approval, its
    /// reason).
    pub fn message(&self) -> &str {
        match self {
            ToolError::Failed(message) => message,
            ToolError::NeedsInput { question, .. } => question,
            ToolError::NeedsApproval { reason } => reason,
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ToolError {
    fn from(error: E) -> Self {
        ToolError::new(error.to_string())
    }
}

impl fmt::Debug for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::Failed(message) => f.debug_tuple("Failed").field(message).finish(),
            ToolError::NeedsInput { field, question } => f
                .debug_struct("NeedsInput")
                .field("field", field)
                .field("question", question)
                .finish(),
            ToolError::NeedsApproval { reason } => f
                .debug_struct("NeedsApproval")
                .field("reason", reason)
                .finish(),
        }
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::Failed(message) => f.write_str(message),
            ToolError::NeedsInput { field, question } => {
                write!(f, "needs `{field}`: {question}")
            }
            ToolError::NeedsApproval { reason } => write!(f, "needs approval: {reason}"),
        }
    }
}

type UpdateFn = Arc<dyn Fn(ToolOutput) + Send + Sync>;
type ActFn = Arc<dyn Fn(String, Value) + Send + Sync>;

/// Agent state by name, shared by a run's calls.
pub(crate) type SharedState = Arc<std::sync::Mutex<serde_json::Map<String, Value>>>;

/// The state behind `shared`, whatever a panicking holder left.
pub(crate) fn lock(
    shared: &std::sync::Mutex<serde_json::Map<String, Value>>,
) -> std::sync::MutexGuard<'_, serde_json::Map<String, Value>> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
type ChildFn = Arc<dyn Fn(Vec<String>, AgentEvent) + Send + Sync>;

/// What a running tool gets from the loop.
#[derive(Clone)]
pub struct ToolContext {
    call_id: String,
    agent: AgentContext,
    cancel: CancellationToken,
    update: UpdateFn,
    act: ActFn,
    child: ChildFn,
    approved: bool,
    /// Whether the call runs with the user's answer merged into it.
    answered: bool,
    /// The agent's state this call set, by name.
    state: Arc<std::sync::Mutex<serde_json::Map<String, Value>>>,
    /// The state the run's earlier calls set, by name.
    run_state: SharedState,
    open: Arc<AtomicBool>,
}

impl ToolContext {
    pub(crate) fn new(
        call_id: String,
        agent: AgentContext,
        cancel: CancellationToken,
        update: UpdateFn,
        act: ActFn,
        child: ChildFn,
    ) -> Self {
        ToolContext {
            call_id,
            agent,
            cancel,
            update,
            act,
            child,
            approved: false,
            answered: false,
            state: Arc::default(),
            run_state: SharedState::default(),
            open: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The agent's state of type `T`: as this call set it, else as the run's
    /// earlier calls did, else as the run started with it (see
    /// [`ContextState`]). Calls running at once each start from what was set
    /// before them; the last to finish wins.
    pub fn state<T: ContextState>(&self) -> Option<T> {
        let set = lock(&self.state).get(T::NAME).cloned();
        let set = set.or_else(|| lock(&self.run_state).get(T::NAME).cloned());
        match set {
            Some(value) => serde_json::from_value(value).ok(),
            None => self.agent.state(),
        }
    }

    /// The same context reading the state the run's earlier calls set.
    pub(crate) fn with_run_state(mut self, run_state: SharedState) -> Self {
        self.run_state = run_state;
        self
    }

    /// Sets the agent's state of type `T`: stored with this call's result (in the
    /// same write), and what the agent's context holds from then on — the next
    /// run's system prompt function and tools see it, across restarts; the
    /// run's later calls see it at once (those of this turn too, when its tools
    /// run one at a time).
    pub fn set_state<T: ContextState>(&self, value: &T) {
        if let Ok(value) = serde_json::to_value(value) {
            lock(&self.run_state).insert(T::NAME.to_owned(), value.clone());
            lock(&self.state).insert(T::NAME.to_owned(), value);
        }
    }

    /// Changes the agent's state of type `T` (its default when it has none)
    /// with `change`, as [`ToolContext::set_state`] does.
    pub fn update_state<T: ContextState + Default>(&self, change: impl FnOnce(&mut T)) {
        let mut state = self.state::<T>().unwrap_or_default();
        change(&mut state);
        self.set_state(&state);
    }

    /// The state this call set, taken (for its result).
    pub(crate) fn take_state(&self) -> serde_json::Map<String, Value> {
        std::mem::take(&mut lock(&self.state))
    }

    /// The same context for a call the user's answer was merged into.
    pub(crate) fn answered_by_user(mut self, answered: bool) -> Self {
        self.answered = answered;
        self
    }

    /// Whether this call runs again because the user answered its question: the
    /// answer is in its arguments, under the field it asked for (see
    /// [`crate::request`]).
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// The same context for a call the user approved in a reply.
    pub(crate) fn approved_by_user(mut self, approved: bool) -> Self {
        self.approved = approved;
        self
    }

    /// Whether the user approved this call in a reply to its approval request
    /// (its tool's policy asked, or the tool did with
    /// [`ToolError::NeedsApproval`]).
    pub fn approved(&self) -> bool {
        self.approved
    }

    /// A context for running a tool outside a loop (in a test, say): updates go to `on_update`.
    pub fn detached(
        call_id: impl Into<String>,
        cancel: CancellationToken,
        on_update: impl Fn(ToolOutput) + Send + Sync + 'static,
    ) -> Self {
        ToolContext::new(
            call_id.into(),
            AgentContext::default(),
            cancel,
            Arc::new(on_update),
            Arc::new(|_, _| {}),
            Arc::new(|_, _| {}),
        )
    }

    /// The same context, with sub-agents' events going to `on_child_event` (in a
    /// test, say).
    pub fn with_child_events(
        mut self,
        on_child_event: impl Fn(Vec<String>, AgentEvent) + Send + Sync + 'static,
    ) -> Self {
        self.child = Arc::new(on_child_event);
        self
    }

    /// The same context, with actions going to `on_action` (in a test, say).
    pub fn with_actions(
        mut self,
        on_action: impl Fn(String, Value) + Send + Sync + 'static,
    ) -> Self {
        self.act = Arc::new(on_action);
        self
    }

    /// The same context, for a tool run on behalf of `agent` (in a test, say).
    pub fn with_agent(mut self, agent: AgentContext) -> Self {
        self.agent = agent;
        self
    }

    /// The id of the call being answered: the idempotency key a tool with an
    /// outside effect hands on (to a payment API, a mail queue), so that the call
    /// is carried out once. Tiller's runtime stores the call before the tool starts
    /// (write-ahead), so the id is the same wherever the call is seen again: after
    /// a crash and resume the call is answered "interrupted", never made anew
    /// under another id as if it had not been.
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// Who the agent calling the tool works for (user, tenant, session, the host's
    /// extensions).
    pub fn agent(&self) -> &AgentContext {
        &self.agent
    }

    /// Fires when the run is aborted or the call is skipped; the tool should stop.
    pub fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Reports a partial result (a `tool_execution_update` event). Ignored once the
    /// tool has finished.
    pub fn update(&self, partial: ToolOutput) {
        if self.open.load(Ordering::Acquire) {
            (self.update)(partial);
        }
    }

    /// Declares an action for the application: an `action` event with this type
    /// and payload. Ignored once the tool has finished.
    pub fn act(&self, action_type: impl Into<String>, payload: Value) {
        if self.open.load(Ordering::Acquire) {
            (self.act)(action_type.into(), payload);
        }
    }

    /// Passes on an event of a sub-agent this call started, which came through the
    /// agents of `path` (see [`AgentEvent::ChildEvent`]): the run's subscribers get
    /// it in order among the run's own events. Ignored once the tool has finished.
    pub fn child_event(&self, path: Vec<String>, event: AgentEvent) {
        if self.open.load(Ordering::Acquire) {
            (self.child)(path, event);
        }
    }

    /// Stops further updates.
    pub(crate) fn close(&self) {
        self.open.store(false, Ordering::Release);
    }

    /// A guard that stops further updates when dropped.
    pub(crate) fn closer(&self) -> Closer {
        Closer(self.open.clone())
    }
}

/// Closes a [`ToolContext`] when dropped.
pub(crate) struct Closer(Arc<AtomicBool>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolContext")
            .field("call_id", &self.call_id)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

type ToolFn =
    dyn Fn(Value, ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + Sync;

/// A tool made from a name, a description, a schema and an async function.
///
/// ```
/// use serde_json::json;
/// use tiller_core::{FnTool, ToolOutput};
/// let echo = FnTool::new(
///     "echo",
///     "Repeat the text",
///     json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
///     |args, _ctx| async move { Ok(ToolOutput::text(args["text"].as_str().unwrap_or_default())) },
/// );
/// ```
pub struct FnTool {
    name: String,
    label: Option<String>,
    description: String,
    parameters: Value,
    execution: ToolExecution,
    timeout: Option<Duration>,
    run: Box<ToolFn>,
}

impl FnTool {
    /// A tool running `run` for each call.
    pub fn new<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        run: F,
    ) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        FnTool {
            name: name.into(),
            label: None,
            description: description.into(),
            parameters,
            execution: ToolExecution::Parallel,
            timeout: None,
            run: Box::new(move |args, ctx| Box::pin(run(args, ctx))),
        }
    }

    /// The same tool with an interface label.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The same tool, made to run alone.
    pub fn sequential(mut self) -> Self {
        self.execution = ToolExecution::Sequential;
        self
    }

    /// The same tool, each call of it bounded by `timeout` (see
    /// [`AgentTool::timeout`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

impl AgentTool for FnTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn label(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.name)
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn execution(&self) -> ToolExecution {
        self.execution
    }

    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    fn execute<'a>(
        &'a self,
        args: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        (self.run)(args, ctx)
    }
}

/// The JSON Schema of a tool's arguments, made from the Rust type `T` that
/// decodes them (subschemas inlined, as providers want them; no `$schema` or
/// `title`). What [`#[tool]`](https://docs.rs/tiller-macros) uses.
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// /// Where to look.
/// #[derive(Deserialize, JsonSchema)]
/// struct Search {
///     /// Words to find.
///     query: String,
///     limit: Option<u32>,
/// }
/// let schema = tiller_core::parameters_schema::<Search>();
/// assert_eq!(schema["type"], "object");
/// assert_eq!(schema["required"], serde_json::json!(["query"]));
/// assert_eq!(schema["properties"]["query"]["description"], "Words to find.");
/// ```
pub fn parameters_schema<T: schemars::JsonSchema>() -> Value {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| settings.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<T>();
    let mut schema = schema.to_value();
    if let Value::Object(fields) = &mut schema {
        fields.remove("$schema");
        fields.remove("title");
        fields.remove("description");
    }
    schema
}

/// Decodes a tool's arguments into `T`; a mismatch is a [`ToolError`] naming the
/// tool and the field.
pub fn decode_arguments<T: serde::de::DeserializeOwned>(
    tool: &str,
    args: Value,
) -> Result<T, ToolError> {
    serde_json::from_value(args)
        .map_err(|error| ToolError::new(format!("invalid arguments for `{tool}`: {error}")))
}

/// What a tool function may return on success: text, a JSON value (sent as its
/// text and kept as the details), or a whole [`ToolOutput`].
pub trait IntoToolOutput {
    /// The output the model reads.
    fn into_tool_output(self) -> ToolOutput;
}

impl IntoToolOutput for ToolOutput {
    fn into_tool_output(self) -> ToolOutput {
        self
    }
}

impl IntoToolOutput for String {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self)
    }
}

impl IntoToolOutput for &str {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self)
    }
}

impl IntoToolOutput for Value {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self.to_string()).with_details(self)
    }
}

/// A tool function's result as the loop wants it.
pub fn tool_result<T: IntoToolOutput, E: Into<ToolError>>(
    result: Result<T, E>,
) -> Result<ToolOutput, ToolError> {
    result
        .map(IntoToolOutput::into_tool_output)
        .map_err(Into::into)
}
