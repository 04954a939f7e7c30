//! The end of each turn and of the run: a turn ends once, with `turn_end`
//! ([`Run::settle`]); then the answer's checks (output guardrails, stop
//! conditions, the output schema) say whether another turn follows, and
//! [`Run::finish`] ends the run with `agent_end` and its messages.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;
use tiller_ai::{AssistantMessage, StopReason, ToolChoice};
use tokio_util::sync::CancellationToken;

use super::Run;
use super::execute::Batch;
use crate::config::{RUN_UNTIL_NUDGE, StopWhen, TurnSummary};
use crate::event::{AgentEvent, RunEnd};
use crate::failure::panic_text;
use crate::guardrail::{GuardrailStage, GuardrailTripped};
use crate::message::AgentMessage;
use crate::output::{self, Output, OutputCheck, OutputError};

/// What follows a turn.
pub(super) enum Next {
    /// Another turn, with these messages delivered first.
    Turn(Vec<AgentMessage>),
    /// The run's end.
    End(RunEnd),
}

/// How a turn ends the run before its answer is judged.
struct Early {
    end: RunEnd,
    /// Whether it is the batch's failure, said after `turn_end`.
    batch_failed: bool,
}

/// What is asked of a turn's answer before `turn_end` (the stop conditions see
/// the turn as it ended), and what is checked after.
struct Judged {
    called_tools: bool,
    /// A final answer of a run with an output schema, to check.
    answer: Option<String>,
    /// The output guardrails' check of a final answer.
    guarded: Option<BoxFuture<'static, Option<GuardrailTripped>>>,
    /// `stop_when`'s answer.
    stop: Option<std::thread::Result<bool>>,
    /// `run_until`'s answer, asked of a plain answer only.
    until: Option<std::thread::Result<bool>>,
}

impl Run {
    /// Ends a turn — `message`, and the `batch` its calls made — with its one
    /// `turn_end`, and says what follows.
    pub(super) async fn settle(
        &mut self,
        message: AssistantMessage,
        batch: Batch,
        check: Option<&mut OutputCheck>,
    ) -> Next {
        let judged = match self.early_end(&message, &batch) {
            Some(early) => Err(early),
            None => Ok(self.judge(&message, &batch, check.is_some())),
        };
        let Batch {
            results,
            steering,
            terminate,
            failure,
            ..
        } = batch;
        self.end_turn(message, results);
        match judged {
            Ok(judged) => self.after(judged, steering, terminate, check).await,
            Err(Early { end, batch_failed }) => {
                if matches!(end, RunEnd::GuardrailTripped | RunEnd::BudgetExceeded) {
                    self.leave(steering);
                }
                if let Some(failure) = failure.filter(|_| batch_failed) {
                    self.fail(failure);
                }
                Next::End(end)
            }
        }
    }

    /// How the turn ends the run before its answer is judged, if it does: a
    /// verdict of the gate, a failed or aborted response, a call waiting for the
    /// user, a batch that failed.
    fn early_end(&self, message: &AssistantMessage, batch: &Batch) -> Option<Early> {
        let end = |end| {
            Some(Early {
                end,
                batch_failed: false,
            })
        };
        if let Some(verdict) = self.gate.ends() {
            return end(verdict);
        }
        match message.stop_reason {
            StopReason::Aborted => end(RunEnd::Aborted),
            StopReason::Error if self.overflowed => end(RunEnd::ContextOverflow),
            StopReason::Error => end(RunEnd::Error),
            _ if !batch.parked.is_empty() => end(RunEnd::Parked),
            _ => batch.failure.as_ref().map(|_| Early {
                end: RunEnd::Error,
                batch_failed: true,
            }),
        }
    }

    /// Asks the stop conditions about the turn and starts the output
    /// guardrails' check of a final answer; a forced tool choice is lifted once
    /// the model called a tool.
    fn judge(&mut self, message: &AssistantMessage, batch: &Batch, schema: bool) -> Judged {
        let called_tools = message.tool_calls().next().is_some();
        let answer = (!called_tools && schema).then(|| message.text());
        let guardrails = &self.config.hooks.guardrails;
        let guarded = (!called_tools && !guardrails.output.is_empty()).then(|| {
            guardrails
                .check(GuardrailStage::Output, message.text(), &self.config.context)
                .boxed()
        });
        if called_tools
            && self
                .options
                .tool_choice
                .as_ref()
                .is_some_and(ToolChoice::forces_a_call)
        {
            self.options.tool_choice = self.config.run.tool_choice_after_tools.clone();
        }
        let summary = TurnSummary {
            turn: self.turns,
            message,
            tool_results: &batch.results,
            context: &self.config.context,
        };
        let hooks = &self.config.hooks;
        let ask = |hook: &StopWhen| std::panic::catch_unwind(AssertUnwindSafe(|| hook(&summary)));
        Judged {
            called_tools,
            answer,
            guarded,
            stop: hooks.stop_when.as_ref().map(ask),
            until: hooks.run_until.as_ref().filter(|_| !called_tools).map(ask),
        }
    }

