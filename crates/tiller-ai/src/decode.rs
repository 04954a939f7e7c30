//! From response bytes to assistant events, without I/O.
//!
//! [`BodyDecoder`] pairs the framing (SSE, or AWS's binary event stream for
//! Bedrock) with the provider's wire decoder and feeds a [`MessageBuilder`]; the HTTP stream drives it as bytes arrive, and
//! [`ResponseDecoder`] exposes the same path for recorded bodies (replays, tests,
//! benchmarks).

use crate::builder::MessageBuilder;
use crate::error::StreamError;
use crate::event::AssistantEvent;
use crate::eventstream::EventStreamDecoder;
use crate::limits::StreamLimits;
use crate::message::AssistantMessage;
use crate::model::{Api, Model};
use crate::providers::{anthropic, bedrock, gemini, openai, openai_responses, pi_proxy};
use crate::sse::{Flow, SseDecoder, SseEvent};

/// A provider's reading of its event stream.
pub(crate) enum WireDecoder {
    OpenAi(openai::Decoder),
    OpenAiResponses(openai_responses::Decoder),
    Anthropic(anthropic::Decoder),
    Gemini(gemini::Decoder),
    Bedrock(bedrock::Decoder),
    PiProxy(pi_proxy::Decoder),
}

impl WireDecoder {
    /// The decoder for `model`'s API; `None` for APIs without a wire format.
    pub(crate) fn for_model(model: &Model) -> Option<Self> {
        match model.api {
            Api::OpenAiCompletions => Some(WireDecoder::OpenAi(openai::Decoder::new(model))),
            Api::OpenAiResponses => Some(WireDecoder::OpenAiResponses(
                openai_responses::Decoder::new(model),
            )),
            Api::AnthropicMessages => Some(WireDecoder::Anthropic(anthropic::Decoder::new(model))),
            Api::GoogleGenerativeAi => Some(WireDecoder::Gemini(gemini::Decoder::new(model))),
            Api::BedrockConverseStream => Some(WireDecoder::Bedrock(bedrock::Decoder::new(model))),
            Api::PiProxy => Some(WireDecoder::PiProxy(pi_proxy::Decoder::new(model))),
            Api::Faux => None,
        }
    }

    /// The same decoder, for a request whose structured answer comes as a call of
    /// the tool `name` (Anthropic's and Bedrock's way; the others' is plain text).
    pub(crate) fn with_output_tool(self, name: Option<&str>) -> Self {
        match (self, name) {
            (WireDecoder::Anthropic(decoder), Some(name)) => {
                WireDecoder::Anthropic(decoder.with_output_tool(name))
            }
            (WireDecoder::Bedrock(decoder), Some(name)) => {
                WireDecoder::Bedrock(decoder.with_output_tool(name))
            }
            (decoder, _) => decoder,
        }
    }

    /// Handles one event; `Ok(true)` once the response is complete.
    fn on_event(&mut self, event: SseEvent<'_>, out: &mut MessageBuilder) -> Flow {
        match self {
            WireDecoder::OpenAi(decoder) => decoder.on_event(event, out),
            WireDecoder::OpenAiResponses(decoder) => decoder.on_event(event, out),
            WireDecoder::Anthropic(decoder) => decoder.on_event(event, out),
            WireDecoder::Gemini(decoder) => decoder.on_event(event, out),
            WireDecoder::Bedrock(decoder) => decoder.on_event(event, out),
            WireDecoder::PiProxy(decoder) => decoder.on_event(event, out),
        }
    }

    /// The body ended before the decoder saw the end of the response.
    fn on_end(&mut self, out: &mut MessageBuilder) -> Result<(), StreamError> {
        match self {
            WireDecoder::OpenAi(decoder) => decoder.on_end(out),
            WireDecoder::OpenAiResponses(decoder) => decoder.on_end(out),
            WireDecoder::Anthropic(decoder) => decoder.on_end(out),
            WireDecoder::Gemini(decoder) => decoder.on_end(out),
            WireDecoder::Bedrock(decoder) => decoder.on_end(out),
            WireDecoder::PiProxy(decoder) => decoder.on_end(out),
        }
    }
}

/// How a body is cut into events.
enum Framing {
    Sse(SseDecoder),
    EventStream(EventStreamDecoder),
}

