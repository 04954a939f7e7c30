//! [`stream`]: one request to a model, as a stream of [`AssistantEvent`]s.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use futures::{FutureExt, Stream, StreamExt};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::breaker::{Admission, Breakers};
use crate::builder::MessageBuilder;
use crate::context::{Context, ContextRef};
use crate::decode::WireDecoder;
use crate::error::StreamError;
use crate::event::AssistantEvent;
use crate::faux::FauxSource;
use crate::http::{HttpRequest, HttpSource};
use crate::limits::millis;
use crate::message::{AssistantMessage, Message};
use crate::model::{Api, Model};
use crate::options::StreamOptions;
use crate::provider::{
    AnthropicMessages, BedrockConverseStream, GoogleGenerativeAi, OpenAiCompletions,
    OpenAiResponses, PiProxy, Provider, ProviderEvent,
};

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
/// so nothing stays borrowed. A model with a [custom provider](Model::with_custom_provider)
/// goes to it; the others to their API's built-in [`Provider`]. With
/// [`Transport::breakers`](crate::Transport::breakers), an endpoint whose circuit is open gets no request
/// (the stream fails at once with [`StreamError::CircuitOpen`]), and how the
/// response ends is recorded in its breaker.
pub fn stream_ref(
    model: &Model,
    context: ContextRef<'_>,
    options: &StreamOptions,
) -> AssistantStream {
    tracing::debug!(api = %model.api, provider = %model.provider, model = %model.id, "streaming a response");
    let Some(breakers) = &options.transport.breakers else {
        return dispatch(model, context, options);
    };
    let endpoint = Breakers::endpoint(model);
    let probe = match breakers.admit(&endpoint) {
        Admission::Go => false,
        Admission::Probe => true,
        Admission::Open { retry_in } => {
            let error = StreamError::CircuitOpen {
                endpoint,
                retry_in_ms: millis(retry_in),
            };
            return AssistantStream::failed(model, options, error);
        }
    };
    // Made first: should the provider panic, its drop lets the next probe in.
    let circuit = Circuit {
        breakers: breakers.clone(),
        endpoint,
        probe,
        recorded: false,
    };
    let mut stream = dispatch(model, context, options);
    stream.circuit = Some(circuit);
    stream
}

