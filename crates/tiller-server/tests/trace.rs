//! Tracing: each request to `tiller serve` runs in a `request` span naming its
//! route and agent, and the run it starts gets a `run` span as its child, with the
//! loop's own span inside. In a test binary of its own, so that no other test's
//! thread sets callsites' interest while this one's subscriber is the default.

#![allow(clippy::unwrap_used)]

use serde_json::json;
use tiller::agents::agent_file::AgentFile;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{Definitions, Supervisor};
use tiller_server::{Server, ServerConfig};

const HELPER: &str = "
type: object
description: You help.
json_schema_extra: {kind: agent, name: helper}
";

/// A span as a test sees it: its name, fields and parent.
#[derive(Debug, Clone)]
struct SpanSeen {
    name: &'static str,
    fields: std::collections::BTreeMap<String, String>,
    parent: Option<tracing::span::Id>,
}

/// Keeps every span created, with the fields recorded on it.
#[derive(Clone, Default)]
struct Spans(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<tracing::span::Id, SpanSeen>>>,
);

struct Fields<'a>(&'a mut std::collections::BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = std::collections::BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = ctx
            .span(id)
            .and_then(|span| span.parent())
            .map(|parent| parent.id());
        self.0.lock().unwrap().insert(
            id.clone(),
            SpanSeen {
                name: attrs.metadata().name(),
                fields,
                parent,
            },
        );
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(span) = self.0.lock().unwrap().get_mut(id) {
            values.record(&mut Fields(&mut span.fields));
        }
    }
}

#[tokio::test]
async fn a_requests_span_names_the_agent_and_is_the_parent_of_the_run_it_starts() {
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    // This test's runtime has one thread, and this process runs no other test:
    // every span is made where this subscriber is the default.
    let _traced =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Traced."));
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("helper.yaml", HELPER).unwrap())
        .unwrap();
    let server = Server::new(
        Supervisor::start().await.unwrap(),
        definitions,
        ServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.serve(listener, async move {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    for (path, body, expected) in [
        ("/agents", json!({"definition": "helper", "id": "t1"}), 201),
        ("/agents/t1/prompt?wait=true", json!({"text": "Hi"}), 200),
    ] {
        let response = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), expected, "{path}");
    }
    let _ = stop.send(());
    served.await.unwrap().unwrap();

    let seen = spans.0.lock().unwrap().clone();
    let named = |name: &str| -> Vec<(&tracing::span::Id, &SpanSeen)> {
        seen.iter().filter(|(_, span)| span.name == name).collect()
    };
    let field = |span: &SpanSeen, name: &str| span.fields.get(name).cloned().unwrap_or_default();
    let requests = named("request");
    let (prompt_id, prompt) = requests
        .iter()
        .find(|(_, span)| field(span, "route") == "/agents/{id}/prompt")
        .unwrap();
    assert_eq!(
        (field(prompt, "method"), field(prompt, "agent")),
        ("POST".to_owned(), "t1".to_owned())
    );
    let runs = named("run");
    assert_eq!(runs.len(), 1, "{runs:?}");
    let (run_id, run) = runs[0];
    assert_eq!(
        (
            field(run, "agent"),
            field(run, "session"),
            field(run, "run"),
            run.parent.as_ref()
        ),
        (
            "t1".to_owned(),
            "t1".to_owned(),
            "1".to_owned(),
            Some(*prompt_id)
        )
    );
    // The loop's own span is inside the run's.
    let loops = named("agent_run");
    assert_eq!(loops.len(), 1);
    assert_eq!(loops[0].1.parent.as_ref(), Some(run_id));
}