impl Framing {
    fn feed<F>(&mut self, bytes: &[u8], on_event: &mut F) -> Flow
    where
        F: FnMut(SseEvent<'_>) -> Flow,
    {
        match self {
            Framing::Sse(sse) => sse.feed(bytes, on_event),
            Framing::EventStream(frames) => frames.feed(bytes, on_event),
        }
    }

    fn finish<F>(&mut self, on_event: &mut F) -> Flow
    where
        F: FnMut(SseEvent<'_>) -> Flow,
    {
        match self {
            Framing::Sse(sse) => sse.finish(on_event),
            Framing::EventStream(frames) => frames.finish(on_event),
        }
    }
}

/// The framing's and the provider's wire decoding of one response body.
pub(crate) struct BodyDecoder {
    framing: Framing,
    wire: WireDecoder,
    events: u64,
}

impl BodyDecoder {
    pub(crate) fn new(wire: WireDecoder, limits: &StreamLimits) -> Self {
        let framing = match wire {
            WireDecoder::Bedrock(_) => {
                Framing::EventStream(EventStreamDecoder::new(limits.max_event_bytes))
            }
            _ => Framing::Sse(SseDecoder::new(limits.max_event_bytes)),
        };
        BodyDecoder {
            framing,
            wire,
            events: 0,
        }
    }

    /// How many SSE events have been decoded (comments are not events).
    pub(crate) fn events(&self) -> u64 {
        self.events
    }

    /// Decodes the next bytes of the body into `out`.
    pub(crate) fn feed(&mut self, bytes: &[u8], out: &mut MessageBuilder) {
        if out.is_finished() {
            return;
        }
        let (wire, events) = (&mut self.wire, &mut self.events);
        let mut on_event = |event: SseEvent<'_>| {
            *events += 1;
            // A builder that failed on its own (a limit) ends the body too.
            Ok(wire.on_event(event, out)? || out.is_finished())
        };
        if let Err(error) = self.framing.feed(bytes, &mut on_event) {
            out.fail(error);
        }
    }

    /// The body ended cleanly: finishes the response or explains what is missing.
    pub(crate) fn end(&mut self, out: &mut MessageBuilder) {
        if out.is_finished() {
            return;
        }
        let wire = &mut self.wire;
        let result = self
            .framing
            .finish(&mut |event| wire.on_event(event, out))
            .and_then(|complete| if complete { Ok(()) } else { wire.on_end(out) });
        if let Err(error) = result {
            out.fail(error);
        }
    }
}

/// Decodes a recorded response body of an OpenAI (chat or Responses), Anthropic,
/// Gemini or Bedrock stream into the
/// events a live stream would yield.
///
/// ```
/// use tiller_ai::{AssistantEvent, Model, ResponseDecoder};
/// let model = Model::openai_compatible("http://localhost/v1", "m");
/// let mut decoder = ResponseDecoder::new(&model).unwrap();
/// decoder.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n");
/// decoder.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
/// decoder.end();
/// let events: Vec<AssistantEvent> = std::iter::from_fn(|| decoder.next_event()).collect();
/// assert!(matches!(events.last(), Some(AssistantEvent::Done { .. })));
/// assert_eq!(decoder.message().text(), "Hi");
/// ```
pub struct ResponseDecoder {
    body: BodyDecoder,
    builder: MessageBuilder,
}

impl ResponseDecoder {
    /// A decoder for a response of `model` under the default [`StreamLimits`];
    /// `None` for the faux API, which has no wire format. The `start` event is
    /// already queued.
    pub fn new(model: &Model) -> Option<Self> {
        Self::with_limits(model, &StreamLimits::default())
    }

    /// A decoder for a response of `model` under `limits` (the body-size limit is
    /// the HTTP layer's and does not apply here).
    pub fn with_limits(model: &Model, limits: &StreamLimits) -> Option<Self> {
        Some(ResponseDecoder {
            body: BodyDecoder::new(WireDecoder::for_model(model)?, limits),
            builder: MessageBuilder::new(model, limits),
        })
    }

    /// Decodes the next bytes of the body. Bytes after the end of the response are ignored.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.body.feed(bytes, &mut self.builder);
    }

    /// Marks the end of the body; a response still incomplete ends with an error event.
    pub fn end(&mut self) {
        self.body.end(&mut self.builder);
    }

    /// The next decoded event, if any is ready.
    pub fn next_event(&mut self) -> Option<AssistantEvent> {
        self.builder.next_event()
    }

    /// The message as decoded so far.
    pub fn message(&self) -> &AssistantMessage {
        self.builder.message()
    }

    /// Whether the terminal event has been produced.
    pub fn is_finished(&self) -> bool {
        self.builder.is_finished()
    }
}
