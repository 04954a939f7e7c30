//! [`AgentContext`]: who an agent works for. The user, tenant, session and client
//! ids, whether the run is an evaluation, and the host's own typed data; tools see
//! it through [`ToolContext::agent`](crate::ToolContext::agent), hooks through
//! [`ToolCallInfo`](crate::ToolCallInfo) and [`TurnSummary`](crate::TurnSummary).
//!
//! ```
//! use tiller_core::{AgentContext, ContextOverrides};
//!
//! #[derive(Debug, PartialEq)]
//! struct Plan(&'static str);
//!
//! let context = AgentContext::new()
//!     .with_user_id("u-7")
//!     .with_tenant_id("acme")
//!     .with_extension(Plan("pro"));
//! assert_eq!(context.user_id(), Some("u-7"));
//! assert_eq!(context.extension::<Plan>(), Some(&Plan("pro")));
//! // A sub-agent inherits all of it, a model or schema of its own if given.
//! let child = context.child_context(ContextOverrides::default().with_default_model("gpt-4o-mini"));
//! assert_eq!((child.tenant_id(), child.default_model()), (Some("acme"), Some("gpt-4o-mini")));
//! ```
//!
//! While an agent runs, its context is also [`AgentContext::current`], for code
//! that was not handed it (a helper a tool calls, a logging layer).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The tenant of a caller whose credentials name none.
pub const DEFAULT_TENANT: &str = "default";

/// The user of a context that names none, for code that needs one
/// ([`AgentContext::user_id_or_default`]).
pub const DEFAULT_USER: &str = "anonymous";

tokio::task_local! {
    /// The context of the agent whose work the task is doing.
    static CURRENT: AgentContext;
}

/// Who an agent works for, and the host's own data. Cheap to clone (one shared
/// allocation, none for an empty context); changed copy-on-write.
#[derive(Clone, Default)]
pub struct AgentContext {
    data: Option<Arc<ContextData>>,
}

type Extensions = HashMap<TypeId, Arc<dyn Any + Send + Sync>>;

#[derive(Clone, Default)]
struct ContextData {
    ids: ContextIds,
    extensions: Extensions,
    /// The serialisable state, by its type's [`ContextState::NAME`].
    states: Map<String, Value>,
}

/// A typed piece of an agent's state that is stored with its session (so it
/// comes back on resume, thaw and restart) and that tools can change
/// ([`ToolContext::set_state`](crate::ToolContext::set_state)): registered by
/// its type name, `NAME`.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use tiller_core::{AgentContext, ContextState};
///
/// #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
/// struct IssuesDiscussed(u32);
/// impl ContextState for IssuesDiscussed {
///     const NAME: &'static str = "issues_discussed";
/// }
///
/// let context = AgentContext::new().with_state(&IssuesDiscussed(2));
/// assert_eq!(context.state::<IssuesDiscussed>(), Some(IssuesDiscussed(2)));
/// ```
pub trait ContextState: Serialize + DeserializeOwned {
    /// The name it is stored under.
    const NAME: &'static str;
}

/// An [`AgentContext`] as a session stores it: the ids and the serialisable
/// state (not the host's typed extensions, which live in one process).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoredContext {
    /// Who the agent works for.
    #[serde(default)]
    pub ids: ContextIds,
    /// Its state, by name.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub states: Map<String, Value>,
}

/// The serialisable part of an [`AgentContext`]: everything but the extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextIds {
    /// The user the agent acts for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The tenant (organisation, account) the user belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// The conversation (the agent's session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The application or device the request came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Whether this is an evaluation run rather than real use.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evaluation: bool,
    /// The model the caller asked for, by name (`X-Model-Name`), for a host that
    /// picks models per caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// Where the schema of the agent the caller asked for lives (`X-Agent-Schema`):
    /// a name or a URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_schema_uri: Option<String>,
    /// An id a client gives for a caller who is not signed in (`X-Anonymous-Id`),
    /// to keep that visitor's conversations together. Never a user id: an
    /// anonymous caller's `user_id` stays `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anonymous_id: Option<String>,
    /// The agents the run works through, from the first one asked to the one
    /// running (by name, else id), such as `["planner", "researcher"]`: a run's
    /// own agent ends it, and an agent asking another extends it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
}

impl AgentContext {
    /// An empty context: no ids, not an evaluation, no extensions.
    pub fn new() -> Self {
        AgentContext::default()
    }

    /// A context with these ids and no extensions.
    pub fn from_ids(ids: ContextIds) -> Self {
        AgentContext::new().with_ids(ids)
    }

    fn data_mut(&mut self) -> &mut ContextData {
        Arc::make_mut(self.data.get_or_insert_with(Arc::default))
    }

