//! Reading a `converse-stream` response: AWS event-stream messages named
//! `messageStart`, `contentBlockStart` (a tool use's id and name), `contentBlockDelta`
//! (text, tool input as pieces of JSON, reasoning text, its signature or redacted
//! content), `contentBlockStop`, `messageStop` (the stop reason) and `metadata`
//! (usage), which ends the response. An exception message
//! (`throttlingException`, `validationException`, `modelStreamErrorException`, …)
//! ends it with the provider's error. Block indexes are the server's and are not
//! trusted: they key a short list, never size a buffer.

use std::borrow::Cow;

use serde::Deserialize;

use crate::builder::MessageBuilder;
use crate::error::StreamError;
use crate::message::StopReason;
use crate::model::Model;
use crate::providers::parse_data;
use crate::sse::{Flow, SseEvent};

pub(crate) struct Decoder {
    provider: String,
    /// The open blocks, with Bedrock's index (a closed block is dropped).
    blocks: Vec<Block>,
    stop_reason: Option<String>,
    /// The tool whose input is a structured answer (see the request): its call is
    /// decoded as the answer's text.
    output_tool: Option<String>,
    /// Whether the response called a tool other than the output tool.
    called_tools: bool,
}

struct Block {
    index: u64,
    content_index: usize,
    kind: Kind,
}

#[derive(PartialEq)]
enum Kind {
    Text,
    /// Reasoning, with its signature (for redacted reasoning, its encrypted data).
    Thinking {
        signature: Option<String>,
        redacted: bool,
    },
    ToolUse,
    /// A call of the output tool, read as text.
    Answer,
}

impl Decoder {
    pub(crate) fn new(model: &Model) -> Self {
        Decoder {
            provider: model.provider.clone(),
            blocks: Vec::new(),
            stop_reason: None,
            output_tool: None,
            called_tools: false,
        }
    }

    /// The same decoder, reading calls of the tool `name` as the answer's text.
    pub(crate) fn with_output_tool(mut self, name: &str) -> Self {
        self.output_tool = Some(name.to_owned());
        self
    }

    pub(crate) fn on_event(&mut self, event: SseEvent<'_>, out: &mut MessageBuilder) -> Flow {
        match event.event {
            "messageStart" => {}
            "contentBlockStart" => {
                let start: BlockStart<'_> = parse_data(event.data)?;
                if let Some(tool) = start.start.and_then(|s| s.tool_use) {
                    self.close(start.content_block_index, out);
                    let (content_index, kind) =
                        if self.output_tool.as_deref() == Some(tool.name.as_ref()) {
                            (out.text_start(), Kind::Answer)
                        } else {
                            self.called_tools = true;
                            (
                                out.tool_call_start(&tool.tool_use_id, &tool.name),
                                Kind::ToolUse,
                            )
                        };
                    self.blocks.push(Block {
                        index: start.content_block_index,
                        content_index,
                        kind,
                    });
                }
            }
            "contentBlockDelta" => {
                let delta: BlockDelta<'_> = parse_data(event.data)?;
                self.delta(delta, out);
            }
            "contentBlockStop" => {
                let stop: BlockStop = parse_data(event.data)?;
                self.close(stop.content_block_index, out);
            }
            "messageStop" => {
                let stop: MessageStop<'_> = parse_data(event.data)?;
                self.stop_reason = Some(stop.stop_reason.into_owned());
            }
            "metadata" => {
                let metadata: Metadata = parse_data(event.data)?;
                if let Some(usage) = metadata.usage {
                    usage.apply(out);
                }
                if self.stop_reason.is_some() {
                    self.complete(out)?;
                    return Ok(true);
                }
            }
            name if name.ends_with("Exception") || name == "error" => {
                let error: ErrorBody<'_> = parse_data(event.data).unwrap_or_default();
                return Err(StreamError::Provider {
                    provider: self.provider.clone(),
                    code: Some(name.to_owned()),
                    message: error
                        .message
                        .map_or_else(|| event.data.to_owned(), Cow::into_owned),
                });
            }
            _ => {}
        }
        Ok(false)
    }

    /// The body ended: complete if the stop reason came (the usage may not).
    pub(crate) fn on_end(&mut self, out: &mut MessageBuilder) -> Result<(), StreamError> {
        if self.stop_reason.is_some() {
            return self.complete(out);
        }
        Err(StreamError::Incomplete {
            message: "the stream ended without a stop reason".to_owned(),
        })
    }

