//! One turn's tool calls: prepared (found, validated, passed through
//! `before_tool_call`), executed in parallel or in sequence, finished through
//! `after_tool_call`, and answered — every call exactly once, whatever happens.
//!
//! A call that cannot run (unknown tool, unusable or invalid arguments, blocked,
//! cut off by the token limit, aborted before it started) is answered at once with
//! an error result. Tool futures are polled on the run's own task, each behind
//! `catch_unwind`, so a panicking tool becomes an error result. When the run is
//! aborted, or steering interrupts, unfinished tools are cancelled and get
//! [`RunOptions::cancel_grace`](crate::RunOptions::cancel_grace) to return before
//! they are dropped; no tool starts after that point.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use tiller_ai::{
    ArgumentsError, AssistantMessage, StopReason, ToolCall, ToolResultMessage, now_ms,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Interrupted, Run};
use crate::budget::Spent;
use crate::config::{
    AfterToolCall, AfterToolCallHook, BeforeToolCall, SteeringDelivery, ToolCallInfo,
    ToolExecutionMode,
};
use crate::event::AgentEvent;
use crate::failure::panic_text;
use crate::guardrail::GuardrailStage;
use crate::message::AgentMessage;
use crate::request::{Approval, UserRequest, asks_in_a_row};
use crate::tool::{AgentTool, ToolContext, ToolError, ToolExecution, ToolOutput};

/// Said for calls skipped because steering arrived.
pub(crate) const SKIPPED: &str = "Skipped due to queued user message.";

/// What a turn's tool calls produced.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// One result per call, in call order.
    pub(crate) results: Vec<ToolResultMessage>,
    /// Steering that interrupted the batch, to deliver next.
    pub(crate) steering: Option<Vec<AgentMessage>>,
    /// Whether every result asked the run to stop.
    pub(crate) terminate: bool,
    /// Requests of calls parked on the user, in call order; these calls have no
    /// result yet.
    pub(crate) parked: Vec<UserRequest>,
    /// Why the run cannot go on (the response could not be made durable before its
    /// calls ran, so none ran).
    pub(crate) failure: Option<String>,
    /// The streamed results whose restatement the next response keeps from
    /// subscribers ([`crate::restate`]).
    pub(crate) echoes: Vec<String>,
    /// Whether a result streamed to subscribers as it was made (a sub-agent's
    /// content): the child-content rule's cue.
    pub(crate) child_streamed: bool,
}

/// How one call ended.
#[derive(Debug, Clone)]
struct Outcome {
    output: ToolOutput,
    is_error: bool,
    /// Set when the call waits for the user instead of ending.
    parked: Option<UserRequest>,
    /// When the call ended: its result's timestamp, the same in the events and
    /// in the run's messages.
    at: u64,
}

impl Outcome {
    fn ok(output: ToolOutput) -> Self {
        Outcome {
            output,
            is_error: false,
            parked: None,
            at: now_ms(),
        }
    }

    fn error(text: impl Into<String>) -> Self {
        Outcome {
            is_error: true,
            ..Outcome::ok(ToolOutput::text(text))
        }
    }

    fn parked(request: UserRequest) -> Self {
        Outcome {
            parked: Some(request),
            ..Outcome::ok(ToolOutput::default())
        }
    }
}

/// A call after preparation.
enum Prepared {
    /// Answered without running.
    Answered(Outcome),
    /// Ready to run with these arguments.
    Ready(Arc<dyn AgentTool>, Value),
    /// Waiting for the user's approval.
    Parked(UserRequest),
}

