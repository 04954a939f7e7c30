//! `GET /agents/{id}/ws`: an agent's events over a WebSocket, and its controls the
//! other way.
//!
//! Each event is a text frame holding the envelope, as the event stream's
//! `data:`; `?after=N` resumes after event `N` as `Last-Event-ID` does. The client
//! sends [`Op`]s as text frames: `{"type": "prompt" | "steer" | "follow_up", "text": …}`,
//! `{"type": "continue"}`, `{"type": "clear_queues", "queues": "steering" | "follow_up" | "both"}`,
//! `{"type": "abort"}`, `{"type": "reset"}`, `{"type": "compact", "instructions"?: …}`, and replies that name the request
//! they answer: `{"type": "answer", "request_id": …, "text": …}`,
//! `{"type": "approve", "request_id": …}` or
//! `{"type": "deny", "request_id": …, "reason": …}`. A command that fails is answered
//! with the REST API's problem details, its `type` moved to `kind`:
//! `{"type": "problem", "kind": "urn:tiller:problem:busy", "status": 409, …}`; one
//! that succeeds is answered by the events it causes. The socket closes when the
//! client closes it or the server shuts down.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tiller::Op;
use tiller::wire::Updates;

use crate::Shared;
use crate::agents::from_client;
use crate::error::Problem;
use crate::quota::StreamSlot;
use crate::reach::Outgoings;
use crate::shutdown::{UntilClosing, until_closing};
use crate::tenants::Caller;

/// `?after=N`: resume after event `N`; `?updates=lean|full` as on the event
/// stream.
#[derive(Debug, Deserialize)]
pub(crate) struct After {
    after: Option<u64>,
    #[serde(default)]
    updates: Updates,
}

/// `GET /agents/{id}/ws`.
pub(crate) async fn socket(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    after: Result<Query<After>, QueryRejection>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    shared.reach(&caller, &id).await?;
    let upgrade = upgrade.map_err(|rejection| {
        Problem::new(rejection.status(), "not-a-websocket", rejection.body_text())
    })?;
    let slot = shared.stream_slot(&caller)?;
    let Query(After { after, updates }) =
        after.map_err(|rejection| Problem::invalid(None, rejection.body_text()))?;
    // Ends when the server closes its streams, after the events published by then.
    let events = until_closing(
        shared.events_of(&caller, &id, after, updates).await?,
        &shared.closing,
    );
    Ok(upgrade
        .max_message_size(shared.config.max_body_bytes)
        .on_upgrade(move |socket| serve(shared, caller, id, events, socket, slot)))
}

/// Serves one socket, holding its caller's stream `_slot` until it closes.
async fn serve(
    shared: Arc<Shared>,
    caller: Caller,
    id: String,
    mut events: UntilClosing<Outgoings>,
    socket: WebSocket,
    _slot: StreamSlot,
) {
    let (mut outgoing, mut incoming) = socket.split();
    loop {
        let frame = tokio::select! {
            event = events.next() => match event {
                Some(frame) => {
                    shared.metrics.event_streamed();
                    // Compact JSON is text: checked, never copied.
                    Utf8Bytes::try_from(frame.json()).unwrap_or_default()
                }
                None => break,
            },
            received = incoming.next() => match received {
                Some(Ok(Message::Text(text))) => match command(&shared, &caller, &id, text.as_str()).await {
                    Ok(()) => continue,
                    Err(problem) => {
                        let mut frame = serde_json::to_value(&problem).unwrap_or_default();
                        frame["type"] = "problem".into();
                        frame["kind"] = problem.kind.into();
                        frame.to_string().into()
                    }
                },
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                Some(Ok(_)) => continue,
            },
        };
        if outgoing.send(Message::Text(frame)).await.is_err() {
            break;
        }
    }
    let _ = outgoing.send(Message::Close(None)).await;
}

/// Carries out one frame from the client, an [`Op`] (one that starts a run only
/// while the server is not shutting down).
async fn command(shared: &Shared, caller: &Caller, id: &str, frame: &str) -> Result<(), Problem> {
    let mut json = serde_json::Deserializer::from_str(frame);
    let op: Op = serde_path_to_error::deserialize(&mut json).map_err(|error| {
        let path = error.path().to_string();
        Problem::invalid(
            (path != ".").then_some(path),
            format!("invalid command: {}", error.inner()),
        )
    })?;
    from_client(&op)?;
    if matches!(op, Op::Fork { .. }) {
        // Where a new session is counted against its owner's quota.
        return Err(Problem::invalid(
            Some("type".to_owned()),
            "a branch is made with POST /sessions/{id}/fork",
        ));
    }
    if op.starts_run() {
        shared.accepting()?;
    }
    if !matches!(op, Op::Abort) {
        shared.writable()?;
    }
    shared
        .submit(caller, &axum::http::HeaderMap::new(), id, async move || {
            Ok(op)
        })
        .await
}
