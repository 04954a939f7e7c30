//! The agents API: create, list, read, prompt, steer, follow up, abort, reset,
//! delete, and the event stream. Every handler is an `Op` (or a state request) to
//! the agent, wherever it lives ([`crate::reach`]); nothing about an agent is
//! kept here but its replay buffer and the tenant it belongs to.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller::ai::{Content, MAX_MESSAGE_FILE_BYTES, MAX_MESSAGE_FILES, UserMessage};
use tiller::{
    AgentHandle, AgentMessage, AgentSettings, AgentSpec, Envelope, Op, Prompt, runtime::AgentState,
};

use crate::Shared;
use crate::error::{Problem, decode};
use crate::events::{Replay, UpdatesQuery, envelopes, event_stream};
use crate::files::FilePart;
use crate::reach::Origin;
use crate::shutdown::until_closing;
use crate::tenants::{Caller, Scope, caller};

/// `POST /agents`: an agent from a definition the server knows, by name, or from
/// one sent inline (an agent file as JSON).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateAgent {
    definition: Option<String>,
    version: Option<String>,
    inline: Option<Value>,
    id: Option<String>,
    name: Option<String>,
}

/// `POST /agents/{id}/prompt`, `/steer`, `/follow_up`: a text from the user, and
/// files sent with it ([`FilePart`]: `{name, mime_type, data}`, the data base64,
/// within the body limit, or `{id}` of a file stored with `POST /files`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Text {
    text: String,
    #[serde(default)]
    files: Vec<FilePart>,
}

impl Text {
    /// The user's message in `body`, its files checked and stored ones read
    /// for `caller` (422 naming the first bad one).
    async fn read(
        shared: &Shared,
        caller: &Caller,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<AgentMessage, Problem> {
        let text: Text = decode(body)?;
        if text.files.len() > MAX_MESSAGE_FILES {
            return Err(Problem::invalid(
                Some("files".to_owned()),
                format!(
                    "{} files, more than the {MAX_MESSAGE_FILES} a message may carry",
                    text.files.len()
                ),
            ));
        }
        let mut message = UserMessage::text(text.text);
        let mut carried = 0;
        for (index, file) in text.files.into_iter().enumerate() {
            let field = format!("files[{index}]");
            let file = file.resolve(shared, caller, &field).await?;
            carried += file.size();
            if carried > MAX_MESSAGE_FILE_BYTES {
                return Err(Problem::invalid(
                    Some(field),
                    format!(
                        "the files come to more than the {MAX_MESSAGE_FILE_BYTES} bytes a message may carry"
                    ),
                ));
            }
            message = message.with_file(file);
        }
        Ok(AgentMessage::Llm(message.into()))
    }
}

/// `?wait=true`: answer once the run has ended, with its outcome.
#[derive(Debug, Deserialize)]
pub(crate) struct Wait {
    #[serde(default)]
    pub(crate) wait: bool,
}

impl Shared {
    /// Who sent `headers`.
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<Caller, Problem> {
        caller(
            &self.config.tokens,
            self.config.trust_context_headers,
            headers,
        )
    }

    /// Whether a caller of `scope` may see the agent `id`: one created through
    /// the API if [`Scope::sees`] its owner; one the host spawned only on an
    /// open server.
    pub(crate) fn visible(&self, scope: &Scope, id: &str) -> bool {
        match self.owners.get(id) {
            Some(owner) => scope.sees(&owner),
            None => scope.tenant.is_none(),
        }
    }

    /// `agent`'s events for a client that last saw `last_seen` (see
    /// [`envelopes`]).
    pub(crate) fn follow(
        &self,
        agent: &AgentHandle,
        last_seen: Option<u64>,
    ) -> impl Stream<Item = Arc<Envelope>> + use<> {
        let live = agent.subscribe_with_buffer(self.config.client_buffer);
        // An agent spawned by the host rather than through the API is recorded
        // from its first stream on.
        let replay = self
            .replays
            .entry(agent.id().clone())
            .or_insert_with(|| self.record(agent))
            .clone();
        envelopes(agent.id().clone(), live, &replay, last_seen)
    }

