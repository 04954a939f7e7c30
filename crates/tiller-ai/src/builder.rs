//! The one place a response is assembled. Providers call the builder as their wire
//! format dictates; the builder turns each call into an [`AssistantEvent`], applies
//! it to the partial message and queues it for the consumer. After `finish` or
//! `fail` every call is ignored, so a stream has exactly one terminal event. A block
//! started past [`StreamLimits::max_content_blocks`] fails the response.

use std::collections::VecDeque;

use serde_json::{Map, Value};

use crate::error::StreamError;
use crate::event::AssistantEvent;
use crate::json;
use crate::limits::{Limit, StreamLimits};
use crate::message::{ArgumentsError, AssistantContent, AssistantMessage, StopReason, ToolCall};
use crate::model::{Model, ModelCost};
use crate::partial::PartialMessage;
use crate::usage::Usage;

pub(crate) struct MessageBuilder {
    partial: PartialMessage,
    events: VecDeque<AssistantEvent>,
    prices: ModelCost,
    max_content_blocks: usize,
    finished: bool,
}

impl MessageBuilder {
    /// A builder for a response of `model`, with its `start` event queued.
    pub(crate) fn new(model: &Model, limits: &StreamLimits) -> Self {
        let message = AssistantMessage::empty(model);
        let mut events = VecDeque::with_capacity(8);
        events.push_back(AssistantEvent::Start {
            message: Box::new(message.clone()),
        });
        MessageBuilder {
            partial: PartialMessage::new(message),
            events,
            prices: model.cost,
            max_content_blocks: limits.max_content_blocks,
            finished: false,
        }
    }

    pub(crate) fn message(&self) -> &AssistantMessage {
        self.partial.message()
    }