pub(crate) async fn run_batch(
    run: &Run,
    message: &AssistantMessage,
    calls: Vec<ToolCall>,
) -> Batch {
    let outcomes = if let Some(why) = not_run_because(message) {
        (not_run(run, &calls, &why), None)
    } else {
        let sequential = run.config.run.tool_execution == ToolExecutionMode::Sequential
            || calls.iter().any(|call| {
                run.tools
                    .get(&call.name)
                    .is_some_and(|t| t.tool.execution() == ToolExecution::Sequential)
            });
        if sequential {
            sequentially(run, &calls).await
        } else {
            in_parallel(run, &calls).await
        }
    };
    let (mut outcomes, steering) = outcomes;
    if run.cancel.is_cancelled() {
        // An aborted run does not park: its waiting calls are answered as aborted.
        for (call, outcome) in calls.iter().zip(&mut outcomes) {
            if outcome.parked.is_some() {
                *outcome = aborted(call);
                end(run, call, outcome);
                announce(run, call, outcome);
            }
        }
    }
    let terminate = !outcomes.is_empty() && outcomes.iter().all(|o| o.output.terminate);
    let mut batch = Batch {
        steering,
        terminate,
        ..Batch::default()
    };
    for (call, outcome) in calls.iter().zip(outcomes) {
        if outcome.output.streamed && !outcome.is_error {
            batch.child_streamed = true;
            if outcome.output.quiet_restatement {
                batch.echoes.push(outcome.output.text_content());
            }
        }
        match outcome.parked {
            Some(request) => batch.parked.push(request),
            None => batch.results.push(result_message(call, outcome)),
        }
    }
    batch
}

/// Answers `call` with `result` without running it (the reply to its request):
/// its start, end and result events, as for a call that ran.
pub(crate) fn answer(run: &Run, call: &ToolCall, result: ToolResultMessage) -> Batch {
    let outcome = Outcome {
        output: ToolOutput {
            content: result.content,
            details: result.details,
            ..ToolOutput::default()
        },
        is_error: result.is_error,
        parked: None,
        at: result.timestamp,
    };
    start(run, call);
    end(run, call, &outcome);
    announce(run, call, &outcome);
    Batch {
        results: vec![result_message(call, outcome)],
        ..Batch::default()
    }
}

fn result_message(call: &ToolCall, outcome: Outcome) -> ToolResultMessage {
    ToolResultMessage {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        content: outcome.output.content,
        details: outcome.output.details,
        is_error: outcome.is_error,
        timestamp: outcome.at,
        state: outcome.output.state,
    }
}

fn start(run: &Run, call: &ToolCall) {
    let label = run
        .tools
        .get(&call.name)
        .map_or(&call.name[..], |registered| registered.tool.label());
    run.emit(AgentEvent::ToolExecutionStart {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        label: label.to_owned(),
        args: call.arguments.clone(),
    });
}

/// The call's `tool_execution_end`; none for a call that waits for the user.
fn end(run: &Run, call: &ToolCall, outcome: &Outcome) {
    if outcome.parked.is_some() {
        return;
    }
    let result = if outcome.output.streamed {
        // Subscribers have had the content already.
        ToolOutput {
            content: Vec::new(),
            details: outcome.output.details.clone(),
            terminate: outcome.output.terminate,
            streamed: true,
            quiet_restatement: outcome.output.quiet_restatement,
            state: outcome.output.state.clone(),
        }
    } else {
        outcome.output.clone()
    };
    run.emit(AgentEvent::ToolExecutionEnd {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        result,
        is_error: outcome.is_error,
    });
}

/// The result's `message_start` and `message_end` (the start without the content
/// of a streamed result).
fn announce(run: &Run, call: &ToolCall, outcome: &Outcome) {
    if outcome.parked.is_some() {
        return;
    }
    let result = result_message(call, outcome.clone());
    let start = if outcome.output.streamed {
        ToolResultMessage {
            tool_call_id: result.tool_call_id.clone(),
            tool_name: result.tool_name.clone(),
            content: Vec::new(),
            details: result.details.clone(),
            is_error: result.is_error,
            timestamp: result.timestamp,
            state: result.state.clone(),
        }
    } else {
        result.clone()
    };
    run.emit(AgentEvent::MessageStart {
        message: Box::new(start.into()),
    });
    run.emit(AgentEvent::MessageEnd {
        message: Box::new(result.into()),
    });
}

/// Answers every call of a response that could not be made durable with an error
/// result saying so: none of them ran.
pub(crate) fn not_durable(run: &Run, calls: &[ToolCall], failure: String) -> Batch {
    let why = format!("the response could not be stored before its calls ran ({failure}).");
    let results = calls
        .iter()
        .zip(not_run(run, calls, &why))
        .map(|(call, outcome)| result_message(call, outcome))
        .collect();
    Batch {
        results,
        failure: Some(format!(
            "the response's tool calls did not run: it could not be stored first ({failure})"
        )),
        ..Batch::default()
    }
}

