//! Running a suite: every case against every model, each repetition a run of
//! its own agent and session, so many at once, judged where the case says, and
//! gathered into a [`Report`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use futures::StreamExt;
use tiller_ai::{AssistantContent, AssistantMessage, Message, TextContent};
use tiller_core::{AgentContext, AgentMessage, Budget, Output, RunEnd, Spent};
use tiller_runtime::{AgentSettings, AgentSpec, RunOutcome, Supervisor};
use tiller_store::{SessionFilter, SpendScope};

use crate::expect::{Judge, Observed};
use crate::report::{Cell, Report, RunReport, rounded};
use crate::suite::{Case, Input, MAX_CONCURRENCY, Turn, session_part};
use crate::{EvalError, Evaluation, Progress, agent, judge, stub};

/// One run to make: the case, the model, the repetition.
#[derive(Clone, Copy)]
struct Job {
    case: usize,
    model: usize,
    rep: u32,
}

/// Runs `evaluation` under `supervisor` (see [`Evaluation::run`]).
pub(crate) async fn run(
    mut evaluation: Evaluation<'_>,
    supervisor: &Supervisor,
) -> Result<Report, EvalError> {
    let suite = evaluation.suite;
    let store = supervisor.store().clone();
    let tenant = evaluation.tenant();
    let taken = store
        .list(&SessionFilter {
            tenant_id: Some(tenant.clone()),
            limit: Some(1),
            ..SessionFilter::default()
        })
        .await
        .map_err(|error| EvalError::Store(error.to_string()))?;
    // Its sessions deleted, a run id still names what its tenant spent, which
    // a budget would start from: an id is used once.
    let spent = store
        .spent(&SpendScope::Tenant(tenant.clone()))
        .await
        .map_err(|error| EvalError::Store(error.to_string()))?;
    if !taken.is_empty() || spent != Spent::default() {
        return Err(EvalError::RunExists(evaluation.run.clone()));
    }
    let subjects = agent::subjects(suite, &evaluation, &store).await?;
    let judges = agent::judges(suite, &evaluation, &store).await?;
    // Each case's agent with each model: shared, stubbed where the case says.
    let mut agents: Vec<Vec<Arc<AgentSettings>>> = Vec::with_capacity(suite.cases.len());
    let plain: Vec<Arc<AgentSettings>> = subjects
        .iter()
        .map(|subject| Arc::new(subject.settings.clone()))
        .collect();
    for case in &suite.cases {
        if case.stubs.is_empty() {
            agents.push(plain.clone());
            continue;
        }
        let mut stubbed = Vec::with_capacity(plain.len());
        for settings in &plain {
            let mut settings = AgentSettings::clone(settings);
            settings.code.tools =
                stub::stubbed(&settings.code.tools, &case.stubs).map_err(|reason| {
                    EvalError::Stub {
                        case: case.name.clone(),
                        reason,
                    }
                })?;
            stubbed.push(Arc::new(settings));
        }
        agents.push(stubbed);
    }
    if !suite.budget.is_unbounded() {
        supervisor
            .set_tenant_budget(&tenant, suite.budget)
            .await
            .map_err(|error| EvalError::Store(error.to_string()))?;
    }

    let jobs = (0..suite.cases.len()).flat_map(|case| {
        (0..subjects.len())
            .flat_map(move |model| (0..suite.repetitions).map(move |rep| Job { case, model, rep }))
    });
    let total = suite.runs();
    let mut done: BTreeMap<(usize, usize, u32), RunReport> = BTreeMap::new();
    let mut progress = Progress {
        done: 0,
        total,
        passed: 0,
    };
    // Once the suite's budget ran out, the runs not yet started are not made.
    let exhausted = AtomicBool::new(false);
    let runs = futures::stream::iter(jobs)
        .map(|job| {
            let case = &suite.cases[job.case];
            let session = format!(
                "{tenant}.{}.{}.{}",
                case.name,
                session_part(&subjects[job.model].label),
                job.rep
            );
            let judge = case
                .judge()
                .zip(suite.judge_of(case).and_then(|source| judges.get(&source)));
            let agent = agents[job.case][job.model].clone();
            let tenant = tenant.clone();
            let exhausted = &exhausted;
            async move {
                if exhausted.load(Ordering::Relaxed) {
                    return (
                        job,
                        RunReport::not_made(session, "not run: the suite's budget had run out"),
                    );
                }
                let (report, ran_out) =
                    one_run(supervisor, agent, case, judge, session, tenant).await;
                if ran_out {
                    exhausted.store(true, Ordering::Relaxed);
                }
                (job, report)
            }
        })
        // A suite made in code is not checked as a file is: kept in bounds here.
        .buffer_unordered(suite.concurrency.clamp(1, MAX_CONCURRENCY));
    futures::pin_mut!(runs);
    while let Some((job, report)) = runs.next().await {
        progress.done += 1;
        progress.passed += usize::from(report.passed);
        if let Some(tell) = &mut evaluation.progress {
            tell(&progress);
        }
        done.insert((job.case, job.model, job.rep), report);
    }
    if !suite.budget.is_unbounded() {
        // The suite's bound ends with it.
        let _ = supervisor
            .set_tenant_budget(&tenant, Budget::default())
            .await;
    }

    let mut cells = Vec::with_capacity(suite.cases.len() * subjects.len());
    for (case_at, case) in suite.cases.iter().enumerate() {
        for (model_at, subject) in subjects.iter().enumerate() {
            let runs = (0..suite.repetitions)
                .filter_map(|rep| done.remove(&(case_at, model_at, rep)))
                .collect();
            cells.push(Cell::of(&case.name, &subject.label, runs));
        }
    }
    Ok(Report {
        complete: !exhausted.load(Ordering::Relaxed),
        suite: suite.name.clone(),
        run: evaluation.run.clone(),
        models: subjects.iter().map(|s| s.label.clone()).collect(),
        thresholds: suite.thresholds,
        passed: progress.passed,
        runs: total,
        cells,
    })
}

