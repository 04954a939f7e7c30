//! A scripted provider for tests and demos.
//!
//! A [`FauxProvider`] holds a queue of [`FauxTurn`]s; each request to its
//! [`FauxProvider::model`] plays the next turn as a stream (text, thinking and tool
//! calls, cut into chunks with an optional delay per chunk, ending normally or with
//! an injected error) through the same event machinery as the real providers. When
//! the queue is empty, a responder function, if set, writes the turn from the
//! request. Every request is recorded, so a test can check what the model was sent.
//!
//! ```
//! use futures::StreamExt;
//! use tiller_ai::faux::{FauxProvider, FauxTurn};
//! use tiller_ai::{AssistantEvent, Context, Message, StreamOptions};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let faux = FauxProvider::new();
//! faux.push(FauxTurn::tool_call("lookup", serde_json::json!({"city": "Oslo"})));
//! let context = Context::new().with_message(Message::user("Weather in Oslo?"));
//! let message = tiller_ai::stream(&faux.model(), &context, &StreamOptions::default())
//!     .result()
//!     .await;
//! let call = message.tool_calls().next().unwrap();
//! assert_eq!(call.arguments["city"], "Oslo");
//! assert_eq!(faux.requests()[0].context, context);
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::lock;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Sleep;

use crate::builder::MessageBuilder;
use crate::context::{Context, ContextRef};
use crate::error::StreamError;
use crate::file::FileContent;
use crate::message::{AssistantContent, Content, Message, StopReason};
use crate::model::{Api, Headers, InputKind, Model, ModelCost};
use crate::options::{StreamOptions, ThinkingLevel, ToolChoice};
use crate::provider::{CustomProvider, Provider};
use crate::stream::AssistantStream;
use crate::usage::Usage;

type Responder = Box<dyn FnMut(&FauxRequest) -> FauxTurn + Send>;

/// A scripted model. Cheap to clone; clones share the script.
#[derive(Clone, Default)]
pub struct FauxProvider {
    state: Arc<FauxState>,
}

#[derive(Default)]
struct FauxState {
    script: Mutex<VecDeque<FauxTurn>>,
    responder: Mutex<Option<Responder>>,
    requests: Mutex<Vec<FauxRequest>>,
    next_call_id: AtomicU64,
}

impl FauxProvider {
    /// A provider with an empty script.
    pub fn new() -> Self {
        FauxProvider::default()
    }

    /// The model that plays this provider's script.
    pub fn model(&self) -> Model {
        Model {
            id: "faux".to_owned(),
            name: "Faux (scripted)".to_owned(),
            api: Api::Faux,
            provider: "faux".to_owned(),
            base_url: "faux://local".to_owned(),
            reasoning: true,
            input: vec![InputKind::Text, InputKind::Image],
            cost: ModelCost::default(),
            context_window: 128_000,
            max_tokens: 16_384,
            headers: Headers::default(),
            custom: Some(CustomProvider(Arc::new(Script(self.state.clone())))),
        }
    }

    /// Queues a turn for a later request.
    pub fn push(&self, turn: FauxTurn) -> &Self {
        lock(&self.state.script).push_back(turn);
        self
    }

    /// Answers requests that find the queue empty.
    pub fn respond_with(&self, responder: impl FnMut(&FauxRequest) -> FauxTurn + Send + 'static) {
        *lock(&self.state.responder) = Some(Box::new(responder));
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<FauxRequest> {
        lock(&self.state.requests).clone()
    }

    /// How many queued turns have not been played.
    pub fn remaining(&self) -> usize {
        lock(&self.state.script).len()
    }
}

/// A scripted model for first runs and demos: it streams, a few words at a time, a
/// reply that quotes the prompt, names the files sent with it, and says how to
/// reach a real provider.
pub fn demo_model() -> Model {
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        let prompt = request.last_user_text().unwrap_or_default();
        let files: Vec<String> = request
            .last_user_files()
            .map(|file| format!("{} ({}, {} bytes)", file.name, file.mime_type, file.size()))
            .collect();
        let attached = if files.is_empty() {
            String::new()
        } else {
            format!(" and attached {}", files.join(", "))
        };
        FauxTurn::text(format!(
            "You said: \"{prompt}\"{attached}. I am Tiller's scripted faux model, streaming this reply \
             in small chunks exactly as a real provider would. Set OPENAI_API_KEY, \
             ANTHROPIC_API_KEY or GEMINI_API_KEY, or point TILLER_BASE_URL at an \
             OpenAI-compatible server, to talk to a real model."
        ))
        .chunk_size(6)
        .delay(Duration::from_millis(15))
    });
    faux.model()
}