    fn delta(&mut self, delta: BlockDelta<'_>, out: &mut MessageBuilder) {
        let index = delta.content_block_index;
        let Some(delta) = delta.delta else {
            return;
        };
        if let Some(text) = delta.text {
            let content_index = self.open(index, Kind::Text, out);
            if !text.is_empty() {
                out.text_delta(content_index, &text);
            }
        }
        if let Some(tool) = delta.tool_use
            && !tool.input.is_empty()
            && let Some(block) = self
                .blocks
                .iter()
                .find(|b| b.index == index && matches!(b.kind, Kind::ToolUse | Kind::Answer))
        {
            if block.kind == Kind::Answer {
                out.text_delta(block.content_index, &tool.input);
            } else {
                out.tool_call_delta(block.content_index, &tool.input);
            }
        }
        if let Some(reasoning) = delta.reasoning_content {
            let redacted = reasoning.redacted_content.is_some();
            let kind = Kind::Thinking {
                signature: None,
                redacted,
            };
            let content_index = self.open(index, kind, out);
            if let Some(text) = reasoning.text.filter(|t| !t.is_empty()) {
                out.thinking_delta(content_index, &text);
            }
            let piece = reasoning.signature.or(reasoning.redacted_content);
            if let Some(piece) = piece
                && let Some(block) = self.blocks.iter_mut().find(|b| b.index == index)
                && let Kind::Thinking { signature, .. } = &mut block.kind
            {
                signature.get_or_insert_default().push_str(&piece);
            }
        }
    }

    /// The open block at `index` of `kind`, started if there is none.
    fn open(&mut self, index: u64, kind: Kind, out: &mut MessageBuilder) -> usize {
        let same_kind = |b: &Block| match (&b.kind, &kind) {
            (Kind::Thinking { .. }, Kind::Thinking { .. }) => true,
            (a, b) => a == b,
        };
        if let Some(block) = self
            .blocks
            .iter()
            .find(|b| b.index == index && same_kind(b))
        {
            return block.content_index;
        }
        self.close(index, out);
        let content_index = match kind {
            Kind::Thinking { redacted, .. } => out.thinking_start(redacted),
            _ => out.text_start(),
        };
        self.blocks.push(Block {
            index,
            content_index,
            kind,
        });
        content_index
    }

    /// Closes the open block at `index`, if any.
    fn close(&mut self, index: u64, out: &mut MessageBuilder) {
        if let Some(at) = self.blocks.iter().position(|b| b.index == index) {
            end(self.blocks.remove(at), out, false);
        }
    }

    fn complete(&mut self, out: &mut MessageBuilder) -> Result<(), StreamError> {
        let reason = self.stop_reason.take().unwrap_or_default();
        let cut_off = reason == "max_tokens";
        for block in std::mem::take(&mut self.blocks) {
            end(block, out, cut_off);
        }
        let stop = match reason.as_str() {
            "end_turn" | "stop_sequence" if out.has_tool_calls() => StopReason::ToolUse,
            "end_turn" | "stop_sequence" => StopReason::Stop,
            // Only the output tool called: the answer is complete.
            "tool_use" if !self.called_tools && self.output_tool.is_some() => StopReason::Stop,
            "tool_use" => StopReason::ToolUse,
            "max_tokens" | "model_context_window_exceeded" => StopReason::Length,
            "guardrail_intervened" | "content_filtered" => {
                return Err(StreamError::ContentFiltered);
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

fn end(block: Block, out: &mut MessageBuilder, cut_off: bool) {
    match block.kind {
        Kind::Text | Kind::Answer => out.text_end(block.content_index, None),
        Kind::Thinking { signature, .. } => out.thinking_end(block.content_index, signature),
        Kind::ToolUse => out.tool_call_end(block.content_index, cut_off),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStart<'a> {
    #[serde(default)]
    content_block_index: u64,
    #[serde(default, borrow)]
    start: Option<Start<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Start<'a> {
    #[serde(default, borrow)]
    tool_use: Option<ToolUseStart<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolUseStart<'a> {
    #[serde(borrow)]
    tool_use_id: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockDelta<'a> {
    #[serde(default)]
    content_block_index: u64,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Delta<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_use: Option<ToolUseDelta<'a>>,
    #[serde(default, borrow)]
    reasoning_content: Option<ReasoningDelta<'a>>,
}

#[derive(Deserialize)]
struct ToolUseDelta<'a> {
    #[serde(default, borrow)]
    input: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReasoningDelta<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    redacted_content: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStop {
    #[serde(default)]
    content_block_index: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageStop<'a> {
    #[serde(borrow)]
    stop_reason: Cow<'a, str>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Usage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_write_input_tokens: u64,
}

impl Usage {
    /// Bedrock counts cached tokens apart from the input, as Anthropic does.
    fn apply(self, out: &mut MessageBuilder) {
        let usage = out.usage_mut();
        usage.input = self.input_tokens;
        usage.output = self.output_tokens;
        usage.cache_read = self.cache_read_input_tokens;
        usage.cache_write = self.cache_write_input_tokens;
    }
}

#[derive(Deserialize, Default)]
struct ErrorBody<'a> {
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}