    /// What follows a turn that ended well: the output guardrails' verdict, the
    /// stop conditions, the output schema's check (a correction is another
    /// turn), then the messages of the next turn (steering, else follow-ups),
    /// unless the turn limit, a budget or a pause ends the run first.
    async fn after(
        &mut self,
        judged: Judged,
        steering: Option<Vec<AgentMessage>>,
        terminate: bool,
        check: Option<&mut OutputCheck>,
    ) -> Next {
        if let Some(guarded) = judged.guarded {
            match self.verdict(GuardrailStage::Output, guarded).await {
                Ok(None) => {}
                Ok(Some(tripped)) => {
                    self.gate.trip(tripped);
                    return Next::End(RunEnd::GuardrailTripped);
                }
                Err(_) => return Next::End(RunEnd::Aborted),
            }
        }
        let keep_going = matches!(judged.until, Some(Ok(false)));
        match (judged.stop, judged.until) {
            (Some(Err(panic)), _) | (_, Some(Err(panic))) => {
                self.leave(steering);
                let reason = format!("the stop condition panicked: {}", panic_text(panic));
                self.fail(reason);
                return Next::End(RunEnd::Error);
            }
            (Some(Ok(true)), _) => {
                self.leave(steering);
                return Next::End(RunEnd::StopCondition);
            }
            _ => {}
        }
        let correction = match (judged.answer, check) {
            (Some(answer), Some(check)) => match self.check_output(answer, check) {
                Ok(correction) => correction,
                Err(end) => {
                    self.leave(steering);
                    return Next::End(end);
                }
            },
            _ => None,
        };
        let wants_model = (judged.called_tools && !terminate) || correction.is_some();
        let mut pending = match steering {
            Some(steering) => steering,
            None => self.take(&self.config.steering).await,
        };
        pending.extend(correction);
        if !wants_model && pending.is_empty() {
            pending = self.take(&self.config.follow_up).await;
            if pending.is_empty() {
                if !keep_going {
                    return Next::End(if judged.called_tools {
                        RunEnd::ToolsTerminated
                    } else {
                        RunEnd::Completed
                    });
                }
                pending.push(AgentMessage::user(RUN_UNTIL_NUDGE));
            }
        }
        self.before_next(pending)
    }

    /// The final answer checked against the output schema: valid, it is the
    /// run's output; invalid, a correction to send while retries are left, else
    /// the run ends.
    fn check_output(
        &mut self,
        answer: String,
        check: &mut OutputCheck,
    ) -> Result<Option<AgentMessage>, RunEnd> {
        match check.check(&answer) {
            Ok(value) => {
                self.output = Some(Output::Valid { value });
                Ok(None)
            }
            Err(errors) if check.attempts <= self.config.run.output_retries => {
                self.output = None;
                Ok(Some(AgentMessage::user(output::correction(&errors))))
            }
            Err(errors) => {
                self.output = Some(Output::Invalid(OutputError {
                    answer,
                    errors,
                    attempts: check.attempts,
                }));
                Err(RunEnd::InvalidOutput)
            }
        }
    }

    /// Another turn with `pending`, unless the turn limit, a budget or a pause
    /// ends the run first.
    fn before_next(&mut self, pending: Vec<AgentMessage>) -> Next {
        if self.turns >= self.config.run.max_turns {
            self.leave(Some(pending));
            return Next::End(RunEnd::TurnLimit);
        }
        // Past a budget, what was taken from the queues is not delivered: it
        // goes back to them for a later run.
        if self.gate.over(&crate::budget::Spent::default()).is_some() {
            return Next::End(RunEnd::BudgetExceeded);
        }
        if self
            .config
            .pause
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
        {
            self.leave(Some(pending));
            return Next::End(RunEnd::Paused);
        }
        Next::Turn(pending)
    }

    /// Steering and follow-ups taken for a turn that will not come: delivered,
    /// unless the run has input guardrails, which they have not passed (then
    /// they go back to their queues, and a later run checks them).
    pub(super) fn leave(&mut self, messages: Option<Vec<AgentMessage>>) {
        if self.config.hooks.guardrails.input.is_empty() {
            self.deliver_all(messages);
        }
    }

    /// Ends the run: the budget or guardrail that ended it, then `agent_end`
    /// with the run's messages.
    pub(super) fn finish(mut self, reason: RunEnd) -> Vec<AgentMessage> {
        let reason = match self.gate.close() {
            Some((event, end)) => {
                self.emit(event);
                end
            }
            None => reason,
        };
        let messages = self.history.take_new();
        let output = self.output.take();
        self.emit(AgentEvent::AgentEnd {
            messages: messages.clone(),
            reason,
            output,
        });
        messages
    }
}