/// One run of `case` by an agent of `settings` in `session`, judged by `judge`
/// when the case has one; and whether the suite's budget ran out in it.
async fn one_run(
    supervisor: &Supervisor,
    settings: Arc<AgentSettings>,
    case: &Case,
    judge: Option<(&Judge, &AgentSettings)>,
    session: String,
    tenant: String,
) -> (RunReport, bool) {
    let (history, prompt) = match &case.input {
        Input::Prompt(prompt) => (Vec::new(), prompt.clone()),
        Input::Conversation(turns) => {
            // The subject's model, always set (see `agent::subjects`).
            let model = settings
                .definition
                .model
                .clone()
                .unwrap_or_else(tiller_ai::faux::demo_model);
            let (last, earlier) = turns.split_last().expect("a conversation has a turn");
            let history = earlier
                .iter()
                .map(|turn| match turn {
                    Turn::User(text) => AgentMessage::user(text.clone()),
                    Turn::Assistant(text) => {
                        let mut answer = AssistantMessage::empty(&model);
                        answer
                            .content
                            .push(AssistantContent::Text(TextContent::new(text.clone())));
                        AgentMessage::Llm(Message::Assistant(Box::new(answer)))
                    }
                })
                .collect();
            let (Turn::User(prompt) | Turn::Assistant(prompt)) = last;
            (history, prompt.clone())
        }
    };
    let spec = AgentSpec::new(settings)
        .with_session(session.clone())
        .with_context(AgentContext::default().with_evaluation(true))
        .with_owner(Some(tenant.clone()), case.user_id.clone())
        .with_messages(history);
    let (outcome, latency_ms) = match run_agent(supervisor, spec, prompt).await {
        Ok(ran) => ran,
        Err(error) => {
            let failure = format!("the run did not start: {error}");
            return (RunReport::not_made(session, failure), false);
        }
    };
    let mut ran_out = outcome.budget_exceeded.is_some();
    let mut observed = observed(&outcome, latency_ms);
    let mut failures = Vec::new();
    if outcome.end != RunEnd::Completed {
        failures.push(ended(&outcome));
    }
    if let Some((judge, settings)) = judge {
        let conversation = outcome.conversation.iter().map(|m| &**m);
        let spec = AgentSpec::new(settings.clone())
            .with_session(format!("{session}.judge"))
            .with_context(AgentContext::default().with_evaluation(true))
            .with_owner(Some(tenant), None);
        match run_agent(supervisor, spec, judge::question(judge, conversation)).await {
            Ok((verdict, _)) => {
                ran_out |= verdict.budget_exceeded.is_some();
                observed.judged = verdict
                    .output
                    .as_ref()
                    .and_then(|output| output.value())
                    .and_then(judge::verdict);
                if observed.judged.is_none() {
                    observed.unjudged = Some(ended(&verdict));
                }
            }
            Err(error) => observed.unjudged = Some(format!("it did not start: {error}")),
        }
    }
    let mut held = 0;
    for expectation in &case.expect {
        match expectation.failure(&observed) {
            Some(failure) => failures.push(failure),
            None => held += 1,
        }
    }
    let score = match (&observed.judged, case.judge()) {
        // A run that did not complete scores nothing, whatever held of it.
        _ if outcome.end != RunEnd::Completed => 0.0,
        (Some(judged), _) => judged.score.clamp(0.0, 1.0),
        (None, Some(_)) => 0.0,
        (None, None) if case.expect.is_empty() => 1.0,
        (None, None) => f64::from(held) / case.expect.len() as f64,
    };
    let report = RunReport {
        session,
        passed: failures.is_empty(),
        score: rounded(score, 4),
        turns: observed.turns,
        cost_usd: rounded(observed.cost_usd, 8),
        latency_ms,
        failures,
    };
    (report, ran_out)
}