/// Answers every call as not run, for `why` (a budget ran out, a guardrail
/// tripped); the run ends after this turn.
pub(crate) fn refused(run: &Run, calls: &[ToolCall], why: &str) -> Batch {
    let results = calls
        .iter()
        .zip(not_run(run, calls, why))
        .map(|(call, outcome)| result_message(call, outcome))
        .collect();
    Batch {
        results,
        ..Batch::default()
    }
}

/// Why none of a response's calls may run: it was cut off by the token limit (any
/// arguments may be incomplete), it failed, or it was aborted.
pub(crate) fn not_run_because(message: &AssistantMessage) -> Option<String> {
    match message.stop_reason {
        StopReason::Length => Some("the response hit the output token limit, so its arguments may be truncated. Re-issue the tool call with complete arguments.".to_owned()),
        StopReason::Aborted => Some("the response was aborted.".to_owned()),
        StopReason::Error => Some(format!(
            "the response failed ({}).",
            message.error_message.as_deref().unwrap_or("no reason given")
        )),
        _ => None,
    }
}

/// Answers every call with an error result saying `why` it did not run.
fn not_run(run: &Run, calls: &[ToolCall], why: &str) -> Vec<Outcome> {
    calls
        .iter()
        .map(|call| {
            start(run, call);
            let outcome = Outcome::error(format!(
                "Tool call \"{}\" was not executed: {why}",
                call.name
            ));
            end(run, call, &outcome);
            announce(run, call, &outcome);
            outcome
        })
        .collect()
}

async fn sequentially(run: &Run, calls: &[ToolCall]) -> (Vec<Outcome>, Option<Vec<AgentMessage>>) {
    let mut outcomes = Vec::with_capacity(calls.len());
    let mut steering = None;
    for (index, call) in calls.iter().enumerate() {
        start(run, call);
        let outcome = if steering.is_some() {
            Outcome::error(SKIPPED)
        } else {
            match prepare(run, call).await {
                Prepared::Answered(outcome) => outcome,
                Prepared::Parked(request) => Outcome::parked(request),
                Prepared::Ready(tool, args) => execute_alone(run, tool, call, args).await,
            }
        };
        end(run, call, &outcome);
        announce(run, call, &outcome);
        outcomes.push(outcome);
        let more = index + 1 < calls.len();
        // Once a call waits for the user, steering waits for the reply too.
        let parked = outcomes.iter().any(|o| o.parked.is_some());
        if more && steering.is_none() && !parked && interrupts(run) {
            let arrived = run.take(&run.config.steering).await;
            if !arrived.is_empty() {
                steering = Some(arrived);
            }
        }
    }
    (outcomes, steering)
}

