//! [`Provider`]: the seam between a request and the events of its answer. The
//! built-in dialects ([`OpenAiCompletions`], [`AnthropicMessages`]) implement it,
//! and so does the scripted [`FauxProvider`](crate::faux::FauxProvider); a host
//! adds its own — another API, a proxy or gateway in front of a built-in, a test
//! stub — and attaches it to a model with [`Model::with_custom_provider`]:
//!
//! ```
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use tiller_ai::{
//!     AssistantStream, Context, ContextRef, Model, Provider, ProviderEvent, StopReason,
//!     StreamOptions,
//! };
//!
//! /// Answers every request with the same words.
//! struct Canned;
//!
//! impl Provider for Canned {
//!     fn stream(&self, model: &Model, _: ContextRef<'_>, options: &StreamOptions) -> AssistantStream {
//!         let events = futures::stream::iter([
//!             ProviderEvent::Text("Hello".into()),
//!             ProviderEvent::Text(" there".into()),
//!             ProviderEvent::Done(StopReason::Stop),
//!         ]);
//!         AssistantStream::from_events(model, options, events)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let model = Model::openai_compatible("canned://", "canned").with_custom_provider(Arc::new(Canned));
//! let answer = tiller_ai::stream(&model, &Context::new(), &StreamOptions::default()).result().await;
//! assert_eq!(answer.text(), "Hello there");
//! # }
//! ```

use std::fmt;
use std::sync::Arc;

use crate::context::ContextRef;
use crate::message::StopReason;
use crate::model::Model;
use crate::options::StreamOptions;
use crate::stream::AssistantStream;
use crate::usage::Usage;

/// Produces a model's answer to a conversation as a stream of events.
pub trait Provider: Send + Sync + 'static {
    /// Starts the answer of `model` to `context`. The request is written before
    /// this returns, so nothing stays borrowed; failures are the stream's error
    /// event.
    fn stream(
        &self,
        model: &Model,
        context: ContextRef<'_>,
        options: &StreamOptions,
    ) -> AssistantStream;
}

/// A built-in provider over HTTP: its request is written by the dialect's
/// `request` module and its stream read by the shared HTTP source.
macro_rules! http_provider {
    ($(#[$doc:meta])* $name:ident => $dialect:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name;

        impl Provider for $name {
            fn stream(
                &self,
                model: &Model,
                context: ContextRef<'_>,
                options: &StreamOptions,
            ) -> AssistantStream {
                AssistantStream::over_http(
                    crate::providers::$dialect::request(model, context, options),
                    model,
                    options,
                )
            }
        }
    };
}

http_provider!(
    /// OpenAI chat completions over HTTP: OpenAI and every compatible server.
    OpenAiCompletions => openai
);
http_provider!(
    /// OpenAI's Responses API over HTTP.
    OpenAiResponses => openai_responses
);
http_provider!(
    /// Anthropic messages over HTTP.
    AnthropicMessages => anthropic
);
http_provider!(
    /// Google's Gemini API over HTTP.
    GoogleGenerativeAi => gemini
);
http_provider!(
    /// Amazon Bedrock's Converse API over HTTP.
    BedrockConverseStream => bedrock
);
http_provider!(
    /// pi's proxy endpoint over HTTP ([`Model::pi_proxy`]).
    PiProxy => pi_proxy
);

/// What a provider of its own reports, for [`AssistantStream::from_events`]. Text
/// and thinking pieces in a row make one block; the stream ends at `Done` or
/// `Failed` (or, without either, with an "incomplete" error).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProviderEvent {
    /// A piece of the answer's text.
    Text(String),
    /// A piece of the model's reasoning.
    Thinking(String),
    /// A whole tool call; `arguments` is its JSON text.
    ToolCall {
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments as JSON text.
        arguments: String,
    },
    /// Tokens (and cost) so far, replacing earlier counts.
    Usage(Usage),
    /// The answer is complete.
    Done(StopReason),
    /// The answer failed, with this message.
    Failed(String),
}

/// A provider attached to a model: compared by identity, shown by name only.
#[derive(Clone)]
pub struct CustomProvider(pub Arc<dyn Provider>);

impl PartialEq for CustomProvider {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for CustomProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CustomProvider")
    }
}
