//! [`stream`]: one request to a model, as a stream of [`AssistantEvent`]s.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use futures::{FutureExt, Stream, StreamExt};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::builder::MessageBuilder;
use crate::context::{Context, ContextRef};
use crate::decode::WireDecoder;
use crate::error::StreamError;
use crate::event::AssistantEvent;
use crate::faux::FauxSource;
use crate::http::{HttpRequest, HttpSource};
use crate::message::{AssistantMessage, Message};
use crate::model::{Api, Model};
use crate::options::StreamOptions;
use crate::providers::{anthropic, openai};

/// Streams one response of `model` to `context`.
///
/// Never fails to return: a missing key, an unreachable server, an error status, a
/// broken or stalled stream and an abort all arrive as the stream's terminal
/// [`AssistantEvent::Error`], carrying the message as far as it got. The request is
/// made when the stream is first polled; dropping the stream cancels it.
///
/// Needs a Tokio runtime with I/O and time enabled.
pub fn stream(model: &Model, context: &Context, options: &StreamOptions) -> AssistantStream {
    let messages: Vec<&Message> = context.messages.iter().collect();
    stream_ref(
        model,
        ContextRef {
            system_prompt: context.system_prompt.as_deref(),
            messages: &messages,
            tools: &context.tools,
        },
        options,
    )
}

/// [`stream`] for a borrowed context; the request is written before this returns,
/// so nothing stays borrowed.
pub fn stream_ref(
    model: &Model,
    context: ContextRef<'_>,
    options: &StreamOptions,
) -> AssistantStream {
    tracing::debug!(api = %model.api, provider = %model.provider, model = %model.id, "streaming a response");
    let mut builder = MessageBuilder::new(model, &options.limits);
    // Where the API has no native structured output, the schema goes in the
    // instructions (Anthropic's answer comes as a forced tool call).
    let instructed;
    let context = match (&options.output_schema, model.api) {
        (Some(schema), Api::Faux) => {
            instructed = match context.system_prompt {
                Some(prompt) if !prompt.is_empty() => {
                    format!("{prompt}\n\n{}", schema.instructions())
                }
                _ => schema.instructions(),
            };
            ContextRef {
                system_prompt: Some(&instructed),
                ..context
            }
        }
        _ => context,
    };
    let source = match model.api {
        Api::OpenAiCompletions => {
            http_source(openai::request(model, context, options), model, options)
        }
        Api::AnthropicMessages => {
            http_source(anthropic::request(model, context, options), model, options)
        }
        Api::Faux => FauxSource::start(model, context, options).map(|s| Source::Faux(Box::new(s))),
    };
    let source = source.unwrap_or_else(|error| {
        builder.fail(error);
        Source::Finished
    });
    AssistantStream {
        builder,
        source,
        cancel: options.cancel.clone(),
        cancelled: Box::pin(options.cancel.clone().cancelled_owned()),
    }
}

fn http_source(
    request: Result<HttpRequest, StreamError>,
    model: &Model,
    options: &StreamOptions,
) -> Result<Source, StreamError> {
    let wire = WireDecoder::for_model(model)
        .ok_or_else(|| StreamError::InvalidRequest {
            message: format!("the {} API has no wire format", model.api),
        })?
        .with_output_tool(options.output_schema.as_ref().map(|o| o.name.as_str()));
    let source = HttpSource::start(request?, wire, options)?;
    Ok(Source::Http(Box::new(source)))
}

/// The events of one response; see [`stream`].
///
/// The message as it stands is always available from [`AssistantStream::partial`].
pub struct AssistantStream {
    builder: MessageBuilder,
    source: Source,
    cancel: CancellationToken,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

enum Source {
    Http(Box<HttpSource>),
    Faux(Box<FauxSource>),
    Finished,
}

impl AssistantStream {
    /// The message as it stands: everything received so far, or the final message
    /// once the terminal event has been produced.
    pub fn partial(&self) -> &AssistantMessage {
        self.builder.message()
    }

    /// Reads the stream to its end and returns the final message (with
    /// `error_message` set when it failed).
    pub async fn result(mut self) -> AssistantMessage {
        while self.next().await.is_some() {}
        self.builder.message().clone()
    }

    fn abort(&mut self) {
        self.source = Source::Finished;
        self.builder.fail(StreamError::Aborted);
    }
}

impl Stream for AssistantStream {
    type Item = AssistantEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<AssistantEvent>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.builder.next_event() {
                return Poll::Ready(Some(event));
            }
            if this.builder.is_finished() {
                this.source = Source::Finished;
                return Poll::Ready(None);
            }
            if this.cancel.is_cancelled() {
                this.abort();
                continue;
            }
            let progress = match &mut this.source {
                Source::Http(source) => source.poll(cx, &mut this.builder),
                Source::Faux(source) => source.poll(cx, &mut this.builder),
                Source::Finished => {
                    this.builder.fail(StreamError::Incomplete {
                        message: "the response source ended without a result".to_owned(),
                    });
                    Poll::Ready(())
                }
            };
            if progress.is_pending() {
                if this.cancelled.poll_unpin(cx).is_ready() {
                    this.abort();
                    continue;
                }
                return Poll::Pending;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_can_move_into_spawned_tasks() {
        fn sendable<T: Send + Unpin + 'static>() {}
        sendable::<AssistantStream>();
        sendable::<AssistantEvent>();
    }
}
