//! Compaction: keeping a long conversation inside the model's context window.
//!
//! **Counting.** Every message has a token count ([`estimate_tokens`]): an
//! assistant message whose provider reported usage counts what the provider
//! said; any other message is estimated at one token per four bytes of its text,
//! tool calls' names and arguments included, 1,200 tokens per image, a document
//! as text of its size and audio by [`AUDIO_BYTES_PER_TOKEN`]. A
//! [`ContextTokens`] keeps the running total of a transcript: the usage of the
//! last response (the provider's own count of everything it was sent, system
//! prompt and tools included, plus its answer) and the estimates of the messages
//! since. Adding a message costs O(1); nothing re-counts the transcript.
//!
//! **When.** Before each model call, when the total passes
//! `context_window − reserve_tokens` ([`CompactionPolicy`]), the oldest messages
//! are replaced by a summary; and when the provider refuses a request as longer
//! than its window (each dialect's form, see
//! [`StreamError::context_overflow`](tiller_ai::StreamError::context_overflow)),
//! the run compacts once and asks again. A second refusal ends the run with
//! [`RunEnd::ContextOverflow`](crate::RunEnd::ContextOverflow).
//!
//! **What.** The most recent `keep_recent_tokens` stay as they are. The cut is
//! made before a user or an assistant message, so a tool call is never
//! separated from its result, and never after a call that waits for the user, so
//! a parked question stays. The summary — written by the agent's own model with
//! [`DEFAULT_INSTRUCTIONS`], by another model, or by a host function
//! ([`RunHooks::summarize`](crate::RunHooks::summarize)) — becomes a custom
//! message of kind [`COMPACTION_KIND`] whose payload ([`CompactionSummary`])
//! says which stored messages it replaces. The model reads it as a user message.
//!
//! **Where.** A store keeps every message; the summary is appended after them,
//! followed by copies of the kept messages, so the transcript the model sees is
//! always the stored transcript from the last summary on. The summary and its
//! copies are written together, in one transaction: a compaction is in the store
//! whole or not at all.

use std::borrow::Cow;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tiller_ai::{
    AssistantContent, Content, Context, FileContent, Message, Model, StopReason, StreamOptions,
    UserMessage,
};
use tokio_util::sync::CancellationToken;

use crate::failure::BoxError;
use crate::message::{AgentMessage, CustomMessage};
use crate::request::open_requests;

/// The custom message kind of a compaction's summary.
pub const COMPACTION_KIND: &str = "compaction";

/// What the summarizing model is told by default.
pub const DEFAULT_INSTRUCTIONS: &str = "You write the memory of a long conversation between a user and an AI assistant. \
Summarize the conversation you are given so that the assistant can carry on without it: the user's goals and \
requests, decisions made, facts learned (names, numbers, files, results of tool calls), questions still open and \
what was being worked on last. Keep an earlier summary's content. Write plain prose or short bullet points, no \
preamble.";

/// The summarizer's instructions `base` with what a user asked of this summary
/// (`/compact keep the warehouse numbers`) added.
pub fn with_request(base: &str, asked: &str) -> String {
    format!(
        "{base}\n\nFor this summary, the user also asks: {}",
        asked.trim()
    )
}

/// Tokens counted for an image.
pub const IMAGE_TOKENS: u64 = 1_200;

/// Bytes of audio counted as one token: about 32 tokens a second of 16 kHz,
/// 16-bit WAV, as Gemini counts audio.
pub const AUDIO_BYTES_PER_TOKEN: u64 = 1_000;

/// When and how a transcript is compacted. Serializes as an agent file's
/// `compaction:` block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionPolicy {
    /// Whether the transcript is compacted when it fills the window and when the
    /// provider says it does. Off, an overflow ends the run. Default on.
    pub enabled: bool,
    /// Tokens left free for the model's answer: compaction starts once the
    /// transcript passes `context_window − reserve_tokens`. At most a quarter of
    /// the window is reserved. Default 16,384.
    pub reserve_tokens: u32,
    /// Tokens of the most recent messages kept as they are. At most a quarter of
    /// the window. Default 20,000.
    pub keep_recent_tokens: u32,
    /// The longest summary, in tokens; at most an eighth of the window. Default
    /// 2,048.
    pub summary_max_tokens: u32,
    /// What the summarizing model is told in place of [`DEFAULT_INSTRUCTIONS`].
    /// (A manual compaction's instructions are added to these, never put in
    /// their place: see [`with_request`].)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// The named LLM configuration that writes the summaries in place of the
    /// agent's own model; the host resolves the name into
    /// [`RunHooks::summarize`](crate::RunHooks::summarize).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm: Option<String>,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            enabled: true,
            reserve_tokens: 16_384,
            keep_recent_tokens: 20_000,
            summary_max_tokens: 2_048,
            instructions: None,
            llm: None,
        }
    }
}

