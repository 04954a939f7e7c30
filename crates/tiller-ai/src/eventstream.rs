//! AWS's binary event stream (`application/vnd.amazon.eventstream`), decoded as
//! bytes arrive, by the maintained `aws-smithy-eventstream` crate (framing, header
//! types and both CRCs are its). Each message becomes the same borrowed event the
//! SSE decoder lends: its `:event-type` (or, for an exception, its
//! `:exception-type`) and its payload as text; an error message becomes an
//! `error` event whose message is its `:error-code` and `:error-message`.
//!
//! A message claiming more than the limit is [`StreamError::LimitExceeded`] as
//! soon as its prelude is read, before its bytes are buffered; a corrupt frame (a
//! bad CRC, say) is [`StreamError::Malformed`], and a body ending inside a frame
//! is [`StreamError::Incomplete`].

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use bytes::{Buf, BytesMut};

use crate::error::StreamError;
use crate::limits::Limit;
use crate::sse::{Flow, SseEvent};

/// The bytes before a message's headers: its total and header lengths and a CRC.
const PRELUDE_BYTES: usize = 12;

#[derive(Debug)]
pub(crate) struct EventStreamDecoder {
    max_bytes: usize,
    buffer: BytesMut,
    frames: MessageFrameDecoder,
    /// Whether the frame decoder holds the prelude of a message still arriving
    /// (taken out of `buffer`).
    in_frame: bool,
    done: bool,
}

impl EventStreamDecoder {
    /// A decoder accepting messages of at most `max_bytes`.
    pub(crate) fn new(max_bytes: usize) -> Self {
        EventStreamDecoder {
            max_bytes,
            buffer: BytesMut::new(),
            frames: MessageFrameDecoder::new(),
            in_frame: false,
            done: false,
        }
    }

    /// Decodes `chunk`, calling `on_event` for every message it completes, until
    /// the callback answers `true` (the response is complete) or fails.
    pub(crate) fn feed<F>(&mut self, chunk: &[u8], on_event: &mut F) -> Flow
    where
        F: FnMut(SseEvent<'_>) -> Flow,
    {
        if self.done {
            return Ok(true);
        }
        self.buffer.extend_from_slice(chunk);
        loop {
            let has_prelude = self.in_frame || self.buffer.len() >= PRELUDE_BYTES;
            if !self.in_frame && has_prelude {
                let claimed = u32::from_be_bytes([
                    self.buffer[0],
                    self.buffer[1],
                    self.buffer[2],
                    self.buffer[3],
                ]) as usize;
                if claimed > self.max_bytes {
                    return Err(Limit::EventBytes.exceeded(self.max_bytes));
                }
            }
            let frame = self
                .frames
                .decode_frame(&mut self.buffer)
                .map_err(|error| StreamError::Malformed {
                    message: format!("a broken event-stream frame: {error}"),
                })?;
            let DecodedFrame::Complete(message) = frame else {
                self.in_frame = has_prelude;
                return Ok(false);
            };
            self.in_frame = false;
            if dispatch(&message, on_event)? {
                self.done = true;
                return Ok(true);
            }
        }
    }

    /// The body ended: a frame left part-way is an incomplete response.
    pub(crate) fn finish<F>(&mut self, _on_event: &mut F) -> Flow
    where
        F: FnMut(SseEvent<'_>) -> Flow,
    {
        if self.done || (!self.in_frame && !self.buffer.has_remaining()) {
            return Ok(self.done);
        }
        let arrived = self.buffer.len() + if self.in_frame { PRELUDE_BYTES } else { 0 };
        Err(StreamError::Incomplete {
            message: format!(
                "the body ended inside an event-stream frame ({arrived} bytes of it arrived)"
            ),
        })
    }
}

/// Lends `message` as an event: named by its event type, or by its exception type.
fn dispatch<F>(message: &Message, on_event: &mut F) -> Flow
where
    F: FnMut(SseEvent<'_>) -> Flow,
{
    let header = |name: &str| {
        message
            .headers()
            .iter()
            .find(|header| header.name().as_str() == name)
            .and_then(|header| match header.value() {
                HeaderValue::String(value) => Some(value.as_str()),
                _ => None,
            })
    };
    if header(":message-type") == Some("error") {
        // An error message says what went wrong in its headers, not its payload.
        let code = header(":error-code").unwrap_or("error");
        let said = header(":error-message").unwrap_or("");
        let data = serde_json::json!({ "message": format!("{code}: {said}") }).to_string();
        return on_event(SseEvent {
            event: "error",
            data: &data,
        });
    }
    let event = match header(":message-type") {
        Some("exception") => header(":exception-type").unwrap_or("exception"),
        _ => header(":event-type").unwrap_or(""),
    };
    let data = std::str::from_utf8(message.payload()).map_err(|_| StreamError::Malformed {
        message: format!("the payload of the event-stream message `{event}` is not UTF-8"),
    })?;
    on_event(SseEvent { event, data })
}
