//! What the OpenAI API's routes share: `GET /v1/models`, which lists the
//! caller's definitions as models, and refusals in OpenAI's form. Chat
//! completions are in [`super::chat`], responses in [`super::responses`].

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::Shared;
use crate::error::{Problem, SaidInJson, as_problem};

/// `GET /v1/models`: the definitions the caller may run, as models.
pub(crate) async fn models(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<Value>, OpenAiError> {
    shared.caller(&headers)?;
    let data: Vec<Value> = shared
        .definitions
        .iter()
        .map(|file| json!({"id": file.name, "object": "model", "created": 0, "owned_by": "tiller"}))
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

/// A refusal in the OpenAI API's form: `{"error": {message, type, param,
/// code}}`, with the problem's status.
pub(crate) struct OpenAiError(Problem);

impl From<Problem> for OpenAiError {
    fn from(problem: Problem) -> Self {
        OpenAiError(problem)
    }
}

impl OpenAiError {
    /// `response` with any refusal in it said as an OpenAI error object: the
    /// problems the middleware answers with (a full queue, a body too large, a
    /// server shutting down), and a plain-text refusal.
    pub(crate) async fn reworded(response: Response) -> Response {
        let response = as_problem(response).await;
        match response.extensions().get::<Problem>() {
            Some(problem) => OpenAiError(problem.clone()).into_response(),
            None => response,
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let Problem {
            kind,
            status,
            detail,
            field,
            ..
        } = self.0;
        let code = kind.rsplit(':').next().unwrap_or_default().to_owned();
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let error =
            json!({"error": {"message": detail, "type": kind, "param": field, "code": code}});
        let mut response = (status, Json(error)).into_response();
        response.extensions_mut().insert(SaidInJson);
        response
    }
}