impl fmt::Debug for FauxProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FauxProvider")
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

/// The [`Provider`] of a faux [`Model`]: its provider's script.
struct Script(Arc<FauxState>);

impl Provider for Script {
    fn stream(
        &self,
        model: &Model,
        context: ContextRef<'_>,
        options: &StreamOptions,
    ) -> AssistantStream {
        // No native structured output here: the schema goes in the instructions.
        let instructed;
        let context = match &options.output_schema {
            Some(schema) => {
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
            None => context,
        };
        AssistantStream::scripted(model, options, FauxSource::start(&self.0, context, options))
    }
}

/// Whether a provider and a model name pick the faux model: provider `faux`, or
/// no provider and a model `faux` or `faux/…`.
pub fn is_named(provider: Option<&str>, model: Option<&str>) -> bool {
    let faux = |name: Option<&str>| name.is_some_and(|n| n == "faux" || n.starts_with("faux/"));
    faux(provider) || (provider.is_none() && faux(model))
}

/// What a faux model was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct FauxRequest {
    /// The context, as the model saw it.
    pub context: Context,
    /// The session id of the options.
    pub session_id: Option<String>,
    /// The thinking level of the options.
    pub thinking: ThinkingLevel,
    /// The output limit of the options.
    pub max_tokens: Option<u32>,
    /// The temperature of the options.
    pub temperature: Option<f32>,
    /// The tool choice of the options.
    pub tool_choice: Option<ToolChoice>,
}

impl FauxRequest {
    /// The text of the last user message, if the conversation ends with one.
    pub fn last_user_text(&self) -> Option<String> {
        match self.context.messages.last()? {
            Message::User(user) => Some(user.text_content()),
            _ => None,
        }
    }

    /// The files of the last user message, if the conversation ends with one.
    pub fn last_user_files(&self) -> impl Iterator<Item = &FileContent> {
        let content = match self.context.messages.last() {
            Some(Message::User(user)) => user.content.as_slice(),
            _ => &[],
        };
        content.iter().filter_map(|block| match block {
            Content::File(file) => Some(file),
            _ => None,
        })
    }
}

/// One scripted response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FauxTurn {
    blocks: Vec<FauxBlock>,
    chunk_size: usize,
    delay: Duration,
    failure: Option<StreamError>,
    stop_reason: Option<StopReason>,
    usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq)]
enum FauxBlock {
    Text(String),
    Thinking(String),
    ToolCall {
        id: Option<String>,
        name: String,
        arguments: String,
    },
}

impl FauxTurn {
    /// An empty turn.
    pub fn new() -> Self {
        FauxTurn::default()
    }

    /// A turn answering with `text`.
    pub fn text(text: impl Into<String>) -> Self {
        FauxTurn::new().with_text(text)
    }

    /// A turn calling one tool.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        FauxTurn::new().with_tool_call(name, arguments)
    }

    /// Adds a text block.
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.blocks.push(FauxBlock::Text(text.into()));
        self
    }

    /// Adds a thinking block.
    pub fn with_thinking(mut self, thinking: impl Into<String>) -> Self {
        self.blocks.push(FauxBlock::Thinking(thinking.into()));
        self
    }

    /// Adds a tool call with a generated id (`faux_call_1`, `faux_call_2`, … per provider).
    pub fn with_tool_call(self, name: impl Into<String>, arguments: Value) -> Self {
        self.push_call(None, name.into(), arguments.to_string())
    }

    /// Adds a tool call with the given id.
    pub fn with_tool_call_id(
        self,
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: Value,
    ) -> Self {
        self.push_call(Some(id.into()), name.into(), arguments.to_string())
    }

    /// Adds a tool call whose argument text is streamed exactly as given, valid JSON
    /// or not (to script malformed or truncated arguments).
    pub fn with_raw_tool_call(self, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        self.push_call(None, name.into(), arguments.into())
    }

    fn push_call(mut self, id: Option<String>, name: String, arguments: String) -> Self {
        self.blocks.push(FauxBlock::ToolCall {
            id,
            name,
            arguments,
        });
        self
    }

    /// Streams each block in deltas of at most `chars` characters (0: one delta per block).
    pub fn chunk_size(mut self, chars: usize) -> Self {
        self.chunk_size = chars;
        self
    }

    /// Waits this long before each delta.
    pub fn delay(mut self, per_chunk: Duration) -> Self {
        self.delay = per_chunk;
        self
    }

    /// Ends the stream with this error after the content, instead of normally.
    pub fn fail(mut self, message: impl Into<String>) -> Self {
        self.failure = Some(failure(&message.into()));
        self
    }

    /// Ends the stream with this error (a provider's refusal, say) after the
    /// content, instead of normally.
    pub fn fail_with(mut self, error: StreamError) -> Self {
        self.failure = Some(error);
        self
    }

    /// Ends with this stop reason instead of `stop` (or `tool_use` when the turn calls
    /// tools); `length` marks unparseable tool arguments as truncated.
    pub fn stop_reason(mut self, reason: StopReason) -> Self {
        self.stop_reason = Some(reason);
        self
    }

    /// Reports this usage instead of an estimate of four characters per token.
    pub fn usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }
}

