//! Server-sent events, decoded as bytes arrive.
//!
//! A push decoder: feed it each network chunk and it calls back once per complete
//! event, lending the event's type and data. Lines split across chunks are carried
//! over; nothing else is copied, and the buffers are reused from event to event, so
//! decoding allocates nothing once warm. (`eventsource-stream` re-buffers the whole
//! remaining chunk for every line and can only be pulled as a `Stream`; the replay
//! decoder and the benchmarks need to push bytes synchronously.)
//!
//! Per the SSE format: lines end in `\n` or `\r\n`; `:` starts a comment; `data`
//! lines of one event join with `\n`; an empty line ends an event. Leniently, an
//! event still open when the body ends is delivered too.
//!
//! A line longer than the limit, or an event whose joined data would be, is
//! [`StreamError::LimitExceeded`]: a broken server cannot grow the buffers forever.

use crate::error::StreamError;
use crate::limits::Limit;

/// One event, borrowed from the decoder until the callback returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SseEvent<'a> {
    /// The `event:` field; empty when the server sent none.
    pub(crate) event: &'a str,
    /// The joined `data:` lines.
    pub(crate) data: &'a str,
}

/// Whether the consumer wants more events.
pub(crate) type Flow = Result<bool, StreamError>;

#[derive(Debug)]
pub(crate) struct SseDecoder {
    /// The longest line, and the most data of one event.
    max_bytes: usize,
    /// An incomplete line carried from the previous chunk.
    line: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
    started: bool,
    done: bool,
}

impl SseDecoder {
    /// A decoder accepting lines and events of at most `max_bytes`.
    pub(crate) fn new(max_bytes: usize) -> Self {
        SseDecoder {
            max_bytes,
            line: Vec::new(),
            event: String::new(),
            data: String::new(),
            has_data: false,
            started: false,
            done: false,
        }
    }

    /// Decodes `chunk`, calling `on_event` for every event it completes, until the
    /// callback answers `true` (the response is complete) or fails.
    pub(crate) fn feed<F>(&mut self, mut chunk: &[u8], on_event: &mut F) -> Flow
    where
        F: FnMut(SseEvent<'_>) -> Flow,
    {
        if self.done {
            return Ok(true);
        }
        if !self.started && !chunk.is_empty() {
            self.started = true;
            chunk = chunk.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(chunk);
        }
        if !self.line.is_empty() {
            let Some(end) = memchr::memchr(b'\n', chunk) else {
                return self.carry(chunk);
            };
            let mut line = std::mem::take(&mut self.line);
            line.extend_from_slice(&chunk[..end]);
            let flow = self.line_done(&line, on_event);
            line.clear();
            self.line = line;
            if self.stop(flow)? {
                return Ok(true);
            }
            chunk = &chunk[end + 1..];
        }
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', chunk) {
            let flow = self.line_done(&chunk[start..end], on_event);
            if self.stop(flow)? {
                return Ok(true);
            }
            start = end + 1;
        }
        self.carry(&chunk[start..])
    }

    /// The body ended: delivers a last line and event left open without their
    /// terminators.
    pub(crate) fn finish<F>(&mut self, on_event: &mut F) -> Flow
    where
        F: FnMut(SseEvent<'_>) -> Flow,
    {
        if self.done {
            return Ok(true);
        }
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            let flow = self.line_done(&line, on_event);
            if self.stop(flow)? {
                return Ok(true);
            }
        }
        let flow = self.line_done(b"", on_event);
        self.stop(flow)
    }

    fn stop(&mut self, flow: Flow) -> Flow {
        let done = flow?;
        self.done = done;
        Ok(done)
    }

    fn carry(&mut self, rest: &[u8]) -> Flow {
        if self.line.len() + rest.len() > self.max_bytes {
            return Err(self.too_large());
        }
        self.line.extend_from_slice(rest);
        Ok(false)
    }

    fn too_large(&self) -> StreamError {
        Limit::EventBytes.exceeded(self.max_bytes)
    }

