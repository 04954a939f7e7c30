//! Errors as `application/problem+json` (RFC 9457): a `type` naming the kind, a
//! `title`, the `status`, a `detail` in words and, for bad input, the `field` at
//! fault. The kinds follow the library's errors: `busy` is 409, an unknown agent
//! 404, bad input 422.

use axum::Extension;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tiller::store::StoreError;
use tiller::{AgentError, SpawnError, agents::DefinitionsError, run::ContinueError};

use crate::metrics::ProblemKind;

/// A request that could not be carried out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    /// `urn:tiller:problem:{kind}`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The kind in a few words.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong, in words.
    pub detail: String,
    /// The request field at fault, as a path such as `text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl Problem {
    /// A problem of `kind` (a short slug) with `status`.
    pub fn new(status: StatusCode, kind: &str, detail: impl Into<String>) -> Self {
        Problem {
            kind: format!("urn:tiller:problem:{kind}"),
            title: status.canonical_reason().unwrap_or("error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            field: None,
        }
    }

    /// Bad input in `field`.
    pub fn invalid(field: Option<String>, detail: impl Into<String>) -> Self {
        Problem {
            field,
            ..Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", detail)
        }
    }

    /// The kind without its `urn:tiller:problem:` prefix.
    pub(crate) fn slug(&self) -> &str {
        self.kind.rsplit(':').next().unwrap_or(&self.kind)
    }

    /// No agent with this id.
    pub fn unknown_agent(id: &str) -> Self {
        Problem::new(
            StatusCode::NOT_FOUND,
            "unknown-agent",
            format!("no agent has the id `{id}`"),
        )
    }

    /// No session with this id.
    pub fn unknown_session(id: &str) -> Self {
        Problem::new(
            StatusCode::NOT_FOUND,
            "unknown-session",
            format!("no session has the id `{id}`"),
        )
    }
}

impl Problem {
    /// The response for this problem with `body` (its JSON, maybe with more
    /// members): its status, the problem+json type, and its kind for the metrics.
    pub(crate) fn respond(&self, body: String) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            Extension(ProblemKind(self.slug().to_owned())),
            // For a protocol's own words (the OpenAI routes').
            Extension(self.clone()),
            body,
        )
            .into_response()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.respond(serde_json::to_string(&self).unwrap_or_default())
    }
}

impl From<AgentError> for Problem {
    fn from(error: AgentError) -> Self {
        let detail = error.to_string();
        match error {
            AgentError::Busy => Problem::new(StatusCode::CONFLICT, "busy", detail),
            AgentError::CannotStart(ContinueError::WaitingForReply { .. }) => {
                Problem::new(StatusCode::CONFLICT, "waiting-for-reply", detail)
            }
            AgentError::CannotStart(ContinueError::NothingToReply) => {
                Problem::new(StatusCode::CONFLICT, "nothing-to-reply", detail)
            }
            AgentError::CannotStart(ContinueError::NoSuchRequest { .. }) => Problem {
                field: Some("request_id".to_owned()),
                ..Problem::new(StatusCode::CONFLICT, "no-such-request", detail)
            },
            AgentError::CannotStart(ContinueError::ReplyDoesNotFit { .. }) => {
                Problem::new(StatusCode::CONFLICT, "reply-does-not-fit", detail)
            }
            AgentError::Stopped { .. } => Problem::new(StatusCode::CONFLICT, "stopped", detail),
            AgentError::QueueFull { .. } => {
                Problem::new(StatusCode::TOO_MANY_REQUESTS, "queue-full", detail)
            }
            AgentError::InvalidBranch { .. } => Problem::invalid(Some("id".to_owned()), detail),
            AgentError::Store(error) => error.into(),
            AgentError::Failed { .. } => {
                Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "failed", detail)
            }
            _ => Problem::invalid(None, detail),
        }
    }
}

impl From<SpawnError> for Problem {
    fn from(error: SpawnError) -> Self {
        let detail = error.to_string();
        match error {
            SpawnError::IdTaken(_) => Problem {
                field: Some("id".to_owned()),
                ..Problem::new(StatusCode::CONFLICT, "id-taken", detail)
            },
            SpawnError::NameTaken(_) => Problem {
                field: Some("name".to_owned()),
                ..Problem::new(StatusCode::CONFLICT, "name-taken", detail)
            },
            SpawnError::MissingTools { .. } => Problem::invalid(None, detail),
            SpawnError::InvalidId { field, .. } => Problem::invalid(Some(field.to_owned()), detail),
            // Answered as a session that does not exist: nothing is learnt of it.
            SpawnError::NotOwner { session } => Problem::unknown_session(&session),
            SpawnError::Store(StoreError::SessionExists(_)) => Problem {
                field: Some("id".to_owned()),
                ..Problem::new(StatusCode::CONFLICT, "session-exists", detail)
            },
            SpawnError::Store(error @ StoreError::TakenOver { .. }) => error.into(),
            SpawnError::Store(_) | SpawnError::ShutDown => {
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
            }
            _ => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "failed", detail),
        }
    }
}

