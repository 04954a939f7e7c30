//! pi's proxy endpoint: the request is `POST {proxy}/api/stream` with pi's body
//! (model by provider and id, the context in pi's camelCase form, borrowed from
//! Tiller's) and the proxy's token as a bearer token; the answer is pi's proxy
//! events, one per SSE `data:` line, whose `contentIndex` is mapped to the blocks
//! opened here. A `done` closes what is still open; an `error` fails the stream
//! with the proxy's message. pi's context has no files: a conversation with one is
//! refused.

use std::borrow::Cow;

use crate::builder::MessageBuilder;
use crate::context::ContextRef;
use crate::error::StreamError;
use crate::http::{self, HttpRequest};
use crate::model::Model;
use crate::options::{ApiKey, StreamOptions, ThinkingLevel};
use crate::pi::{PiContext, ProxyEvent, ProxyModel, ProxyOptions, ProxyRequest};
use crate::providers::{check_files, parse_data};
use crate::sse::{Flow, SseEvent};

/// The variable holding the proxy's token when the request gives none.
const TOKEN_ENV: &str = "TILLER_PROXY_TOKEN";

pub(crate) fn request(
    model: &Model,
    context: ContextRef<'_>,
    options: &StreamOptions,
) -> Result<HttpRequest, StreamError> {
    check_files(model, context, |_, _| false)?;
    let token = options
        .transport
        .api_key
        .clone()
        .or_else(|| ApiKey::from_env(TOKEN_ENV));
    let auth = token.map(|key| key.bearer());
    let body = ProxyRequest {
        model: ProxyModel {
            id: Cow::Borrowed(&model.id),
            provider: Cow::Borrowed(&model.provider),
            api: None,
        },
        context: PiContext::from_ref(context),
        options: ProxyOptions {
            temperature: options.temperature,
            max_tokens: options.max_tokens,
            reasoning: (options.thinking != ThinkingLevel::Off).then_some(options.thinking),
            session_id: options.session_id.clone(),
        },
    };
    http::post_json(model, "api/stream", &body, &[], auth, options)
}

/// What a block the proxy opened is, and its index here.
#[derive(Clone, Copy)]
enum Block {
    Text(usize),
    Thinking(usize),
    Tool(usize),
}

pub(crate) struct Decoder {
    provider: String,
    /// The blocks open now, by the proxy's `contentIndex`.
    open: Vec<(usize, Block)>,
    saw_event: bool,
}

impl Decoder {
    pub(crate) fn new(model: &Model) -> Self {
        Decoder {
            provider: model.provider.clone(),
            open: Vec::new(),
            saw_event: false,
        }
    }

    pub(crate) fn on_event(&mut self, event: SseEvent<'_>, out: &mut MessageBuilder) -> Flow {
        let event: ProxyEvent<'_> = parse_data(event.data)?;
        self.saw_event = true;
        match event {
            ProxyEvent::Start => {}
            ProxyEvent::TextStart { content_index } => {
                let block = Block::Text(out.text_start());
                self.opened(content_index, block);
            }
            ProxyEvent::ThinkingStart { content_index } => {
                let block = Block::Thinking(out.thinking_start(false));
                self.opened(content_index, block);
            }
            ProxyEvent::ToolcallStart {
                content_index,
                id,
                tool_name,
            } => {
                let block = Block::Tool(out.tool_call_start(&id, &tool_name));
                self.opened(content_index, block);
            }
            ProxyEvent::TextDelta {
                content_index,
                delta,
            }
            | ProxyEvent::ThinkingDelta {
                content_index,
                delta,
            }
            | ProxyEvent::ToolcallDelta {
                content_index,
                delta,
            } => match self.block(content_index)? {
                Block::Text(index) => out.text_delta(index, &delta),
                Block::Thinking(index) => out.thinking_delta(index, &delta),
                Block::Tool(index) => out.tool_call_delta(index, &delta),
            },
            ProxyEvent::TextEnd {
                content_index,
                content_signature,
            }
            | ProxyEvent::ThinkingEnd {
                content_index,
                content_signature,
            } => {
                let block = self.block(content_index)?;
                self.open.retain(|(at, _)| *at != content_index);
                close(out, block, content_signature.map(Cow::into_owned));
            }
            ProxyEvent::ToolcallEnd { content_index } => {
                let block = self.block(content_index)?;
                self.open.retain(|(at, _)| *at != content_index);
                close(out, block, None);
            }
            ProxyEvent::Done { reason, usage } => {
                for (_, block) in self.open.drain(..) {
                    close(out, block, None);
                }
                *out.usage_mut() = usage.into();
                out.finish(reason.into());
                return Ok(true);
            }
            ProxyEvent::Error {
                error_message,
                usage,
                ..
            } => {
                *out.usage_mut() = usage.into();
                return Err(StreamError::Provider {
                    provider: self.provider.clone(),
                    code: None,
                    message: error_message
                        .map_or_else(|| "the proxy reported an error".to_owned(), Cow::into_owned),
                });
            }
        }
        Ok(false)
    }

