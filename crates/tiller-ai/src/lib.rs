//! The wire layer of Tiller: provider-neutral messages and models, and one function,
//! [`stream`], that sends a conversation to a model and yields its answer as a stream
//! of typed [`AssistantEvent`]s.
//!
//! The same events come from every API: OpenAI chat completions (OpenAI and every
//! compatible server: llama.cpp, vLLM, Ollama, OpenRouter, Groq, DeepSeek, Mistral),
//! OpenAI's Responses API, Anthropic messages, Google's Gemini API, Amazon Bedrock's
//! Converse API, and the scripted [`faux`] provider for tests and demos. A
//! stream never fails to deliver a final message: a missing key, an error status, a
//! cut connection, a stall or an abort ends it with an [`AssistantEvent::Error`] that
//! carries what arrived. Requests are retried before the first byte of a response
//! (see [`RetryPolicy`]), never after. There are no agents here; those live in
//! `tiller-core` and `tiller`.
//!
//! ```
//! use futures::StreamExt;
//! use tiller_ai::faux::{FauxProvider, FauxTurn};
//! use tiller_ai::{AssistantEvent, Context, Message, StreamOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A scripted model; point `model` at `catalog::find("openai/gpt-4o-mini")` or
//! // `Model::openai_compatible(base_url, id)` for a real one.
//! let faux = FauxProvider::new();
//! faux.push(FauxTurn::text("Hello from a scripted model.").chunk_size(6));
//! let model = faux.model();
//!
//! let context = Context::new()
//!     .with_system_prompt("Be brief.")
//!     .with_message(Message::user("Say hello"));
//! let mut events = tiller_ai::stream(&model, &context, &StreamOptions::default());
//! while let Some(event) = events.next().await {
//!     match event {
//!         AssistantEvent::TextDelta { delta, .. } => print!("{delta}"),
//!         AssistantEvent::Done { message, .. } => println!("\n[{} tokens]", message.usage.total_tokens),
//!         AssistantEvent::Error { error, .. } => eprintln!("\nfailed: {error}"),
//!         _ => {}
//!     }
//! }
//! assert_eq!(events.partial().text(), "Hello from a scripted model.");
//! # }
//! ```

pub mod catalog;
pub mod env;
pub mod faux;
pub mod pi;

mod breaker;
mod builder;
mod context;
mod decode;
mod embed;
mod error;
mod event;
mod eventstream;
mod file;
mod http;
mod id;
mod json;
mod limits;
mod message;
pub mod millis;
mod model;
mod options;
mod overflow;
mod partial;
mod provider;
mod providers;
pub mod ratelimit;
mod retry;
mod sse;
mod stream;
mod usage;
mod watchdog;

pub use breaker::{Admission, BreakerPolicy, BreakerStats, Breakers};
pub use context::{Context, ContextRef, Tool};
pub use decode::ResponseDecoder;
pub use embed::{EmbedPurpose, EmbeddingApi, EmbeddingModel, MAX_EMBED_TEXTS};
pub use error::StreamError;
pub use event::AssistantEvent;
pub use file::{
    FileContent, FileError, MAX_FILE_BYTES, MAX_FILE_NAME_BYTES, MAX_MESSAGE_FILE_BYTES,
    MAX_MESSAGE_FILES, media_type_of,
};
pub use http::use_thread_client;
pub use id::new_id;
pub use limits::{Limit, StreamLimits};
pub use message::{
    ArgumentsError, AssistantContent, AssistantMessage, Content, ImageContent, Message, StopReason,
    TextContent, ThinkingContent, ToolCall, ToolResultMessage, UserMessage, now_ms,
};
pub use model::{Api, Headers, InputKind, Model, ModelCost};
pub use options::{
    ApiKey, OutputSchema, StreamOptions, ThinkingBudgets, ThinkingLevel, ToolChoice, Transport,
    UnknownThinkingLevel,
};
pub use overflow::ContextOverflow;
pub use partial::{PartialMessage, StreamedMessage};
pub use provider::{
    AnthropicMessages, BedrockConverseStream, CustomProvider, GoogleGenerativeAi,
    OpenAiCompletions, OpenAiResponses, PiProxy, Provider, ProviderEvent,
};
pub use providers::path_segment;
pub use ratelimit::{RateLimitObserver, RateLimitWait, RateLimits};
pub use retry::RetryPolicy;
pub use stream::{AssistantStream, stream, stream_ref};
pub use tokio_util::sync::CancellationToken;
pub use usage::{Cost, Usage};

/// Takes `mutex`, a panic of another holder notwithstanding: the state behind
/// this crate's mutexes is whole after every change.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