/// Spawns `spec`, runs `prompt` to its end and stops the agent (its session
/// stays in the store); the run's outcome and its time in milliseconds, from
/// the prompt to the end.
async fn run_agent(
    supervisor: &Supervisor,
    spec: AgentSpec,
    prompt: String,
) -> Result<(RunOutcome, u64), String> {
    let agent = supervisor
        .spawn(spec)
        .await
        .map_err(|error| error.to_string())?;
    let started = Instant::now();
    let outcome = agent.run(prompt).await.map_err(|error| error.to_string());
    let took = started.elapsed().as_millis() as u64;
    supervisor.stop(agent.id().as_str()).await;
    outcome.map(|outcome| (outcome, took))
}

/// What the expectations read of a run.
fn observed(outcome: &RunOutcome, latency_ms: u64) -> Observed {
    let mut observed = Observed {
        latency_ms,
        output: outcome
            .output
            .as_ref()
            .and_then(|output| output.value())
            .cloned(),
        ..Observed::default()
    };
    for message in &outcome.messages {
        let Some(answer) = message.as_assistant() else {
            continue;
        };
        observed.turns += 1;
        observed.cost_usd += answer.usage.cost.total;
        observed.text = answer.text();
        observed.calls.extend(
            answer
                .tool_calls()
                .map(|call| (call.name.clone(), call.arguments.clone())),
        );
    }
    observed
}

/// Why a run did not complete, in a line.
fn ended(outcome: &RunOutcome) -> String {
    if let Some(exceeded) = &outcome.budget_exceeded {
        return format!("the suite's budget ran out ({exceeded})");
    }
    if let Some(Output::Invalid(error)) = &outcome.output {
        return error.to_string();
    }
    let reason = serde_json::to_value(outcome.end)
        .ok()
        .and_then(|end| end.as_str().map(str::to_owned))
        .unwrap_or_default();
    let error = outcome
        .messages
        .iter()
        .rev()
        .find_map(|message| message.as_assistant()?.error_message.clone());
    match error {
        Some(error) => format!("the run ended: {reason}: {error}"),
        None => format!("the run ended: {reason}"),
    }
}