/// A faux turn being played.
pub(crate) struct FauxSource {
    steps: VecDeque<Step>,
    delay: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    open: Option<(BlockKind, usize)>,
    ending: Ending,
    usage: Usage,
}

enum Step {
    Open(BlockKind),
    Delta(String),
    Close,
}

#[derive(Clone)]
enum BlockKind {
    Text,
    Thinking,
    ToolCall { id: String, name: String },
}

enum Ending {
    Finish(StopReason),
    Fail(StreamError),
}

/// A failure of the faux provider.
fn failure(message: &str) -> StreamError {
    StreamError::Provider {
        provider: "faux".to_owned(),
        code: None,
        message: message.to_owned(),
    }
}

impl FauxSource {
    fn start(
        state: &FauxState,
        context: ContextRef<'_>,
        options: &StreamOptions,
    ) -> Result<Self, StreamError> {
        let request = FauxRequest {
            context: context.to_context(),
            session_id: options.session_id.clone(),
            thinking: options.thinking,
            max_tokens: options.max_tokens,
            temperature: options.temperature,
            tool_choice: options.tool_choice.clone(),
        };
        let queued = lock(&state.script).pop_front();
        let turn = match queued {
            Some(turn) => Some(turn),
            None => lock(&state.responder)
                .as_mut()
                .map(|respond| respond(&request)),
        };
        let input_chars = context_chars(&request.context);
        lock(&state.requests).push(request);
        let turn = turn
            .ok_or_else(|| failure("no scripted turn left: push a FauxTurn or set a responder"))?;
        Ok(FauxSource::play(
            turn,
            state,
            input_chars,
            options.max_tokens,
        ))
    }

