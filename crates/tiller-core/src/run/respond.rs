//! The model call: the transcript as the model sees it, compacted first when
//! it passed the policy's threshold and once more when the provider refused it
//! as too long; each call held against the budgets; the agent's model, then its
//! fallbacks, each asked when the one before failed before streaming; each
//! response streamed as `message_update`s.

use std::panic::AssertUnwindSafe;

use futures::StreamExt;
use tiller_ai::{
    AssistantEvent, AssistantMessage, ContextRef, Message, Model, StopReason, StreamError,
    StreamedMessage,
};
use tracing::Instrument;

use super::compact::Unfinished;
use super::{Interrupted, Run};
use crate::budget::Spent;
use crate::compaction::CompactionReason;
use crate::compaction::default_convert_to_llm;
use crate::event::AgentEvent;
use crate::failure::panic_text;
use crate::message::AgentMessage;
use crate::repair::repair;
use crate::restate::Restatements;

impl Run {
    /// Streams the model's response to the transcript as it stands: compacted
    /// first when it passed the policy's threshold, and asked once more, after a
    /// compaction, when the provider refused it as too long.
    pub(super) async fn respond(&mut self) -> AssistantMessage {
        let compacting = self.config.run.compaction.enabled;
        let mut compacted_once = false;
        loop {
            if self.cancel.is_cancelled() {
                return self.aborted();
            }
            match self.resolve_key().await {
                Ok(()) => {}
                Err(Interrupted::Panicked(panic)) => {
                    return self.fail(format!("the API key resolver panicked: {panic}"));
                }
                Err(Interrupted::Aborted) => return self.aborted(),
            }
            if let Err(failed) = self.instruct().await {
                return failed;
            }
            let threshold = self.config.run.compaction.threshold(self.window);
            if compacting && !compacted_once && self.history.tokens() > threshold {
                // Nothing to cut is no failure here: the provider has the last word.
                let _ = self.compact(CompactionReason::Threshold, None).await;
                if self.cancel.is_cancelled() {
                    return self.aborted();
                }
            }
            let (start, mut message) = match self.ask_model().await {
                Ok(message) => return message,
                Err(refused) => *refused,
            };
            let overflow = message
                .error_message
                .clone()
                .unwrap_or_else(|| "the request is longer than the context window".to_owned());
            let why = if !compacting {
                "compaction is off".to_owned()
            } else if compacted_once {
                "the context was compacted once and still does not fit".to_owned()
            } else {
                // The provider named no window: it is at most what was sent.
                let sent = u32::try_from(self.history.tokens()).unwrap_or(u32::MAX);
                self.window = self.window.min(sent);
                match self.compact(CompactionReason::Overflow, None).await {
                    _ if self.cancel.is_cancelled() => return self.aborted(),
                    Ok(()) => {
                        compacted_once = true;
                        continue;
                    }
                    Err(Unfinished::NothingToCut) => "nothing could be compacted".to_owned(),
                    Err(Unfinished::Failed(error)) => format!("the compaction failed: {error}"),
                }
            };
            message.error_message = Some(format!("{overflow}; {why}"));
            self.overflowed = true;
            return self.finish_response(Some(start), message);
        }
    }

    /// Asks the API key resolver, if the run has one, for the key of the next
    /// model call (a summary's too).
    pub(super) async fn resolve_key(&mut self) -> Result<(), Interrupted> {
        if let Some(resolve) = &self.config.hooks.api_key_resolver {
            let key = self.call_back(resolve(&self.config.model.provider)).await?;
            self.options.transport.api_key =
                key.or_else(|| self.config.run.stream.transport.api_key.clone());
        }
        Ok(())
    }

