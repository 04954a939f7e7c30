//! `tiller eval`: a suite of twenty cases against the faux model and a scripted
//! OpenAI-compatible server, judged by an agent on that server; its report, its
//! JUnit XML, a baseline that flags exactly the cases a change made worse, and
//! the runs' sessions deleted in one command.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Dialect, Scratch, finish, tiller};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_test_support::{CapturedRequest, MockResponse, MockServer};

/// The scripted model: judges by the rubric, calls `weather` for "Weather in
/// X?", says what the tool answered, and otherwise "Scripted: PROMPT" — but
/// "Oops" to a fragile prompt once the agent's instructions say v2.
fn scripted(request: &CapturedRequest) -> MockResponse {
    let openai = Dialect::OpenAi;
    let prompt = openai.last_user_text(request);
    if prompt.starts_with("Judge the assistant's answer") {
        let verdict = if prompt.contains("Rubric: lenient") {
            json!({"pass": true, "score": 0.9, "reason": "Kind enough"})
        } else {
            json!({"pass": false, "score": 0.2, "reason": "Too curt"})
        };
        return openai.text(&[&verdict.to_string()]);
    }
    if let Some(result) = openai.tool_results(request).last() {
        return openai.text(&["Weather: ", result["text"].as_str().unwrap_or("?")]);
    }
    if let Some(city) = prompt.strip_prefix("Weather in ") {
        let city = city.trim_end_matches('?');
        return openai.tool_call("call_1", "weather", json!({ "city": city }));
    }
    let system = request.body["messages"][0]["content"]
        .as_str()
        .unwrap_or("");
    if prompt.contains("fragile") && system.contains("v2") {
        return openai.text(&["Oops"]);
    }
    openai.text(&["Scripted: ", &prompt])
}

const SUITE: &str = r#"
name: twenty
agent: agent.yaml
agents: judges
models:
  - faux
  - {name: scripted, provider: llamacpp, model: scripted, base_url: "BASE_URL"}
concurrency: 8
budget: {model_calls: 400}
cases:
  - {name: hello, input: Hello, expect: [{contains: Hello}]}
  - {name: said, input: Ping, expect: [{contains: 'You said: "Ping"'}]}
  - {name: scripted-prefix, input: Pong, expect: [{regex: "^Scripted: Pong$"}]}
  - {name: equals, input: Exactly this, expect: [{equals: "Scripted: Exactly this"}]}
  - {name: polite, input: Hi there, expect: [{not_contains: sorry}]}
  - name: weather-stubbed
    input: Weather in Paris?
    stubs: {weather: Sunny}
    expect:
      - tool_called: {name: weather, args: {city: Paris}, order: 0}
      - contains: Sunny
  - {name: weather-real, input: Weather in Oslo?, expect: [{contains: "Weather: Rain (an evaluation)"}]}
  - name: weather-down
    input: Weather in Bern?
    stubs: {weather: {error: station down}}
    expect: [{contains: station down}]
  - {name: no-tool, input: Just talk, expect: [{no_tool: true}]}
  - {name: no-tool-weather, input: Weather in Rome?, stubs: {weather: Warm}, expect: [{no_tool: true}]}
  - {name: one-turn, input: Weather in Lima?, stubs: {weather: Dry}, expect: [{max_turns: 1}]}
  - {name: free, input: Anything, expect: [{max_cost_usd: 0}, {max_latency_ms: 60000}]}
  - {name: judged-lenient, input: Greet me, expect: [{judge: {definition: judge, rubric: lenient}}]}
  - {name: judged-strict, input: Greet me, expect: [{judge: {definition: judge@1, rubric: strict}}]}
  - {name: judged-high-bar, input: Greet me, expect: [{judge: {agent: judges/judge.yaml, rubric: lenient, min_score: 0.95}}]}
  - name: conversation
    conversation: [{user: Hi}, {assistant: Hello!}, {user: Again}]
    expect: [{contains: Again}]
  - {name: with-user, input: Who am I?, context: {user_id: ada}, expect: [{contains: Who am I?}]}
  - {name: schema, input: Give JSON, expect: [{json_schema: {type: object}}]}
  - {name: fragile-one, input: fragile one, expect: [{contains: "Scripted: fragile one"}]}
  - {name: fragile-two, input: fragile two, expect: [{not_contains: Oops}]}