async fn in_parallel(run: &Run, calls: &[ToolCall]) -> (Vec<Outcome>, Option<Vec<AgentMessage>>) {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; calls.len()];
    let mut running = FuturesUnordered::new();
    // Cancelled on abort (with the run) or when steering interrupts the batch.
    let batch = run.cancel.child_token();
    for (index, call) in calls.iter().enumerate() {
        start(run, call);
        match prepare(run, call).await {
            Prepared::Answered(outcome) => {
                end(run, call, &outcome);
                outcomes[index] = Some(outcome);
            }
            Prepared::Parked(request) => outcomes[index] = Some(Outcome::parked(request)),
            Prepared::Ready(tool, args) => {
                let running_call = execute(run, tool, call, args, batch.clone());
                running.push(running_call.map(move |outcome| (index, outcome)));
            }
        }
    }
    let mut steering = None;
    loop {
        tokio::select! {
            biased;
            finished = running.next() => {
                let Some((index, outcome)) = finished else { break };
                end(run, &calls[index], &outcome);
                outcomes[index] = Some(outcome);
                let parked = outcomes.iter().flatten().any(|o| o.parked.is_some());
                if !running.is_empty() && !parked && interrupts(run) {
                    let arrived = run.take(&run.config.steering).await;
                    if !arrived.is_empty() {
                        steering = Some(arrived);
                        break;
                    }
                }
            }
            () = run.cancel.cancelled() => break,
        }
    }
    if !running.is_empty() {
        batch.cancel();
        // `sleep` saturates, so any grace (even `Duration::MAX`) is safe.
        let grace = tokio::time::sleep(run.config.run.cancel_grace);
        tokio::pin!(grace);
        while let Some((index, outcome)) = tokio::select! {
            biased;
            finished = running.next() => finished,
            () = &mut grace => None,
        } {
            let outcome = match (&steering, outcome.is_error || outcome.parked.is_some()) {
                (Some(_), true) => Outcome::error(SKIPPED),
                (None, _) if outcome.parked.is_some() => aborted(&calls[index]),
                _ => outcome,
            };
            end(run, &calls[index], &outcome);
            outcomes[index] = Some(outcome);
        }
        drop(running);
        for (index, slot) in outcomes.iter_mut().enumerate() {
            if slot.is_none() {
                let outcome = match steering {
                    Some(_) => Outcome::error(SKIPPED),
                    None => aborted(&calls[index]),
                };
                end(run, &calls[index], &outcome);
                *slot = Some(outcome);
            }
        }
    }
    let outcomes: Vec<Outcome> = outcomes.into_iter().flatten().collect();
    for (call, outcome) in calls.iter().zip(&outcomes) {
        announce(run, call, outcome);
    }
    (outcomes, steering)
}

fn interrupts(run: &Run) -> bool {
    run.config.run.steering_delivery == SteeringDelivery::Interrupt
        && run.config.steering.is_some()
        && !run.cancel.is_cancelled()
}

fn aborted(call: &ToolCall) -> Outcome {
    Outcome::error(format!(
        "Tool \"{}\" was aborted before it finished.",
        call.name
    ))
}

/// Finds the tool, checks the arguments and asks `before_tool_call`.
async fn prepare(run: &Run, call: &ToolCall) -> Prepared {
    if run.gate.tripped().is_some() {
        return Prepared::Answered(Outcome::error(format!(
            "Tool \"{}\" was not executed: a guardrail stopped the run.",
            call.name
        )));
    }
    if run.cancel.is_cancelled() {
        return Prepared::Answered(Outcome::error(format!(
            "Tool \"{}\" was not executed: the run was aborted.",
            call.name
        )));
    }
    if let Some(problem) = &call.arguments_error {
        let received = match problem {
            ArgumentsError::Truncated { received } | ArgumentsError::Malformed { received, .. } => {
                received
            }
        };
        return Prepared::Answered(Outcome::error(format!(
            "Tool call \"{}\" was not executed: {problem}. Received: {received}",
            call.name
        )));
    }
    let Some(registered) = run.tools.get(&call.name) else {
        let known: Vec<&str> = run.tools.tools().map(|t| t.name()).collect();
        return Prepared::Answered(Outcome::error(format!(
            "Tool \"{}\" not found. Available tools: {}.",
            call.name,
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        )));
    };
    let args = match registered.check(call.arguments.clone()) {
        Ok(args) => args,
        Err(failure) => return Prepared::Answered(Outcome::error(failure)),
    };
    let guardrails = &run.config.hooks.guardrails;
    if !guardrails.tool_calls.is_empty() {
        let text = format!("{} {args}", call.name);
        let check = guardrails.check(GuardrailStage::ToolCall, text, &run.config.context);
        let Ok(tripped) = run.verdict(GuardrailStage::ToolCall, check).await else {
            return Prepared::Answered(aborted(call));
        };
        if let Some(tripped) = tripped {
            let blocked = format!(
                "Tool call \"{}\" was blocked by the guardrail `{}`: {}",
                call.name, tripped.guardrail, tripped.reason
            );
            run.gate.trip(tripped);
            return Prepared::Answered(Outcome::error(blocked));
        }
    }
    let Some(hook) = &run.config.hooks.before_tool_call else {
        return approved(run, call, registered.tool.clone(), args);
    };
    let info = ToolCallInfo {
        call: call.clone(),
        args: args.clone(),
        context: run.config.context.clone(),
    };
    let args = match run.call_back(hook(info)).await {
        Ok(Ok(BeforeToolCall::Proceed)) => args,
        Ok(Ok(BeforeToolCall::Rewrite(rewritten))) => rewritten,
        Ok(Ok(BeforeToolCall::Block { reason, terminate })) => {
            let mut outcome = Outcome::error(reason);
            outcome.output.terminate = terminate;
            return Prepared::Answered(outcome);
        }
        Ok(Err(error)) => {
            return Prepared::Answered(Outcome::error(format!("before_tool_call failed: {error}")));
        }
        Err(Interrupted::Panicked(panic)) => {
            return Prepared::Answered(Outcome::error(format!(
                "before_tool_call panicked: {panic}"
            )));
        }
        Err(Interrupted::Aborted) => return Prepared::Answered(aborted(call)),
    };
    if run.cancel.is_cancelled() {
        return Prepared::Answered(aborted(call));
    }
    approved(run, call, registered.tool.clone(), args)
}