    /// Asks the model once. A refusal of the request as longer than the window,
    /// before anything streamed, comes back unannounced (no `message_start`),
    /// with the held start message and the failed one.
    async fn ask_model(
        &mut self,
    ) -> Result<AssistantMessage, Box<(AssistantMessage, AssistantMessage)>> {
        let transformed = match self.transformed().await {
            Ok(transformed) => transformed,
            Err(failed) => return Ok(failed),
        };
        let view = transformed.as_deref().unwrap_or(self.history.messages());
        let converted = match &self.config.hooks.convert_to_llm {
            None => Ok(default_convert_to_llm(view)),
            Some(convert) => std::panic::catch_unwind(AssertUnwindSafe(|| convert(view))),
        };
        let llm = match converted {
            Ok(llm) => llm,
            Err(panic) => {
                return Ok(self.fail(format!("convert_to_llm panicked: {}", panic_text(panic))));
            }
        };
        let (llm, repaired) = repair(llm, &self.config.model);
        if repaired > 0 {
            tracing::warn!(
                repaired,
                "repaired orphaned tool calls or results before the model call"
            );
        }
        let messages: Vec<&Message> = llm.iter().map(AsRef::as_ref).collect();
        let context = ContextRef {
            system_prompt: self.system_prompt.as_deref(),
            messages: &messages,
            tools: self.tools.definitions(),
        };
        let mut echoes = std::mem::take(&mut self.echoes);
        // The models in order: the agent's, then its fallbacks, each asked only
        // when the one before failed before it streamed anything; each call
        // holds the most it may spend against the budgets until it ends.
        let input = self.history.tokens();
        let mut candidate = 0;
        let mut reservation = match self
            .gate
            .meter
            .reserve(input, &self.config.model, &self.options)
            .await
        {
            Ok(reservation) => reservation,
            Err(exceeded) => {
                drop(messages);
                drop(llm);
                return Ok(self.refuse(exceeded));
            }
        };
        let mut attempt = self.stream_to(&self.config.model, context, None, reservation.max_tokens);
        let (outcome, message, spent) = loop {
            let span = attempt.span.clone();
            let mut answered = self.answer(attempt, &echoes).instrument(span).await;
            let failed = match &answered.outcome {
                Answered::Ended {
                    error: Some(error), ..
                } if error.is_unavailable() && !answered.streamed => error,
                _ => break (answered.outcome, answered.message, answered.spent),
            };
            let Some(next) = self.config.fallbacks.get(candidate) else {
                break (answered.outcome, answered.message, answered.spent);
            };
            let failed = failed.to_string();
            self.gate
                .meter
                .settle(reservation, std::mem::take(&mut answered.spent))
                .await;
            reservation = match self.gate.meter.reserve(input, next, &self.options).await {
                Ok(reservation) => reservation,
                Err(exceeded) => {
                    self.gate.exceed(exceeded);
                    reservation = Default::default();
                    break (answered.outcome, answered.message, answered.spent);
                }
            };
            candidate += 1;
            let from = self.model_at(candidate - 1);
            self.emit(AgentEvent::ModelFallback {
                from: model_name(from),
                to: model_name(next),
                error: failed,
            });
            let key = self.fallback_key(next).await;
            attempt = self.stream_to(next, context, Some(key), reservation.max_tokens);
            echoes = Vec::new();
        };
        drop(messages);
        drop(llm);
        self.gate.meter.settle(reservation, spent).await;
        self.ended(outcome, message)
    }

    /// A response read to its end: refused as too long (the window the
    /// provider named learnt), or added to the transcript.
    fn ended(
        &mut self,
        outcome: Answered,
        message: AssistantMessage,
    ) -> Result<AssistantMessage, Box<(AssistantMessage, AssistantMessage)>> {
        match outcome {
            Answered::Refused { start, window } => {
                if let Some(window) = window {
                    self.window = self.window.min(window);
                }
                Err(Box::new((start, message)))
            }
            Answered::Ended { start, error } => {
                if let Some(overflow) = error.as_ref().and_then(StreamError::context_overflow) {
                    if let Some(window) = overflow.context_window {
                        self.window = self.window.min(window);
                    }
                    self.overflowed = true;
                }
                Ok(self.finish_response(start, message))
            }
        }
    }

