//! [`AgentContext`]: who an agent works for. The user, tenant, session and client
//! ids, whether the run is an evaluation, and the host's own typed data; tools see
//! it through [`ToolContext::agent`](crate::ToolContext::agent), hooks through
//! [`ToolCallInfo`](crate::ToolCallInfo) and [`TurnSummary`](crate::TurnSummary).
//!
//! ```
//! use tiller_core::AgentContext;
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
//! // A sub-agent inherits all of it.
//! assert_eq!(context.child_context().tenant_id(), Some("acme"));
//! ```

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

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
    /// `X-Session-Id`, `X-Client-Id` and `X-Evaluation` (`true` or `1`), names
    /// matched without regard to case, other headers ignored, empty values
    /// treated as absent. Only for headers from a trusted source (a gateway that
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
                "x-evaluation" => {
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

    /// The context a sub-agent runs in: the same user, tenant, session, client,
    /// evaluation flag and extensions.
    pub fn child_context(&self) -> Self {
        self.clone()
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
        self.ids() == other.ids()
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
            }
        );
        assert!(!AgentContext::from_headers([("x-evaluation", "yes")]).is_evaluation());
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
        let child = parent.child_context();
        assert_eq!(child, parent);
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
    fn ids_serialise_without_empty_fields() {
        let ids = AgentContext::new().with_tenant_id("acme").ids().clone();
        assert_eq!(
            serde_json::to_value(&ids).unwrap(),
            serde_json::json!({"tenant_id": "acme"})
        );
    }
}
