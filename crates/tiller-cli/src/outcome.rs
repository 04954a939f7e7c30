//! How a run ended, as the exit status and message a script acts on.

use tiller::{AgentMessage, RunEnd, ai::StopReason, run::Output};

/// The exit status of the `tiller` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The answer ended normally.
    Success = 0,
    /// The run ended in a provider or tool-loop error.
    Failed = 1,
    /// Bad usage or a bad agent file.
    Usage = 2,
    /// Interrupted with Ctrl-C.
    Interrupted = 130,
}

impl Exit {
    /// Says `error` on stderr (`tiller: …`); exit status 1.
    pub fn failed(error: impl std::fmt::Display) -> Exit {
        crate::say!("tiller: {error}");
        Exit::Failed
    }

    /// Says `error` on stderr (`tiller: …`); exit status 2.
    pub fn usage(error: impl std::fmt::Display) -> Exit {
        crate::say!("tiller: {error}");
        Exit::Usage
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit as u8)
    }
}

/// Whether a run that ended for `reason`, having added `messages` (and, with an
/// output schema, `output`), answered normally; if not, why.
pub fn verdict(
    reason: RunEnd,
    messages: &[AgentMessage],
    output: Option<&Output>,
) -> Result<(), String> {
    let last = messages.iter().rev().find_map(AgentMessage::as_assistant);
    let error = || {
        last.and_then(|message| message.error_message.clone())
            .unwrap_or_else(|| "the run failed".to_owned())
    };
    match reason {
        RunEnd::StopCondition | RunEnd::ToolsTerminated => Ok(()),
        RunEnd::Completed => match last.map(|message| message.stop_reason) {
            Some(StopReason::Length) => {
                Err("the answer was cut off at the model's output limit".to_owned())
            }
            Some(StopReason::Error | StopReason::Aborted) => Err(error()),
            _ => Ok(()),
        },
        RunEnd::TurnLimit => Err("the run reached its turn limit with work left".to_owned()),
        RunEnd::Aborted => Err("the run was aborted".to_owned()),
        RunEnd::Paused => Err("the run was paused between two turns, with work left".to_owned()),
        RunEnd::Parked => Err(
            "a tool call waits for the user's answer or approval, which `tiller run` cannot give: use `tiller chat`"
                .to_owned(),
        ),
        RunEnd::Error | RunEnd::ContextOverflow => Err(error()),
        RunEnd::BudgetExceeded => Err("a budget ran out (its budget_exceeded event says which)".to_owned()),
        RunEnd::GuardrailTripped => {
            Err("a guardrail tripped (its guardrail_tripped event says which and why)".to_owned())
        }
        RunEnd::InvalidOutput => Err(match output {
            Some(Output::Invalid(error)) => error.to_string(),
            _ => "the answer did not match the output schema".to_owned(),
        }),
        other => Err(format!("the run ended: {other:?}")),
    }
}