    /// A context from request headers: `X-User-Id`, `X-Tenant-Id`,
    /// `X-Session-Id`, `X-Client-Id`, `X-Evaluation` or `X-Is-Eval` (`true` or
    /// `1`), `X-Model-Name` (the default model), `X-Agent-Schema` (the agent
    /// schema's URI) and `X-Anonymous-Id` (a caller not signed in), names matched without regard to case, other headers
    /// ignored, empty values treated as absent. Only for headers from a trusted source (a gateway that
    /// authenticated the caller): anyone can send them.
    pub fn from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut ids = ContextIds::default();
        for (name, value) in headers {
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            let slot = match name.to_ascii_lowercase().as_str() {
                "x-user-id" => &mut ids.user_id,
                "x-tenant-id" => &mut ids.tenant_id,
                "x-session-id" => &mut ids.session_id,
                "x-client-id" => &mut ids.client_id,
                "x-model-name" => &mut ids.default_model,
                "x-agent-schema" => &mut ids.agent_schema_uri,
                "x-anonymous-id" => &mut ids.anonymous_id,
                "x-evaluation" | "x-is-eval" => {
                    ids.evaluation = value.eq_ignore_ascii_case("true") || value == "1";
                    continue;
                }
                _ => continue,
            };
            *slot = Some(value.to_owned());
        }
        AgentContext::from_ids(ids)
    }

    /// The same context with these ids (extensions kept).
    pub fn with_ids(mut self, ids: ContextIds) -> Self {
        self.data_mut().ids = ids;
        self
    }

    /// The ids, for serialising or showing.
    pub fn ids(&self) -> &ContextIds {
        static NONE: ContextIds = ContextIds {
            user_id: None,
            tenant_id: None,
            session_id: None,
            client_id: None,
            evaluation: false,
            agents: Vec::new(),
            default_model: None,
            agent_schema_uri: None,
            anonymous_id: None,
        };
        self.data.as_ref().map_or(&NONE, |data| &data.ids)
    }

    /// The user the agent acts for.
    pub fn user_id(&self) -> Option<&str> {
        self.ids().user_id.as_deref()
    }

    /// The tenant the user belongs to.
    pub fn tenant_id(&self) -> Option<&str> {
        self.ids().tenant_id.as_deref()
    }

    /// The tenant, [`DEFAULT_TENANT`] when the context names none.
    pub fn tenant_id_or_default(&self) -> &str {
        self.tenant_id().unwrap_or(DEFAULT_TENANT)
    }

    /// The user, [`DEFAULT_USER`] when the context names none.
    pub fn user_id_or_default(&self) -> &str {
        self.user_id().unwrap_or(DEFAULT_USER)
    }

    /// The model the caller asked for, by name.
    pub fn default_model(&self) -> Option<&str> {
        self.ids().default_model.as_deref()
    }

    /// Where the schema of the agent the caller asked for lives.
    pub fn agent_schema_uri(&self) -> Option<&str> {
        self.ids().agent_schema_uri.as_deref()
    }

    /// The id a client gave for a caller who is not signed in.
    pub fn anonymous_id(&self) -> Option<&str> {
        self.ids().anonymous_id.as_deref()
    }

    /// The conversation (the agent's session).
    pub fn session_id(&self) -> Option<&str> {
        self.ids().session_id.as_deref()
    }

    /// The application or device the request came from.
    pub fn client_id(&self) -> Option<&str> {
        self.ids().client_id.as_deref()
    }

    /// Whether this is an evaluation run.
    pub fn is_evaluation(&self) -> bool {
        self.ids().evaluation
    }

    /// The same context for this user.
    pub fn with_user_id(mut self, id: impl Into<String>) -> Self {
        self.data_mut().ids.user_id = Some(id.into());
        self
    }

    /// The same context for this tenant.
    pub fn with_tenant_id(mut self, id: impl Into<String>) -> Self {
        self.data_mut().ids.tenant_id = Some(id.into());
        self
    }

    /// The same context in this session.
    pub fn with_session_id(mut self, id: impl Into<String>) -> Self {
        self.data_mut().ids.session_id = Some(id.into());
        self
    }

    /// The same context from this client.
    pub fn with_client_id(mut self, id: impl Into<String>) -> Self {
        self.data_mut().ids.client_id = Some(id.into());
        self
    }

    /// The agents the run works through (see [`ContextIds::agents`]).
    pub fn agents(&self) -> &[String] {
        &self.ids().agents
    }

    /// The same context working through one more agent, `name`.
    pub fn through(mut self, name: impl Into<String>) -> Self {
        self.data_mut().ids.agents.push(name.into());
        self
    }

    /// The same context, marked as an evaluation run (or not).
    pub fn with_evaluation(mut self, evaluation: bool) -> Self {
        self.data_mut().ids.evaluation = evaluation;
        self
    }

    /// The same context carrying `value`, replacing a value of the same type.
    pub fn with_extension<T: Any + Send + Sync>(mut self, value: T) -> Self {
        self.data_mut()
            .extensions
            .insert(TypeId::of::<T>(), Arc::new(value));
        self
    }

    /// The host's value of type `T`, when the context carries one.
    pub fn extension<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.data
            .as_ref()?
            .extensions
            .get(&TypeId::of::<T>())
            .and_then(|value| value.downcast_ref())
    }

    /// The same context with this default model.
    pub fn with_default_model(mut self, model: impl Into<String>) -> Self {
        self.data_mut().ids.default_model = Some(model.into());
        self
    }

    /// The same context with this agent schema URI.
    pub fn with_agent_schema_uri(mut self, uri: impl Into<String>) -> Self {
        self.data_mut().ids.agent_schema_uri = Some(uri.into());
        self
    }

    /// The context a sub-agent runs in: the same user, tenant, session, client,
    /// evaluation flag and extensions, with the model and schema `overrides`
    /// gives in place of these.
    pub fn child_context(&self, overrides: ContextOverrides) -> Self {
        let mut child = self.clone();
        if let Some(model) = overrides.default_model {
            child = child.with_default_model(model);
        }
        if let Some(uri) = overrides.agent_schema_uri {
            child = child.with_agent_schema_uri(uri);
        }
        child
    }

    /// The state of type `T`, if the context holds it.
    pub fn state<T: ContextState>(&self) -> Option<T> {
        let value = self.data.as_ref()?.states.get(T::NAME)?;
        serde_json::from_value(value.clone()).ok()
    }

    /// The same context holding `value` as its state of type `T`.
    pub fn with_state<T: ContextState>(mut self, value: &T) -> Self {
        if let Ok(value) = serde_json::to_value(value) {
            self.data_mut().states.insert(T::NAME.to_owned(), value);
        }
        self
    }

    /// The same context with these states (by name) set over its own.
    pub fn with_states(mut self, states: &Map<String, Value>) -> Self {
        if !states.is_empty() {
            let own = &mut self.data_mut().states;
            for (name, value) in states {
                own.insert(name.clone(), value.clone());
            }
        }
        self
    }

    /// The context as a session stores it: ids and states.
    pub fn to_stored(&self) -> StoredContext {
        StoredContext {
            ids: self.ids().clone(),
            states: self
                .data
                .as_ref()
                .map(|data| data.states.clone())
                .unwrap_or_default(),
        }
    }

    /// The same context over what `stored` kept: each id this context lacks taken
    /// from it (the evaluation flag too), and its states over this context's (a
    /// session's stored state is the newer: its tools set it).
    pub fn over_stored(self, stored: &StoredContext) -> Self {
        let mut ids = stored.ids.clone();
        let own = self.ids().clone();
        let pick = |mine: Option<String>, kept: &mut Option<String>| {
            if mine.is_some() {
                *kept = mine;
            }
        };
        pick(own.user_id, &mut ids.user_id);
        pick(own.tenant_id, &mut ids.tenant_id);
        pick(own.session_id, &mut ids.session_id);
        pick(own.client_id, &mut ids.client_id);
        pick(own.default_model, &mut ids.default_model);
        pick(own.agent_schema_uri, &mut ids.agent_schema_uri);
        pick(own.anonymous_id, &mut ids.anonymous_id);
        ids.evaluation |= own.evaluation;
        if !own.agents.is_empty() {
            ids.agents = own.agents;
        }
        self.with_ids(ids).with_states(&stored.states)
    }

    /// The context of the agent whose work the current task is doing (a run, a
    /// tool call, a hook), for code that was not handed one; `None` outside
    /// an agent's work.
    pub fn current() -> Option<AgentContext> {
        CURRENT.try_with(AgentContext::clone).ok()
    }

    /// Runs `work` with this context as [`AgentContext::current`].
    pub async fn scope<F: Future>(self, work: F) -> F::Output {
        CURRENT.scope(self, work).await
    }
}

