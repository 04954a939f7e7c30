//! What guards a run: fallback models and circuit breakers, budgets, guardrails.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, context, describe, echo, end_reason, log, prompt, roles};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_ai::{BreakerPolicy, Breakers, StreamError, Usage};
use tiller_core::budget::{Amount, BudgetLimit, BudgetScope};
use tiller_core::{
    AgentEvent, AgentMessage, Budget, Guardrail, GuardrailInput, Guardrails, RunEnd, Spending,
    Spent, Tally, Verdict,
};

fn unavailable() -> StreamError {
    StreamError::Http {
        provider: "primary".into(),
        status: 503,
        message: "Service Unavailable".into(),
        body: String::new(),
        retry_after_ms: None,
    }
}

/// A primary model and a fallback, each a faux model of its own provider.
fn two_models() -> (FauxProvider, FauxProvider, tiller_core::LoopConfig) {
    let primary = FauxProvider::new();
    let backup = FauxProvider::new();
    let mut config = tiller_core::LoopConfig::new(primary.model().with_provider("primary"));
    config.fallbacks = vec![backup.model().with_provider("backup")];
    (primary, backup, config)
}

fn answered_by(messages: &[AgentMessage]) -> Vec<String> {
    messages
        .iter()
        .filter_map(AgentMessage::as_assistant)
        .map(|message| format!("{}/{}", message.provider, message.model))
        .collect()
}

