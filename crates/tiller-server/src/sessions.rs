//! Conversations: the sessions the store keeps, as a resource. List a user's
//! sessions, read one's messages a page at a time, resume one into an agent, and
//! delete one. Everything here is read from the store, so it works for sessions
//! no agent holds (an agent stopped, or a server restarted).
//!
//! A caller sees the sessions of its tenant (every session on an open server), and
//! only its own when its token (or a trusted `X-User-Id`) names a user. A session it
//! may not see is answered as one that does not exist.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller::run::{Widget, widgets_of};
use tiller::runtime::{AgentStatus, MessageStatus, message_statuses};
use tiller::store::{SessionFilter, SessionInfo, SessionRecord, SessionStatus, ago, is_within};
use tiller::{AgentContext, AgentSpec, Op};
use tiller::{AgentMessage, runtime::AgentInfo};

use crate::Shared;
use crate::agents::{Wait, wait_of};
use crate::error::{Problem, decode};
use crate::reach::Origin;
use crate::tenants::{Caller, Scope};

/// The most sessions, or messages, one page holds.
pub const MAX_PAGE: u32 = 1_000;

/// A page's size when the request names none.
const DEFAULT_PAGE: u32 = 100;

/// `GET /sessions`: which sessions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListSessions {
    user_id: Option<String>,
    status: Option<SessionStatus>,
    limit: Option<u32>,
}

/// `GET /sessions/{id}/messages`: which page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    #[serde(default)]
    from: u64,
    limit: Option<u32>,
}

/// `POST /sessions/{id}/resume`: the definition whose tools the agent gets (its
/// model, instructions and transcript are the session's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeSession {
    definition: Option<String>,
    version: Option<String>,
    inline: Option<Value>,
}

/// `POST /sessions/{id}/fork`: where the branch begins, its id, and a prompt
/// its agent runs at once (fork at a user message and send it edited: try
/// that turn again).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkSession {
    at: u64,
    id: Option<String>,
    prompt: Option<String>,
}

/// A session as the API shows it: its row, how many messages it holds, and the
/// agent holding it, if one is.
#[derive(Debug, Serialize)]
pub(crate) struct SessionView {
    #[serde(flatten)]
    info: SessionInfo,
    agent: Option<AgentInfo>,
}

/// A page of a session's messages.
#[derive(Debug, Serialize)]
pub(crate) struct MessagePage {
    session_id: String,
    /// The place of the page's first message in the transcript.
    from: u64,
    /// How many messages the transcript holds.
    total: u64,
    messages: Vec<Arc<AgentMessage>>,
    /// Where each message stands (`pending`, `streaming`, `done`, `failed`;
    /// see `tiller::runtime::MessageStatus`), in the order of `messages`.
    statuses: Vec<MessageStatus>,
    /// Where the next page starts, or `null` after the last.
    next: Option<u64>,
}

/// How far past a page the store is read for a response to the page's last
/// user messages (a response follows its prompt at once, but for steering).
const LOOK_AHEAD: u32 = 16;

/// A page size the request asked for, within [`MAX_PAGE`].
pub(crate) fn page_size(limit: Option<u32>) -> Result<u32, Problem> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(limit) if (1..=MAX_PAGE).contains(&limit) => Ok(limit),
        Some(_) => Err(Problem::invalid(
            Some("limit".to_owned()),
            format!("`limit` must be from 1 to {MAX_PAGE}"),
        )),
    }
}

/// A query string as `T`, or a 422 naming the query.
pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Problem> {
    query
        .map(|Query(query)| query)
        .map_err(|rejection| Problem::invalid(Some("query".to_owned()), rejection.body_text()))
}

impl Shared {
    /// The sessions `caller` may see, narrowed to `user_id` when asked.
    fn sessions_of(&self, caller: &Caller, user_id: Option<String>) -> Option<SessionFilter> {
        let own = caller.context.ids().user_id.clone();
        let user_id = match (own, user_id) {
            (Some(own), Some(asked)) if own != asked => return None,
            (own, asked) => own.or(asked),
        };
        Some(SessionFilter {
            tenant_id: caller.tenant.clone(),
            user_id,
            ..SessionFilter::default()
        })
    }

    /// The session `id`, if `caller` may see it.
    async fn session(&self, caller: &Caller, id: &str) -> Result<SessionInfo, Problem> {
        self.find_session(caller, id)
            .await?
            .ok_or_else(|| Problem::unknown_session(id))
    }