impl From<StoreError> for Problem {
    fn from(error: StoreError) -> Self {
        let detail = error.to_string();
        match error {
            // Another process holds the session now: retrying here cannot help.
            StoreError::TakenOver { .. } => {
                Problem::new(StatusCode::CONFLICT, "taken-over", detail)
            }
            // A fork the session cannot give.
            StoreError::ForkPastEnd { .. } | StoreError::BranchTooDeep { .. } => {
                Problem::invalid(Some("at".to_owned()), detail)
            }
            StoreError::SessionExists(_) => Problem {
                field: Some("id".to_owned()),
                ..Problem::new(StatusCode::CONFLICT, "session-exists", detail)
            },
            StoreError::Unsupported(_) => {
                Problem::new(StatusCode::NOT_IMPLEMENTED, "unsupported", detail)
            }
            StoreError::InvalidFile(_) => Problem::invalid(Some("data".to_owned()), detail),
            StoreError::TooManyFiles { .. } => {
                Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "too-many-files", detail)
            }
            // The store cannot be reached just now: try again later.
            StoreError::Unavailable(_) => {
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable", detail)
            }
            _ => Problem::new(StatusCode::SERVICE_UNAVAILABLE, "store", detail),
        }
    }
}

impl From<DefinitionsError> for Problem {
    fn from(error: DefinitionsError) -> Self {
        let field = match &error {
            DefinitionsError::Unknown { .. } => Some("definition".to_owned()),
            DefinitionsError::Unusable(error) => {
                error.field.as_ref().map(|field| format!("inline.{field}"))
            }
            _ => None,
        };
        Problem::invalid(field, error.to_string())
    }
}

/// The answer to a path the API does not have (404 `no-route`).
pub(crate) async fn no_route(uri: axum::http::Uri) -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "no-route",
        format!("the API has no `{}` (see /openapi.json)", uri.path()),
    )
}

/// The answer to a method a path does not take (405 `method-not-allowed`).
pub(crate) async fn method_not_allowed(method: axum::http::Method) -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        format!("this path does not take {method} (see /openapi.json)"),
    )
}

/// A JSON body decoded with the path of the field at fault in its error.
pub(crate) fn decode<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, Problem> {
    let body =
        body.map_err(|rejection| Problem::new(rejection.status(), "body", rejection.body_text()))?;
    let mut json = serde_json::Deserializer::from_slice(&body);
    serde_path_to_error::deserialize(&mut json).map_err(|error| {
        let message = error.inner().to_string();
        let path = error.path().to_string();
        // A missing field is reported at its parent.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let field = match (path.as_str(), missing) {
            (".", Some(name)) => Some(name.to_owned()),
            (".", None) => None,
            (parent, Some(name)) => Some(format!("{parent}.{name}")),
            (path, None) => Some(path.to_owned()),
        };
        Problem::invalid(field, format!("invalid request body: {message}"))
    })
}

/// Marks a refusal that says what went wrong in a protocol's own JSON (the
/// OpenAI API's error object): it goes out as it is.
#[derive(Clone, Copy)]
pub(crate) struct SaidInJson;

/// The most bytes of a plain-text refusal kept as a problem's detail.
const MAX_DETAIL_BYTES: usize = 4_096;

/// Whether `response` is problem details already.
pub(crate) fn is_problem(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|kind| kind == "application/problem+json")
}

/// `response` as it is, or, when it refuses the request in plain text (the
/// router's and extractors' own refusals, the MCP library's), as problem details
/// holding its words.
pub(crate) async fn as_problem(response: Response) -> Response {
    let status = response.status();
    let said = is_problem(&response) || response.extensions().get::<SaidInJson>().is_some();
    if !(status.is_client_error() || status.is_server_error()) || said {
        return response;
    }
    let words = axum::body::to_bytes(response.into_body(), MAX_DETAIL_BYTES)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let kind = match status {
        StatusCode::FORBIDDEN => "host-not-allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "body",
        StatusCode::NOT_FOUND => "not-found",
        _ if status.is_server_error() => "failed",
        _ => "invalid",
    };
    let detail = if words.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_owned()
    } else {
        words
    };
    Problem::new(status, kind, detail).into_response()
}