/// What a sub-agent's context changes of its caller's
/// ([`AgentContext::child_context`]); nothing by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContextOverrides {
    /// The model the sub-agent is asked for.
    pub default_model: Option<String>,
    /// The sub-agent's schema URI.
    pub agent_schema_uri: Option<String>,
}

impl ContextOverrides {
    /// These overrides with the default model `model`.
    pub fn with_default_model(mut self, model: impl Into<String>) -> Self {
        self.default_model = Some(model.into());
        self
    }

    /// These overrides with the agent schema URI `uri`.
    pub fn with_agent_schema_uri(mut self, uri: impl Into<String>) -> Self {
        self.agent_schema_uri = Some(uri.into());
        self
    }
}

impl fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentContext")
            .field("ids", self.ids())
            .field(
                "extensions",
                &self.data.as_ref().map_or(0, |data| data.extensions.len()),
            )
            .finish()
    }
}

impl PartialEq for AgentContext {
    /// Equal ids, and the very same extension values.
    fn eq(&self, other: &Self) -> bool {
        fn extensions(context: &AgentContext) -> Option<&Extensions> {
            context
                .data
                .as_ref()
                .map(|data| &data.extensions)
                .filter(|extensions| !extensions.is_empty())
        }
        let states = |context: &AgentContext| {
            context
                .data
                .as_ref()
                .map(|data| data.states.clone())
                .unwrap_or_default()
        };
        self.ids() == other.ids()
            && states(self) == states(other)
            && match (extensions(self), extensions(other)) {
                (None, None) => true,
                (Some(mine), Some(theirs)) => {
                    mine.len() == theirs.len()
                        && mine.iter().all(|(key, value)| {
                            theirs
                                .get(key)
                                .is_some_and(|other| Arc::ptr_eq(value, other))
                        })
                }
                _ => false,
            }
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn headers_fill_the_ids_without_regard_to_case() {
        let context = AgentContext::from_headers([
            ("X-User-Id", "u-1"),
            ("x-tenant-id", " acme "),
            ("X-SESSION-ID", ""),
            ("X-Client-Id", "web"),
            ("X-Evaluation", "TRUE"),
            ("X-Model-Name", "gpt-4o-mini"),
            ("x-agent-schema", "agents/helper.yaml"),
            ("X-Anonymous-Id", "visitor-9"),
            ("Authorization", "Bearer secret"),
        ]);
        assert_eq!(
            context.ids(),
            &ContextIds {
                user_id: Some("u-1".into()),
                tenant_id: Some("acme".into()),
                session_id: None,
                client_id: Some("web".into()),
                evaluation: true,
                agents: Vec::new(),
                default_model: Some("gpt-4o-mini".into()),
                agent_schema_uri: Some("agents/helper.yaml".into()),
                anonymous_id: Some("visitor-9".into()),
            }
        );
        assert!(!AgentContext::from_headers([("x-evaluation", "yes")]).is_evaluation());
        // The seed's name for the flag.
        assert!(AgentContext::from_headers([("X-Is-Eval", "1")]).is_evaluation());
    }

    #[test]
    fn extensions_are_typed_and_inherited() {
        #[derive(Debug, PartialEq)]
        struct Quota(u32);
        let parent = AgentContext::new()
            .with_user_id("u-1")
            .with_evaluation(true)
            .with_extension(Quota(3))
            .with_extension(Quota(5));
        assert_eq!(parent.extension::<Quota>(), Some(&Quota(5)));
        assert_eq!(parent.extension::<String>(), None);
        let child = parent.child_context(ContextOverrides::default());
        assert_eq!(child, parent);
        let overridden = parent.child_context(
            ContextOverrides::default()
                .with_default_model("small")
                .with_agent_schema_uri("agents/child.yaml"),
        );
        assert_eq!(
            (
                overridden.default_model(),
                overridden.agent_schema_uri(),
                overridden.user_id()
            ),
            (Some("small"), Some("agents/child.yaml"), Some("u-1"))
        );
        assert_eq!(overridden.extension::<Quota>(), Some(&Quota(5)));
        assert_eq!(child.extension::<Quota>(), Some(&Quota(5)));
        // A child's own additions leave the parent's untouched.
        let child = child.with_extension(String::from("child only"));
        assert_eq!(parent.extension::<String>(), None);
        assert_eq!(
            child.extension::<String>().map(String::as_str),
            Some("child only")
        );
    }

    #[test]
    fn a_context_without_tenant_or_user_has_defaults() {
        let empty = AgentContext::new();
        assert_eq!(
            (empty.tenant_id_or_default(), empty.user_id_or_default()),
            ("default", "anonymous")
        );
        let named = empty.with_tenant_id("acme").with_user_id("u-1");
        assert_eq!(
            (named.tenant_id_or_default(), named.user_id_or_default()),
            ("acme", "u-1")
        );
    }

    /// Inside `scope`, code that was not handed the context reads it.
    #[tokio::test]
    async fn the_current_context_is_reachable_inside_its_scope() {
        fn tenant_here() -> Option<String> {
            AgentContext::current().and_then(|context| context.tenant_id().map(str::to_owned))
        }
        assert_eq!(tenant_here(), None);
        let inside = AgentContext::new()
            .with_tenant_id("acme")
            .scope(async { tenant_here() })
            .await;
        assert_eq!(inside.as_deref(), Some("acme"));
        assert_eq!(tenant_here(), None);
    }

    #[test]
    fn ids_serialise_without_empty_fields() {
        let ids = AgentContext::new().with_tenant_id("acme").ids().clone();
        assert_eq!(
            serde_json::to_value(&ids).unwrap(),
            serde_json::json!({"tenant_id": "acme"})
        );
    }
}
