//! `POST /triggers/{topic}`: an event for the agents whose definitions' triggers
//! answer it (see `tiller::agents::trigger`). The event is the caller's tenant's: only
//! that tenant's sessions are started or prompted, and the agents they make
//! belong to the tenant, as agents it created would.

use std::sync::{Arc, Weak};

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use tiller::{
    AgentContext, AgentMessage, Supervisor,
    agents::schedule::SCHEDULE_TOPICS,
    agents::{Arrival, Schedules, Spawned, Spawner, Triggers, WindowLimits, WindowQuota},
    runtime::{Event, EventError},
};

use crate::Shared;
use crate::error::{Problem, decode};
use crate::reach::Origin;
use crate::tenants::Scope;

/// The largest event payload `POST /triggers/{topic}` takes, in bytes.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;

/// Publishes the body as an event of `topic`, for the caller's tenant: 202 with
/// how many triggers it matched.
pub(crate) async fn publish(
    State(shared): State<Arc<Shared>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    shared.accepting()?;
    if let Ok(body) = &body
        && body.len() > MAX_EVENT_BYTES
    {
        return Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body",
            format!("an event's payload is at most {MAX_EVENT_BYTES} bytes"),
        ));
    }
    let payload: Value = decode(body)?;
    if topic.starts_with(SCHEDULE_TOPICS) {
        return Err(Problem::invalid(
            Some("topic".to_owned()),
            format!("`{SCHEDULE_TOPICS}…` topics are the schedules' own: a client cannot fire one"),
        ));
    }
    // The agents it may start are admitted now (see `attach`'s quota).
    let scope = caller.scope();
    let event = Event {
        topic,
        payload,
        tenant: scope.tenant.clone(),
        user: scope.user.clone(),
    };
    match shared.supervisor.publish(event) {
        Ok(matched) => {
            Ok((StatusCode::ACCEPTED, Json(json!({"matched": matched}))).into_response())
        }
        Err(EventError::Topic(reason)) => Err(Problem::invalid(Some("topic".to_owned()), reason)),
        Err(EventError::Key(reason)) => Err(Problem::invalid(Some("payload".to_owned()), reason)),
        Err(EventError::Quota { quota, max }) => Err(crate::quota::exceeded(
            &format!("quotas.{quota}"),
            &crate::quota::tenant_name(&scope),
            max,
            match quota {
                "trigger_windows" => "trigger windows open",
                "agents" => "live agents, counting those its open trigger windows will start",
                _ => "bytes of events waiting in trigger windows",
            },
        )),
        Err(EventError::Full) => Err(Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-events",
            EventError::Full.to_string(),
        )),
        Err(error) => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            error.to_string(),
        )),
    }
}

/// Attaches the definitions' triggers to `supervisor`, their agents made as
/// agents created through the API are (owned by the event's tenant, recorded for
/// clients that follow them), and starts firing their schedules.
pub(crate) fn attach(shared: &Arc<Shared>, supervisor: &Supervisor) {
    if !shared
        .definitions
        .iter()
        .any(|file| !file.triggers.is_empty())
    {
        return;
    }
    let me: Weak<Shared> = Arc::downgrade(shared);
    let spawner: Spawner = Arc::new(move |arrival: Arrival| {
        let me = me.clone();
        Box::pin(async move {
            let shared = me
                .upgrade()
                .ok_or_else(|| "the server has stopped".to_owned())?;
            // In a cluster, the session may live on another host: it takes
            // the prompt there, once (one key per batch).
            let key = tiller::ai::new_id();
            if deliver_elsewhere(&shared, &arrival, &key).await? {
                return Ok(Spawned::Delivered);
            }
            let Arrival {
                spec,
                definition,
                tenant,
                prompt: _,
            } = &arrival;
            let mut context = AgentContext::new();
            if let Some(tenant) = tenant {
                context = context.with_tenant_id(tenant.clone());
            }
            let origin = Origin {
                definition: Some(definition.clone()),
                version: None,
                inline: None,
                context: context.ids().clone(),
            };
            let owner = Scope {
                tenant: tenant.clone(),
                user: spec.context.ids().user_id.clone(),
            };
            match shared.spawn_admitted(spec.clone(), owner, &origin).await {
                Ok(info) => shared
                    .supervisor
                    .get(info.id.as_str())
                    .map(Spawned::Here)
                    .ok_or_else(|| "the agent started on another host".to_owned()),
                // Another host may have made it meanwhile: it takes the prompt.
                Err(problem) => match deliver_elsewhere(&shared, &arrival, &key).await {
                    Ok(true) => Ok(Spawned::Delivered),
                    Ok(false) | Err(_) => Err(problem.detail),
                },
            }
        })
    });
    let me: Weak<Shared> = Arc::downgrade(shared);
    let quota: WindowQuota = Arc::new(move |tenant| {
        let Some(shared) = me.upgrade() else {
            return WindowLimits {
                windows: 0,
                bytes: 0,
                agents: 0,
            };
        };
        let quotas = shared.quotas_of(tenant).0;
        WindowLimits {
            windows: quotas.trigger_windows.unwrap_or(usize::MAX),
            bytes: quotas.trigger_bytes.unwrap_or(usize::MAX),
            // No more windows starting an agent than the tenant may still start.
            agents: quotas.agents.map_or(usize::MAX, |max| {
                max.saturating_sub(shared.agents_held.of_tenant(&tenant.map(str::to_owned)))
            }),
        }
    });
    Triggers::attach_limited(supervisor, shared.definitions.clone(), spawner, quota);
    // Each slot fires once across the hosts that share the store.
    let _ = shared
        .schedules
        .set(Schedules::start(supervisor, &shared.definitions));
}

/// Hands a batch's prompt to the host of the cluster that holds (or brings up)
/// its session; `false` when none does (it is started here).
async fn deliver_elsewhere(shared: &Shared, arrival: &Arrival, key: &str) -> Result<bool, String> {
    let id = arrival.spec.id.as_deref().unwrap_or_default();
    let on_behalf = Scope {
        tenant: arrival.tenant.clone(),
        user: arrival.spec.context.ids().user_id.clone(),
    };
    let message = AgentMessage::user(arrival.prompt.clone());
    shared.agents.hand_over(id, message, key, on_behalf).await
}