    /// An agent spec from a definition the server knows (`definition`, `version`)
    /// or one sent `inline` (an agent file as JSON): one of the two.
    pub(crate) fn spec(
        &self,
        definition: Option<&str>,
        version: Option<&str>,
        inline: Option<&Value>,
    ) -> Result<AgentSpec, Problem> {
        let mut spec = match (definition, inline) {
            (Some(name), None) => self.definitions.spec(name, version)?,
            (None, Some(inline)) => self.inline_spec(inline)?,
            _ => {
                return Err(Problem::invalid(
                    Some("definition".to_owned()),
                    "give either `definition` (a name the server knows) or `inline` (an agent file as JSON)",
                ));
            }
        };
        if self.config.quiet_after_child_content {
            Arc::make_mut(&mut spec.settings)
                .definition
                .run
                .quiet_after_child_content = true;
        }
        Ok(spec)
    }

    /// `settings` with the model of the operator's LLM configuration `name`, as
    /// `X-Model-Name` asks; a name the operator did not configure is refused.
    fn with_model_named(
        &self,
        settings: &AgentSettings,
        name: &str,
    ) -> Result<AgentSettings, Problem> {
        let refused = |detail: String| Problem::invalid(Some("X-Model-Name".to_owned()), detail);
        let patch = self
            .definitions
            .llms()
            .get(name)
            .map_err(|error| refused(error.to_string()))?;
        let mut settings = settings.clone();
        patch
            .apply(&mut settings.definition)
            .map_err(|error| refused(error.to_string()))?;
        Ok(settings)
    }

    /// Starts recording `agent`'s events for clients that come back (and, the
    /// first time, the task that forgets recordings of agents that stop).
    pub(crate) fn record(&self, agent: &AgentHandle) -> Arc<Replay> {
        let stops = self
            .stops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(stops) = stops {
            tokio::spawn(Shared::forget_stopped(self.me.clone(), stops));
        }
        Replay::record(
            agent,
            self.config.replay_events,
            &self.metrics,
            &self.stopped,
        )
    }
}

pub(crate) async fn create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    let request: CreateAgent = decode(body)?;
    // With trusted context headers, `X-Agent-Schema` names the definition when
    // the body gives none, and `X-Model-Name` one of the operator's LLM
    // configurations (`--llms`) for the agent's model, when there are any
    // (without, it is only the context's).
    let definition = match (&request.definition, &request.inline) {
        (None, None) => caller.context.agent_schema_uri().map(str::to_owned),
        _ => request.definition.clone(),
    };
    let mut spec = shared.spec(
        definition.as_deref(),
        request.version.as_deref(),
        request.inline.as_ref(),
    )?;
    if let Some(model) = caller.context.default_model()
        && shared.definitions.llms().iter().next().is_some()
    {
        spec.settings = Arc::new(shared.with_model_named(&spec.settings, model)?);
    }
    if caller.tenant.is_some()
        && let Some(field) = [("id", &request.id), ("name", &request.name)]
            .into_iter()
            .find_map(|(field, value)| value.as_ref().map(|_| field))
    {
        // Ids and names are one namespace for every tenant: one chosen by a client
        // could tell it another tenant's agent exists.
        return Err(Problem::invalid(
            Some(field.to_owned()),
            format!("`{field}` is chosen by the server when it serves several tenants"),
        ));
    }
    if let Some(id) = &request.id {
        check_client_id(id, "id")?;
    }
    let owner = caller.scope();
    let origin = Origin {
        definition,
        version: request.version,
        inline: request.inline,
        context: caller.context.ids().clone(),
    };
    let spec = spec.with_context(caller.context);
    let spec = match request.id {
        Some(id) => spec.with_id(id),
        None => spec,
    };
    let spec = match request.name {
        Some(name) => spec.with_name(name),
        None => spec,
    };
    let agent = shared.spawn(spec, owner, &origin).await?;
    Ok((StatusCode::CREATED, Json(agent)).into_response())
}

