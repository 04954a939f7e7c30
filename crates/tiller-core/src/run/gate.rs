//! The gate: what is checked before the model is asked and before tools run.
//! The input guardrails see the prompt (before the first model call, or beside
//! it), then each turn's steering and follow-ups; the budgets are checked before
//! every call. A verdict is kept in the run's [`Gate`] and ends the run at the end
//! of its turn.

use std::future::Future;
use std::sync::OnceLock;

use futures::FutureExt;
use futures::future::BoxFuture;
use tiller_ai::{AssistantMessage, UserMessage};

use super::{Interrupted, Run, Start};
use crate::budget::{BudgetExceeded, Meter, Spent};
use crate::event::{AgentEvent, RunEnd};
use crate::guardrail::{GuardrailStage, GuardrailTripped};
use crate::message::AgentMessage;

/// The input guardrails' verdict, awaited beside the first model call.
pub(super) type Beside = Option<BoxFuture<'static, Option<GuardrailTripped>>>;

/// A run's budgets and the verdicts that end it.
pub(crate) struct Gate {
    /// The run's budgets and spending.
    pub(super) meter: Meter,
    /// The budget that ran out.
    exceeded: Option<BudgetExceeded>,
    /// The guardrail that tripped (the first to fail).
    tripped: OnceLock<GuardrailTripped>,
}

impl Gate {
    pub(super) fn new(meter: Meter) -> Self {
        Gate {
            meter,
            exceeded: None,
            tripped: OnceLock::new(),
        }
    }

    /// Ends the run at the end of this turn: `tripped` failed (the first
    /// guardrail to fail is the one reported).
    pub(crate) fn trip(&self, tripped: GuardrailTripped) {
        let _ = self.tripped.set(tripped);
    }

    /// The guardrail that tripped, if one did.
    pub(crate) fn tripped(&self) -> Option<&GuardrailTripped> {
        self.tripped.get()
    }

    /// Ends the run at the end of this turn: `exceeded` ran out.
    pub(super) fn exceed(&mut self, exceeded: BudgetExceeded) {
        self.exceeded = Some(exceeded);
    }

    /// The budget `more` (tool calls about to run) would pass, if any; it then
    /// ends the run.
    pub(super) fn over(&mut self, more: &Spent) -> Option<BudgetExceeded> {
        let exceeded = self.meter.exceeded(more)?;
        self.exceeded = Some(exceeded);
        Some(exceeded)
    }

    /// How the verdicts so far end the run, if they do.
    pub(super) fn ends(&self) -> Option<RunEnd> {
        if self.tripped.get().is_some() {
            Some(RunEnd::GuardrailTripped)
        } else {
            self.exceeded.map(|_| RunEnd::BudgetExceeded)
        }
    }

    /// Stops the run's clock, and gives the verdict that ended the run as its
    /// event and the run's end, if one did.
    pub(super) fn close(&mut self) -> Option<(AgentEvent, RunEnd)> {
        self.meter.stop();
        match (self.tripped.take(), self.exceeded.take()) {
            (Some(tripped), _) => Some((tripped.into(), RunEnd::GuardrailTripped)),
            (None, Some(exceeded)) => Some((exceeded.into(), RunEnd::BudgetExceeded)),
            (None, None) => None,
        }
    }
}

impl Run {
    /// Awaits the guardrails' `check` of `stage` as a callback is awaited:
    /// `Err` once the run is aborted and the check does not answer within the
    /// grace. The one place a panicking check becomes a verdict (a check that
    /// panics inside [`Guardrails::check`](crate::Guardrails::check) has failed
    /// already).
    pub(crate) async fn verdict(
        &self,
        stage: GuardrailStage,
        check: impl Future<Output = Option<GuardrailTripped>>,
    ) -> Result<Option<GuardrailTripped>, Interrupted> {
        match self.call_back(check).await {
            Err(Interrupted::Panicked(panic)) => Ok(Some(GuardrailTripped {
                stage,
                guardrail: stage.as_str().to_owned(),
                reason: format!("the guardrail panicked: {panic}"),
            })),
            verdict => verdict,
        }
    }