    pub(crate) fn next_event(&mut self) -> Option<AssistantEvent> {
        self.events.pop_front()
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    pub(crate) fn has_tool_calls(&self) -> bool {
        self.message().tool_calls().next().is_some()
    }

    fn emit(&mut self, event: AssistantEvent) {
        if !self.finished {
            self.partial.apply(&event);
            self.events.push_back(event);
        }
    }

    /// The index of a new block; past the limit, the response fails (and the
    /// index is never used, as every later call is ignored).
    fn next_index(&mut self) -> usize {
        let index = self.message().content.len();
        if index >= self.max_content_blocks {
            self.fail(Limit::ContentBlocks.exceeded(self.max_content_blocks));
        }
        index
    }

    /// The most content blocks a response may hold.
    pub(crate) fn max_content_blocks(&self) -> usize {
        self.max_content_blocks
    }

    pub(crate) fn text_start(&mut self) -> usize {
        let content_index = self.next_index();
        self.emit(AssistantEvent::TextStart { content_index });
        content_index
    }

    pub(crate) fn text_delta(&mut self, content_index: usize, delta: &str) {
        self.emit(AssistantEvent::TextDelta {
            content_index,
            delta: delta.to_owned(),
        });
    }

    pub(crate) fn text_end(&mut self, content_index: usize, signature: Option<String>) {
        self.emit(AssistantEvent::TextEnd {
            content_index,
            signature,
        });
    }

    pub(crate) fn thinking_start(&mut self, redacted: bool) -> usize {
        let content_index = self.next_index();
        self.emit(AssistantEvent::ThinkingStart {
            content_index,
            redacted,
        });
        content_index
    }

    pub(crate) fn thinking_delta(&mut self, content_index: usize, delta: &str) {
        self.emit(AssistantEvent::ThinkingDelta {
            content_index,
            delta: delta.to_owned(),
        });
    }

    pub(crate) fn thinking_end(&mut self, content_index: usize, signature: Option<String>) {
        self.emit(AssistantEvent::ThinkingEnd {
            content_index,
            signature,
        });
    }

    pub(crate) fn tool_call_start(&mut self, id: &str, name: &str) -> usize {
        let content_index = self.next_index();
        self.emit(AssistantEvent::ToolCallStart {
            content_index,
            id: id.to_owned(),
            name: name.to_owned(),
        });
        content_index
    }

    /// Names a tool call whose name arrived after its start.
    pub(crate) fn name_tool_call(&mut self, content_index: usize, name: &str) {
        if let Some(AssistantContent::ToolCall(call)) =
            self.partial.message_mut().content.get_mut(content_index)
            && call.name.is_empty()
        {
            call.name = name.to_owned();
        }
    }

    /// Attaches the provider's signature to a tool call before it ends (Gemini's
    /// thought signature, sent back with the call).
    pub(crate) fn sign_tool_call(&mut self, content_index: usize, signature: &str) {
        if let Some(AssistantContent::ToolCall(call)) =
            self.partial.message_mut().content.get_mut(content_index)
        {
            call.signature = Some(signature.to_owned());
        }
    }

    pub(crate) fn tool_call_delta(&mut self, content_index: usize, delta: &str) {
        self.emit(AssistantEvent::ToolCallDelta {
            content_index,
            delta: delta.to_owned(),
        });
    }

    /// Closes a tool call, parsing its arguments strictly. `cut_off` says the
    /// response hit its token limit, so unparseable arguments are truncated rather
    /// than malformed.
    pub(crate) fn tool_call_end(&mut self, content_index: usize, cut_off: bool) {
        self.close_tool_call(content_index, Some(cut_off));
    }

    /// Closes a tool call only if its arguments are complete JSON; says whether it did.
    pub(crate) fn tool_call_end_if_complete(&mut self, content_index: usize) -> bool {
        self.close_tool_call(content_index, None)
    }

    fn close_tool_call(&mut self, content_index: usize, cut_off: Option<bool>) -> bool {
        let Some(AssistantContent::ToolCall(call)) = self.message().content.get(content_index)
        else {
            return false;
        };
        let text = self.partial.argument_text(content_index).unwrap_or("");
        let parsed = json::parse_complete(text);
        if parsed.is_err() && cut_off.is_none() {
            return false;
        }
        let tool_call = finished_call(call, text, parsed, cut_off == Some(true));
        self.emit(AssistantEvent::ToolCallEnd {
            content_index,
            tool_call: Box::new(tool_call),
        });
        true
    }

    pub(crate) fn usage_mut(&mut self) -> &mut Usage {
        &mut self.partial.message_mut().usage
    }

    /// Ends the response normally.
    pub(crate) fn finish(&mut self, reason: StopReason) {
        if self.finished {
            return;
        }
        let message = self.partial.message_mut();
        message.stop_reason = reason;
        message.usage.price(&self.prices);
        self.finished = true;
        self.events.push_back(AssistantEvent::Done {
            reason,
            message: Box::new(message.clone()),
        });
    }

    /// Ends the response with an error, keeping what arrived. Tool calls still
    /// streaming are closed as truncated.
    pub(crate) fn fail(&mut self, error: StreamError) {
        if self.finished {
            return;
        }
        for (content_index, text) in self.partial.take_open_arguments() {
            if let Some(AssistantContent::ToolCall(call)) =
                self.partial.message_mut().content.get_mut(content_index)
            {
                **call = finished_call(call, &text, json::parse_complete(&text), true);
            }
        }
        let reason = if error == StreamError::Aborted {
            StopReason::Aborted
        } else {
            StopReason::Error
        };
        let message = self.partial.message_mut();
        message.stop_reason = reason;
        message.error_message = Some(error.to_string());
        message.usage.price(&self.prices);
        self.finished = true;
        self.events.push_back(AssistantEvent::Error {
            reason,
            error,
            message: Box::new(message.clone()),
        });
    }
}

fn finished_call(
    call: &ToolCall,
    text: &str,
    parsed: Result<Value, String>,
    cut_off: bool,
) -> ToolCall {
    let (arguments, arguments_error) = match parsed {
        Ok(arguments) => (arguments, None),
        Err(error) => {
            let received = text.to_owned();
            let problem = if cut_off {
                ArgumentsError::Truncated { received }
            } else {
                ArgumentsError::Malformed { received, error }
            };
            (Value::Object(Map::new()), Some(problem))
        }
    };
    ToolCall {
        id: call.id.clone(),
        name: call.name.clone(),
        arguments,
        arguments_error,
        signature: call.signature.clone(),
    }
}