impl CompactionPolicy {
    /// The most tokens the transcript may hold before a model call on a window of
    /// `window` tokens.
    pub fn threshold(&self, window: u32) -> u64 {
        u64::from(window) - u64::from(self.reserve_tokens.min(window / 4))
    }

    /// The tokens of recent messages kept on a window of `window` tokens.
    pub fn keep_tokens(&self, window: u32) -> u64 {
        u64::from(self.keep_recent_tokens.min(window / 4))
    }

    /// The longest summary on a window of `window` tokens.
    pub fn summary_tokens(&self, window: u32) -> u32 {
        self.summary_max_tokens.min(window / 8).max(1)
    }
}

/// Why a compaction ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CompactionReason {
    /// The transcript passed `context_window − reserve_tokens`.
    Threshold,
    /// The provider refused the request as longer than its window.
    Overflow,
    /// Asked for ([`Prompt::Compact`](crate::Prompt::Compact)).
    Manual,
}

/// What a compaction did, as its `compaction_end` event says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionReport {
    /// Why it ran.
    pub reason: CompactionReason,
    /// The transcript's tokens before.
    pub tokens_before: u64,
    /// The transcript's tokens after (estimated); `tokens_before` when it failed.
    pub tokens_after: u64,
    /// The summary's id: its place in the session's stored transcript (what
    /// `GET /sessions/{id}/messages?from=` and the `lookup` tool's `message:N`
    /// name). `None` when it failed.
    pub summary_id: Option<u64>,
    /// Why it failed, when it did; the transcript is then as it was.
    pub error: Option<String>,
}

/// The payload of a compaction's summary message: the summary, and what it
/// replaces by place in the session's stored transcript.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionSummary {
    /// The summary.
    pub summary: String,
    /// The first stored message it replaces (an earlier summary, which replaced
    /// those before it, or the first message).
    pub first_seq: u64,
    /// The last stored message it replaces.
    pub last_seq: u64,
    /// How many messages after it are copies of the kept ones, which follow
    /// `last_seq` in the store.
    pub kept: u64,
    /// The transcript's tokens before.
    pub tokens_before: u64,
    /// The transcript's tokens after (estimated).
    pub tokens_after: u64,
}

impl CompactionSummary {
    /// The summary payload of `message`, if it is a compaction's summary.
    pub fn of(message: &AgentMessage) -> Option<CompactionSummary> {
        match message {
            AgentMessage::Custom(custom) if custom.kind == COMPACTION_KIND => {
                CompactionSummary::deserialize(&custom.payload).ok()
            }
            _ => None,
        }
    }

    /// The text the model reads in the summary's place.
    pub fn for_model(&self) -> String {
        format!(
            "[The conversation before this point (stored as message:{} to message:{}) was compacted. Summary:]\n{}",
            self.first_seq, self.last_seq, self.summary
        )
    }
}

/// The model's view of a transcript message: the LLM message itself, a
/// compaction summary as a user message, nothing for other custom messages.
pub fn summary_as_llm(message: &AgentMessage) -> Option<Cow<'_, Message>> {
    match message {
        AgentMessage::Llm(message) => Some(Cow::Borrowed(message)),
        AgentMessage::Custom(_) => CompactionSummary::of(message)
            .map(|summary| Cow::Owned(Message::User(UserMessage::text(summary.for_model())))),
    }
}

/// The default `convert_to_llm`: every user, assistant and tool-result message as
/// it is (borrowed, not copied); a compaction's summary as a user message (see
/// this module); other custom messages dropped.
pub fn default_convert_to_llm(messages: &[AgentMessage]) -> Vec<Cow<'_, Message>> {
    messages.iter().filter_map(summary_as_llm).collect()
}

/// The estimate of `bytes` of text: a token per four bytes.
pub(crate) fn text_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// A file's estimate: a document as text of its size, audio at one token per
/// [`AUDIO_BYTES_PER_TOKEN`] bytes.
pub fn file_tokens(file: &FileContent) -> u64 {
    if file.is_audio() {
        (file.size() as u64).div_ceil(AUDIO_BYTES_PER_TOKEN)
    } else {
        text_tokens(file.size())
    }
}

