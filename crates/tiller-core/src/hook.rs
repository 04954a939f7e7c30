//! Hooks made from closures and async functions.
//!
//! Each hook is stored as an `Arc` of a boxed-future function (the aliases in the crate
//! root); these constructors do the boxing, so callers write plain `async` closures.
//! [`LoopConfig`](crate::LoopConfig)'s `with_*` builders use them, and so can any
//! other holder of hooks.
//!
//! ```
//! use tiller_core::hook;
//! let keep_last_ten = hook::transform_context(|messages, _cancel| {
//!     let kept = messages[messages.len().saturating_sub(10)..].to_vec();
//!     async move { Ok(kept) }
//! });
//! # let _ = keep_last_ten;
//! ```

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use tiller_ai::{ApiKey, Message};
use tokio_util::sync::CancellationToken;

use crate::config::{
    AfterToolCall, AfterToolCallHook, ApiKeyResolver, BeforeToolCall, BeforeToolCallHook,
    ConvertToLlm, Instructions, MessageSource, StopWhen, ToolCallInfo, TransformContext,
    TurnSummary,
};
use crate::context::AgentContext;
use crate::failure::BoxError;
use crate::message::AgentMessage;
use crate::tool::ToolOutput;

/// What the model sees of the transcript.
pub fn convert_to_llm(
    convert: impl for<'a> Fn(&'a [AgentMessage]) -> Vec<Cow<'a, Message>> + Send + Sync + 'static,
) -> ConvertToLlm {
    Arc::new(convert)
}

/// A transform applied to the transcript before each model call.
pub fn transform_context<F, Fut>(transform: F) -> TransformContext
where
    F: Fn(&[AgentMessage], CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<AgentMessage>, BoxError>> + Send + 'static,
{
    Arc::new(move |messages, cancel| Box::pin(transform(messages, cancel)))
}

/// Instructions for each run from its context, added to the system prompt.
pub fn instructions<F, Fut>(write: F) -> Instructions
where
    F: Fn(&AgentContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<String>, BoxError>> + Send + 'static,
{
    Arc::new(move |context| Box::pin(write(context)))
}

/// An API key resolver, asked with the provider's name.
pub fn api_key_resolver<F, Fut>(resolve: F) -> ApiKeyResolver
where
    F: Fn(&str) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<ApiKey>> + Send + 'static,
{
    Arc::new(move |provider| Box::pin(resolve(provider)))
}

/// A source of queued messages (steering or follow-ups).
pub fn message_source<F, Fut>(source: F) -> MessageSource
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<AgentMessage>> + Send + 'static,
{
    Arc::new(move || Box::pin(source()))
}

/// A hook run before each validated tool call.
pub fn before_tool_call<F, Fut>(hook: F) -> BeforeToolCallHook
where
    F: Fn(ToolCallInfo) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<BeforeToolCall, BoxError>> + Send + 'static,
{
    Arc::new(move |info| Box::pin(hook(info)))
}

/// A hook run after each tool call, given its output and whether it failed.
pub fn after_tool_call<F, Fut>(hook: F) -> AfterToolCallHook
where
    F: Fn(ToolCallInfo, ToolOutput, bool) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<AfterToolCall, BoxError>> + Send + 'static,
{
    Arc::new(move |info, output, is_error| Box::pin(hook(info, output, is_error)))
}

/// A stop condition, asked after each turn.
pub fn stop_when(stop: impl Fn(&TurnSummary<'_>) -> bool + Send + Sync + 'static) -> StopWhen {
    Arc::new(stop)
}
