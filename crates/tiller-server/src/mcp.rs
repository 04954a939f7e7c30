//! `/mcp`: the definitions offered to MCP hosts over streamable HTTP, each a tool
//! that runs an agent of it ([`tiller::mcp::McpToolServer`]). A request needs the same
//! bearer token as the rest of the API, and the agents a call runs work for the
//! token's tenant and user.
//!
//! With tokens, the definitions' instructions (an open server's MCP prompts)
//! are not offered: they are the operator's, not any tenant's.
//!
//! An MCP session belongs to the caller that opened it: a request naming another
//! caller's `Mcp-Session-Id` is answered as if the session did not exist (404).
//! At most [`crate::ServerConfig::max_mcp_sessions`] are live at once (503
//! `too-many-mcp-sessions` past it), and
//! [`crate::ServerConfig::max_mcp_sessions_per_tenant`] of one tenant (429); one
//! idle for
//! [`crate::ServerConfig::mcp_idle_timeout`] ends. Every refusal, the MCP
//! library's own included, is `application/problem+json` (the server's guard
//! makes it so).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use dashmap::DashMap;
use tiller::mcp::McpToolServer;
use tiller::mcp::{McpHttpConfig, McpSessions};

use crate::Shared;
use crate::error::{Problem, is_problem};
use crate::tenants::{Scope, caller};

/// The header naming a request's MCP session.
const SESSION_HEADER: &str = "mcp-session-id";

/// Who opened each live MCP session, and the live sessions themselves.
struct Sessions {
    shared: Arc<Shared>,
    live: McpSessions,
    owners: DashMap<String, Scope>,
}

/// The routes under `/mcp`.
pub(crate) fn router(shared: &Arc<Shared>) -> Router<Arc<Shared>> {
    let config = &shared.config;
    let (tokens, trust) = (config.tokens.clone(), config.trust_context_headers);
    let tools = shared
        .definitions
        .agent_tools(&shared.supervisor)
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "the definitions cannot be offered over /mcp");
            Vec::new()
        });
    // A definition's instructions are the operator's: offered as prompts on an
    // open server (one tenant) only, never to the tenants of a server with tokens.
    let prompts = if config.tokens.is_empty() {
        shared.definitions.prompts()
    } else {
        Vec::new()
    };
    let (service, live) = McpToolServer::new("tiller", tools)
        .with_prompts(prompts)
        .with_instructions("Each tool is an agent: call it with `text`, what to ask it; each prompt (an open server's) is an agent's instructions.")
        .with_context_from(move |parts| {
            caller(&tokens, trust, &parts.headers)
                .map(|caller| caller.context)
                .unwrap_or_default()
        })
        .http_service(McpHttpConfig {
            allowed_hosts: config.allowed_hosts.clone(),
            max_body_bytes: config.max_body_bytes,
            idle_timeout: config.mcp_idle_timeout,
            stop: shared.closing.child_token(),
        });
    let sessions = Arc::new(Sessions {
        shared: shared.clone(),
        live,
        owners: DashMap::new(),
    });
    Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn_with_state(sessions, guard))
}

/// Refuses a request without a token the server knows (when it has tokens), one
/// naming another caller's session, and a new session past the cap; records who
/// opens a session; and answers every refusal as problem details.
async fn guard(State(sessions): State<Arc<Sessions>>, request: Request, next: Next) -> Response {
    let scope = match sessions.shared.caller(request.headers()) {
        Ok(caller) => caller.scope(),
        Err(problem) => return problem.into_response(),
    };
    let named = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    match &named {
        Some(id) if sessions.owners.get(id).is_some_and(|owner| *owner != scope) => {
            return unknown_session().into_response();
        }
        None if request.method() == Method::POST => {
            let config = &sessions.shared.config;
            let live = sessions.live.ids().await;
            // The owners of sessions that ended (idle, closed, at shutdown) go,
            // so there are never more owners than live sessions and one opening.
            sessions.owners.retain(|id, _| live.contains(id.as_str()));
            let per_tenant = sessions
                .shared
                .quotas_of(scope.tenant.as_deref())
                .0
                .mcp_sessions
                .unwrap_or(config.max_mcp_sessions_per_tenant);
            let held = sessions
                .owners
                .iter()
                .filter(|owner| owner.tenant == scope.tenant)
                .count();
            if held >= per_tenant {
                return Problem::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too-many-mcp-sessions",
                    format!("your tenant holds {per_tenant} MCP sessions, the most one may: close one (DELETE /mcp) or wait for an idle one to end"),
                )
                .into_response();
            }
            let max = config.max_mcp_sessions;
            if live.len() >= max {
                return Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too-many-mcp-sessions",
                    format!("{max} MCP sessions are open, the most this server keeps: close one (DELETE /mcp) or wait for an idle one to end"),
                )
                .into_response();
            }
        }
        _ => {}
    }
    let closing = request.method() == Method::DELETE;
    let response = next.run(request).await;
    if let Some(opened) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|opened| named.as_deref() != Some(*opened))
    {
        sessions.owners.insert(opened.to_owned(), scope);
    }
    if closing
        && response.status().is_success()
        && let Some(id) = &named
    {
        sessions.owners.remove(id);
    }
    match response.status() {
        // The MCP library's own 404: no such session (of anyone's).
        StatusCode::NOT_FOUND if !is_problem(&response) => unknown_session().into_response(),
        _ => response,
    }
}

fn unknown_session() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "unknown-mcp-session",
        "no MCP session of yours has this id: start one with `initialize`",
    )
}