/// The call as its tool's [`Approval`] policy has it: ready, refused, or waiting
/// for the user (unless the user approved it already, in a reply).
fn approved(run: &Run, call: &ToolCall, tool: Arc<dyn AgentTool>, args: Value) -> Prepared {
    let ask = match run.config.run.approvals.get(&call.name) {
        None | Some(Approval::Always) => false,
        Some(Approval::Never) => {
            return Prepared::Answered(Outcome::error(format!(
                "Tool \"{}\" was not executed: it is not allowed to run.",
                call.name
            )));
        }
        Some(Approval::Ask) => true,
        Some(Approval::AskIf(predicate)) => {
            match std::panic::catch_unwind(AssertUnwindSafe(|| predicate(&args))) {
                Ok(ask) => ask,
                Err(panic) => {
                    return Prepared::Answered(Outcome::error(format!(
                        "the approval policy of \"{}\" panicked: {}",
                        call.name,
                        panic_text(panic)
                    )));
                }
            }
        }
    };
    if ask && !run.is_approved(&call.id) {
        return Prepared::Parked(UserRequest::Approval {
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            args,
            reason: None,
        });
    }
    Prepared::Ready(tool, args)
}

/// Runs one tool while nothing else runs, honouring an abort.
async fn execute_alone(
    run: &Run,
    tool: Arc<dyn AgentTool>,
    call: &ToolCall,
    args: Value,
) -> Outcome {
    let running = execute(run, tool, call, args, run.cancel.clone());
    tokio::pin!(running);
    tokio::select! {
        biased;
        outcome = &mut running => outcome,
        () = run.cancel.cancelled() => {
            tokio::time::timeout(run.config.run.cancel_grace, running).await.unwrap_or_else(|_| aborted(call))
        }
    }
}

