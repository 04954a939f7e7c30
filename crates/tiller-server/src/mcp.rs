//! `/mcp`: the definitions offered to MCP hosts over streamable HTTP, each a tool
//! that runs an agent of it ([`tiller::McpToolServer`]). A request needs the same
//! bearer token as the rest of the API, and the agents a call runs work for the
//! token's tenant and user.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tiller::McpToolServer;
use tiller::tiller_mcp::McpHttpConfig;

use crate::Shared;
use crate::tenants::caller;

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
    let service = McpToolServer::new("tiller", tools)
        .with_instructions("Each tool is an agent: call it with `text`, what to ask it.")
        .with_context_from(move |parts| {
            caller(&tokens, trust, &parts.headers)
                .map(|caller| caller.context)
                .unwrap_or_default()
        })
        .http_service(McpHttpConfig {
            allowed_hosts: config.mcp_allowed_hosts.clone(),
            max_body_bytes: config.max_body_bytes,
            stop: shared.closing.child_token(),
        });
    Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            authorized,
        ))
}

/// Refuses a request without a token the server knows (when it has tokens).
async fn authorized(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    match shared.caller(request.headers()) {
        Ok(_) => next.run(request).await,
        Err(problem) => problem.into_response(),
    }
}