    /// Adds what the `instructions` hook writes to the system prompt, once a
    /// run (before its first model call); `Err` is the response saying it failed.
    async fn instruct(&mut self) -> Result<(), AssistantMessage> {
        let Some(write) = self.config.hooks.instructions.take() else {
            return Ok(());
        };
        let pending = write(&self.config.context);
        let written = match self.call_back(pending).await {
            Ok(Ok(written)) => written,
            Ok(Err(error)) => return Err(self.fail(format!("instructions failed: {error}"))),
            Err(Interrupted::Panicked(panic)) => {
                return Err(self.fail(format!("instructions panicked: {panic}")));
            }
            Err(Interrupted::Aborted) => return Err(self.aborted()),
        };
        if let Some(text) = written.filter(|text| !text.is_empty()) {
            self.history
                .add_overhead(crate::compaction::overhead_tokens(Some(&text), &[]));
            self.system_prompt = Some(match self.system_prompt.take() {
                Some(prompt) if !prompt.is_empty() => format!("{prompt}\n\n{text}"),
                _ => text,
            });
        }
        Ok(())
    }

    /// The transcript as the `transform_context` hook shows it to the model,
    /// when the run has one; `Err` is the response saying it failed.
    async fn transformed(&mut self) -> Result<Option<Vec<AgentMessage>>, AssistantMessage> {
        let Some(transform) = &self.config.hooks.transform_context else {
            return Ok(None);
        };
        let pending = transform(self.history.messages(), self.cancel.child_token());
        match self.call_back(pending).await {
            Ok(Ok(messages)) => Ok(Some(messages)),
            Ok(Err(error)) => Err(self.fail(format!("transform_context failed: {error}"))),
            Err(Interrupted::Panicked(panic)) => {
                Err(self.fail(format!("transform_context panicked: {panic}")))
            }
            Err(Interrupted::Aborted) => Err(self.aborted()),
        }
    }

    /// The model at `index` of the agent's list (0 is the agent's own).
    fn model_at(&self, index: usize) -> &Model {
        match index {
            0 => &self.config.model,
            _ => &self.config.fallbacks[index - 1],
        }
    }

    /// The key a fallback model is asked with: the resolver's for its provider,
    /// else the run's when it is the same provider at the same address, else
    /// none (its provider's environment variable).
    async fn fallback_key(&self, model: &Model) -> Option<tiller_ai::ApiKey> {
        if let Some(resolve) = &self.config.hooks.api_key_resolver
            && let Ok(Some(key)) = self.call_back(resolve(&model.provider)).await
        {
            return Some(key);
        }
        let own = &self.config.model;
        (own.provider == model.provider && own.base_url == model.base_url)
            .then(|| self.options.transport.api_key.clone())
            .flatten()
    }

