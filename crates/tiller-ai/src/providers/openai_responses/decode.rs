//! Reading a Responses stream.
//!
//! Typed events, each naming its output item by `output_index`: an item is added
//! (a `message`, a `reasoning` item or a `function_call`), grows by deltas (output
//! text and refusals per content part, reasoning summary or reasoning text,
//! function-call arguments) and is done, whole. The stream ends with
//! `response.completed`, `response.incomplete` (the token limit, a content filter)
//! or `response.failed`; an `error` event ends it too. Items of kinds Tiller does
//! not model (built-in tools' calls) are skipped.
//!
//! What a later request must carry back rides on the blocks as their signature: a
//! message's item id on its text, a function call's item id on the call (its
//! `call_id` is the call's id, which results answer), and the whole reasoning item
//! (with its `encrypted_content`) on the thinking, as compact JSON.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use crate::builder::MessageBuilder;
use crate::error::StreamError;
use crate::message::StopReason;
use crate::model::Model;
use crate::providers::parse_data;
use crate::sse::{Flow, SseEvent};

pub(crate) struct Decoder {
    provider: String,
    /// The open blocks of the output items, in the order they started (a closed
    /// block is dropped).
    blocks: Vec<Block>,
    refusal: Option<String>,
    saw_event: bool,
}

/// A block of the message, with the output item (and content part) it reads.
struct Block {
    output_index: u64,
    /// The content part of a message item; the summary part of a reasoning item.
    part: u64,
    content_index: usize,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Thinking,
    Call { streamed: bool },
}

impl Decoder {
    pub(crate) fn new(model: &Model) -> Self {
        Decoder {
            provider: model.provider.clone(),
            blocks: Vec::new(),
            refusal: None,
            saw_event: false,
        }
    }

    pub(crate) fn on_event(&mut self, event: SseEvent<'_>, out: &mut MessageBuilder) -> Flow {
        let event: Event<'_> = parse_data(event.data.trim())?;
        self.saw_event = true;
        match event.kind.as_ref() {
            "response.output_item.added" => {
                if let Some(item) = event.item {
                    self.item_added(event.output_index, item, out);
                }
            }
            "response.content_part.added"
                if event.part.is_some_and(|part| {
                    matches!(part.kind.as_ref(), "output_text" | "refusal")
                }) =>
            {
                let content_index = out.text_start();
                self.blocks.push(Block {
                    output_index: event.output_index,
                    part: event.content_index,
                    content_index,
                    kind: Kind::Text,
                });
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let delta = event.delta.unwrap_or_default();
                if event.kind == "response.refusal.delta" {
                    self.refusal.get_or_insert_default().push_str(&delta);
                }
                if let Some(block) = self.block(event.output_index, event.content_index, Kind::Text)
                    && !delta.is_empty()
                {
                    out.text_delta(block.content_index, &delta);
                }
            }
            "response.reasoning_summary_part.added" if event.summary_index > 0 => {
                if let Some(block) = self.block(event.output_index, 0, Kind::Thinking) {
                    out.thinking_delta(block.content_index, "\n\n");
                }
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                let delta = event.delta.unwrap_or_default();
                if let Some(block) = self.block(event.output_index, 0, Kind::Thinking)
                    && !delta.is_empty()
                {
                    out.thinking_delta(block.content_index, &delta);
                }
            }
            "response.function_call_arguments.delta" => {
                let delta = event.delta.unwrap_or_default();
                if let Some(block) = self.call(event.output_index)
                    && !delta.is_empty()
                {
                    block.kind = Kind::Call { streamed: true };
                    out.tool_call_delta(block.content_index, &delta);
                }
            }
            "response.output_item.done" => {
                if let Some(item) = event.item {
                    self.item_done(event.output_index, item, out);
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = event.response.unwrap_or_default();
                if let Some(usage) = response.usage {
                    usage.apply(out);
                }
                self.complete(response.incomplete_details, out)?;
                return Ok(true);
            }
            "response.failed" => {
                let response = event.response.unwrap_or_default();
                if let Some(usage) = response.usage {
                    usage.apply(out);
                }
                let error = response.error.unwrap_or_default();
                return Err(self.provider_error(error));
            }
            "error" => {
                // The error's fields, at the top or (in newer streams) nested.
                let nested = event.error.unwrap_or_default();
                return Err(self.provider_error(ErrorBody {
                    code: event.code.or(nested.code),
                    message: event.message.or(nested.message),
                }));
            }
            _ => {}
        }
        Ok(false)
    }

    pub(crate) fn on_end(&mut self, _out: &mut MessageBuilder) -> Result<(), StreamError> {
        let message = if self.saw_event {
            "the stream ended before the response was completed"
        } else {
            "the server closed the stream without sending any event"
        };
        Err(StreamError::Incomplete {
            message: message.to_owned(),
        })
    }

    fn item_added(&mut self, output_index: u64, item: Item, out: &mut MessageBuilder) {
        let (content_index, kind) = match item.kind() {
            "reasoning" => (out.thinking_start(false), Kind::Thinking),
            "function_call" => {
                let id = match item.text("call_id").filter(|id| !id.is_empty()) {
                    Some(id) => Cow::Borrowed(id),
                    None => Cow::Owned(crate::new_id()),
                };
                let name = item.text("name").unwrap_or("");
                (
                    out.tool_call_start(&id, name),
                    Kind::Call { streamed: false },
                )
            }
            _ => return,
        };
        self.blocks.push(Block {
            output_index,
            part: 0,
            content_index,
            kind,
        });
    }

    fn item_done(&mut self, output_index: u64, item: Item, out: &mut MessageBuilder) {
        match item.kind() {
            "message" => {
                let (ended, open): (Vec<Block>, Vec<Block>) = std::mem::take(&mut self.blocks)
                    .into_iter()
                    .partition(|b| b.output_index == output_index && b.kind == Kind::Text);
                self.blocks = open;
                for block in ended {
                    out.text_end(block.content_index, item.text("id").map(str::to_owned));
                }
            }
            "reasoning" => {
                if let Some(block) =
                    self.take(|b| b.output_index == output_index && b.kind == Kind::Thinking)
                {
                    out.thinking_end(block.content_index, Some(item.0.to_string()));
                }
            }
            "function_call" => {
                let Some(block) = self.take(|b| {
                    b.output_index == output_index && matches!(b.kind, Kind::Call { .. })
                }) else {
                    return;
                };
                let content_index = block.content_index;
                if block.kind == (Kind::Call { streamed: false })
                    && let Some(arguments) = item.text("arguments").filter(|a| !a.is_empty())
                {
                    out.tool_call_delta(content_index, arguments);
                }
                if let Some(id) = item.text("id") {
                    out.sign_tool_call(content_index, id);
                }
                out.tool_call_end(content_index, false);
            }
            _ => {}
        }
    }

    /// The open block of `kind` reading `output_index`'s part `part`.
    fn block(&mut self, output_index: u64, part: u64, kind: Kind) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .find(|b| b.output_index == output_index && b.part == part && b.kind == kind)
    }

