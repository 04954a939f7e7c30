//! Guardrails: checks of what goes into a run and what comes out of it.
//!
//! A [`Guardrail`] is a named check that answers [`Verdict::Pass`] or
//! [`Verdict::Fail`] with a reason; a check that errors or panics fails (a
//! guardrail fails closed). [`Guardrails`] holds three lists, each run
//! concurrently, the first failure in list order reported:
//!
//! - **input**: the run's new user messages. By default they are checked before
//!   they join the transcript, and a failure keeps them out of it; with
//!   [`Guardrails::input_beside`] the check runs beside the first model call,
//!   which a failure cancels (the input and the cancelled response then stay in
//!   the transcript, and tools wait for the verdict).
//! - **output**: the final answer (a response without tool calls), after it
//!   streamed.
//! - **tool_calls**: each tool call (`name` and arguments as JSON), before it
//!   runs; a failure answers the call as blocked.
//!
//! A failure ends the run with [`RunEnd::GuardrailTripped`](crate::RunEnd::GuardrailTripped)
//! after a `guardrail_tripped` event naming the stage, the guardrail and the reason.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use serde::{Deserialize, Serialize};

use crate::context::AgentContext;
use crate::failure::BoxError;
use crate::failure::panic_text;

/// What a guardrail checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardrailStage {
    /// The run's new user messages.
    Input,
    /// The final answer.
    Output,
    /// A tool call about to run.
    ToolCall,
}

impl GuardrailStage {
    /// Its name, as JSON and agent files write it.
    pub fn as_str(self) -> &'static str {
        match self {
            GuardrailStage::Input => "input",
            GuardrailStage::Output => "output",
            GuardrailStage::ToolCall => "tool_call",
        }
    }
}

/// A guardrail's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Let it through.
    Pass,
    /// Stop the run, for this reason.
    Fail {
        /// Why.
        reason: String,
    },
}

/// What a guardrail is asked about.
#[derive(Debug, Clone)]
pub struct GuardrailInput {
    /// Which check this is.
    pub stage: GuardrailStage,
    /// The text: the user's messages, the answer, or `name {arguments}`.
    pub text: String,
    /// Who the run works for.
    pub context: AgentContext,
}

type Check = dyn Fn(GuardrailInput) -> BoxFuture<'static, Result<Verdict, BoxError>> + Send + Sync;

/// A named check.
#[derive(Clone)]
pub struct Guardrail {
    name: Arc<str>,
    check: Arc<Check>,
}

impl fmt::Debug for Guardrail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Guardrail").field(&self.name).finish()
    }
}

