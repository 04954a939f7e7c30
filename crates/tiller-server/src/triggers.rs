//! `POST /triggers/{topic}`: an event for the agents whose definitions' triggers
//! answer it (see `tiller::trigger`). The event is the caller's tenant's: only
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
use tiller::{AgentContext, Event, EventError, Spawner, Supervisor, Triggers};

use crate::Shared;
use crate::error::{Problem, decode};
use crate::placement::Origin;
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
    let event = Event {
        topic,
        payload,
        tenant: caller.tenant,
    };
    match shared.supervisor.publish(event) {
        Ok(matched) => {
            Ok((StatusCode::ACCEPTED, Json(json!({"matched": matched}))).into_response())
        }
        Err(EventError::Topic(reason)) => Err(Problem::invalid(Some("topic".to_owned()), reason)),
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
/// clients that follow them).
pub(crate) fn attach(shared: &Arc<Shared>, supervisor: &Supervisor) {
    if !shared
        .definitions
        .iter()
        .any(|file| !file.triggers.is_empty())
    {
        return;
    }
    let me: Weak<Shared> = Arc::downgrade(shared);
    let spawner: Spawner = Arc::new(move |spec, definition, tenant| {
        let me = me.clone();
        Box::pin(async move {
            let shared = me
                .upgrade()
                .ok_or_else(|| "the server has stopped".to_owned())?;
            let mut context = AgentContext::new();
            if let Some(tenant) = &tenant {
                context = context.with_tenant_id(tenant.clone());
            }
            let origin = Origin {
                definition: Some(definition),
                version: None,
                inline: None,
                context: context.ids().clone(),
            };
            let owner = Scope { tenant, user: None };
            let info = shared
                .spawn(spec, owner, &origin)
                .await
                .map_err(|problem| problem.detail)?;
            shared
                .supervisor
                .get(info.id.as_str())
                .ok_or_else(|| "the agent started on another host".to_owned())
        })
    });
    Triggers::attach_with(supervisor, shared.definitions.clone(), spawner);
}