    /// Sends the request to `model` (with `key` in place of the run's, for a
    /// fallback), in a span of its own.
    fn stream_to(
        &self,
        model: &Model,
        context: ContextRef<'_>,
        key: Option<Option<tiller_ai::ApiKey>>,
        max_tokens: Option<u32>,
    ) -> Attempt {
        let span = tracing::info_span!(
            "chat",
            otel.name = %format_args!("chat {}", model.id),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %model.provider,
            gen_ai.request.model = %model.id,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        // Held to what a budget leaves it.
        let capped = max_tokens.and_then(|most| self.options.capped(model, most));
        let options = capped.as_ref().unwrap_or(&self.options);
        let stream = span.in_scope(|| match key {
            None => tiller_ai::stream_ref(model, context, options),
            Some(api_key) => {
                let mut options = options.clone();
                options.transport.api_key = api_key;
                tiller_ai::stream_ref(model, context, &options)
            }
        });
        Attempt { stream, span }
    }

    /// Reads a response to its end, streaming its updates. The start is held
    /// until something else arrives, so that a refusal of the request (before any
    /// content) can be answered by compacting, and a failure by the next model.
    async fn answer(&self, attempt: Attempt, echoes: &[String]) -> Answer {
        let Attempt { mut stream, span } = attempt;
        let mut held = None;
        let mut last = None;
        let mut streamed = None;
        let mut failed = None;
        let mut refused = None;
        let mut quiet = if self.child_streamed && self.config.run.quiet_after_child_content {
            Restatements::all()
        } else {
            Restatements::new(echoes)
        };
        while let Some(event) = stream.next().await {
            match event {
                AssistantEvent::Start { message } => {
                    streamed = Some(StreamedMessage::start((*message).clone()));
                    held = Some(message);
                }
                AssistantEvent::Error { message, error, .. } => {
                    if let Some(overflow) = error.context_overflow()
                        && let Some(start) = held.take()
                    {
                        refused = Some(Answered::Refused {
                            start: *start,
                            window: overflow.context_window,
                        });
                    } else {
                        failed = Some(error);
                    }
                    last = Some(*message);
                    break;
                }
                AssistantEvent::Done { message, .. } => {
                    last = Some(*message);
                    break;
                }
                event => {
                    if let Some(start) = held.take() {
                        self.emit(AgentEvent::MessageStart {
                            message: Box::new((*start).into()),
                        });
                    }
                    if quiet.is_empty() {
                        self.update(&mut streamed, event, &stream);
                    } else {
                        for (event, ()) in quiet.pass(event, ()) {
                            self.update(&mut streamed, event, &stream);
                        }
                    }
                }
            }
        }
        for (event, ()) in quiet.release() {
            self.update(&mut streamed, event, &stream);
        }
        let message = last.unwrap_or_else(|| stream.partial().clone());
        if !span.is_disabled() {
            record_answer(&span, &message, failed.as_ref());
        }
        let spent = Spent::response(&message);
        // Whether anything went out: the start is announced with the first update.
        let streamed = held.is_none() && streamed.is_some();
        let outcome = refused.unwrap_or(Answered::Ended {
            start: held.map(|start| *start),
            error: failed,
        });
        Answer {
            outcome,
            message,
            spent,
            streamed,
        }
    }

    /// The `message_update` of one event of the response streaming: its
    /// message is `streamed` (what went out before) with this event too, so
    /// nothing held back is in it.
    fn update(
        &self,
        streamed: &mut Option<StreamedMessage>,
        event: AssistantEvent,
        stream: &tiller_ai::AssistantStream,
    ) {
        let message = match streamed {
            Some(before) => before.then(event.clone()),
            None => StreamedMessage::start(stream.partial().clone()),
        };
        *streamed = Some(message.clone());
        self.emit(AgentEvent::MessageUpdate {
            assistant_message_event: event,
            message,
        });
    }
}

/// A request sent to one model, and its span.
struct Attempt {
    stream: tiller_ai::AssistantStream,
    span: tracing::Span,
}

/// A response read to its end.
struct Answer {
    outcome: Answered,
    /// The final message.
    message: AssistantMessage,
    /// What the call spent.
    spent: Spent,
    /// Whether any of it streamed (its start announced).
    streamed: bool,
}

/// How a response ended.
enum Answered {
    /// Refused as longer than the window before anything streamed, with the
    /// held start and the window the provider named.
    Refused {
        start: AssistantMessage,
        window: Option<u32>,
    },
    /// Done or failed: the start still held when nothing streamed.
    Ended {
        start: Option<AssistantMessage>,
        error: Option<StreamError>,
    },
}

/// The GenAI attributes of a model call's span, once its response ended.
fn record_answer(span: &tracing::Span, message: &AssistantMessage, failed: Option<&StreamError>) {
    span.record("gen_ai.response.model", message.model.as_str());
    let finish = format!("[\"{}\"]", stop_reason_name(message.stop_reason));
    span.record("gen_ai.response.finish_reasons", finish.as_str());
    let tokens = |count: u64| i64::try_from(count).unwrap_or(i64::MAX);
    span.record("gen_ai.usage.input_tokens", tokens(message.usage.input));
    span.record("gen_ai.usage.output_tokens", tokens(message.usage.output));
    if let Some(error) = failed {
        span.record("error.type", error_kind(error));
    }
}

/// A model as events name it: `provider/id`.
fn model_name(model: &Model) -> String {
    format!("{}/{}", model.provider, model.id)
}

/// A stop reason as the GenAI conventions write finish reasons.
fn stop_reason_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Stop => "stop",
        StopReason::Length => "length",
        StopReason::ToolUse => "tool_call",
        StopReason::Error => "error",
        StopReason::Aborted => "aborted",
    }
}

/// The kind of a stream error, as its JSON names it.
fn error_kind(error: &StreamError) -> String {
    serde_json::to_value(error)
        .ok()
        .and_then(|value| value.get("kind")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "error".to_owned())
}
