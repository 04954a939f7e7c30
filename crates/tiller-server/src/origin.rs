//! Where requests may come from: the checks that keep a web page the user visits
//! from driving the server through the user's browser.
//!
//! - **Host.** An open server (no tokens) answers only requests whose `Host` is
//!   loopback or one of [`crate::ServerConfig::allowed_hosts`] (403
//!   `host-not-allowed`): a page cannot reach it by a name of its own that
//!   resolves to 127.0.0.1 (DNS rebinding).
//! - **Origin.** A request a browser sends from a page carries `Origin`; it is
//!   accepted from loopback origins, from the server's own origin (its `Host`), and
//!   from [`crate::ServerConfig::allowed_origins`], else refused (403
//!   `cross-origin`). That covers WebSocket upgrades, which browsers send across
//!   origins without asking.
//! - **JSON only.** A request with a body must say `Content-Type:
//!   application/json` (415 `unsupported-media-type`): the forms and `text/plain`
//!   bodies a page may send across origins without a preflight are refused.
//! - **Token first, body in time.** With tokens, a request's token is checked
//!   before its body is read, and a body must arrive whole within
//!   [`crate::ServerConfig::body_timeout`].
//! - **Problems only.** An error the router or an extractor answers in plain text
//!   (a path that does not decode, say) goes out as problem details.
//! - **No framing.** Every answer says `Content-Security-Policy: frame-ancestors
//!   'none'` and `X-Frame-Options: DENY`, so the dashboard's buttons cannot be
//!   clickjacked from another page.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Shared;
use crate::error::{Problem, as_problem};
use crate::protocols::openai::OpenAiError;
use crate::proxy::PiProblem;

/// Refuses requests from where the server is not meant to be reached, and marks
/// every answer as not to be framed.
pub(crate) async fn guard(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    // pi's proxy clients read a refusal's words from `error`, OpenAI's clients
    // from an error object.
    let pi = request.uri().path() == "/api/stream";
    let openai = request.uri().path().starts_with("/v1/");
    let checked = match refusal(&shared, request.method(), request.headers()) {
        Some(problem) => Err(problem),
        None => admitted(&shared, request).await,
    };
    let mut response = match checked {
        Ok(request) if openai => OpenAiError::reworded(next.run(request).await).await,
        Ok(request) => as_problem(next.run(request).await).await,
        Err(problem) if pi => PiProblem::from(problem).into_response(),
        Err(problem) if openai => OpenAiError::from(problem).into_response(),
        Err(problem) => problem.into_response(),
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// Why a request with `method` and `headers` is refused, if it is.
fn refusal(shared: &Shared, method: &Method, headers: &HeaderMap) -> Option<Problem> {
    let config = &shared.config;
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if config.tokens.is_empty() && !host_allowed(host, &config.allowed_hosts) {
        return Some(Problem::new(
            StatusCode::FORBIDDEN,
            "host-not-allowed",
            format!(
                "this server has no tokens and answers only on this machine: `{host}` is not a loopback name (allow more with --allowed-host)"
            ),
        ));
    }
    // A page's request that carries no `Origin` (an image, a script, a form's GET)
    // still says where it comes from.
    let site = headers
        .get("sec-fetch-site")
        .and_then(|value| value.to_str().ok());
    if matches!(site, Some("cross-site" | "same-site")) && !headers.contains_key(header::ORIGIN) {
        return Some(Problem::new(
            StatusCode::FORBIDDEN,
            "cross-origin",
            "requests from pages of other sites are refused",
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origin_allowed(origin, host, &config.allowed_origins) {
            return Some(Problem::new(
                StatusCode::FORBIDDEN,
                "cross-origin",
                format!(
                    "requests from pages of `{origin}` are refused (allow an origin with --allowed-origin)"
                ),
            ));
        }
    }
    if *method != Method::GET && *method != Method::HEAD && has_body(headers) && !is_json(headers) {
        return Some(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "a request body must be JSON, sent with `Content-Type: application/json`",
        ));
    }
    None
}

/// `request` once its caller is known (with tokens: before its body is read, so
/// that no one without a token holds a connection by sending one slowly) and its
/// body has arrived within [`crate::ServerConfig::body_timeout`] (408 `slow-body`
/// past it; 413 `body` past [`crate::ServerConfig::max_body_bytes`]).
async fn admitted(shared: &Shared, request: Request) -> Result<Request, Problem> {
    let path = request.uri().path();
    if !shared.config.tokens.is_empty() && path != "/" && path != "/healthz" {
        shared.caller(request.headers())?;
    }
    if !has_body(request.headers()) {
        return Ok(request);
    }
    let (parts, body) = request.into_parts();
    let limit = shared.config.max_body_bytes;
    let bytes = tokio::time::timeout(
        shared.config.body_timeout,
        axum::body::to_bytes(body, limit),
    )
    .await
    .map_err(|_| {
        Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "slow-body",
            format!(
                "the request's body did not arrive within {} ms",
                shared.config.body_timeout.as_millis()
            ),
        )
    })?
    .map_err(|_| {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body",
            format!("the request's body is larger than {limit} bytes, or was cut"),
        )
    })?;
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

/// Whether `host` (a `Host` header, maybe with a port) is loopback or one of
/// `allowed` (any, when `allowed` is empty).
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = without_port(host);
    allowed.is_empty() || is_loopback(name) || allowed.iter().any(|known| known == name)
}

/// Whether pages of `origin` may call a server reached as `host`.
fn origin_allowed(origin: &str, host: &str, allowed: &[String]) -> bool {
    if allowed.iter().any(|known| known == origin) {
        return true;
    }
    let Ok(uri) = origin.parse::<Uri>() else {
        // `null` (a sandboxed frame, a file) and anything else unreadable.
        return false;
    };
    let Some(authority) = uri.authority() else {
        return false;
    };
    is_loopback(authority.host()) || authority.as_str().eq_ignore_ascii_case(host)
}

/// `host` without its `:port`, and an IPv6 address without its brackets.
fn without_port(host: &str) -> &str {
    if host.parse::<IpAddr>().is_ok() {
        return host;
    }
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// Whether `name` (a host name or an address) is this machine.
fn is_loopback(name: &str) -> bool {
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

/// Whether the request says it carries a body.
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|length| length.trim() != "0")
        || headers.contains_key(header::CONTENT_TYPE)
}

/// Whether the request's body is said to be JSON (`application/json`, or a
/// `+json` type such as `application/merge-patch+json`).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence.to_ascii_lowercase().ends_with("+json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_and_origins_are_this_machine() {
        for host in [
            "localhost",
            "localhost:8787",
            "127.0.0.1:1",
            "[::1]:80",
            "::1",
        ] {
            assert!(host_allowed(host, &["localhost".to_owned()]), "{host}");
        }
        for host in ["evil.test", "evil.test:8787", "10.0.0.1:80", ""] {
            assert!(!host_allowed(host, &["localhost".to_owned()]), "{host}");
        }
        assert!(origin_allowed("http://127.0.0.1:9", "127.0.0.1:8787", &[]));
        assert!(origin_allowed("http://[::1]:9", "x", &[]));
        assert!(origin_allowed(
            "https://tiller.example",
            "tiller.example",
            &[]
        ));
        assert!(!origin_allowed(
            "http://evil.test:8787",
            "127.0.0.1:8787",
            &[]
        ));
        assert!(!origin_allowed("null", "127.0.0.1:8787", &[]));
        assert!(origin_allowed(
            "https://app.example",
            "127.0.0.1:8787",
            &["https://app.example".to_owned()]
        ));
    }
}
