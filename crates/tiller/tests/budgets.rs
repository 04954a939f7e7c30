//! Budgets that outlive the process: what an agent and a tenant spent is stored
//! with their messages, and a new supervisor on the same SQLite file counts it.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use pretty_assertions::assert_eq;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::tiller_store::{SessionStore, SpendScope, SqlStore};
use tiller::{
    AgentContext, AgentSettings, AgentSpec, Budget, RunEnd, Supervisor, SupervisorConfig, Usage,
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
        total_tokens: Some(100),
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
    // (120 of 100 after it), and the next is refused before its model call.
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
        serde_json::json!({"scope": "agent", "limit": "total_tokens", "max": 100, "spent": 120})
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