/// The estimate of what every request carries besides the transcript: the
/// system prompt and the tools' definitions.
pub(crate) fn overhead_tokens(system_prompt: Option<&str>, tools: &[tiller_ai::Tool]) -> u64 {
    let tools: u64 = tools
        .iter()
        .map(|tool| {
            text_tokens(
                tool.name.len() + tool.description.len() + crate::tool::json_len(&tool.parameters),
            )
        })
        .sum();
    system_prompt.map_or(0, |prompt| text_tokens(prompt.len())) + tools
}

/// The provider's count of the whole request and its answer, when `message` is a
/// response that reported usage.
fn measured_tokens(message: &AgentMessage) -> Option<u64> {
    let usage = &message.as_assistant()?.usage;
    (usage.input + usage.cache_read > 0)
        .then(|| usage.input + usage.cache_read + usage.cache_write + usage.output)
}

/// A message's token count: what the provider reported for an assistant message
/// that has usage, an estimate otherwise (see the module's doc).
pub fn estimate_tokens(message: &AgentMessage) -> u64 {
    let text = text_tokens;
    let content = |content: &[Content]| -> u64 {
        content
            .iter()
            .map(|block| match block {
                Content::Text(t) => text(t.text.len()),
                Content::Image(_) => IMAGE_TOKENS,
                Content::File(file) => file_tokens(file),
            })
            .sum()
    };
    match message {
        AgentMessage::Llm(Message::User(user)) => content(&user.content),
        AgentMessage::Llm(Message::ToolResult(result)) => content(&result.content),
        AgentMessage::Llm(Message::Assistant(assistant)) if assistant.usage.output > 0 => {
            assistant.usage.output
        }
        AgentMessage::Llm(Message::Assistant(assistant)) => assistant
            .content
            .iter()
            .map(|block| match block {
                AssistantContent::Text(t) => text(t.text.len()),
                AssistantContent::Thinking(t) => text(t.thinking.len()),
                AssistantContent::ToolCall(call) => {
                    text(call.name.len() + crate::tool::json_len(&call.arguments))
                }
            })
            .sum(),
        AgentMessage::Custom(_) => {
            CompactionSummary::of(message).map_or(0, |summary| text(summary.for_model().len()))
        }
    }
}

/// The tokens a transcript holds, kept up to date message by message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ContextTokens {
    /// The count.
    pub total: u64,
    /// Whether the count starts from a provider's usage, which includes the
    /// system prompt and the tools; an estimate from scratch does not.
    pub measured: bool,
}

impl ContextTokens {
    /// The count after `message` joins the transcript: a response with usage
    /// resets it to the provider's count, any other message adds its estimate.
    pub fn after(self, message: &AgentMessage) -> ContextTokens {
        match measured_tokens(message) {
            Some(total) => ContextTokens {
                total,
                measured: true,
            },
            None => ContextTokens {
                total: self.total + estimate_tokens(message),
                measured: self.measured,
            },
        }
    }

    /// The count of a whole transcript, for one loaded from a store: the last
    /// response's usage and the estimates after it, walking back only that far.
    /// The copies a compaction kept carry usage from before it, and are estimated.
    pub fn of<M: std::borrow::Borrow<AgentMessage>>(messages: &[M]) -> ContextTokens {
        let fresh_from = messages
            .first()
            .and_then(|first| CompactionSummary::of(first.borrow()))
            .map_or(0, |summary| 1 + summary.kept as usize);
        let measured = (fresh_from..messages.len())
            .rev()
            .find(|&at| measured_tokens(messages[at].borrow()).is_some());
        match measured {
            Some(at) => messages[at..]
                .iter()
                .fold(ContextTokens::default(), |tokens, m| {
                    tokens.after(m.borrow())
                }),
            None => ContextTokens {
                total: messages.iter().map(|m| estimate_tokens(m.borrow())).sum(),
                measured: false,
            },
        }
    }
}