impl Guardrail {
    /// A guardrail named `name` that asks `check`.
    pub fn new<F, Fut>(name: impl Into<String>, check: F) -> Self
    where
        F: Fn(GuardrailInput) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Verdict, BoxError>> + Send + 'static,
    {
        Guardrail {
            name: name.into().into(),
            check: Arc::new(move |input| check(input).boxed()),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A guardrail that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("the {} guardrail `{guardrail}` tripped: {reason}", stage.as_str())]
pub struct GuardrailTripped {
    /// What it checked.
    pub stage: GuardrailStage,
    /// Its name.
    pub guardrail: String,
    /// Why it failed.
    pub reason: String,
}

/// A run's guardrails.
#[derive(Debug, Clone, Default)]
pub struct Guardrails {
    /// Checks of the run's new user messages.
    pub input: Vec<Guardrail>,
    /// Checks of the final answer.
    pub output: Vec<Guardrail>,
    /// Checks of each tool call before it runs.
    pub tool_calls: Vec<Guardrail>,
    /// Whether the input checks run beside the first model call rather than
    /// before it.
    pub input_beside: bool,
}

impl Guardrails {
    /// Whether there is no check at all.
    pub fn is_empty(&self) -> bool {
        self.input.is_empty() && self.output.is_empty() && self.tool_calls.is_empty()
    }

    /// These and `other`'s, list by list.
    pub fn and(mut self, other: &Guardrails) -> Self {
        self.input.extend(other.input.iter().cloned());
        self.output.extend(other.output.iter().cloned());
        self.tool_calls.extend(other.tool_calls.iter().cloned());
        self.input_beside |= other.input_beside;
        self
    }

    /// The checks of `stage`.
    pub fn of(&self, stage: GuardrailStage) -> &[Guardrail] {
        match stage {
            GuardrailStage::Input => &self.input,
            GuardrailStage::Output => &self.output,
            GuardrailStage::ToolCall => &self.tool_calls,
        }
    }

    /// Adds `guardrail` to the checks of `stage`.
    pub fn add(&mut self, stage: GuardrailStage, guardrail: Guardrail) {
        match stage {
            GuardrailStage::Input => self.input.push(guardrail),
            GuardrailStage::Output => self.output.push(guardrail),
            GuardrailStage::ToolCall => self.tool_calls.push(guardrail),
        }
    }

    /// Runs the checks of `stage` on `text` concurrently: the first failure in
    /// list order, or `None` when all pass.
    pub fn check(
        &self,
        stage: GuardrailStage,
        text: String,
        context: &AgentContext,
    ) -> impl Future<Output = Option<GuardrailTripped>> + Send + 'static {
        let checks: Vec<_> = self
            .of(stage)
            .iter()
            .map(|guardrail| {
                let input = GuardrailInput {
                    stage,
                    text: text.clone(),
                    context: context.clone(),
                };
                let name = Arc::clone(&guardrail.name);
                // A panic calling the check, or awaiting it, fails it.
                let verdict =
                    std::panic::catch_unwind(AssertUnwindSafe(|| (guardrail.check)(input)))
                        .map(|verdict| AssertUnwindSafe(verdict).catch_unwind());
                async move {
                    let verdict = match verdict {
                        Ok(verdict) => verdict.await,
                        Err(panic) => Err(panic),
                    };
                    (name, verdict)
                }
            })
            .collect();
        async move {
            join_all(checks)
                .await
                .into_iter()
                .find_map(|(name, verdict)| {
                    let reason = match verdict {
                        Ok(Ok(Verdict::Pass)) => return None,
                        Ok(Ok(Verdict::Fail { reason })) => reason,
                        Ok(Err(error)) => format!("the guardrail failed: {error}"),
                        Err(panic) => format!("the guardrail panicked: {}", panic_text(panic)),
                    };
                    Some(GuardrailTripped {
                        stage,
                        guardrail: name.to_string(),
                        reason,
                    })
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_failure_in_order_is_reported_and_an_error_fails_closed() {
        let pass = Guardrail::new("pass", |_| async { Ok(Verdict::Pass) });
        let pii = Guardrail::new("pii", |input: GuardrailInput| async move {
            Ok(if input.text.contains('@') {
                Verdict::Fail {
                    reason: "an email address".into(),
                }
            } else {
                Verdict::Pass
            })
        });
        let broken = Guardrail::new("broken", |_| async {
            Err::<Verdict, BoxError>("down".into())
        });
        let guardrails = Guardrails {
            input: vec![pass.clone(), pii.clone()],
            output: vec![broken],
            ..Guardrails::default()
        };
        let context = AgentContext::default();
        let clean = guardrails.check(GuardrailStage::Input, "hello".into(), &context);
        assert_eq!(clean.await, None);
        let tripped = guardrails.check(GuardrailStage::Input, "me@x.org".into(), &context);
        assert_eq!(
            tripped.await,
            Some(GuardrailTripped {
                stage: GuardrailStage::Input,
                guardrail: "pii".into(),
                reason: "an email address".into(),
            })
        );
        let failed = guardrails.check(GuardrailStage::Output, "anything".into(), &context);
        assert_eq!(
            failed.await.map(|tripped| tripped.reason),
            Some("the guardrail failed: down".to_owned())
        );
        assert_eq!(
            guardrails
                .check(GuardrailStage::ToolCall, "x".into(), &context)
                .await,
            None
        );
    }
}
