//! `/metrics` shows what the agents share of their providers: each account's
//! pace, each failing endpoint's circuit breaker, each tenant's budget.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::Running;
use tiller::faux::FauxProvider;
use tiller::{
    AgentContext, AgentSettings, AgentSpec, Definitions, Model, RunEnd, Supervisor,
    SupervisorConfig, ai::ApiKey, run::Budget,
};
use tiller_server::ServerConfig;
use tiller_test_support::sse;
use tiller_test_support::{MockResponse, MockServer};

fn with_limits(response: MockResponse, remaining: &str) -> MockResponse {
    response
        .header("x-ratelimit-limit-tokens", "60000")
        .header("x-ratelimit-remaining-tokens", remaining)
        .header("x-ratelimit-reset-tokens", "1s")
}

#[tokio::test]
async fn metrics_show_the_accounts_pace_the_open_breaker_and_the_tenants_budget() {
    // The primary always fails (503, to be retried at once); the backup
    // answers, after one 429.
    let primary = MockServer::start().await;
    primary.always(MockResponse::status(503, "overloaded").header("retry-after-ms", "0"));
    let backup = MockServer::start().await;
    backup.push(with_limits(
        MockResponse::sse(sse::openai_text(&["First."])),
        "59000",
    ));
    backup.push(with_limits(
        MockResponse::status(429, "slow down").header("retry-after-ms", "5"),
        "0",
    ));
    backup.always(with_limits(
        MockResponse::sse(sse::openai_text(&["Again."])),
        "58000",
    ));

    let supervisor = Supervisor::with_config(SupervisorConfig {
        breakers: tiller::ai::BreakerPolicy {
            failures: 1,
            open_for: Duration::from_secs(60),
        },
        ..SupervisorConfig::default()
    })
    .await
    .unwrap();
    supervisor
        .set_tenant_budget(
            "acme",
            Budget {
                model_calls: Some(2),
                ..Budget::default()
            },
        )
        .await
        .unwrap();
    let mut settings = AgentSettings::new(
        Model::openai_compatible(primary.base_url(), "gpt-test").with_provider("primary"),
    );
    settings.definition.fallbacks =
        vec![Model::openai_compatible(backup.base_url(), "gpt-test").with_provider("backup")];
    settings.definition.run.stream.transport.api_key = Some(ApiKey::new("sk-acme"));
    let agent = supervisor
        .spawn(
            AgentSpec::new(settings).with_context(AgentContext::default().with_tenant_id("acme")),
        )
        .await
        .unwrap();

    let first = agent.run("One.").await.unwrap();
    assert_eq!(
        (first.end, first.text()),
        (RunEnd::Completed, "First.".to_owned())
    );
    // The breaker is open: the primary gets no second request.
    let second = agent.run("Two.").await.unwrap();
    assert_eq!(
        (second.end, second.text()),
        (RunEnd::Completed, "Again.".to_owned())
    );
    assert_eq!(primary.requests().len(), 4);
    // Two model calls: the tenant's budget is spent.
    let third = agent.run("Three.").await.unwrap();
    assert_eq!(third.end, RunEnd::BudgetExceeded);
    assert_eq!(
        serde_json::to_value(third.budget_exceeded).unwrap(),
        serde_json::json!({"scope": "tenant", "limit": "model_calls", "max": 2, "spent": 2})
    );

    let server = Running::on(
        supervisor,
        Definitions::new().with_default_model(FauxProvider::new().model()),
        ServerConfig::default(),
    )
    .await;
    let text = server
        .http
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let shown: Vec<&str> = text
        .lines()
        .filter(|line| {
            ["tiller_rate_limit_", "tiller_breaker_", "tiller_tenant_"]
                .iter()
                .any(|family| line.starts_with(family))
        })
        .map(|line| line.rsplit_once(' ').map_or(line, |(series, _)| series))
        .collect();
    // The primary's account has its key's fingerprint (never the key); the
    // fallback got no key of the primary's provider: provider and model alone.
    let primary_account = text
        .lines()
        .find_map(|line| line.strip_prefix("tiller_rate_limit_requests_total{account=\"primary/"))
        .and_then(|rest| rest.split_once('"'))
        .map(|(account, _)| format!("primary/{account}"))
        .unwrap();
    assert!(
        primary_account.starts_with("primary/gpt-test key "),
        "{primary_account}"
    );
    assert!(!text.contains("sk-acme"));
    let account = "backup/gpt-test";
    let series = |name: &str| format!("{name}{{account=\"{account}\"}}");
    let primary_series = |name: &str| format!("{name}{{account=\"{primary_account}\"}}");
    let endpoint = format!("endpoint=\"primary 127.0.0.1:{}\"", port(&primary));
    assert_eq!(
        shown,
        [
            series("tiller_rate_limit_requests_total"),
            primary_series("tiller_rate_limit_requests_total"),
            series("tiller_rate_limit_waits_total"),
            primary_series("tiller_rate_limit_waits_total"),
            series("tiller_rate_limit_wait_seconds_total"),
            primary_series("tiller_rate_limit_wait_seconds_total"),
            series("tiller_rate_limit_throttled_total"),
            primary_series("tiller_rate_limit_throttled_total"),
            series("tiller_rate_limit_tokens_per_minute"),
            format!("tiller_breaker_open{{{endpoint}}}"),
            format!("tiller_breaker_failures{{{endpoint}}}"),
            format!("tiller_breaker_opened_total{{{endpoint}}}"),
            "tiller_tenant_spent{tenant=\"acme\",counted=\"input_tokens\"}".to_owned(),
            "tiller_tenant_spent{tenant=\"acme\",counted=\"output_tokens\"}".to_owned(),
            "tiller_tenant_spent{tenant=\"acme\",counted=\"cost_usd\"}".to_owned(),
            "tiller_tenant_spent{tenant=\"acme\",counted=\"model_calls\"}".to_owned(),
            "tiller_tenant_spent{tenant=\"acme\",counted=\"tool_calls\"}".to_owned(),
            "tiller_tenant_spent{tenant=\"acme\",counted=\"wall_clock_ms\"}".to_owned(),
            "tiller_tenant_budget{tenant=\"acme\",bound=\"model_calls\"}".to_owned(),
        ]
    );
    let value = |series: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap()
            .to_owned()
    };
    assert_eq!(value(&series("tiller_rate_limit_requests_total")), "3");
    assert_eq!(value(&series("tiller_rate_limit_throttled_total")), "1");
    assert_eq!(
        value(&primary_series("tiller_rate_limit_requests_total")),
        "4"
    );
    assert_eq!(value(&format!("tiller_breaker_open{{{endpoint}}}")), "1");
    assert_eq!(
        value("tiller_tenant_spent{tenant=\"acme\",counted=\"model_calls\"}"),
        "2"
    );
    server.stop().await;
}

fn port(server: &MockServer) -> u16 {
    server
        .base_url()
        .rsplit(':')
        .next()
        .and_then(|rest| rest.split('/').next())
        .and_then(|port| port.parse().ok())
        .unwrap()
}