/// Runs the tool and `after_tool_call`; a panic or error in either is an error result.
async fn execute(
    run: &Run,
    tool: Arc<dyn AgentTool>,
    call: &ToolCall,
    args: Value,
    token: CancellationToken,
) -> Outcome {
    let max_output = run.config.run.max_tool_output_bytes;
    let limit = tool.timeout().or(run.config.run.tool_timeout);
    // A call past its timeout is cancelled as an abort cancels it: its own token.
    let token = if limit.is_some() {
        token.child_token()
    } else {
        token
    };
    let ctx = tool_context(run, call, &args, token.clone());
    // Closes the context however this call ends, dropped after a grace included,
    // so a tool's leftover task cannot report after its call was answered.
    let _closed = ctx.closer();
    // The after hook sees the arguments too; copy them only for it.
    let (args, after) = match run.config.hooks.after_tool_call.clone() {
        Some(hook) => (
            args.clone(),
            Some((
                hook,
                ToolCallInfo {
                    call: call.clone(),
                    args,
                    context: run.config.context.clone(),
                },
            )),
        ),
        None => (args, None),
    };
    let span = tracing::info_span!(
        "tool",
        id = %ctx.call_id(),
        name = %tool.name(),
        otel.name = %format_args!("execute_tool {}", tool.name()),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool.name(),
        gen_ai.tool.call.id = %ctx.call_id(),
    );
    // The agent's context is `AgentContext::current()` inside the tool.
    let running = AssertUnwindSafe(
        run.config
            .context
            .clone()
            .scope(tool.execute(args, ctx.clone())),
    )
    .catch_unwind()
    .instrument(span);
    let ran = match limit {
        Some(limit) => {
            tokio::pin!(running);
            match tokio::time::timeout(limit, &mut running).await {
                Ok(ran) => ran,
                Err(_) => {
                    // Cancelled, then the grace an abort gives, then dropped;
                    // whatever it returns meanwhile, the call timed out.
                    token.cancel();
                    let _ = tokio::time::timeout(run.config.run.cancel_grace, &mut running).await;
                    Ok(Err(ToolError::new(format!(
                        "Tool \"{}\" timed out after {} ms",
                        call.name,
                        limit.as_millis()
                    ))))
                }
            }
        }
        None => running.await,
    };
    ctx.close();
    if let Ok(Err(ToolError::NeedsApproval { reason })) = &ran {
        return if run.is_approved(&call.id) {
            Outcome::error(format!(
                "Tool \"{}\" asked for approval again after the user approved it: {reason}",
                call.name
            ))
        } else {
            Outcome::parked(UserRequest::Approval {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                args: call.arguments.clone(),
                reason: Some(reason.clone()),
            })
        };
    }
    let mut outcome = finish_hooks(run, after, ran, call).await;
    outcome.output.cut_to(max_output);
    // The state the call set goes with its result (whatever the result).
    if outcome.parked.is_none() {
        outcome.output.state.extend(ctx.take_state());
    }
    outcome
}

/// The context a call of `call` runs with: its updates, actions and
/// sub-agents' events sent as the call's events, the user's approval or answer
/// if this run's reply gave one, the run's state.
fn tool_context(run: &Run, call: &ToolCall, args: &Value, token: CancellationToken) -> ToolContext {
    let sink = run.sink().clone();
    let (id, name) = (call.id.clone(), call.name.clone());
    let max_output = run.config.run.max_tool_output_bytes;
    // Copied once for all the call's updates.
    let shared_args = Arc::new(args.clone());
    let updates = Arc::new(move |mut partial_result: ToolOutput| {
        partial_result.cut_to(max_output);
        sink(AgentEvent::ToolExecutionUpdate {
            tool_call_id: id.clone(),
            tool_name: name.clone(),
            args: shared_args.clone(),
            partial_result,
        });
    });
    let actions = {
        let sink = run.sink().clone();
        let id = call.id.clone();
        Arc::new(move |action_type: String, payload: Value| {
            sink(AgentEvent::Action {
                tool_call_id: id.clone(),
                action_type,
                payload,
            });
        })
    };
    let children = {
        let sink = run.sink().clone();
        let id = call.id.clone();
        Arc::new(move |path: Vec<String>, event: AgentEvent| {
            sink(AgentEvent::ChildEvent {
                path,
                tool_call_id: id.clone(),
                event: Box::new(event),
            });
        })
    };
    ToolContext::new(
        call.id.clone(),
        run.config.context.clone(),
        token,
        updates,
        actions,
        children,
    )
    .approved_by_user(run.is_approved(&call.id))
    .answered_by_user(run.is_answered(&call.id))
    .with_run_state(run.state.clone())
}

