//! Budgets that outlive the process: what an agent and a tenant spent is stored
//! with their messages, and a new supervisor on the same SQLite file counts it.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use pretty_assertions::assert_eq;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::store::{SessionStore, SpendScope, SqlStore};
use tiller::{
    AgentContext, AgentSettings, AgentSpec, RunEnd, Supervisor, SupervisorConfig, ai::Usage,
    run::Budget,
};
use tiller_test_support::sqlite::TempSqlite;

fn used(input: u64, output: u64) -> Usage {
    Usage {
        input,
        output,
        total_tokens: input + output,
        ..Usage::default()
    }
}

fn settings(faux: &FauxProvider) -> AgentSettings {
    let mut settings = AgentSettings::new(faux.model());
    settings.definition.run.budget.agent = Budget {
        total_tokens: Some(130),
        ..Budget::default()
    };
    settings
}

#[tokio::test]
async fn an_agents_and_a_tenants_spending_are_counted_across_restarts() {
    let db = TempSqlite::new();
    let faux = FauxProvider::new();
    faux.respond_with(|_| FauxTurn::text("ok").usage(used(40, 20)));
    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let context = AgentContext::new().with_tenant_id("acme");

    let first = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    let agent = first
        .spawn(
            AgentSpec::new(settings(&faux))
                .with_session("support")
                .with_context(context.clone()),
        )
        .await
        .unwrap();
    assert_eq!(agent.run("One.").await.unwrap().end, RunEnd::Completed);
    first.shutdown().await;
    let spent = store
        .spent(&SpendScope::Session("support".into()))
        .await
        .unwrap();
    assert_eq!(
        (spent.input_tokens, spent.output_tokens, spent.model_calls),
        (40, 20, 1)
    );

    // A new process: the agent's 60 tokens are counted, so one more run goes
    // (its call held to what is left of 130; the scripted usage says 60 more),
    // and the next is refused before its model call.
    let second = Supervisor::with_store(SupervisorConfig::default(), store.clone())
        .await
        .unwrap();
    second
        .set_tenant_budget(
            "acme",
            Budget {
                model_calls: Some(3),
                ..Budget::default()
            },
        )
        .await
        .unwrap();
    let resumed = second
        .spawn(
            AgentSpec::new(settings(&faux))
                .with_session("support")
                .with_context(context.clone()),
        )
        .await
        .unwrap();
    assert_eq!(resumed.run("Two.").await.unwrap().end, RunEnd::Completed);
    let refused = resumed.run("Three.").await.unwrap();
    assert_eq!(refused.end, RunEnd::BudgetExceeded);
    assert_eq!(
        serde_json::to_value(refused.budget_exceeded).unwrap(),
        serde_json::json!({"scope": "agent", "limit": "total_tokens", "max": 130, "spent": 120})
    );
    assert_eq!(faux.requests().len(), 2);

    // The tenant's tally started from the store: another agent of the tenant
    // has one model call left of its three.
    let other = second
        .spawn(AgentSpec::new(AgentSettings::new(faux.model())).with_context(context))
        .await
        .unwrap();
    assert_eq!(other.run("Four.").await.unwrap().end, RunEnd::Completed);
    let refused = other.run("Five.").await.unwrap();
    assert_eq!(refused.end, RunEnd::BudgetExceeded);
    assert_eq!(
        serde_json::to_value(refused.budget_exceeded).unwrap(),
        serde_json::json!({"scope": "tenant", "limit": "model_calls", "max": 3, "spent": 3})
    );
    let tenant = store
        .spent(&SpendScope::Tenant("acme".into()))
        .await
        .unwrap();
    assert_eq!(tenant.model_calls, 3);
    assert_eq!(second.tenant_budgets()[0].2.model_calls, 3);
}

/// Twenty runs of a tenant at once, each answered with a seeded length (some
/// calling a tool first, so two model calls), against a tenant budget of a few
/// model calls or a few thousand tokens: over fifty seeded rounds, what went out
/// never passes the budget, and every call that went out is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_runs_at_once_never_spend_past_the_tenants_budget() {
    use tiller::{AgentTool, FnTool, ToolOutput};
    let noop: Arc<dyn AgentTool> = Arc::new(FnTool::new(
        "noop",
        "Does nothing",
        serde_json::json!({"type": "object"}),
        |_, _| async { Ok(ToolOutput::text("done")) },
    ));
    let (mut most_calls, mut most_tokens, mut refused) = (0.0f64, 0.0f64, 0);
    for seed in 0..50u64 {
        // A small linear congruential generator: the same rounds every time.
        let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let mut next = move |below: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % below
        };
        let budget = if seed % 2 == 0 {
            Budget {
                model_calls: Some(1 + next(12)),
                ..Budget::default()
            }
        } else {
            Budget {
                total_tokens: Some(300 + next(3_000)),
                ..Budget::default()
            }
        };
        let lengths: Vec<usize> = (0..20).map(|_| 40 + next(2_000) as usize).collect();
        let calls_tool: Vec<bool> = (0..20).map(|_| next(3) == 0).collect();
        let faux = FauxProvider::new();
        faux.respond_with(move |request| {
            let last = request.context.messages.last();
            let prompt = match last {
                Some(tiller::ai::Message::User(user)) => match user.content.first() {
                    Some(tiller::ai::Content::Text(text)) => text.text.clone(),
                    _ => String::new(),
                },
                _ => String::new(),
            };
            let Some(n) = prompt
                .strip_prefix("run ")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                return FauxTurn::text("The tool is done.");
            };
            if calls_tool[n] {
                FauxTurn::tool_call("noop", serde_json::json!({}))
            } else {
                FauxTurn::text("x".repeat(lengths[n]))
            }
        });
        let supervisor = Supervisor::start().await.unwrap();
        supervisor.set_tenant_budget("acme", budget).await.unwrap();
        let mut agents = Vec::new();
        for _ in 0..20 {
            let settings = AgentSettings::new(faux.model())
                .with_tools(tiller::ToolSet::new([noop.clone()]).unwrap());
            let spec =
                AgentSpec::new(settings).with_context(AgentContext::new().with_tenant_id("acme"));
            agents.push(supervisor.spawn(spec).await.unwrap());
        }
        let runs = agents
            .iter()
            .enumerate()
            .map(|(n, agent)| agent.run(format!("run {n}")));
        let outcomes = futures::future::join_all(runs).await;
        refused += outcomes
            .iter()
            .filter(|outcome| outcome.as_ref().unwrap().end == RunEnd::BudgetExceeded)
            .count();
        let (_, _, spent) = supervisor.tenant_budgets().remove(0);
        let sent = faux.requests().len() as u64;
        assert_eq!(spent.model_calls, sent, "round {seed}: every call counted");
        if let Some(max) = budget.model_calls {
            assert!(
                spent.model_calls <= max,
                "round {seed}: {spent:?} of {budget:?}"
            );
            most_calls = most_calls.max(spent.model_calls as f64 / max as f64);
        }
        if let Some(max) = budget.total_tokens {
            assert!(
                spent.total_tokens() <= max,
                "round {seed}: {spent:?} of {budget:?}"
            );
            most_tokens = most_tokens.max(spent.total_tokens() as f64 / max as f64);
        }
        supervisor.shutdown().await;
    }
    eprintln!(
        "budgets: 50 rounds of 20 runs at once; at most {:.0}% of a call budget and {:.0}% of a token budget spent; {refused} runs ended refused",
        most_calls * 100.0,
        most_tokens * 100.0
    );
}