    /// The turn's steps; with `max_tokens`, its output cut at four characters a
    /// token, as a provider cuts an answer at its limit (stop reason `length`).
    fn play(
        turn: FauxTurn,
        state: &FauxState,
        input_chars: usize,
        max_tokens: Option<u32>,
    ) -> Self {
        let mut steps = VecDeque::new();
        let mut output_chars = 0;
        let mut calls = false;
        let mut room = max_tokens.map_or(usize::MAX, |max| (max as usize).saturating_mul(4));
        let mut cut = false;
        for block in turn.blocks {
            if cut {
                break;
            }
            let (kind, text) = match block {
                FauxBlock::Text(text) => (BlockKind::Text, text),
                FauxBlock::Thinking(text) => (BlockKind::Thinking, text),
                FauxBlock::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    calls = true;
                    let id = id.unwrap_or_else(|| {
                        let n = state.next_call_id.fetch_add(1, Ordering::Relaxed) + 1;
                        format!("faux_call_{n}")
                    });
                    (BlockKind::ToolCall { id, name }, arguments)
                }
            };
            let chars = text.chars().count();
            let text = if chars <= room {
                room -= chars;
                text
            } else if matches!(kind, BlockKind::ToolCall { .. }) || room == 0 {
                cut = true;
                continue;
            } else {
                cut = true;
                let kept: String = text.chars().take(room).collect();
                room = 0;
                kept
            };
            output_chars += text.chars().count();
            steps.push_back(Step::Open(kind));
            steps.extend(chunks(&text, turn.chunk_size).map(|c| Step::Delta(c.to_owned())));
            steps.push_back(Step::Close);
        }
        let ending = match (turn.failure, turn.stop_reason) {
            (Some(error), _) => Ending::Fail(error),
            (None, _) if cut => Ending::Finish(StopReason::Length),
            (None, Some(StopReason::Aborted)) => Ending::Fail(StreamError::Aborted),
            (None, Some(StopReason::Error)) => Ending::Fail(failure("scripted error")),
            (None, Some(reason)) => Ending::Finish(reason),
            (None, None) if calls => Ending::Finish(StopReason::ToolUse),
            (None, None) => Ending::Finish(StopReason::Stop),
        };
        let usage = turn.usage.unwrap_or(Usage {
            input: input_chars.div_ceil(4) as u64,
            output: output_chars.div_ceil(4) as u64,
            ..Usage::default()
        });
        FauxSource {
            steps,
            delay: turn.delay,
            sleep: None,
            open: None,
            ending,
            usage,
        }
    }

    /// Plays the next step: `Ready` once it has queued events, `Pending` while a
    /// chunk delay runs.
    pub(crate) fn poll(&mut self, cx: &mut TaskContext<'_>, out: &mut MessageBuilder) -> Poll<()> {
        let Some(step) = self.steps.front() else {
            *out.usage_mut() = self.usage;
            match std::mem::replace(&mut self.ending, Ending::Finish(StopReason::Stop)) {
                Ending::Finish(reason) => out.finish(reason),
                Ending::Fail(error) => out.fail(error),
            }
            return Poll::Ready(());
        };
        if matches!(step, Step::Delta(_)) && !self.delay.is_zero() {
            let delay = self.delay;
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        match self.steps.pop_front() {
            Some(Step::Open(kind)) => {
                let content_index = match &kind {
                    BlockKind::Text => out.text_start(),
                    BlockKind::Thinking => out.thinking_start(false),
                    BlockKind::ToolCall { id, name } => out.tool_call_start(id, name),
                };
                self.open = Some((kind, content_index));
            }
            Some(Step::Delta(delta)) => match &self.open {
                Some((BlockKind::Text, index)) => out.text_delta(*index, &delta),
                Some((BlockKind::Thinking, index)) => out.thinking_delta(*index, &delta),
                Some((BlockKind::ToolCall { .. }, index)) => out.tool_call_delta(*index, &delta),
                None => {}
            },
            Some(Step::Close) => match self.open.take() {
                Some((BlockKind::Text, index)) => out.text_end(index, None),
                Some((BlockKind::Thinking, index)) => out.thinking_end(index, None),
                Some((BlockKind::ToolCall { .. }, index)) => {
                    let cut_off = matches!(self.ending, Ending::Finish(StopReason::Length));
                    out.tool_call_end(index, cut_off);
                }
                None => {}
            },
            None => {}
        }
        Poll::Ready(())
    }
}

/// `text` in pieces of at most `size` characters; the whole text when `size` is 0.
fn chunks(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = match size {
            0 => rest.len(),
            _ => rest.char_indices().nth(size).map_or(rest.len(), |(i, _)| i),
        };
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// Characters of text the model was sent, for the usage estimate.
fn context_chars(context: &Context) -> usize {
    let text = |content: &[Content]| -> usize {
        content
            .iter()
            .map(|c| match c {
                Content::Text(t) => t.text.chars().count(),
                Content::Image(_) | Content::File(_) => 0,
            })
            .sum()
    };
    let messages: usize = context
        .messages
        .iter()
        .map(|message| match message {
            Message::User(user) => text(&user.content),
            Message::ToolResult(result) => text(&result.content),
            Message::Assistant(assistant) => assistant
                .content
                .iter()
                .map(|block| match block {
                    AssistantContent::Text(t) => t.text.chars().count(),
                    AssistantContent::Thinking(t) => t.thinking.chars().count(),
                    AssistantContent::ToolCall(call) => call.arguments.to_string().len(),
                })
                .sum(),
        })
        .sum();
    messages
        + context
            .system_prompt
            .as_deref()
            .map_or(0, |p| p.chars().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_character_boundaries() {
        assert_eq!(
            chunks("héllo wörld", 3).collect::<Vec<_>>(),
            ["hél", "lo ", "wör", "ld"]
        );
        assert_eq!(chunks("abc", 0).collect::<Vec<_>>(), ["abc"]);
        assert_eq!(chunks("", 2).count(), 0);
    }
}