/// The tool's result through `after_tool_call`, if there is one.
async fn finish_hooks(
    run: &Run,
    after: Option<(AfterToolCallHook, ToolCallInfo)>,
    ran: std::thread::Result<Result<ToolOutput, ToolError>>,
    call: &ToolCall,
) -> Outcome {
    let tool_name = call.name.as_str();
    let mut outcome = match ran {
        Ok(Ok(output)) => Outcome::ok(output),
        Ok(Err(ToolError::NeedsInput { field, question })) => {
            let asked = asks_in_a_row(run.messages(), &call.name);
            if asked >= run.config.run.max_asks_per_tool {
                Outcome::error(format!(
                    "Tool \"{}\" still needs `{field}` ({question}) after asking the user {asked} times; it gives up.",
                    call.name
                ))
            } else {
                // Waiting for the user: no after hook, no result yet.
                return Outcome::parked(UserRequest::Input {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    field,
                    question,
                    current_data: call.arguments.clone(),
                });
            }
        }
        Ok(Err(error)) => Outcome::error(error.message()),
        Err(panic) => Outcome::error(format!(
            "Tool \"{tool_name}\" panicked: {}",
            panic_text(panic)
        )),
    };
    let Some((hook, info)) = after else {
        return outcome;
    };
    let changed = hook(info, outcome.output.clone(), outcome.is_error);
    match run.call_back(changed).await {
        Ok(Ok(AfterToolCall {
            content,
            details,
            is_error,
            terminate,
        })) => {
            if let Some(content) = content {
                outcome.output.content = content;
            }
            if let Some(details) = details {
                outcome.output.details = details;
            }
            if let Some(terminate) = terminate {
                outcome.output.terminate = terminate;
            }
            if let Some(is_error) = is_error {
                outcome.is_error = is_error;
            }
            outcome
        }
        Ok(Err(error)) => Outcome::error(format!("after_tool_call failed: {error}")),
        Err(Interrupted::Panicked(panic)) => {
            Outcome::error(format!("after_tool_call panicked: {panic}"))
        }
        Err(Interrupted::Aborted) => Outcome::error(format!(
            "Tool \"{tool_name}\" finished, but after_tool_call did not return after the abort."
        )),
    }
}

impl Run {
    /// The tool calls of `message` answered: run once the response is durable
    /// (write-ahead), or refused when a guardrail tripped or they would pass a
    /// budget. Every call the model made counts, answered however it was (as
    /// the agent's stored spending counts its results).
    pub(super) async fn batch(&mut self, message: &AssistantMessage) -> Batch {
        let calls: Vec<_> = message.tool_calls().cloned().collect();
        let more = Spent::tool_calls(calls.len() as u64);
        let batch = if calls.is_empty() {
            Batch::default()
        } else if let Err(failure) = self.write_ahead(message).await {
            not_durable(self, &calls, failure)
        } else if let Some(tripped) = self.gate.tripped() {
            let why = format!("the guardrail `{}` tripped.", tripped.guardrail);
            refused(self, &calls, &why)
        } else if let Some(exceeded) = self.gate.over(&more) {
            refused(self, &calls, &format!("{exceeded}."))
        } else {
            run_batch(self, message, calls).await
        };
        self.gate.meter.spend(more);
        self.record_batch(&batch);
        batch
    }

    /// Waits until `message`, whose calls are about to run, is durable (see
    /// [`LoopConfig::write_ahead`]). Calls that will not run need no wait.
    pub(super) async fn write_ahead(&self, message: &AssistantMessage) -> Result<(), String> {
        if not_run_because(message).is_some() {
            return Ok(());
        }
        self.durable().await
    }

    /// Waits until everything the run emitted is durable (see
    /// [`LoopConfig::write_ahead`]), as a callback is waited for; an aborted run
    /// stops waiting: its calls are answered without running.
    pub(super) async fn durable(&self) -> Result<(), String> {
        let Some(write_ahead) = &self.config.write_ahead else {
            return Ok(());
        };
        match self.call_back(write_ahead()).await {
            Ok(durable) => durable,
            Err(Interrupted::Panicked(panic)) => {
                Err(format!("the write-ahead wait panicked: {panic}"))
            }
            Err(Interrupted::Aborted) => Ok(()),
        }
    }

    /// Adds a batch's results to the transcript, then its requests to the user,
    /// each announced.
    pub(super) fn record_batch(&mut self, batch: &Batch) {
        self.echoes.clone_from(&batch.echoes);
        self.child_streamed |= batch.child_streamed;
        for result in batch
            .results
            .iter()
            .filter(|result| !result.state.is_empty())
        {
            crate::tool::lock(&self.state).extend(result.state.clone());
        }
        for result in &batch.results {
            self.history.push(result.clone().into());
        }
        for request in &batch.parked {
            self.deliver(request.to_message());
            self.emit(AgentEvent::requested(request));
        }
    }
}