/// Refuses an agent id a client chose (given as `field`) that holds `/`, `#`
/// or `@`: a sub-agent's session is `{session}/{definition}`, and an id of a
/// client's own with these would reach into another conversation's.
pub(crate) fn check_client_id(id: &str, field: &str) -> Result<(), Problem> {
    if id.contains(['/', '#', '@']) {
        return Err(Problem::invalid(
            Some(field.to_owned()),
            "`/`, `#` and `@` are kept for sub-agents' sessions: choose an id without them",
        ));
    }
    Ok(())
}

/// A definition as `GET /definitions` lists it.
#[derive(Debug, Serialize)]
pub(crate) struct DefinitionView {
    name: String,
    version: Option<String>,
}

pub(crate) async fn definitions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<Vec<DefinitionView>>, Problem> {
    shared.caller(&headers)?;
    Ok(Json(
        shared
            .definitions
            .iter()
            .map(|file| DefinitionView {
                name: file.name.clone(),
                version: file.version.clone(),
            })
            .collect(),
    ))
}

/// `GET /agents?after=ID&limit=N`: a page of the agents the caller may see,
/// in id order (on a cluster, every host's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentsPage {
    /// The last id of the page before.
    after: Option<String>,
    /// At most this many (1 to [`crate::MAX_PAGE`], that many by default).
    limit: Option<u32>,
}

/// `GET /agents`: a page of agents; a `Link: <…>; rel="next"` header names the
/// next page while there may be one.
pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    page: Result<Query<AgentsPage>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    let Query(page) = page
        .map_err(|rejection| Problem::invalid(Some("query".to_owned()), rejection.body_text()))?;
    let limit = match page.limit {
        None => crate::MAX_PAGE,
        Some(limit) if (1..=crate::MAX_PAGE).contains(&limit) => limit,
        Some(_) => {
            return Err(Problem::invalid(
                Some("limit".to_owned()),
                format!("`limit` must be from 1 to {}", crate::MAX_PAGE),
            ));
        }
    };
    let (agents, next) = shared
        .agents_of(&caller, page.after.unwrap_or_default(), limit)
        .await?;
    let mut response = Json(agents).into_response();
    if let Some(next) = next {
        let link = format!(
            "</agents?after={}&limit={limit}>; rel=\"next\"",
            tiller::ai::path_segment(&next)
        );
        if let Ok(link) = link.parse() {
            response
                .headers_mut()
                .insert(axum::http::header::LINK, link);
        }
    }
    Ok(response)
}

