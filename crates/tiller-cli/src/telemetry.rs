//! Logs and traces of the `tiller` command.
//!
//! `tiller serve` logs to standard error at the level `TILLER_LOG` names (`warn`
//! by default; `info` logs each request and each run in their spans). With
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set,
//! every command also exports Tiller's spans over OTLP/HTTP with JSON (to
//! `{endpoint}/v1/traces`): the server's `request`, each `run` and `agent_run`,
//! each `turn`, each model call (`chat {model}`, with the GenAI semantic
//! conventions' `gen_ai.*` attributes: provider, requested and answering model,
//! input and output tokens, finish reason; never the messages) and each tool call
//! (`execute_tool {name}`). `OTEL_SERVICE_NAME` names the service (`tiller` by
//! default); the other `OTEL_EXPORTER_OTLP_*` and `OTEL_BSP_*` variables apply.
//!
//! The export is the crate's `otlp` feature (`cargo install --path
//! crates/tiller-cli --features otlp`); a `tiller` built without it says so on
//! standard error when an endpoint is set, and logs as usual.

#[cfg(feature = "otlp")]
use opentelemetry::trace::TracerProvider as _;
#[cfg(feature = "otlp")]
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _};
#[cfg(feature = "otlp")]
use opentelemetry_sdk::Resource;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::EnvFilter;
#[cfg(feature = "otlp")]
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer as _, fmt};

/// Keeps the exporter until the command ends; dropping it sends the spans
/// still buffered (waiting at most five seconds).
#[must_use = "dropping it at once stops the export"]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<SdkTracerProvider>,
}

#[cfg(feature = "otlp")]
impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            crate::say!("tiller: could not send the last traces: {error}");
        }
    }
}

/// Whether spans are to be exported: an OTLP endpoint is set.
fn exporting() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

/// Installs the command's logging (`logs`: to standard error, as `TILLER_LOG`
/// says) and, when an OTLP endpoint is set, the export of its spans. Call it
/// outside any async runtime: the exporter's HTTP client runs on a thread of
/// its own. Does nothing if the process has a subscriber already.
pub fn init(logs: bool) -> Telemetry {
    let (trace_layer, telemetry) = traces();
    let log_layer = logs.then(|| {
        let filter =
            EnvFilter::try_from_env("TILLER_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
        fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter)
    });
    let _ = tracing_subscriber::registry()
        .with(trace_layer)
        .with(log_layer)
        .try_init();
    telemetry
}

/// A layer of the registry, boxed: made once per process.
type BoxedLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// The layer exporting Tiller's spans when an endpoint is set, and what keeps
/// the exporter.
#[cfg(feature = "otlp")]
fn traces() -> (Option<BoxedLayer>, Telemetry) {
    let provider = exporting().then(tracer_provider).flatten();
    let layer = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("tiller"))
            .with_threads(false)
            .with_tracked_inactivity(false)
            // Tiller's spans only: not the HTTP stack's (the exporter's own
            // requests among them).
            .with_filter(
                Targets::new()
                    .with_target("tiller", LevelFilter::INFO)
                    .with_default(LevelFilter::OFF),
            )
            .boxed()
    });
    (layer, Telemetry { provider })
}

/// No export without the `otlp` feature: said when an endpoint is set.
#[cfg(not(feature = "otlp"))]
fn traces() -> (Option<BoxedLayer>, Telemetry) {
    if exporting() {
        crate::say!(
            "tiller: traces are not exported: this tiller was built without `--features otlp`"
        );
    }
    (None, Telemetry {})
}

/// The tracer provider exporting over OTLP/HTTP with JSON, or `None` (said on
/// standard error) when the exporter cannot be made.
#[cfg(feature = "otlp")]
fn tracer_provider() -> Option<SdkTracerProvider> {
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .build();
    let exporter = match exporter {
        Ok(exporter) => exporter,
        Err(error) => {
            crate::say!("tiller: traces will not be exported: {error}");
            return None;
        }
    };
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("tiller");
    }
    Some(
        SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter)
            .build(),
    )
}
