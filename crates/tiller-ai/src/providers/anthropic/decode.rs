//! Reading a messages stream.
//!
//! `message_start` (usage so far), `content_block_start/delta/stop` per block (text,
//! thinking with its `signature_delta`, redacted thinking, `tool_use` with
//! `input_json_delta` pieces), `message_delta` (stop reason, final usage),
//! `message_stop`, `ping` and `error`. Blocks of kinds Tiller does not model
//! (server tools, say) are skipped. Events are dispatched on the SSE `event:` name,
//! falling back to the data's `type` when a proxy drops the name. Block indexes are
//! the server's and are not trusted: they key a short list, never size a buffer,
//! and a response may open at most `max_content_blocks` blocks of any kind.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use crate::builder::MessageBuilder;
use crate::error::StreamError;
use crate::limits::Limit;
use crate::message::StopReason;
use crate::model::Model;
use crate::providers::parse_data;
use crate::sse::{Flow, SseEvent};

pub(crate) struct Decoder {
    provider: String,
    /// The blocks in the order they started, with Anthropic's index; `None` for
    /// skipped kinds.
    blocks: Vec<(u64, Option<Block>)>,
    /// Tool calls whose arguments did not parse at `content_block_stop`; closed once
    /// the stop reason says whether the token limit cut them off.
    unparsed_tool_calls: Vec<usize>,
    stop_reason: Option<String>,
    /// The tool whose input is a structured answer (see the request): its call is
    /// decoded as the answer's text.
    output_tool: Option<String>,
    /// Whether the response called a tool other than the output tool.
    called_tools: bool,
}

struct Block {
    content_index: usize,
    kind: BlockKind,
}

enum BlockKind {
    Text,
    Thinking {
        signature: Option<String>,
    },
    ToolUse {
        initial_input: Option<String>,
    },
    /// A call of the output tool, as text.
    Answer {
        initial_input: Option<String>,
    },
    Closed,
}

impl Decoder {
    pub(crate) fn new(model: &Model) -> Self {
        Decoder {
            provider: model.provider.clone(),
            blocks: Vec::new(),
            unparsed_tool_calls: Vec::new(),
            stop_reason: None,
            output_tool: None,
            called_tools: false,
        }
    }

    /// The same decoder reading calls of `tool` as the answer's text.
    pub(crate) fn with_output_tool(mut self, tool: &str) -> Self {
        self.output_tool = Some(tool.to_owned());
        self
    }

    pub(crate) fn on_event(&mut self, event: SseEvent<'_>, out: &mut MessageBuilder) -> Flow {
        let typed;
        let kind = if event.event.is_empty() || event.event == "message" {
            typed = parse_data::<Typed<'_>>(event.data)?;
            typed.kind.as_ref()
        } else {
            event.event
        };
        match kind {
            "message_start" => {
                let start: MessageStart = parse_data(event.data)?;
                start.message.usage.apply(out);
            }
            "content_block_start" => {
                let start: BlockStart<'_> = parse_data(event.data)?;
                self.block_start(start, out)?;
            }
            "content_block_delta" => {
                let delta: BlockDelta<'_> = parse_data(event.data)?;
                self.block_delta(delta, out);
            }
            "content_block_stop" => {
                let stop: BlockStop = parse_data(event.data)?;
                self.block_stop(stop.index, out);
            }
            "message_delta" => {
                let delta: MessageDelta<'_> = parse_data(event.data)?;
                if let Some(reason) = delta.delta.stop_reason {
                    self.stop_reason = Some(reason.into_owned());
                }
                if let Some(usage) = delta.usage {
                    usage.apply(out);
                }
                self.close_unparsed(out);
            }
            "message_stop" => {
                self.complete(out)?;
                return Ok(true);
            }
            "error" => {
                let error: ErrorEvent<'_> = parse_data(event.data)?;
                return Err(StreamError::Provider {
                    provider: self.provider.clone(),
                    code: error.error.kind.map(Cow::into_owned),
                    message: error
                        .error
                        .message
                        .map_or_else(|| event.data.to_owned(), Cow::into_owned),
                });
            }
            _ => {}
        }
        Ok(false)
    }

    pub(crate) fn on_end(&mut self, out: &mut MessageBuilder) -> Result<(), StreamError> {
        if self.stop_reason.is_some() {
            return self.complete(out);
        }
        Err(StreamError::Incomplete {
            message: if self.blocks.is_empty() {
                "the stream ended before any content".to_owned()
            } else {
                "the stream ended before `message_stop`".to_owned()
            },
        })
    }