    /// The input guardrails' check of the user messages among `messages`, if
    /// the run has input guardrails and `messages` a user message.
    fn input_check<'a>(
        &self,
        messages: impl IntoIterator<Item = &'a AgentMessage>,
    ) -> Option<impl Future<Output = Option<GuardrailTripped>> + Send + 'static> {
        let guardrails = &self.config.hooks.guardrails;
        if guardrails.input.is_empty() {
            return None;
        }
        let users: Vec<String> = messages
            .into_iter()
            .filter_map(AgentMessage::as_user)
            .map(UserMessage::text_content)
            .collect();
        if users.is_empty() {
            return None;
        }
        let text = users.join("\n\n");
        Some(guardrails.check(GuardrailStage::Input, text, &self.config.context))
    }

    /// The checks before the first turn: the prompt's input guardrails (with
    /// the steering taken for the start), awaited or left to run beside the
    /// first model call; then the budgets, unless the run starts with a reply,
    /// which resolves its request whatever they say (the turn after it is
    /// checked as every other). `Err` stops the run before its first turn.
    pub(super) async fn open_gate(&mut self, start: &Start) -> Result<Beside, (RunEnd, Beside)> {
        let mut beside = None;
        if let Start::Messages(prompts) = start {
            let steering = self.config.first_steering.iter().flatten();
            match self.input_check(prompts.iter().chain(steering)) {
                Some(check) if self.config.hooks.guardrails.input_beside => {
                    beside = Some(check.boxed());
                }
                // Kept out of the transcript: the model never sees it.
                Some(check) => match self.verdict(GuardrailStage::Input, check).await {
                    Ok(None) => {}
                    Ok(Some(tripped)) => {
                        self.gate.trip(tripped);
                        return Err((RunEnd::GuardrailTripped, None));
                    }
                    Err(_) => return Err((RunEnd::Aborted, None)),
                },
                None => {}
            }
        }
        if !matches!(start, Start::Reply(..)) && self.gate.over(&Spent::default()).is_some() {
            return Err((RunEnd::BudgetExceeded, beside));
        }
        Ok(beside)
    }

    /// A run the gate stopped before its first turn. Nothing is lost: a prompt
    /// the guardrails let through joins the transcript though no turn runs (its
    /// check, had it to run beside the first model call, is awaited now).
    pub(super) async fn stopped_at_gate(
        &mut self,
        start: Start,
        reason: RunEnd,
        beside: Beside,
    ) -> RunEnd {
        if let (Start::Messages(prompts), RunEnd::BudgetExceeded) = (start, reason) {
            let checked = match beside {
                Some(check) => self.verdict(GuardrailStage::Input, check).await,
                None => Ok(None),
            };
            match checked {
                Ok(None) => self.deliver_all(Some(prompts)),
                Ok(Some(tripped)) => self.gate.trip(tripped),
                // Unchecked, it is not kept.
                Err(_) => {}
            }
        }
        reason
    }

    /// Steering and follow-ups pass the input guardrails before they join the
    /// transcript (unless `checked` with the prompt already); refused, they
    /// never do, and `Err` is the turn's message saying why.
    pub(super) async fn admit(
        &mut self,
        pending: Vec<AgentMessage>,
        checked: bool,
    ) -> Result<(), AssistantMessage> {
        if let Some(check) = self.input_check(&pending).filter(|_| !checked) {
            match self.verdict(GuardrailStage::Input, check).await {
                Ok(None) => {}
                Ok(Some(tripped)) => {
                    let message = self.fail(tripped.to_string());
                    self.gate.trip(tripped);
                    return Err(message);
                }
                Err(_) => return Err(self.aborted()),
            }
        }
        for message in pending {
            self.deliver(message);
        }
        Ok(())
    }

    /// A model call the budgets leave no room for: never made, its response an
    /// error saying so, and the run ends after the turn.
    pub(super) fn refuse(&mut self, exceeded: BudgetExceeded) -> AssistantMessage {
        self.gate.exceed(exceeded);
        self.fail(format!("not asked: {exceeded}"))
    }

    /// The first response, asked while the input guardrails decide: a failure
    /// cancels it.
    pub(super) async fn respond_beside(
        &mut self,
        mut verdict: BoxFuture<'static, Option<GuardrailTripped>>,
    ) -> AssistantMessage {
        let call = self.cancel.child_token();
        let run = std::mem::replace(&mut self.options.transport.cancel, call.clone());
        let (message, decided) = {
            let respond = self.respond();
            tokio::pin!(respond);
            tokio::select! {
                message = &mut respond => (message, None),
                tripped = &mut verdict => {
                    if tripped.is_some() {
                        call.cancel();
                    }
                    (respond.await, Some(tripped))
                }
            }
        };
        self.options.transport.cancel = run;
        // Tools wait for the verdict, as an aborted run waits for a callback.
        let tripped = match decided {
            Some(tripped) => tripped,
            None => self
                .verdict(GuardrailStage::Input, verdict)
                .await
                .ok()
                .flatten(),
        };
        if let Some(tripped) = tripped {
            self.gate.trip(tripped);
        }
        message
    }
}