/// Where to cut `messages` to keep about `keep` tokens of the most recent ones:
/// the index of the first message kept, which is a user or an assistant message
/// and never after a response whose calls wait for the user. `None` when nothing
/// can be cut (everything fits in `keep`, or no place qualifies, or the cut would
/// replace an earlier summary alone).
pub fn cut_point(messages: &[AgentMessage], keep: u64) -> Option<usize> {
    // A summary alone is not summarized again: that would save nothing.
    let first = match messages.first() {
        Some(first) if CompactionSummary::of(first).is_some() => 2,
        _ => 1,
    };
    let can_cut = |&at: &usize| {
        at >= first
            && matches!(
                messages[at],
                AgentMessage::Llm(Message::User(_) | Message::Assistant(_))
            )
    };
    let last = messages.len().checked_sub(1)?;
    // A parked question stays with the response that asked it.
    let latest = if open_requests(messages).is_empty() {
        last
    } else {
        messages.iter().rposition(|m| m.as_assistant().is_some())?
    };
    let mut kept = 0;
    let mut wanted = 0;
    for at in (0..=last).rev() {
        kept += estimate_tokens(&messages[at]);
        if kept >= keep {
            wanted = at;
            break;
        }
    }
    if wanted == 0 || latest == 0 {
        return None;
    }
    let wanted = wanted.min(latest);
    // At least `keep` tokens: the nearest cut at or before; failing that, after.
    (first..=wanted)
        .rev()
        .find(can_cut)
        .or_else(|| (wanted + 1..=latest).find(can_cut))
}

/// What a summarizer is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRequest {
    /// What it is told to do.
    pub instructions: String,
    /// The messages it summarizes, rendered as text (an earlier summary first).
    pub conversation: String,
    /// The messages themselves.
    pub messages: Vec<AgentMessage>,
    /// The longest summary wanted, in tokens.
    pub max_tokens: u32,
}

/// Writes a compaction's summary: a host function in place of a model.
pub type Summarize = Arc<
    dyn Fn(SummaryRequest, CancellationToken) -> BoxFuture<'static, Result<String, BoxError>>
        + Send
        + Sync,
>;

/// A summarizer that asks `model` with `options` (their tools, output schema and
/// tool choice left out).
pub fn model_summarizer(model: Model, options: StreamOptions) -> Summarize {
    Arc::new(move |request: SummaryRequest, cancel: CancellationToken| {
        let model = model.clone();
        let mut options = StreamOptions {
            max_tokens: Some(request.max_tokens),
            tool_choice: None,
            output_schema: None,
            ..options.clone()
        };
        options.transport.cancel = cancel;
        Box::pin(async move { summarize_with(&model, &options, request).await })
    })
}

/// Asks `model` for the summary `request` wants.
pub(crate) async fn summarize_with(
    model: &Model,
    options: &StreamOptions,
    request: SummaryRequest,
) -> Result<String, BoxError> {
    let context = Context::new()
        .with_system_prompt(request.instructions)
        .with_message(Message::user(request.conversation));
    let answer = tiller_ai::stream(model, &context, options).result().await;
    if matches!(answer.stop_reason, StopReason::Error | StopReason::Aborted) {
        return Err(answer
            .error_message
            .unwrap_or_else(|| "the summary failed".to_owned())
            .into());
    }
    let text = answer.text();
    if text.trim().is_empty() {
        return Err("the summarizing model answered with no text".into());
    }
    Ok(text.trim().to_owned())
}

/// `summary` cut to about `max_tokens` tokens (four bytes each), at a character
/// boundary: a summarizer that writes more than it was asked for is held to it.
pub fn cut_to_tokens(summary: String, max_tokens: u32) -> String {
    match cut_text(&summary, (max_tokens as usize).saturating_mul(4)) {
        Cow::Borrowed(_) => summary,
        Cow::Owned(cut) => cut,
    }
}

/// `text` as it is when it holds at most `max_bytes`, else its first `max_bytes`
/// (to a character boundary) and ` […]`.
fn cut_text(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    Cow::Owned(format!(
        "{} […]",
        &text[..text.floor_char_boundary(max_bytes)]
    ))
}

/// The most bytes of one message a summarizer is shown.
const MESSAGE_BYTES: usize = 4_000;