    /// The block the server numbered `index`.
    fn block_mut(&mut self, index: u64) -> Option<&mut Block> {
        // Deltas go to the newest block almost always: search from the end.
        self.blocks
            .iter_mut()
            .rev()
            .find(|(at, _)| *at == index)
            .and_then(|(_, block)| block.as_mut())
    }

    fn block_start(
        &mut self,
        start: BlockStart<'_>,
        out: &mut MessageBuilder,
    ) -> Result<(), StreamError> {
        // Indexes count blocks from 0, so one at or past the limit means too many.
        let max = out.max_content_blocks();
        if self.blocks.len() >= max || start.index >= max as u64 {
            return Err(Limit::ContentBlocks.exceeded(max));
        }
        // A repeated index ends the block it had before the new one starts, so no
        // block is left open.
        self.block_stop(start.index, out);
        let block = start.content_block;
        let kind = match block.kind.as_ref() {
            "text" => {
                let content_index = out.text_start();
                if let Some(text) = block.text.filter(|t| !t.is_empty()) {
                    out.text_delta(content_index, &text);
                }
                Some((content_index, BlockKind::Text))
            }
            "thinking" => {
                let content_index = out.thinking_start(false);
                if let Some(thinking) = block.thinking.filter(|t| !t.is_empty()) {
                    out.thinking_delta(content_index, &thinking);
                }
                let signature = block
                    .signature
                    .filter(|s| !s.is_empty())
                    .map(Cow::into_owned);
                Some((content_index, BlockKind::Thinking { signature }))
            }
            "redacted_thinking" => {
                let content_index = out.thinking_start(true);
                let signature = block.data.map(Cow::into_owned);
                Some((content_index, BlockKind::Thinking { signature }))
            }
            "tool_use" => {
                // A call without an id gets one of its own: its id is the key a tool
                // may pass on to stay idempotent.
                let id = block
                    .id
                    .filter(|id| !id.is_empty())
                    .unwrap_or_else(|| Cow::Owned(crate::new_id()));
                let name = block.name.unwrap_or_default();
                let initial_input = block
                    .input
                    .filter(|input| input.as_object().is_some_and(|o| !o.is_empty()))
                    .map(|input| input.to_string());
                if self.output_tool.as_deref() == Some(name.as_ref()) {
                    let content_index = out.text_start();
                    Some((content_index, BlockKind::Answer { initial_input }))
                } else {
                    self.called_tools = true;
                    let content_index = out.tool_call_start(&id, &name);
                    Some((content_index, BlockKind::ToolUse { initial_input }))
                }
            }
            _ => None,
        };
        let slot = kind.map(|(content_index, kind)| Block {
            content_index,
            kind,
        });
        match self.blocks.iter_mut().find(|(at, _)| *at == start.index) {
            // A repeated index starts the block afresh; the old one ended above.
            Some((_, old)) => *old = slot,
            None => self.blocks.push((start.index, slot)),
        }
        Ok(())
    }

    fn block_delta(&mut self, delta: BlockDelta<'_>, out: &mut MessageBuilder) {
        let Some(block) = self.block_mut(delta.index) else {
            return;
        };
        let delta = delta.delta;
        match (&mut block.kind, delta.kind.as_ref()) {
            (BlockKind::Text, "text_delta") => {
                if let Some(text) = delta.text {
                    out.text_delta(block.content_index, &text);
                }
            }
            (BlockKind::Thinking { .. }, "thinking_delta") => {
                if let Some(thinking) = delta.thinking {
                    out.thinking_delta(block.content_index, &thinking);
                }
            }
            (BlockKind::Thinking { signature }, "signature_delta") => {
                if let Some(piece) = delta.signature {
                    signature.get_or_insert_default().push_str(&piece);
                }
            }
            (BlockKind::ToolUse { initial_input }, "input_json_delta") => {
                if let Some(json) = delta.partial_json.filter(|j| !j.is_empty()) {
                    *initial_input = None;
                    out.tool_call_delta(block.content_index, &json);
                }
            }
            (BlockKind::Answer { initial_input }, "input_json_delta") => {
                if let Some(json) = delta.partial_json.filter(|j| !j.is_empty()) {
                    *initial_input = None;
                    out.text_delta(block.content_index, &json);
                }
            }
            _ => {}
        }
    }