/// The stream of the provider that serves `model`.
fn dispatch(model: &Model, context: ContextRef<'_>, options: &StreamOptions) -> AssistantStream {
    if let Some(provider) = model.custom_provider() {
        return provider.stream(model, context, options);
    }
    match model.api {
        Api::OpenAiCompletions => OpenAiCompletions.stream(model, context, options),
        Api::OpenAiResponses => OpenAiResponses.stream(model, context, options),
        Api::AnthropicMessages => AnthropicMessages.stream(model, context, options),
        Api::GoogleGenerativeAi => GoogleGenerativeAi.stream(model, context, options),
        Api::BedrockConverseStream => BedrockConverseStream.stream(model, context, options),
        Api::PiProxy => PiProxy.stream(model, context, options),
        Api::Faux => AssistantStream::failed(
            model,
            options,
            StreamError::Provider {
                provider: model.provider.clone(),
                code: None,
                message: "this model has no script; make faux models with FauxProvider::model()"
                    .to_owned(),
            },
        ),
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
    /// The endpoint's breaker, told how the response ends.
    circuit: Option<Circuit>,
    cancel: CancellationToken,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

enum Source {
    Http(Box<HttpSource>),
    Faux(Box<FauxSource>),
    Events(Box<EventSource>),
    Finished,
}

impl AssistantStream {
    fn with_source(
        model: &Model,
        options: &StreamOptions,
        source: Result<Source, StreamError>,
    ) -> Self {
        let mut builder = MessageBuilder::new(model, &options.limits);
        let source = source.unwrap_or_else(|error| {
            builder.fail(error);
            Source::Finished
        });
        AssistantStream {
            builder,
            source,
            circuit: None,
            cancel: options.transport.cancel.clone(),
            cancelled: Box::pin(options.transport.cancel.clone().cancelled_owned()),
        }
    }

    /// A stream that ends at once with `error`.
    fn failed(model: &Model, options: &StreamOptions, error: StreamError) -> Self {
        Self::with_source(model, options, Err(error))
    }

    /// The answer to an HTTP request of a built-in dialect.
    pub(crate) fn over_http(
        request: Result<HttpRequest, StreamError>,
        model: &Model,
        options: &StreamOptions,
    ) -> Self {
        Self::with_source(model, options, http_source(request, model, options))
    }

    /// A faux model's scripted answer.
    pub(crate) fn scripted(
        model: &Model,
        options: &StreamOptions,
        source: Result<FauxSource, StreamError>,
    ) -> Self {
        let source = source.map(|source| Source::Faux(Box::new(source)));
        Self::with_source(model, options, source)
    }

    /// The answer a [`Provider`] of the host's reports as [`ProviderEvent`]s;
    /// the same limits, cancellation and event order apply as to the built-ins.
    pub fn from_events(
        model: &Model,
        options: &StreamOptions,
        events: impl Stream<Item = ProviderEvent> + Send + 'static,
    ) -> Self {
        let source = EventSource {
            events: Box::pin(events),
            open: None,
            provider: model.provider.clone(),
        };
        Self::with_source(model, options, Ok(Source::Events(Box::new(source))))
    }

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

    /// The response ended with `event`: its breaker and its account hear how.
    fn ended(&mut self, event: &AssistantEvent) {
        if let Some(circuit) = &mut self.circuit {
            match event {
                AssistantEvent::Error { error, .. } if error.is_unavailable() => {
                    circuit.record(true);
                }
                // The endpoint answered, if only to refuse.
                AssistantEvent::Error {
                    error: StreamError::Http { .. } | StreamError::RetryAfterTooLong { .. },
                    ..
                }
                | AssistantEvent::Done { .. } => circuit.record(false),
                // Aborted, or failed before or beside the endpoint (no key, a
                // request that could not be made, a limit): it says nothing.
                _ => {}
            }
        }
        if let Source::Http(source) = &mut self.source
            && let Some(ticket) = source.take_ticket()
        {
            let usage = &self.builder.message().usage;
            ticket.settle(usage.prompt_tokens(), usage.output);
        }
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
                if matches!(
                    event,
                    AssistantEvent::Done { .. } | AssistantEvent::Error { .. }
                ) {
                    this.ended(&event);
                }
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
                Source::Events(source) => source.poll(cx, &mut this.builder),
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

/// A response's place at its endpoint's breaker.
struct Circuit {
    breakers: Breakers,
    endpoint: String,
    /// Whether this call is the open breaker's probe.
    probe: bool,
    recorded: bool,
}

impl Circuit {
    fn record(&mut self, unavailable: bool) {
        self.recorded = true;
        self.breakers
            .record(&self.endpoint, unavailable, self.probe);
    }
}

impl Drop for Circuit {
    fn drop(&mut self) {
        if self.probe && !self.recorded {
            // A probe that said nothing either way: the next call probes.
            self.breakers.release(&self.endpoint);
        }
    }
}

/// A provider's [`ProviderEvent`]s, written into a message.
struct EventSource {
    events: Pin<Box<dyn Stream<Item = ProviderEvent> + Send>>,
    /// The text or thinking block being written, and its index.
    open: Option<(OpenBlock, usize)>,
    provider: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Text,
    Thinking,
}

impl EventSource {
    fn poll(&mut self, cx: &mut TaskContext<'_>, out: &mut MessageBuilder) -> Poll<()> {
        let Poll::Ready(event) = self.events.poll_next_unpin(cx) else {
            return Poll::Pending;
        };
        let Some(event) = event else {
            self.close(out);
            out.fail(StreamError::Incomplete {
                message: format!("the {} provider ended without a result", self.provider),
            });
            return Poll::Ready(());
        };
        match event {
            ProviderEvent::Text(text) => self.write(OpenBlock::Text, &text, out),
            ProviderEvent::Thinking(text) => self.write(OpenBlock::Thinking, &text, out),
            ProviderEvent::ToolCall {
                id,
                name,
                arguments,
            } => {
                self.close(out);
                if self.room(out) {
                    let index = out.tool_call_start(&id, &name);
                    out.tool_call_delta(index, &arguments);
                    out.tool_call_end(index, false);
                }
            }
            ProviderEvent::Usage(usage) => *out.usage_mut() = usage,
            ProviderEvent::Done(reason) => {
                self.close(out);
                out.finish(reason);
            }
            ProviderEvent::Failed(message) => {
                self.close(out);
                out.fail(StreamError::Provider {
                    provider: self.provider.clone(),
                    code: None,
                    message,
                });
            }
            // Kinds added later are for providers of later versions.
            #[allow(unreachable_patterns)]
            _ => {}
        }
        Poll::Ready(())
    }

    /// Whether one more block fits; if not, the answer fails.
    fn room(&mut self, out: &mut MessageBuilder) -> bool {
        let max = out.max_content_blocks();
        if out.message().content.len() < max {
            return true;
        }
        out.fail(crate::Limit::ContentBlocks.exceeded(max));
        false
    }

    fn write(&mut self, kind: OpenBlock, text: &str, out: &mut MessageBuilder) {
        let index = match self.open {
            Some((open, index)) if open == kind => index,
            _ => {
                self.close(out);
                if !self.room(out) {
                    return;
                }
                let index = match kind {
                    OpenBlock::Text => out.text_start(),
                    OpenBlock::Thinking => out.thinking_start(false),
                };
                self.open = Some((kind, index));
                index
            }
        };
        match kind {
            OpenBlock::Text => out.text_delta(index, text),
            OpenBlock::Thinking => out.thinking_delta(index, text),
        }
    }

    fn close(&mut self, out: &mut MessageBuilder) {
        match self.open.take() {
            Some((OpenBlock::Text, index)) => out.text_end(index, None),
            Some((OpenBlock::Thinking, index)) => out.thinking_end(index, None),
            None => {}
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