"#;

fn agent(version: &str) -> String {
    format!(
        r#"type: object
description: You are the {version} assistant.
json_schema_extra:
  kind: agent
  name: helper
  tools:
    - name: weather
      description: The weather in a city
      parameters: {{type: object, properties: {{city: {{type: string}}}}, required: [city]}}
      command: [python3, -c, "import os; print('Rain' + (' (an evaluation)' if os.environ.get('TILLER_EVALUATION') == '1' else ''))"]
"#
    )
}

/// The report without its timings, the one thing that differs between runs.
fn untimed(mut report: Value) -> Value {
    for cell in report["cells"].as_array_mut().unwrap() {
        cell["latency_p50_ms"] = json!(0);
        cell["latency_p95_ms"] = json!(0);
        for run in cell["runs"].as_array_mut().unwrap() {
            run["latency_ms"] = json!(0);
        }
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suite_over_two_models_reports_exactly_and_a_baseline_flags_what_a_change_made_worse() {
    if common::missing_tool(&["python3"], "the evaluation test").is_some() {
        return;
    }
    let server = MockServer::start().await;
    server.respond_with(scripted);
    let scratch = Scratch::new();
    let suite = scratch.write("suite.yaml", &SUITE.replace("BASE_URL", &server.base_url()));
    scratch.write("agent.yaml", &agent("v1"));
    std::fs::create_dir_all(scratch.path().join("judges")).unwrap();
    scratch.write(
        "judges/judge.yaml",
        &format!(
            "type: object\ndescription: You judge answers.\njson_schema_extra:\n  kind: agent\n  name: judge\n  version: \"1\"\n  model: {{provider: llamacpp, id: judge, base_url: \"{}\"}}\n",
            server.base_url()
        ),
    );
    let store = format!("sqlite://{}", scratch.path().join("sessions.db").display());
    let path = |name: &str| scratch.path().join(name).display().to_string();
    let eval = |run: &str, extra: &[&str]| {
        let mut args = vec![
            "eval",
            suite.to_str().unwrap(),
            "--store",
            &store,
            "--run",
            run,
        ];
        args.extend_from_slice(extra);
        tiller(&args)
    };

    // The first run: some cases fail on one model or both, so it exits 1.
    let (first_json, junit) = (path("first.json"), path("first.xml"));
    let first = finish(eval("first", &["--json", &first_json, "--junit", &junit])).await;
    assert_eq!(first.code(), Some(1), "{}", first.stderr);
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&first_json).unwrap()).unwrap();
    let expected: Value = serde_json::from_str(include_str!("eval/expected.json")).unwrap();
    assert_eq!(untimed(report), expected);
    let junit = std::fs::read_to_string(&junit).unwrap();
    assert!(
        junit.contains("<testsuites name=\"twenty\" tests=\"40\" failures=\"15\">"),
        "{junit}"
    );
    assert_eq!(junit.matches("<testcase ").count(), 40);
    assert_eq!(junit.matches("<failure ").count(), 15);
    let table: Vec<&str> = first.stdout.lines().collect();
    assert_eq!(table.len(), 1 + 40 + 1 + 15, "{}", first.stdout);
    assert!(
        table[1].starts_with("hello            faux         1/1   1.00  $0.0000"),
        "{}",
        table[1]
    );
    assert_eq!(table[41], "25 of 40 runs passed (twenty, run first)");

    // The same agent again: nothing got worse.
    let second = finish(eval("second", &["--baseline", &first_json])).await;
    assert_eq!(second.code(), Some(0), "{}", second.stderr);
    assert!(
        second
            .stdout
            .ends_with("no case got worse than in run first\n"),
        "{}",
        second.stdout
    );

    // A change to the agent: exactly the two fragile cases on the scripted model.
    scratch.write("agent.yaml", &agent("v2"));
    let third = finish(eval("third", &["--baseline", &first_json])).await;
    assert_eq!(third.code(), Some(1), "{}", third.stderr);
    let flagged = third
        .stdout
        .split("worse than in run first:\n")
        .nth(1)
        .unwrap();
    assert_eq!(
        flagged,
        "  fragile-one · scripted: pass rate 100% → 0%\n  \
         fragile-one · scripted: score 1.00 → 0.00\n  \
         fragile-two · scripted: pass rate 100% → 0%\n  \
         fragile-two · scripted: score 1.00 → 0.00\n"
    );

    // A run id is used once; its sessions (40 runs, 6 judges') go in one command.
    let again = finish(eval("first", &[])).await;
    assert_eq!(again.code(), Some(2));
    assert_eq!(
        again.stderr,
        "tiller: the store has a run `first` already: choose another run id\n"
    );
    let remove_first = [
        "sessions",
        "rm",
        "--tenant",
        "eval-first",
        "--store",
        &store,
    ];
    let removed = finish(tiller(&remove_first)).await;
    assert_eq!(
        removed.stdout, "46 session(s) of tenant eval-first deleted\n",
        "{}",
        removed.stderr
    );
    let nothing = finish(tiller(&remove_first)).await;
    assert_eq!(
        (nothing.code(), nothing.stderr.as_str()),
        (Some(1), "tiller: no session of tenant `eval-first`\n")
    );
    let listed = finish(tiller(&["sessions", "list", "--store", &store])).await;
    assert!(!listed.stdout.contains("eval-first."), "{}", listed.stdout);
    assert!(
        listed.stdout.contains("eval-second.hello.faux.0"),
        "{}",
        listed.stdout
    );
}