    fn block_stop(&mut self, index: u64, out: &mut MessageBuilder) {
        let Some(block) = self.block_mut(index) else {
            return;
        };
        let content_index = block.content_index;
        match std::mem::replace(&mut block.kind, BlockKind::Closed) {
            BlockKind::Text => out.text_end(content_index, None),
            BlockKind::Thinking { signature } => out.thinking_end(content_index, signature),
            BlockKind::ToolUse { initial_input } => {
                if let Some(input) = initial_input {
                    out.tool_call_delta(content_index, &input);
                }
                if !out.tool_call_end_if_complete(content_index) {
                    self.unparsed_tool_calls.push(content_index);
                }
            }
            BlockKind::Answer { initial_input } => {
                if let Some(input) = initial_input {
                    out.text_delta(content_index, &input);
                }
                out.text_end(content_index, None);
            }
            BlockKind::Closed => {}
        }
    }

    /// Closes tool calls left unparsed, now or at the end: truncated when the
    /// response hit its token limit, malformed otherwise.
    fn close_unparsed(&mut self, out: &mut MessageBuilder) {
        if self.stop_reason.is_none() {
            return;
        }
        let cut_off = self.stop_reason.as_deref() == Some("max_tokens");
        for content_index in self.unparsed_tool_calls.drain(..) {
            out.tool_call_end(content_index, cut_off);
        }
    }

    fn complete(&mut self, out: &mut MessageBuilder) -> Result<(), StreamError> {
        let reason = self
            .stop_reason
            .clone()
            .unwrap_or_else(|| "end_turn".to_owned());
        let cut_off = matches!(
            reason.as_str(),
            "max_tokens" | "model_context_window_exceeded"
        );
        let open: Vec<u64> = self.blocks.iter().map(|(index, _)| *index).collect();
        for index in open {
            self.block_stop(index, out);
        }
        self.stop_reason = Some(reason.clone());
        self.close_unparsed(out);
        let stop = match reason.as_str() {
            "end_turn" | "pause_turn" | "stop_sequence" => StopReason::Stop,
            _ if cut_off => StopReason::Length,
            // Only the output tool called: the answer is complete.
            "tool_use" if !self.called_tools && self.output_tool.is_some() => StopReason::Stop,
            "tool_use" => StopReason::ToolUse,
            "refusal" => {
                return Err(StreamError::Refused {
                    message: out.message().text(),
                });
            }
            other => {
                return Err(StreamError::UnknownStopReason {
                    reason: other.to_owned(),
                });
            }
        };
        out.finish(stop);
        Ok(())
    }
}

#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
struct MessageStart {
    message: StartedMessage,
}

#[derive(Deserialize)]
struct StartedMessage {
    #[serde(default)]
    usage: Usage,
}

#[derive(Deserialize)]
struct BlockStart<'a> {
    index: u64,
    #[serde(borrow)]
    content_block: ContentBlock<'a>,
}

/// Every block kind's fields in one flat struct, so no buffering is needed to
/// dispatch on `type`.
#[derive(Deserialize)]
struct ContentBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    data: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    input: Option<Value>,
}

#[derive(Deserialize)]
struct BlockDelta<'a> {
    index: u64,
    #[serde(borrow)]
    delta: DeltaBody<'a>,
}

#[derive(Deserialize)]
struct DeltaBody<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    partial_json: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct BlockStop {
    index: u64,
}

#[derive(Deserialize)]
struct MessageDelta<'a> {
    #[serde(borrow)]
    delta: StopDelta<'a>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct StopDelta<'a> {
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

/// Anthropic reports cached prompt tokens beside `input_tokens`, not inside it.
/// `message_delta` repeats the counts cumulatively; absent fields keep their value.
#[derive(Deserialize, Default)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    thinking_tokens: Option<u64>,
}

impl Usage {
    fn apply(self, out: &mut MessageBuilder) {
        let usage = out.usage_mut();
        let fields = [
            (self.input_tokens, &mut usage.input),
            (self.output_tokens, &mut usage.output),
            (self.cache_read_input_tokens, &mut usage.cache_read),
            (self.cache_creation_input_tokens, &mut usage.cache_write),
            (
                self.output_tokens_details.and_then(|d| d.thinking_tokens),
                &mut usage.reasoning,
            ),
        ];
        for (value, field) in fields {
            if let Some(value) = value {
                *field = value;
            }
        }
    }
}

#[derive(Deserialize)]
struct ErrorEvent<'a> {
    #[serde(borrow)]
    error: ErrorBody<'a>,
}

#[derive(Deserialize)]
struct ErrorBody<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}
