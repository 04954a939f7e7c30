//! Structured output: the answer checked against the schema, corrective retries,
//! and the typed failure past the budget.

#![allow(clippy::unwrap_used)]

mod common;

use common::{config, context, describe, echo, log, prompt, user_text};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::OutputSchema;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_core::{AgentEvent, LoopConfig, Output, OutputError, RunEnd};

fn city_schema() -> OutputSchema {
    OutputSchema::new(
        "city",
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
            "required": ["name", "population"]
        }),
    )
}

fn structured(faux: &FauxProvider) -> LoopConfig {
    let mut config = config(faux);
    config.run.stream.output_schema = Some(city_schema());
    config
}

fn ending(events: &[AgentEvent]) -> (RunEnd, Option<Output>) {
    match events.last() {
        Some(AgentEvent::AgentEnd { reason, output, .. }) => (*reason, output.clone()),
        other => panic!("expected agent_end, got {other:?}"),
    }
}

#[tokio::test]
async fn a_valid_answer_is_parsed_and_the_schema_reaches_the_model() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text(r#"{"name": "Oslo", "population": 709000}"#));
    let (events, _) = prompt(
        "Largest city of Norway?",
        context(vec![], vec![]),
        structured(&faux),
    )
    .await;
    assert_eq!(
        ending(&events),
        (
            RunEnd::Completed,
            Some(Output::Valid {
                value: json!({"name": "Oslo", "population": 709000})
            })
        )
    );
    // The faux API has no native mechanism: the schema is in the instructions.
    assert_eq!(
        faux.requests()[0].context.system_prompt.as_deref(),
        Some(format!("You are helpful.\n\n{}", city_schema().instructions()).as_str())
    );
}

#[tokio::test]
async fn a_failing_answer_goes_back_with_its_errors_and_the_corrected_one_counts() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Oslo, about 709,000 people."));
    faux.push(FauxTurn::text(r#"{"name": "Oslo"}"#));
    faux.push(FauxTurn::text(
        "```json\n{\"name\": \"Oslo\", \"population\": 709000}\n```",
    ));
    let (events, messages) = prompt(
        "Largest city of Norway?",
        context(vec![], vec![]),
        structured(&faux),
    )
    .await;
    assert_eq!(
        ending(&events),
        (
            RunEnd::Completed,
            Some(Output::Valid {
                value: json!({"name": "Oslo", "population": 709000})
            })
        )
    );
    let users: Vec<String> = messages.iter().filter_map(user_text).collect();
    assert_eq!(
        users,
        [
            "Largest city of Norway?".to_owned(),
            "Your answer does not match the required JSON Schema:\n  - root: the answer is not JSON: expected value at line 1 column 1\n\nAnswer again with only a JSON value that matches the schema.".to_owned(),
            "Your answer does not match the required JSON Schema:\n  - root: \"population\" is a required property\n\nAnswer again with only a JSON value that matches the schema.".to_owned(),
        ]
    );
    // The corrections go to the model as the conversation's last message.
    let requests = faux.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        requests[2].last_user_text().as_deref(),
        Some(users[2].as_str())
    );
    assert_eq!(
        describe(&events)
            .iter()
            .filter(|line| line.starts_with("turn_end") || line.starts_with("agent_end"))
            .count(),
        4
    );
}

#[tokio::test]
async fn past_the_budget_the_run_ends_with_the_last_answer_and_its_errors() {
    let faux = FauxProvider::new();
    for _ in 0..3 {
        faux.push(FauxTurn::text(r#"{"name": 7}"#));
    }
    let mut config = structured(&faux);
    config.run.output_retries = 2;
    let (events, messages) = prompt("Largest city?", context(vec![], vec![]), config).await;
    assert_eq!(
        ending(&events),
        (
            RunEnd::InvalidOutput,
            Some(Output::Invalid(OutputError {
                answer: r#"{"name": 7}"#.to_owned(),
                errors: vec![
                    "root: \"population\" is a required property".to_owned(),
                    "/name: 7 is not of type \"string\"".to_owned(),
                ],
                attempts: 3,
            }))
        )
    );
    assert_eq!(faux.remaining(), 0);
    // The prompt, three answers and two corrections.
    assert_eq!(messages.len(), 6);
}

#[tokio::test]
async fn tool_calls_run_as_usual_and_only_the_final_answer_is_checked() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("echo", json!({"value": "Oslo"})));
    faux.push(FauxTurn::text(r#"{"name": "Oslo", "population": 709000}"#));
    let calls = log();
    let (events, _) = prompt(
        "Largest city?",
        context(vec![echo(&calls)], vec![]),
        structured(&faux),
    )
    .await;
    assert_eq!(*calls.lock().unwrap(), ["Oslo"]);
    assert_eq!(
        ending(&events).1.and_then(|output| output.value().cloned()),
        Some(json!({"name": "Oslo", "population": 709000}))
    );
}

#[tokio::test]
async fn an_unusable_schema_fails_the_run_before_any_model_call() {
    let faux = FauxProvider::new();
    let mut config = config(&faux);
    config.run.stream.output_schema = Some(OutputSchema::new("bad", json!({"type": 12})));
    let (events, messages) = prompt("hi", context(vec![], vec![]), config).await;
    assert_eq!(ending(&events), (RunEnd::Error, None));
    assert!(faux.requests().is_empty());
    let error = messages
        .last()
        .and_then(|message| message.as_assistant())
        .and_then(|message| message.error_message.clone())
        .unwrap();
    assert!(
        error.starts_with("the output schema is not a valid JSON Schema: "),
        "{error}"
    );
}