pub(crate) async fn get(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Shown>, Problem> {
    let caller = shared.caller(&headers)?;
    let (state, owner) = shared.state(&caller, &id).await?;
    let statuses = state.message_statuses();
    Ok(Json(Shown {
        state,
        statuses,
        owner,
    }))
}

/// `GET /agents/{id}`: the agent's state and, in a cluster, the host that
/// holds it with its epoch.
#[derive(Serialize)]
pub(crate) struct Shown {
    #[serde(flatten)]
    state: AgentState,
    /// Where each of its messages stands, in their order.
    statuses: Vec<tiller::runtime::MessageStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<crate::reach::Holder>,
}

pub(crate) async fn prompt(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    wait: Result<Query<Wait>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    let (reader, asker) = (&*shared, &caller);
    start_route(&shared, &caller, &id, wait, &headers, async move || {
        Ok(Prompt::from(Text::read(reader, asker, body).await?))
    })
    .await
}

/// The `?wait=` of a request, or why it is not one.
pub(crate) fn wait_of(wait: Result<Query<Wait>, QueryRejection>) -> Result<Wait, Problem> {
    let Query(wait) =
        wait.map_err(|rejection| Problem::invalid(Some("wait".to_owned()), rejection.body_text()))?;
    Ok(wait)
}

/// A route that starts a run from the [`Prompt`] `prompt` makes of the request on
/// the agent `{id}` (found first, so an unknown agent is a 404 whatever the body):
/// 202 once accepted, or the run's outcome with `?wait=true`.
async fn start_route(
    shared: &Shared,
    caller: &Caller,
    id: &str,
    wait: Result<Query<Wait>, QueryRejection>,
    headers: &HeaderMap,
    prompt: impl AsyncFnOnce() -> Result<Prompt, Problem>,
) -> Result<Response, Problem> {
    shared.reach(caller, id).await?;
    let wait = wait_of(wait)?;
    let prompt = prompt().await?;
    start(shared, caller, headers, id, wait, prompt).await
}

/// Starts a run from `prompt`: 202 once accepted (and durable), or its outcome
/// with `?wait=true`.
async fn start(
    shared: &Shared,
    caller: &Caller,
    headers: &HeaderMap,
    id: &str,
    wait: Wait,
    prompt: Prompt,
) -> Result<Response, Problem> {
    let op = Op::from(prompt);
    if wait.wait {
        let outcome = shared.run(caller, headers, id, op).await?;
        return Ok(Json(outcome).into_response());
    }
    shared
        .submit(caller, headers, id, async move || Ok(op))
        .await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// `POST /agents/{id}/reply`: the user's reply to the request a parked run waits
/// for that it names by `request_id` (an answer, approve or deny); like a prompt, 202 once its run
/// started, or its outcome with `?wait=true`.
pub(crate) async fn reply(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    wait: Result<Query<Wait>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    start_route(&shared, &caller, &id, wait, &headers, async move || {
        Ok(Prompt::Reply(decode(body)?))
    })
    .await
}

/// What `POST /agents/{id}/compact` may carry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Compact {
    instructions: Option<String>,
}

/// `POST /agents/{id}/compact`: compacts the transcript now (an optional body
/// `{"instructions": …}` for the summary); 202 once started, or its outcome,
/// whose `compactions` say what was done, with `?wait=true`.
pub(crate) async fn compact(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    wait: Result<Query<Wait>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    start_route(&shared, &caller, &id, wait, &headers, async move || {
        let Compact { instructions } = match &body {
            Ok(bytes) if bytes.is_empty() => Compact::default(),
            _ => decode(body)?,
        };
        Ok(Prompt::Compact { instructions })
    })
    .await
}

/// Refuses the ops a client may not send: the transcript is the agent's, so a
/// client neither replaces it nor sends anything but user messages; and a
/// definition is the operator's (its model, server and key).
pub(crate) fn from_client(op: &Op) -> Result<(), Problem> {
    let messages: &[AgentMessage] = match op {
        Op::Prompt { messages } => messages,
        Op::Steer { message } | Op::FollowUp { message } => std::slice::from_ref(message),
        Op::Continue
        | Op::ClearQueues { .. }
        | Op::Abort
        | Op::Reset
        | Op::Compact { .. }
        | Op::Fork { .. }
        | Op::Reply(_) => &[],
        _ => {
            return Err(Problem::invalid(
                Some("type".to_owned()),
                "only prompt, continue, steer, follow_up, clear_queues, abort, reset, compact, fork, answer, approve and deny are available to clients",
            ));
        }
    };
    if messages.iter().any(|message| message.role() != "user") {
        return Err(Problem::invalid(
            Some("messages".to_owned()),
            "a client sends user messages only",
        ));
    }
    // Each file whole, checked as over HTTP (base64: never a stored id).
    for (at, message) in messages.iter().enumerate() {
        let AgentMessage::Llm(tiller::ai::Message::User(user)) = message else {
            continue;
        };
        let files = user.content.iter().filter_map(|block| match block {
            Content::File(file) => Some(file),
            _ => None,
        });
        let mut carried = 0;
        for (index, file) in files.enumerate() {
            let field = || Some(format!("messages[{at}].files[{index}]"));
            file.validate()
                .map_err(|error| Problem::invalid(field(), error.to_string()))?;
            carried += file.size();
            if index >= MAX_MESSAGE_FILES || carried > MAX_MESSAGE_FILE_BYTES {
                return Err(Problem::invalid(
                    field(),
                    format!(
                        "a message carries at most {MAX_MESSAGE_FILES} files of {MAX_MESSAGE_FILE_BYTES} bytes in all"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A route that carries out the [`Op`] `op` makes of the request on the agent
/// `{id}` (found first, so an unknown agent is a 404 whatever the body): 204 once
/// done.
async fn op_route(
    shared: Arc<Shared>,
    caller: &Caller,
    id: &str,
    headers: &HeaderMap,
    op: impl AsyncFnOnce() -> Result<Op, Problem>,
) -> Result<StatusCode, Problem> {
    shared.submit(caller, headers, id, op).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn steer(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, Problem> {
    let caller = shared.caller(&headers)?;
    let (reader, asker) = (&*shared, &caller);
    let read = async move || {
        Ok(Op::Steer {
            message: Text::read(reader, asker, body).await?,
        })
    };
    op_route(shared.clone(), &caller, &id, &headers, read).await
}

pub(crate) async fn follow_up(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, Problem> {
    let caller = shared.caller(&headers)?;
    let (reader, asker) = (&*shared, &caller);
    let read = async move || {
        Ok(Op::FollowUp {
            message: Text::read(reader, asker, body).await?,
        })
    };
    op_route(shared.clone(), &caller, &id, &headers, read).await
}

pub(crate) async fn abort(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let caller = shared.caller(&headers)?;
    op_route(shared, &caller, &id, &headers, async || Ok(Op::Abort)).await
}

pub(crate) async fn reset(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let caller = shared.caller(&headers)?;
    op_route(shared, &caller, &id, &headers, async || Ok(Op::Reset)).await
}

pub(crate) async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let caller = shared.caller(&headers)?;
    shared.reach(&caller, &id).await?;
    if !shared.stop(&id).await? {
        return Err(Problem::unknown_agent(&id));
    }
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn events(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    query: Result<Query<UpdatesQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    shared.reach(&caller, &id).await?;
    let last_seen = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|value| value.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    Problem::invalid(
                        Some("Last-Event-ID".to_owned()),
                        "Last-Event-ID must be the id of an event of this stream (a number)",
                    )
                })?,
        ),
    };
    let slot = shared.stream_slot(&caller)?;
    let counted = shared.clone();
    let Query(UpdatesQuery { updates }) = query.map_err(updates_rejected)?;
    let following = shared.events_of(&caller, &id, last_seen, updates).await?;
    let events = until_closing(following, &shared.closing).map(move |frame| {
        // Held while the stream is.
        let _ = &slot;
        counted.metrics.event_streamed();
        frame.sse().clone()
    });
    Ok(event_stream(events, shared.config.keep_alive))
}

/// `GET /events`: every event of every agent the caller may see, agents created
/// later joining; for dashboards. No `id:` and no resume: sequence numbers are
/// each agent's own (the envelope carries agent and number).
pub(crate) async fn all_events(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<UpdatesQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let caller = shared.caller(&headers)?;
    let Query(UpdatesQuery { updates }) = query.map_err(updates_rejected)?;
    let slot = shared.stream_slot(&caller)?;
    let counted = shared.clone();
    let following = shared.all_events_of(&caller, updates)?;
    let events = until_closing(following, &shared.closing).map(move |frame| {
        // Held while the stream is.
        let _ = &slot;
        counted.metrics.event_streamed();
        frame.sse_unnumbered()
    });
    Ok(event_stream(events, shared.config.keep_alive))
}

/// A `?updates=` that is not `lean` or `full`.
pub(crate) fn updates_rejected(rejection: QueryRejection) -> Problem {
    Problem::invalid(Some("updates".to_owned()), rejection.body_text())
}