    fn line_done<F>(&mut self, line: &[u8], on_event: &mut F) -> Flow
    where
        F: FnMut(SseEvent<'_>) -> Flow,
    {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > self.max_bytes {
            return Err(self.too_large());
        }
        if line.is_empty() {
            return self.dispatch(on_event);
        }
        if line[0] == b':' {
            return Ok(false);
        }
        let line = std::str::from_utf8(line).map_err(|error| StreamError::Malformed {
            message: format!("the event stream is not valid UTF-8: {error}"),
        })?;
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.data.len() + value.len() + 1 > self.max_bytes {
                    return Err(self.too_large());
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => {
                self.event.clear();
                self.event.push_str(value);
            }
            _ => {}
        }
        Ok(false)
    }

    fn dispatch<F>(&mut self, on_event: &mut F) -> Flow
    where
        F: FnMut(SseEvent<'_>) -> Flow,
    {
        let flow = if self.has_data {
            on_event(SseEvent {
                event: &self.event,
                data: &self.data,
            })
        } else {
            Ok(false)
        };
        self.event.clear();
        self.data.clear();
        self.has_data = false;
        flow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(chunks: &[&[u8]]) -> Vec<(String, String)> {
        let mut decoder = SseDecoder::new(1024);
        let mut events = Vec::new();
        let mut collect = |event: SseEvent<'_>| {
            events.push((event.event.to_owned(), event.data.to_owned()));
            Ok(false)
        };
        for chunk in chunks {
            decoder.feed(chunk, &mut collect).unwrap();
        }
        decoder.finish(&mut collect).unwrap();
        events
    }

    fn pair(event: &str, data: &str) -> (String, String) {
        (event.to_owned(), data.to_owned())
    }

    #[test]
    fn events_fields_and_comments() {
        let body = b"\xEF\xBB\xBF: comment\nevent: ping\ndata: {\"a\":1}\n\ndata: x\ndata: y\nid: 3\nretry: 10\n\ndata\n\n";
        assert_eq!(
            decode(&[body]),
            vec![pair("ping", "{\"a\":1}"), pair("", "x\ny"), pair("", "")]
        );
    }

    #[test]
    fn crlf_and_lines_split_anywhere() {
        let body: &[u8] = b"event: a\r\ndata: one\r\n\r\ndata: two\r\n\r\n";
        let whole = decode(&[body]);
        assert_eq!(whole, vec![pair("a", "one"), pair("", "two")]);
        for split in 0..body.len() {
            assert_eq!(
                decode(&[&body[..split], &body[split..]]),
                whole,
                "split at {split}"
            );
        }
    }

    #[test]
    fn an_unterminated_last_event_is_delivered() {
        assert_eq!(decode(&[b"data: [DONE]"]), vec![pair("", "[DONE]")]);
        assert_eq!(decode(&[b"data: [DONE]\n"]), vec![pair("", "[DONE]")]);
    }

    #[test]
    fn the_consumer_can_stop_early() {
        let mut decoder = SseDecoder::new(1024);
        let mut seen = 0;
        let done = decoder
            .feed(b"data: 1\n\ndata: 2\n\ndata: 3\n\n", &mut |_| {
                seen += 1;
                Ok(seen == 2)
            })
            .unwrap();
        assert!(done);
        assert_eq!(seen, 2);
    }

    #[test]
    fn lines_and_events_past_the_limit_are_typed_errors() {
        let too_large = StreamError::LimitExceeded {
            limit: Limit::EventBytes,
            max: 16,
        };
        let mut decoder = SseDecoder::new(16);
        let long_line = [b'a'; 17];
        assert_eq!(
            decoder.feed(&long_line, &mut |_| Ok(false)),
            Err(too_large.clone())
        );
        let mut decoder = SseDecoder::new(16);
        let many_lines = b"data: 0123456\ndata: 0123456\ndata: 0123456\n";
        assert_eq!(
            decoder.feed(many_lines, &mut |_| Ok(false)),
            Err(too_large.clone())
        );
        let mut decoder = SseDecoder::new(16);
        let whole_line = b"data: 0123456789abcdef\n";
        assert_eq!(decoder.feed(whole_line, &mut |_| Ok(false)), Err(too_large));
    }

    #[test]
    fn invalid_utf8_is_malformed() {
        let mut decoder = SseDecoder::new(1024);
        let err = decoder
            .feed(b"data: \xff\xfe\n\n", &mut |_| Ok(false))
            .unwrap_err();
        assert!(matches!(err, StreamError::Malformed { .. }), "{err:?}");
    }
}
