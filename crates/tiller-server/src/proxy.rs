//! `POST /api/stream`: pi's proxy endpoint. pi-agent-core's `streamProxy` sends a
//! model, a context and options ([`tiller::ai::pi::ProxyRequest`]); the
//! server makes the model call with its own keys and streams the answer back as
//! server-sent events in pi's proxy form ([`ProxyEvent`]), so that clients hold no
//! provider keys.
//!
//! The server decides where a call goes: the request's `provider` and `id` pick
//! one of the models it serves (the definitions' default model and each named LLM
//! configuration's); the request's base URL, headers and prices are never used, so
//! a client cannot send the server's keys elsewhere. A client that goes away ends
//! the model call; a server shutting down aborts it, and the client reads pi's
//! `error` event with reason `aborted`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use tiller::ai::pi::{ProxyEvent, ProxyRequest};
use tiller::{
    AgentSettings, Definitions, Model,
    ai::{AssistantEvent, StreamOptions},
    run::GuardrailStage,
};

use crate::Shared;
use crate::error::{Problem, decode};
use crate::events::{event_stream, sse_data};

/// The models `/api/stream` calls, each with the request options it is called
/// with (its configuration's temperature, token limit, thinking and key).
#[derive(Debug, Default)]
pub(crate) struct ProxyModels {
    models: Vec<(Model, StreamOptions)>,
}

impl ProxyModels {
    /// The default model of `definitions`, then each usable named configuration's
    /// model; the first of a provider and id wins.
    pub(crate) fn of(definitions: &Definitions) -> Self {
        let mut models: Vec<(Model, StreamOptions)> = Vec::new();
        let default = definitions.default_model().map(|model| {
            let options = StreamOptions {
                transport: tiller::ai::Transport {
                    api_key: definitions.default_key().cloned(),
                    ..tiller::ai::Transport::default()
                },
                ..StreamOptions::default()
            };
            (model.clone(), options)
        });
        let configured = definitions.llms().iter().filter_map(|(_, config)| {
            let settings = AgentSettings::default().with_patch(config).ok()?;
            let definition = settings.definition;
            Some((definition.model?, definition.run.stream))
        });
        for (model, options) in default.into_iter().chain(configured) {
            if !models
                .iter()
                .any(|(known, _)| known.provider == model.provider && known.id == model.id)
            {
                models.push((model, options));
            }
        }
        ProxyModels { models }
    }

    /// The model `provider`/`id`, with its options.
    fn find(&self, provider: &str, id: &str) -> Option<&(Model, StreamOptions)> {
        self.models
            .iter()
            .find(|(model, _)| model.provider == provider && model.id == id)
    }

    /// Whether `model` is one of them: the same provider, id and server.
    pub(crate) fn serves(&self, model: &Model) -> bool {
        self.models.iter().any(|(known, _)| {
            known.provider == model.provider
                && known.id == model.id
                && known.base_url == model.base_url
        })
    }

    /// `provider/id` of each, for error messages.
    pub(crate) fn names(&self) -> String {
        let names: Vec<String> = self
            .models
            .iter()
            .map(|(model, _)| format!("{}/{}", model.provider, model.id))
            .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }
}