#[tokio::test]
async fn a_bad_suite_is_refused_with_its_field_before_any_run() {
    let scratch = Scratch::new();
    let suite = scratch.write(
        "suite.yaml",
        "cases:\n  - {name: a, input: hi, stubs: {weather: Sunny}}\n",
    );
    let store = format!("sqlite://{}", scratch.path().join("sessions.db").display());
    let refused = finish(tiller(&[
        "eval",
        suite.to_str().unwrap(),
        "--store",
        &store,
    ]))
    .await;
    assert_eq!(refused.code(), Some(2));
    assert_eq!(
        refused.stderr,
        "tiller: case `a`: a stub for `weather`, a tool the agent does not have\n"
    );
    let other = scratch.write(
        "other.json",
        r#"{"suite": "other", "run": "x", "models": [], "thresholds": {"pass_rate": 0, "score": 0, "cost": 0}, "complete": true, "passed": 0, "runs": 0, "cells": []}"#,
    );
    let good = scratch.write("suite.yaml", "cases: [{name: a, input: hi}]\n");
    let baseline = ["--baseline", other.to_str().unwrap()];
    let mut args = vec!["eval", good.to_str().unwrap(), "--store", &store];
    args.extend(baseline);
    let refused = finish(tiller(&args)).await;
    assert_eq!(
        (refused.code(), refused.stderr.as_str()),
        (
            Some(2),
            "tiller: --baseline is a report of the suite `other`, not of `suite`\n"
        )
    );
    let bad = scratch.write(
        "bad.yaml",
        "cases:\n  - {name: a, input: hi, expect: [{regex: \"(\"}]}\n",
    );
    let refused = finish(tiller(&["eval", bad.to_str().unwrap(), "--store", &store])).await;
    assert_eq!(refused.code(), Some(2));
    assert_eq!(
        refused.stderr,
        format!(
            "tiller: {}: cases[0].expect[0]: `(` is not a regular expression\n",
            bad.display()
        )
    );
}

/// A table's line with its timings and run id left out: what a run decides.
fn untimed_line(line: &str) -> String {
    let line = line.split(", run ").next().unwrap_or_default();
    line.split_whitespace()
        .map(|word| match word.chars().all(|c| c.is_ascii_digit()) {
            true => "N",
            false => word,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn the_readmes_suite_runs_and_prints_the_table_shown() {
    let shown = common::readme_block("### Evaluations", "text");
    let scratch = Scratch::new();
    let store = format!("sqlite://{}", scratch.path().join("sessions.db").display());
    let readme = common::readme_block("### Evaluations", "sh");
    let args: Vec<&str> = readme.split_whitespace().skip(5).collect();
    assert_eq!(args, ["eval", "examples/evals/quick.yaml"]);
    let mut command = tiller(&[args[0], args[1], "--store", &store]);
    command.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let ran = finish(command).await;
    assert_eq!(ran.code(), Some(0), "{}", ran.stderr);
    let lines = |text: &str| text.lines().map(untimed_line).collect::<Vec<_>>();
    assert_eq!(lines(&ran.stdout), lines(&shown));
}