    /// The session `id` if there is one `caller` may see.
    pub(crate) async fn find_session(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Option<SessionInfo>, Problem> {
        let Some(filter) = self.sessions_of(caller, None) else {
            return Ok(None);
        };
        let filter = SessionFilter {
            id: Some(id.to_owned()),
            limit: Some(1),
            ..filter
        };
        Ok(self.supervisor.store().list(&filter).await?.pop())
    }

    /// Whether an agent holds the session `id` for `caller`: the one that
    /// does, or one brought up from the origin the session keeps (as after a
    /// restart); `false` when `caller` has no such session.
    pub(crate) async fn hold(&self, caller: &Caller, id: &str) -> Result<bool, Problem> {
        if self.reach(caller, id).await.is_ok() {
            return Ok(true);
        }
        let Some(info) = self.find_session(caller, id).await? else {
            return Ok(false);
        };
        let origin = Origin::of(&info.record)?;
        let spec = self.remade(&origin)?;
        self.bring_up(info.record, spec, &origin).await?;
        Ok(true)
    }

    /// The spec of an agent as `origin` says the server made it, working for
    /// whom it worked for.
    pub(crate) fn remade(&self, origin: &Origin) -> Result<AgentSpec, Problem> {
        Ok(self
            .spec(
                origin.definition.as_deref(),
                origin.version.as_deref(),
                origin.inline.as_ref(),
            )?
            .with_context(AgentContext::from_ids(origin.context.clone())))
    }

    /// An agent of `spec` holding the stored session `record` again, for the
    /// tenant and user it belongs to, made as `origin` says.
    async fn bring_up(
        &self,
        record: SessionRecord,
        spec: AgentSpec,
        origin: &Origin,
    ) -> Result<AgentInfo, Problem> {
        let owner = Scope {
            tenant: record.tenant_id.clone(),
            user: record.user_id.clone(),
        };
        let mut spec = spec
            .with_owner(record.tenant_id, record.user_id)
            .with_id(record.id.clone())
            .with_session(record.id);
        spec.name = record.name;
        self.spawn(spec, owner, origin).await
    }

    fn view(&self, info: SessionInfo) -> SessionView {
        let agent = self.holder_info(&info.record.id);
        SessionView { info, agent }
    }
}

pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    asked: Result<Query<ListSessions>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<Vec<SessionView>>, Problem> {
    let caller = shared.caller(&headers)?;
    listed(&shared, &caller, query(asked)?, None).await
}

/// The sessions `caller` may see that `asked` asks for, the branches of
/// `parent` alone when it is given.
async fn listed(
    shared: &Shared,
    caller: &Caller,
    asked: ListSessions,
    parent: Option<String>,
) -> Result<Json<Vec<SessionView>>, Problem> {
    let Some(filter) = shared.sessions_of(caller, asked.user_id) else {
        return Ok(Json(Vec::new()));
    };
    let filter = SessionFilter {
        parent,
        status: asked.status,
        limit: Some(page_size(asked.limit)?),
        ..filter
    };
    let found = shared.supervisor.store().list(&filter).await?;
    Ok(Json(
        found.into_iter().map(|info| shared.view(info)).collect(),
    ))
}

pub(crate) async fn get(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<SessionView>, Problem> {
    let caller = shared.caller(&headers)?;
    let info = shared.session(&caller, &id).await?;
    Ok(Json(shared.view(info)))
}

pub(crate) async fn messages(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    page: Result<Query<PageQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<MessagePage>, Problem> {
    let caller = shared.caller(&headers)?;
    let page = query(page)?;
    let limit = page_size(page.limit)?;
    let info = shared.session(&caller, &id).await?;
    let messages = shared
        .supervisor
        .store()
        .messages(&id, page.from, limit)
        .await?;
    let end = page.from.saturating_add(messages.len() as u64);
    // A user message at the page's end is answered if a response follows it
    // on the pages after.
    let unanswered_at_end = messages
        .last()
        .is_some_and(|message| message.as_user().is_some());
    let answered_after = unanswered_at_end
        && end < info.messages
        && shared
            .supervisor
            .store()
            .messages(&id, end, LOOK_AHEAD)
            .await?
            .iter()
            .any(|message| message.as_assistant().is_some());
    let working = shared
        .holder_info(&id)
        .is_some_and(|agent| agent.status == AgentStatus::Running);
    Ok(Json(MessagePage {
        session_id: id,
        from: page.from,
        total: info.messages,
        next: (end < info.messages && !messages.is_empty()).then_some(end),
        statuses: message_statuses(&messages, answered_after, working),
        messages,
    }))
}

/// `GET /sessions/{id}/widgets`: the widgets the conversation shows, each
/// with its latest data, read from its stored transcript.
pub(crate) async fn widgets(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Vec<Widget>>, Problem> {
    let caller = shared.caller(&headers)?;
    shared.session(&caller, &id).await?;
    let stored = shared
        .supervisor
        .store()
        .load(&id)
        .await?
        .ok_or_else(|| Problem::unknown_session(&id))?;
    Ok(Json(widgets_of(0, &stored.messages)))
}

pub(crate) async fn resume(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    let info = shared.session(&caller, &id).await?;
    let request: ResumeSession = decode(body)?;
    if let Some(agent) = shared.holder_info(&id) {
        return Ok(Json(agent).into_response());
    }
    let origin = Origin {
        definition: request.definition.clone(),
        version: request.version.clone(),
        inline: request.inline.clone(),
        context: caller.context.ids().clone(),
    };
    let spec = shared
        .spec(
            request.definition.as_deref(),
            request.version.as_deref(),
            request.inline.as_ref(),
        )?
        .with_context(caller.context);
    let agent = shared.bring_up(info.record, spec, &origin).await?;
    Ok((StatusCode::CREATED, Json(agent)).into_response())
}

/// Forks the session into a branch (see [`tiller::Op::Fork`]) of the same
/// owner, counted against its quota of sessions; 201 with the branch, and the
/// agent that runs the prompt when one is given (with `?wait=true`, once its
/// run ended).
pub(crate) async fn fork(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    wait: Result<Query<Wait>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    let info = shared.session(&caller, &id).await?;
    let wait = wait_of(wait)?.wait;
    let request: ForkSession = decode(body)?;
    shared.writable()?;
    if request.prompt.is_some() {
        shared.accepting()?;
    }
    let owner = Scope {
        tenant: info.record.tenant_id.clone(),
        user: info.record.user_id.clone(),
    };
    shared.check_sessions(&owner, None).await?;
    if let Some(branch) = &request.id {
        crate::agents::check_client_id(branch, "id")?;
    }
    let branch = request.id.unwrap_or_else(tiller::ai::new_id);
    shared.hold(&caller, &id).await?;
    let fork = Op::Fork {
        at: request.at,
        session: branch.clone(),
    };
    shared
        .submit(&caller, &headers, &id, async move || Ok(fork))
        .await?;
    if let Some(prompt) = request.prompt {
        shared.hold(&caller, &branch).await?;
        let prompt = Op::Prompt {
            messages: vec![AgentMessage::user(prompt)],
        };
        if wait {
            shared.run(&caller, &headers, &branch, prompt).await?;
        } else {
            shared
                .submit(&caller, &headers, &branch, async move || Ok(prompt))
                .await?;
        }
    }
    let info = shared.session(&caller, &branch).await?;
    Ok((StatusCode::CREATED, Json(shared.view(info))).into_response())
}

/// The branches forked from the session, most recently changed first.
pub(crate) async fn branches(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    asked: Result<Query<ListSessions>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<Vec<SessionView>>, Problem> {
    let caller = shared.caller(&headers)?;
    let asked = query(asked)?;
    shared.session(&caller, &id).await?;
    listed(&shared, &caller, asked, Some(id)).await
}

pub(crate) async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let caller = shared.caller(&headers)?;
    shared.session(&caller, &id).await?;
    // The agent holding it and its sub-agents (whose sessions go with it).
    for agent in shared.supervisor.list() {
        if is_within(agent.id.as_str(), &id) {
            shared.stop(agent.id.as_str()).await?;
        }
    }
    // Wherever else it is held.
    shared.stop(&id).await?;
    if !shared.supervisor.store().delete(&id).await? {
        return Err(Problem::unknown_session(&id));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes the closed sessions last changed more than `retain` ago, now and every
/// hour after (see [`crate::ServerConfig::retain_closed`]).
pub(crate) async fn prune_every_hour(shared: Arc<Shared>, retain: std::time::Duration) {
    let mut hourly = tokio::time::interval(std::time::Duration::from_secs(3_600));
    loop {
        hourly.tick().await;
        match shared.supervisor.store().prune(ago(retain)).await {
            Ok(0) => {}
            Ok(pruned) => tracing::info!(pruned, "closed sessions past their retention deleted"),
            Err(error) => tracing::warn!(%error, "closed sessions could not be pruned"),
        }
    }
}