#[tokio::test]
async fn an_unavailable_model_falls_back_and_the_answer_names_the_model_that_gave_it() {
    let (primary, backup, config) = two_models();
    primary.push(FauxTurn::new().fail_with(unavailable()));
    backup.push(FauxTurn::text("From the backup."));
    let (events, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(
        describe(&events),
        [
            "agent_start",
            "turn_start",
            "message_start user:hi",
            "message_end user:hi",
            "model_fallback primary/faux -> backup/faux",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 2",
        ]
    );
    assert_eq!(answered_by(&messages), ["backup/faux"]);
    let AgentEvent::ModelFallback { error, .. } = &events[4] else {
        panic!("{:?}", events[4]);
    };
    assert_eq!(error, "HTTP 503 from primary: Service Unavailable");
}

#[tokio::test]
async fn a_refused_request_does_not_fall_back() {
    let (primary, backup, config) = two_models();
    primary.push(FauxTurn::new().fail_with(StreamError::Http {
        provider: "primary".into(),
        status: 400,
        message: "Bad Request".into(),
        body: String::new(),
        retry_after_ms: None,
    }));
    let (events, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(end_reason(&events), RunEnd::Error);
    assert_eq!(backup.requests().len(), 0);
    assert_eq!(answered_by(&messages), ["primary/faux"]);
}

#[tokio::test(start_paused = true)]
async fn a_breaker_opens_after_failures_and_agents_skip_the_dead_provider_until_a_probe() {
    let (primary, backup, mut config) = two_models();
    let breakers = Breakers::new(BreakerPolicy {
        failures: 2,
        open_for: Duration::from_secs(30),
    });
    config.run.stream.transport.breakers = Some(breakers.clone());
    primary.respond_with(|_| FauxTurn::new().fail_with(unavailable()));
    backup.respond_with(|_| FauxTurn::text("From the backup."));
    for _ in 0..2 {
        let (_, messages) = prompt("hi", context(vec![], vec![]), config.clone()).await;
        assert_eq!(answered_by(&messages), ["backup/faux"]);
    }
    assert_eq!(primary.requests().len(), 2);
    // Open: the primary gets no request, the backup answers at once.
    let (events, messages) = prompt("hi", context(vec![], vec![]), config.clone()).await;
    assert_eq!(primary.requests().len(), 2);
    assert_eq!(answered_by(&messages), ["backup/faux"]);
    let error = events.iter().find_map(|event| match event {
        AgentEvent::ModelFallback { error, .. } => Some(error.clone()),
        _ => None,
    });
    assert_eq!(
        error.as_deref(),
        Some("primary faux://local is failing: its circuit is open for 30s")
    );
    assert!(breakers.stats()[0].open);
    // After the wait one call probes; the primary is back and closes it.
    tokio::time::advance(Duration::from_secs(30)).await;
    primary.respond_with(|_| FauxTurn::text("The primary again."));
    let (_, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(answered_by(&messages), ["primary/faux"]);
    assert!(!breakers.stats()[0].open);
}

fn used(input: u64, output: u64) -> Usage {
    Usage {
        input,
        output,
        total_tokens: input + output,
        ..Usage::default()
    }
}

#[tokio::test]
async fn a_token_budget_ends_the_run_before_the_model_call_it_cannot_cover() {
    let faux = FauxProvider::new();
    faux.respond_with(|_| {
        FauxTurn::tool_call("echo", json!({"value": "again"})).usage(used(60, 30))
    });
    let mut config = config(&faux);
    config.run.budget.run = Budget {
        total_tokens: Some(150),
        ..Budget::default()
    };
    let ran = log();
    let (events, messages) = prompt("loop", context(vec![echo(&ran)], vec![]), config).await;
    // 90 tokens; the next call's input (the 90 and the tool's result) on top
    // of them leaves no room under 150: it is never made.
    assert_eq!(faux.requests().len(), 1);
    let lines = describe(&events);
    assert_eq!(
        lines[lines.len() - 3..],
        [
            "turn_end Error []",
            "budget_exceeded Run TotalTokens 90/150",
            "agent_end BudgetExceeded 4"
        ]
    );
    assert_eq!(
        roles(&messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
    let refused = messages[3].as_assistant().unwrap();
    assert_eq!(
        refused.error_message.as_deref(),
        Some("not asked: the run budget of total_tokens ran out: 90 spent of 150")
    );
}

#[tokio::test]
async fn a_tool_call_budget_answers_the_batch_it_cannot_cover_as_not_run() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("echo", json!({"value": "one"})));
    faux.push(
        FauxTurn::new()
            .with_tool_call("echo", json!({"value": "two"}))
            .with_tool_call("echo", json!({"value": "three"})),
    );
    let mut config = config(&faux);
    config.run.budget.run.tool_calls = Some(2);
    let ran = log();
    let (events, messages) = prompt("go", context(vec![echo(&ran)], vec![]), config).await;
    assert_eq!(common::logged(&ran), ["one"]);
    let exceeded = events.iter().find_map(|event| match event {
        AgentEvent::BudgetExceeded {
            scope,
            limit,
            max,
            spent,
        } => Some((*scope, *limit, *max, *spent)),
        _ => None,
    });
    assert_eq!(
        exceeded,
        Some((
            BudgetScope::Run,
            BudgetLimit::ToolCalls,
            Amount::Count(2),
            Amount::Count(3)
        ))
    );
    let results: Vec<String> = messages
        .iter()
        .filter_map(AgentMessage::as_tool_result)
        .map(|result| result.text_content())
        .collect();
    assert_eq!(
        results[1],
        "Tool call \"echo\" was not executed: the run budget of tool_calls ran out: 3 spent of 2."
    );
    assert_eq!(end_reason(&events), RunEnd::BudgetExceeded);
}

#[tokio::test]
async fn an_agents_and_a_tenants_spending_before_the_run_count_against_their_budgets() {
    let faux = FauxProvider::new();
    faux.respond_with(|_| FauxTurn::text("ok").usage(used(10, 5)));
    // The agent spent 3 calls before; its budget allows 3.
    let mut agent = config(&faux);
    agent.run.budget.agent.model_calls = Some(3);
    agent.spending.agent_before = Spent {
        model_calls: 3,
        ..Spent::default()
    };
    let (events, _) = prompt("hi", context(vec![], vec![]), agent).await;
    assert_eq!(end_reason(&events), RunEnd::BudgetExceeded);
    assert_eq!(faux.requests().len(), 0);
    // A tenant's tally is shared: after one run of 15 tokens under a budget of
    // 20, the next run's input on top of them leaves no room.
    let tally = Arc::new(Tally::new(
        Budget {
            total_tokens: Some(20),
            ..Budget::default()
        },
        Spent::default(),
    ));
    let mut tenant = config(&faux);
    tenant.spending = Spending {
        agent_before: Spent::default(),
        tenant: Some(tally.clone()),
    };
    let (first, _) = prompt("hi", context(vec![], vec![]), tenant.clone()).await;
    let (second, _) = prompt("hi", context(vec![], vec![]), tenant.clone()).await;
    let (third, _) = prompt("hi", context(vec![], vec![]), tenant).await;
    assert_eq!(
        [end_reason(&first), end_reason(&second), end_reason(&third)],
        [
            RunEnd::Completed,
            RunEnd::BudgetExceeded,
            RunEnd::BudgetExceeded
        ]
    );
    assert!(
        describe(&second).contains(&"budget_exceeded Tenant TotalTokens 15/20".to_owned()),
        "{:?}",
        describe(&second)
    );
    assert_eq!(tally.spent().total_tokens(), 15);
    assert_eq!(tally.spent().model_calls, 1);
    assert!(tally.held().is_zero());
}

fn no_secrets() -> Guardrail {
    Guardrail::new("no_secrets", |input: GuardrailInput| async move {
        Ok(if input.text.contains("password") {
            Verdict::Fail {
                reason: format!("{:?} mentions a password", input.stage),
            }
        } else {
            Verdict::Pass
        })
    })
}

#[tokio::test]
async fn a_tripped_input_guardrail_keeps_the_input_from_the_model_and_the_transcript() {
    let faux = FauxProvider::new();
    let mut config = config(&faux);
    config.hooks.guardrails.input = vec![no_secrets()];
    let (events, messages) =
        prompt("my password is hunter2", context(vec![], vec![]), config).await;
    assert_eq!(
        describe(&events),
        [
            "agent_start",
            "guardrail_tripped Input no_secrets: Input mentions a password",
            "agent_end GuardrailTripped 0",
        ]
    );
    assert!(messages.is_empty());
    assert_eq!(faux.requests().len(), 0);

    // Steering is checked before it joins the transcript too: refused, it never
    // does, and the turn ends saying why.
    faux.push(FauxTurn::tool_call("echo", json!({"value": "one"})));
    let steered = std::sync::atomic::AtomicBool::new(false);
    let steered = Arc::new(steered);
    let mut steering = common::config(&faux).with_steering(move || {
        let first = !steered.swap(true, std::sync::atomic::Ordering::SeqCst);
        async move {
            if first {
                Vec::new()
            } else {
                vec![AgentMessage::user("and the password is hunter2")]
            }
        }
    });
    steering.hooks.guardrails.input = vec![no_secrets()];
    let ran = log();
    let (events, messages) = prompt("echo one", context(vec![echo(&ran)], vec![]), steering).await;
    assert_eq!(
        roles(&messages),
        ["user", "assistant", "tool_result", "assistant"]
    );
    let last = messages
        .last()
        .and_then(AgentMessage::as_assistant)
        .unwrap();
    assert_eq!(
        last.error_message.as_deref(),
        Some("the input guardrail `no_secrets` tripped: Input mentions a password")
    );
    let lines = describe(&events);
    assert_eq!(
        lines[lines.len() - 4..],
        [
            "message_end assistant",
            "turn_end Error []",
            "guardrail_tripped Input no_secrets: Input mentions a password",
            "agent_end GuardrailTripped 4"
        ]
    );
}

#[tokio::test]
async fn an_input_guardrail_beside_the_first_call_cancels_it_when_it_trips() {
    let faux = FauxProvider::new();
    // A slow answer: the guardrail decides while it streams.
    faux.push(
        FauxTurn::text("a long and slow answer")
            .chunk_size(2)
            .delay(Duration::from_millis(20)),
    );
    let mut config = config(&faux);
    config.hooks.guardrails = Guardrails {
        input: vec![Guardrail::new("slow_check", |_| async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok(Verdict::Fail {
                reason: "off topic".into(),
            })
        })],
        input_beside: true,
        ..Guardrails::default()
    };
    let (events, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(faux.requests().len(), 1);
    let last = messages
        .last()
        .and_then(AgentMessage::as_assistant)
        .unwrap();
    assert_eq!(last.stop_reason, tiller_ai::StopReason::Aborted);
    let lines = describe(&events);
    assert_eq!(
        lines[lines.len() - 2..],
        [
            "guardrail_tripped Input slow_check: off topic",
            "agent_end GuardrailTripped 2"
        ]
    );
}

#[tokio::test]
async fn output_and_tool_call_guardrails_end_the_run_with_the_reason() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("The password is hunter2."));
    let mut output = config(&faux);
    output.hooks.guardrails.output = vec![no_secrets()];
    let (events, _) = prompt("what is it?", context(vec![], vec![]), output).await;
    let lines = describe(&events);
    assert_eq!(
        lines[lines.len() - 2..],
        [
            "guardrail_tripped Output no_secrets: Output mentions a password",
            "agent_end GuardrailTripped 2"
        ]
    );

    faux.push(FauxTurn::tool_call("echo", json!({"value": "password"})));
    let mut tools = config(&faux);
    tools.hooks.guardrails.tool_calls = vec![no_secrets()];
    let ran = log();
    let (events, messages) = prompt("echo it", context(vec![echo(&ran)], vec![]), tools).await;
    assert!(common::logged(&ran).is_empty());
    let result = messages
        .iter()
        .find_map(AgentMessage::as_tool_result)
        .unwrap();
    assert_eq!(
        result.text_content(),
        "Tool call \"echo\" was blocked by the guardrail `no_secrets`: ToolCall mentions a password"
    );
    assert_eq!(end_reason(&events), RunEnd::GuardrailTripped);
}