/// `messages` as a summarizer reads them, newest kept first when they pass
/// `budget` tokens (an earlier summary always stays, at the start).
pub fn render(messages: &[AgentMessage], budget: u64) -> String {
    let mut lines: Vec<String> = Vec::new();
    let mut used = 0;
    let mut omitted = false;
    let (previous, rest) = match messages.split_first() {
        Some((first, rest)) if CompactionSummary::of(first).is_some() => (Some(first), rest),
        _ => (None, messages),
    };
    let previous = previous.map(|first| render_one(first).unwrap_or_default());
    used += previous.as_ref().map_or(0, |p| text_tokens(p.len()));
    for message in rest.iter().rev() {
        let Some(line) = render_one(message) else {
            continue;
        };
        let cost = text_tokens(line.len());
        if used + cost > budget {
            omitted = true;
            break;
        }
        used += cost;
        lines.push(line);
    }
    if omitted {
        lines.push("[Earlier messages omitted.]".to_owned());
    }
    lines.extend(previous);
    lines.reverse();
    lines.join("\n\n")
}

fn render_one(message: &AgentMessage) -> Option<String> {
    let cut = |text: &str| cut_text(text, MESSAGE_BYTES).into_owned();
    let content_text = |content: &[Content]| {
        content
            .iter()
            .map(|block| match block {
                Content::Text(t) => Cow::Borrowed(t.text.as_str()),
                Content::Image(_) => Cow::Borrowed("[image]"),
                Content::File(file) => {
                    Cow::Owned(format!("[file {} ({})]", file.name, file.mime_type))
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    Some(match message {
        AgentMessage::Llm(Message::User(user)) => {
            format!("User: {}", cut(&content_text(&user.content)))
        }
        AgentMessage::Llm(Message::Assistant(assistant)) => {
            let mut parts = Vec::new();
            let text = assistant.text();
            if !text.is_empty() {
                parts.push(format!("Assistant: {}", cut(&text)));
            }
            for call in assistant.tool_calls() {
                parts.push(format!(
                    "Assistant called {}({})",
                    call.name,
                    cut(&call.arguments.to_string())
                ));
            }
            if parts.is_empty() {
                return None;
            }
            parts.join("\n")
        }
        AgentMessage::Llm(Message::ToolResult(result)) => format!(
            "Result of {}{}: {}",
            result.tool_name,
            if result.is_error { " (failed)" } else { "" },
            cut(&content_text(&result.content))
        ),
        AgentMessage::Custom(_) => {
            let summary = CompactionSummary::of(message)?;
            format!("Earlier summary: {}", summary.summary)
        }
    })
}

/// The summary message replacing the messages before the cut.
pub(crate) fn summary_message(summary: CompactionSummary) -> AgentMessage {
    CustomMessage::new(
        COMPACTION_KIND,
        serde_json::to_value(summary).unwrap_or_default(),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tiller_ai::{AssistantMessage, ToolResultMessage, Usage};

    use super::*;
    use crate::request::UserRequest;

    fn model() -> Model {
        tiller_ai::faux::FauxProvider::new().model()
    }

    /// An answer of `words` words (about two tokens each).
    fn answer(words: usize) -> AgentMessage {
        let mut message = AssistantMessage::empty(&model());
        message
            .content
            .push(AssistantContent::Text(tiller_ai::TextContent::new(
                "word ".repeat(words),
            )));
        message.into()
    }

    fn call(id: &str) -> (AgentMessage, tiller_ai::ToolCall) {
        let mut message = AssistantMessage::empty(&model());
        let call = tiller_ai::ToolCall {
            id: id.into(),
            name: "look".into(),
            arguments: json!({"q": "x".repeat(200)}),
            arguments_error: None,
            signature: None,
        };
        message
            .content
            .push(AssistantContent::ToolCall(Box::new(call.clone())));
        (message.into(), call)
    }

    #[test]
    fn a_cut_keeps_a_call_with_its_result() {
        let (asking, made) = call("c1");
        let messages = vec![
            AgentMessage::user("one"),
            answer(100),
            AgentMessage::user("two"),
            asking,
            ToolResultMessage::text(&made, "y".repeat(400), false).into(),
            answer(10),
        ];
        // Keeping 110 tokens lands on the result: the cut moves back to its call.
        assert_eq!(cut_point(&messages, 110), Some(3));
        assert_eq!(cut_point(&messages, 167), Some(2));
        // Everything fits: nothing to cut.
        assert_eq!(cut_point(&messages, 10_000), None);
    }

    #[test]
    fn a_parked_question_stays_with_the_response_that_asked_it() {
        let (asking, made) = call("c1");
        let request = UserRequest::Input {
            tool_call_id: made.id.clone(),
            tool_name: made.name.clone(),
            field: "q".into(),
            question: "Which one?".into(),
            current_data: serde_json::Value::Null,
        };
        let messages = vec![
            AgentMessage::user("one"),
            answer(100),
            AgentMessage::user("two"),
            asking,
            request.to_message(),
        ];
        // However little is kept, the cut is at the asking response or before.
        assert_eq!(cut_point(&messages, 0), Some(3));
    }

    #[test]
    fn an_earlier_summary_is_not_summarized_alone() {
        let summary = summary_message(CompactionSummary {
            summary: "s".repeat(4_000),
            first_seq: 0,
            last_seq: 9,
            kept: 1,
            tokens_before: 0,
            tokens_after: 0,
        });
        let messages = vec![summary.clone(), answer(10), AgentMessage::user("next")];
        assert_eq!(cut_point(&messages, 0), Some(2));
        assert_eq!(cut_point(&messages[..2], 0), None);
    }

    #[test]
    fn the_count_follows_usage_and_estimates_the_rest() {
        let mut measured = AssistantMessage::empty(&model());
        measured.usage = Usage {
            input: 900,
            output: 40,
            ..Usage::default()
        };
        let measured = AgentMessage::from(measured);
        let question = AgentMessage::user("x".repeat(400));
        let tokens = ContextTokens::default().after(&question);
        assert_eq!(
            tokens,
            ContextTokens {
                total: 100,
                measured: false
            }
        );
        let tokens = tokens.after(&measured);
        assert_eq!(
            tokens,
            ContextTokens {
                total: 940,
                measured: true
            }
        );
        assert_eq!(tokens.after(&question).total, 1_040);
        // Counted whole, the last usage and what follows it.
        let messages = [question.clone(), measured.clone(), question.clone()];
        assert_eq!(ContextTokens::of(&messages), tokens.after(&question));
        // After a summary, the kept copies' usage is from before it: estimated.
        let summary = summary_message(CompactionSummary {
            summary: "short".into(),
            first_seq: 0,
            last_seq: 3,
            kept: 1,
            tokens_before: 0,
            tokens_after: 0,
        });
        let after = [summary.clone(), measured.clone(), question];
        assert_eq!(
            ContextTokens::of(&after),
            ContextTokens {
                total: estimate_tokens(&summary) + 40 + 100,
                measured: false
            }
        );
    }

    #[test]
    fn a_summary_longer_than_asked_is_cut_at_a_character() {
        assert_eq!(cut_to_tokens("short".into(), 2), "short");
        assert_eq!(cut_to_tokens("ééééé".into(), 1), "éé […]");
    }

    #[test]
    fn a_small_window_caps_the_reserve_the_tail_and_the_summary() {
        let policy = CompactionPolicy::default();
        assert_eq!(policy.threshold(128_000), 128_000 - 16_384);
        assert_eq!(policy.threshold(4_096), 3_072);
        assert_eq!(policy.keep_tokens(4_096), 1_024);
        assert_eq!(policy.summary_tokens(4_096), 512);
    }

    #[test]
    fn a_summarizer_reads_the_newest_messages_that_fit_after_an_earlier_summary() {
        let summary = summary_message(CompactionSummary {
            summary: "before".into(),
            first_seq: 0,
            last_seq: 3,
            kept: 0,
            tokens_before: 0,
            tokens_after: 0,
        });
        let messages = vec![
            summary,
            AgentMessage::user("old ".repeat(100)),
            AgentMessage::user("new"),
        ];
        assert_eq!(
            render(&messages, 20),
            "Earlier summary: before\n\n[Earlier messages omitted.]\n\nUser: new"
        );
        assert_eq!(render(&messages[1..], 1_000).lines().count(), 3);
    }

    #[test]
    fn files_are_counted_by_kind_and_named_in_a_summary_request() {
        let pdf = tiller_ai::FileContent::from_bytes("report.pdf", &[b'x'; 4000]).unwrap();
        let wav = tiller_ai::FileContent::from_bytes("memo.wav", &[0; 32_000]).unwrap();
        let message = AgentMessage::Llm(
            UserMessage::text("Read")
                .with_file(pdf)
                .with_file(wav)
                .into(),
        );
        // "Read": 1; the PDF as 4,000 bytes of text: 1,000; the audio: 32.
        assert_eq!(estimate_tokens(&message), 1 + 1_000 + 32);
        assert_eq!(
            render(std::slice::from_ref(&message), 10_000),
            "User: Read\n[file report.pdf (application/pdf)]\n[file memo.wav (audio/wav)]"
        );
    }
}