    /// The open function call of `output_index`.
    fn call(&mut self, output_index: u64) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .find(|b| b.output_index == output_index && matches!(b.kind, Kind::Call { .. }))
    }

    /// Takes out the first open block `which` picks, as it closes.
    fn take(&mut self, which: impl Fn(&Block) -> bool) -> Option<Block> {
        let at = self.blocks.iter().position(which)?;
        Some(self.blocks.remove(at))
    }

    fn complete(
        &mut self,
        incomplete: Option<IncompleteDetails<'_>>,
        out: &mut MessageBuilder,
    ) -> Result<(), StreamError> {
        let reason = incomplete.and_then(|details| details.reason);
        let cut_off = reason.as_deref() == Some("max_output_tokens");
        // Blocks a done item did not close (a cut-off response) close here.
        for block in std::mem::take(&mut self.blocks) {
            match block.kind {
                Kind::Text => out.text_end(block.content_index, None),
                Kind::Thinking => out.thinking_end(block.content_index, None),
                Kind::Call { .. } => out.tool_call_end(block.content_index, cut_off),
            }
        }
        if let Some(refusal) = self.refusal.take() {
            return Err(StreamError::Refused { message: refusal });
        }
        let stop = match reason.as_deref() {
            None if out.has_tool_calls() => StopReason::ToolUse,
            None => StopReason::Stop,
            Some("max_output_tokens") => StopReason::Length,
            Some("content_filter") => return Err(StreamError::ContentFiltered),
            Some(other) => {
                return Err(StreamError::UnknownStopReason {
                    reason: other.to_owned(),
                });
            }
        };
        out.finish(stop);
        Ok(())
    }

    fn provider_error(&self, error: ErrorBody<'_>) -> StreamError {
        StreamError::Provider {
            provider: self.provider.clone(),
            code: error.code.map(Cow::into_owned),
            message: error
                .message
                .map_or_else(|| "the response failed".to_owned(), Cow::into_owned),
        }
    }
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    output_index: u64,
    #[serde(default)]
    content_index: u64,
    #[serde(default)]
    summary_index: u64,
    #[serde(default, borrow)]
    delta: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    part: Option<ContentPart<'a>>,
    #[serde(default)]
    item: Option<Item>,
    #[serde(default, borrow)]
    response: Option<Response<'a>>,
    #[serde(default, borrow)]
    code: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    error: Option<ErrorBody<'a>>,
}

#[derive(Deserialize)]
struct ContentPart<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

/// An output item, whole: a reasoning item goes back as it came.
#[derive(Deserialize)]
#[serde(transparent)]
struct Item(Value);

impl Item {
    fn text(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    fn kind(&self) -> &str {
        self.text("type").unwrap_or_default()
    }
}

#[derive(Deserialize, Default)]
struct Response<'a> {
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, borrow)]
    incomplete_details: Option<IncompleteDetails<'a>>,
    #[serde(default, borrow)]
    error: Option<ErrorBody<'a>>,
}

#[derive(Deserialize)]
struct IncompleteDetails<'a> {
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct ErrorBody<'a> {
    #[serde(default, borrow)]
    code: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: u64,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: u64,
}

impl Usage {
    /// As in chat completions: cached tokens are counted inside the input, and
    /// reasoning tokens inside the output; each is counted once here.
    fn apply(self, out: &mut MessageBuilder) {
        let cached = self.input_tokens_details.map_or(0, |d| d.cached_tokens);
        let usage = out.usage_mut();
        usage.input = self.input_tokens.saturating_sub(cached);
        usage.cache_read = cached;
        usage.output = self.output_tokens;
        usage.reasoning = self.output_tokens_details.map_or(0, |d| d.reasoning_tokens);
    }
}