    /// The body ended before a `done` or `error`.
    pub(crate) fn on_end(&mut self, _out: &mut MessageBuilder) -> Result<(), StreamError> {
        Err(StreamError::Incomplete {
            message: if self.saw_event {
                "the proxy's stream ended without `done`".to_owned()
            } else {
                "the proxy closed the stream without sending any event".to_owned()
            },
        })
    }

    fn opened(&mut self, content_index: usize, block: Block) {
        self.open.retain(|(at, _)| *at != content_index);
        self.open.push((content_index, block));
    }

    /// The open block the proxy numbers `content_index`.
    fn block(&self, content_index: usize) -> Result<Block, StreamError> {
        self.open
            .iter()
            .find(|(at, _)| *at == content_index)
            .map(|(_, block)| *block)
            .ok_or_else(|| StreamError::Malformed {
                message: format!(
                    "the proxy sent an event for block {content_index}, which is not open"
                ),
            })
    }
}

fn close(out: &mut MessageBuilder, block: Block, signature: Option<String>) {
    match block {
        Block::Text(index) => out.text_end(index, signature),
        Block::Thinking(index) => out.thinking_end(index, signature),
        Block::Tool(index) => out.tool_call_end(index, false),
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use crate::message::{AssistantContent, StopReason};
    use crate::{Model, ResponseDecoder};

    /// The message `body` decodes to, and the error it ended with, if any.
    fn decode(body: &str) -> (Vec<AssistantContent>, StopReason, Option<String>) {
        let model = Model::pi_proxy("http://127.0.0.1:1", "openai", "m");
        let mut decoder = ResponseDecoder::new(&model).unwrap();
        decoder.feed(body.as_bytes());
        decoder.end();
        let message = decoder.message();
        (
            message.content.clone(),
            message.stop_reason,
            message.error_message.clone(),
        )
    }

    fn data(events: &[&str]) -> String {
        events
            .iter()
            .map(|event| format!("data: {event}\n\n"))
            .collect()
    }

    #[test]
    fn the_proxys_numbering_maps_to_the_blocks_opened_here() {
        let body = data(&[
            r#"{"type":"start"}"#,
            r#"{"type":"thinking_start","contentIndex":0}"#,
            r#"{"type":"thinking_delta","contentIndex":0,"delta":"hm"}"#,
            r#"{"type":"thinking_end","contentIndex":0,"contentSignature":"sig"}"#,
            r#"{"type":"toolcall_start","contentIndex":1,"id":"c1","toolName":"clock"}"#,
            r#"{"type":"toolcall_delta","contentIndex":1,"delta":"{\"zone\":"}"#,
            r#"{"type":"toolcall_delta","contentIndex":1,"delta":"\"UTC\"}"}"#,
            r#"{"type":"done","reason":"toolUse","usage":{"input":3,"output":4,"totalTokens":7}}"#,
        ]);
        let (content, stop, error) = decode(&body);
        assert_eq!(
            serde_json::to_value(&content).unwrap(),
            serde_json::json!([
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "tool_call", "id": "c1", "name": "clock", "arguments": {"zone": "UTC"}}
            ])
        );
        assert_eq!((stop, error), (StopReason::ToolUse, None));
    }

    #[test]
    fn errors_unopened_blocks_and_cut_streams_fail_the_answer() {
        let said = data(&[
            r#"{"type":"start"}"#,
            r#"{"type":"error","reason":"error","errorMessage":"upstream said no","usage":{}}"#,
        ]);
        let unopened = data(&[r#"{"type":"text_delta","contentIndex":4,"delta":"x"}"#]);
        let cut = data(&[
            r#"{"type":"start"}"#,
            r#"{"type":"text_start","contentIndex":0}"#,
        ]);
        let errors: Vec<_> = [said, unopened, cut]
            .iter()
            .map(|body| {
                let (_, stop, error) = decode(body);
                (stop, error.unwrap())
            })
            .collect();
        assert_eq!(
            errors,
            [
                (StopReason::Error, "openai reported an error: upstream said no".to_owned()),
                (
                    StopReason::Error,
                    "malformed stream: the proxy sent an event for block 4, which is not open"
                        .to_owned()
                ),
                (
                    StopReason::Error,
                    "the response ended before it was complete: the proxy's stream ended without `done`".to_owned()
                ),
            ]
        );
    }
}