/// `POST /api/stream`.
pub(crate) async fn stream(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, PiProblem> {
    let caller = shared.caller(&headers)?;
    let slot = shared.stream_slot(&caller)?;
    // The request's size bounds its input tokens (a token is at least a byte of
    // its text, which the JSON holds and more).
    let sent = body.as_ref().map_or(0, Bytes::len) as u64;
    let request: ProxyRequest = decode(body)?;
    let (model, served) = shared
        .proxy_models
        .find(&request.model.provider, &request.model.id)
        .ok_or_else(|| {
            Problem::invalid(
                Some("model".to_owned()),
                format!(
                    "this server does not serve the model {}/{}; it serves {}",
                    request.model.provider,
                    request.model.id,
                    shared.proxy_models.names()
                ),
            )
        })?;
    let options = request.options;
    let mut call = served.clone();
    call.temperature = options.temperature.or(call.temperature);
    // The operator's limit (the configuration's, else the model's) is the most
    // a client may ask for.
    let limit = served.max_tokens.unwrap_or(model.max_tokens);
    call.max_tokens = Some(options.max_tokens.map_or(limit, |asked| asked.min(limit)));
    call.thinking = options.reasoning.unwrap_or(call.thinking);
    call.session_id = options.session_id.or(call.session_id);
    // Its own token: a shutdown aborts the call (pi's client gets `error`, reason
    // `aborted`); a client that goes away drops it.
    call.transport.cancel = shared.closing.child_token();
    // The pace of its account and the breaker of its endpoint are the agents'.
    call.transport.rate_limits = shared.supervisor.rate_limits().cloned();
    call.transport.tenant = caller.tenant.as_deref().map(Arc::from);
    call.transport.breakers = Some(shared.supervisor.breakers().clone());
    let context = request.context.into_context(model.api);
    check_input(&shared.config.guardrails, &context, &caller.context).await?;
    // Last, the tenant's budget holds the call's most (its settings all
    // applied) until it ends.
    let mut spending = match caller
        .tenant
        .as_deref()
        .and_then(|tenant| shared.supervisor.tenant_tally(tenant))
    {
        Some(tally) => Some(reserve(tally, sent / 4, model, &mut call).await?),
        None => None,
    };
    shared.metrics.proxy_call();
    let started = Instant::now();
    let counted = shared.clone();
    // Events ready together go out as one chunk (a reply often arrives in a few
    // large reads): one write for many, not one per event.
    let frames = tiller::ai::stream(model, &context, &call)
        .enumerate()
        .map(move |(index, event)| {
            // Held while the call streams.
            let _ = &slot;
            if index == 0 {
                counted.metrics.proxy_first_event(started.elapsed());
            }
            if let (
                Some(spending),
                AssistantEvent::Done { message, .. } | AssistantEvent::Error { message, .. },
            ) = (spending.as_mut(), &event)
            {
                spending.used = Some(tiller::run::Spent::response(message));
            }
            event
        })
        .ready_chunks(MAX_BATCH)
        .map(|events| sse_frames(&events));
    Ok(event_stream(frames, shared.config.keep_alive))
}

/// The operator's input checks on what the client asks (its last user
/// message), before the model is called: 403 `guardrail-tripped`.
async fn check_input(
    guardrails: &tiller::run::Guardrails,
    context: &tiller::ai::Context,
    caller: &tiller::AgentContext,
) -> Result<(), Problem> {
    if guardrails.input.is_empty() {
        return Ok(());
    }
    let asked = context
        .messages
        .iter()
        .rev()
        .find_map(|message| match message {
            tiller::ai::Message::User(user) => Some(user.text_content()),
            _ => None,
        });
    let Some(asked) = asked else {
        return Ok(());
    };
    match guardrails.check(GuardrailStage::Input, asked, caller).await {
        Some(tripped) => Err(Problem::new(
            StatusCode::FORBIDDEN,
            "guardrail-tripped",
            tripped.to_string(),
        )),
        None => Ok(()),
    }
}

/// Holds `call`'s most (`input` tokens, the output its options allow, priced)
/// against the tenant's `tally`, its `max_tokens` lowered to what the budget
/// leaves; 429 `budget-exceeded` when it leaves nothing.
async fn reserve(
    tally: Arc<tiller::run::Tally>,
    input: u64,
    model: &Model,
    call: &mut StreamOptions,
) -> Result<ProxySpending, Problem> {
    let most = u64::from(call.output_cap(model));
    let hold = tally
        .hold(input, most, &model.cost)
        .await
        .map_err(|(limit, max, spent)| {
            Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "budget-exceeded",
                tiller::run::BudgetExceeded {
                    scope: tiller::run::budget::BudgetScope::Tenant,
                    limit,
                    max,
                    spent,
                }
                .to_string(),
            )
        })?;
    if hold.spent.output_tokens < most
        && let Some(capped) = call.capped(
            model,
            u32::try_from(hold.spent.output_tokens).unwrap_or(u32::MAX),
        )
    {
        *call = capped;
    }
    Ok(ProxySpending {
        tally,
        hold,
        used: None,
    })
}

/// A proxied call's hold on its tenant's budget: settled to what its response
/// used when the stream ends; a call cut short (the client gone) counts as its
/// most, which the provider may have spent.
struct ProxySpending {
    tally: Arc<tiller::run::Tally>,
    hold: tiller::run::CallHold,
    used: Option<tiller::run::Spent>,
}

impl Drop for ProxySpending {
    fn drop(&mut self) {
        let used = self.used.unwrap_or(self.hold.spent);
        self.tally
            .release_later(std::mem::take(&mut self.hold), used);
    }
}

/// The most events written in one chunk.
const MAX_BATCH: usize = 64;

/// `events` as server-sent events in pi's proxy form, one `data:` line each.
fn sse_frames(events: &[AssistantEvent]) -> Bytes {
    let mut frames = Vec::with_capacity(events.len() * 96);
    for event in events {
        sse_data(&mut frames, &ProxyEvent::from(event));
    }
    Bytes::from(frames)
}

/// A [`Problem`] that also carries its detail as `error`, where pi's proxy client
/// reads the message of a failed request.
pub(crate) struct PiProblem(Problem);

impl From<Problem> for PiProblem {
    fn from(problem: Problem) -> Self {
        PiProblem(problem)
    }
}

impl IntoResponse for PiProblem {
    fn into_response(self) -> Response {
        let problem = self.0;
        let mut body = serde_json::to_value(&problem).unwrap_or_default();
        body["error"] = problem.detail.clone().into();
        problem.respond(body.to_string())
    }
}
