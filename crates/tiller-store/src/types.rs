//! What a store keeps and the changes it is sent.

use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use tiller_core::{AgentMessage, Spent};

/// A session's lifecycle as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// An agent holds it (or held it when its process ended): `resume` brings it back.
    Active,
    /// Its agent was stopped on purpose; it can still be resumed by id.
    Closed,
}

impl SessionStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Closed => "closed",
        }
    }

    /// The status a stored spelling names.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(SessionStatus::Active),
            "closed" => Some(SessionStatus::Closed),
            _ => None,
        }
    }
}

/// Which queue a queued message waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueKind {
    /// Steering: for the model as soon as possible.
    Steering,
    /// Follow-up: for when the agent would otherwise stop.
    FollowUp,
}

impl QueueKind {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueKind::Steering => "steering",
            QueueKind::FollowUp => "follow_up",
        }
    }

    /// The queue a stored spelling names.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "steering" => Some(QueueKind::Steering),
            "follow_up" => Some(QueueKind::FollowUp),
            _ => None,
        }
    }
}

/// A session's own row: who it belongs to, what agent it is, when it changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session's id.
    pub id: String,
    /// The tenant it belongs to.
    pub tenant_id: Option<String>,
    /// The user it belongs to.
    pub user_id: Option<String>,
    /// The agent's name, if it has one.
    pub name: Option<String>,
    /// The agent's definition (model, system prompt, tool names, options).
    pub definition: Definition,
    /// Active or closed.
    pub status: SessionStatus,
    /// Created, in milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Last changed, in milliseconds since the Unix epoch.
    pub updated_at: i64,
    /// Which claim on the session is current: [`SessionStore::claim`] raises it
    /// when an agent takes the session over, and a write carrying an older one is
    /// refused ([`StoreError::TakenOver`](crate::StoreError::TakenOver)). A new
    /// session starts at the epoch its creating write carries.
    ///
    /// [`SessionStore::claim`]: crate::SessionStore::claim
    pub epoch: u64,
    /// What the host that created the session keeps to bring its agent up again
    /// in another process (`tiller serve`: the definition's name and version, or
    /// the agent file sent inline, and who asked), as JSON the store does not
    /// read; `null` when it keeps nothing.
    pub origin: Definition,
    /// Who the agent works for and the state its tools keep (its
    /// `AgentContext`, stored), as JSON the store does not read; `null` when
    /// none was stored.
    pub context: Definition,
    /// The context its line of sessions began with, before any tool changed
    /// it (a branch's is its parent's): with the states the tool results of
    /// the transcript set, in order, the context as it stood at any message.
    /// `null` when none was stored (sessions stored before it was).
    #[serde(skip)]
    pub first_context: Definition,
    /// The session this one was forked from, and where (see [`Change::Fork`]);
    /// `None` for one that was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<Branch>,
}

/// Where a branch was forked: its parent session and how many of the
/// parent's messages it began with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch {
    /// The session it was forked from (which may have been deleted since).
    pub parent: String,
    /// How many of the parent's messages it began with: the branch's own
    /// messages are numbered from here.
    pub at: u64,
}

impl SessionRecord {
    /// An active session `id` created now, with an empty definition.
    pub fn new(id: impl Into<String>) -> Self {
        let now = now();
        SessionRecord {
            id: id.into(),
            tenant_id: None,
            user_id: None,
            name: None,
            definition: Definition::default(),
            status: SessionStatus::Active,
            created_at: now,
            updated_at: now,
            epoch: 0,
            origin: Definition::default(),
            context: Definition::default(),
            first_context: Definition::default(),
            branch: None,
        }
    }
}

/// An agent's definition as stored: its JSON text, shared, so the sessions made
/// from one set of settings encode it once and keep it once. It serializes as
/// the JSON it holds (an object, not a string).
#[derive(Clone, PartialEq, Eq)]
pub struct Definition(Arc<str>);

impl Definition {
    /// The definition `value` encodes.
    pub fn new(value: &impl Serialize) -> Result<Self, serde_json::Error> {
        Ok(Definition(serde_json::to_string(value)?.into()))
    }

    /// Text a store kept, checked to be JSON (it is not decoded).
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn stored(text: String) -> Result<Self, serde_json::Error> {
        serde_json::from_str::<serde::de::IgnoredAny>(&text)?;
        Ok(Definition(text.into()))
    }

    /// Its JSON text.
    pub fn as_json(&self) -> &str {
        &self.0
    }

    /// Decodes it.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
}

impl Default for Definition {
    /// `null`: no definition (one text, shared by every session without one).
    fn default() -> Self {
        static NULL: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| "null".into());
        Definition(NULL.clone())
    }
}

impl From<Value> for Definition {
    fn from(value: Value) -> Self {
        Definition(value.to_string().into())
    }
}

impl fmt::Debug for Definition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Definition {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let value: Value = self.decode().map_err(serde::ser::Error::custom)?;
        value.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Definition {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Definition::new(&Value::deserialize(deserializer)?).map_err(D::Error::custom)
    }
}

/// A queued message with its place among the session's queued messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Queued {
    /// Its number, rising in the order messages were queued.
    pub seq: u64,
    /// The message.
    pub message: AgentMessage,
}

/// A session as loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSession {
    /// Its row.
    pub record: SessionRecord,
    /// Every finished message, in order (shared, not copied, with a memory store).
    pub messages: Vec<Arc<AgentMessage>>,
    /// The queued steering messages, oldest first.
    pub steering: Vec<Queued>,
    /// The queued follow-up messages, oldest first.
    pub follow_up: Vec<Queued>,
    /// The idempotency keys of the ops last applied to the session (see
    /// [`Change::OpKey`]), at most [`MAX_OP_KEYS`], oldest first.
    pub op_keys: Vec<Arc<str>>,
}

/// The most sessions an SQL store reads a branch's transcript through: a
/// branch of a branch, and so on, this many deep (a branch forked within what
/// its parent itself shares counts as its parent's sibling).
pub const MAX_BRANCH_DEPTH: usize = 64;

/// The most idempotency keys a session remembers: a store keeps (and loads) the
/// newest this many, and forgets older ones when the session is claimed. An op
/// retried after this many others were applied to its session is applied again.
pub const MAX_OP_KEYS: usize = 1_024;

/// A session as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionInfo {
    /// Its row.
    #[serde(flatten)]
    pub record: SessionRecord,
    /// How many messages its transcript holds.
    pub messages: u64,
}

/// Which sessions to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// Only the session with this id.
    pub id: Option<String>,
    /// Only this tenant's.
    pub tenant_id: Option<String>,
    /// Only this user's.
    pub user_id: Option<String>,
    /// Only sessions with this status.
    pub status: Option<SessionStatus>,
    /// Only the branches forked from this session.
    pub parent: Option<String>,
    /// Only sessions whose id sorts after this one, listed in id order (a
    /// cursor: the last id of the page before; empty for the first page).
    /// Without it, the most recently changed come first.
    pub after: Option<String>,
    /// At most this many.
    pub limit: Option<u32>,
}

impl SessionFilter {
    /// The session `id` alone, whoever owns it.
    pub fn only(id: impl Into<String>) -> Self {
        SessionFilter {
            id: Some(id.into()),
            limit: Some(1),
            ..SessionFilter::default()
        }
    }
}

/// One change to one session, made under the writer's claim on it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionWrite {
    /// The session.
    pub session: Arc<str>,
    /// The epoch of the writer's claim on the session (see
    /// [`SessionRecord::epoch`]): a store refuses the write when the session's
    /// epoch is another. [`Change::Create`] gives a new session this epoch.
    pub epoch: u64,
    /// The change.
    pub change: Change,
}

impl SessionWrite {
    /// `change` to `session`, under epoch 0 (a session never claimed).
    pub fn new(session: impl Into<Arc<str>>, change: Change) -> Self {
        SessionWrite {
            session: session.into(),
            epoch: 0,
            change,
        }
    }

    /// The same write under the claim of epoch `epoch`.
    pub fn at_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }
}

/// A change to a session. Every change also sets the session's `updated_at`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Change {
    /// Creates the session at the write's epoch (the record's own `epoch` is not
    /// read); fails if it exists.
    Create(SessionRecord),
    /// Creates the session, as [`Change::Create`] does, as a branch of
    /// `parent` whose transcript begins with the parent's first `at` messages:
    /// shared with the parent, not copied (what the parent later truncates, and
    /// the parent's deletion, leave them to the branch). The record's `branch`
    /// is set from `parent` and `at`. Fails when the parent does not exist, or
    /// holds fewer than `at` messages ([`StoreError::ForkPastEnd`]); an SQL
    /// store, whose branches read their prefix through the sessions they were
    /// forked from, refuses a branch more than [`MAX_BRANCH_DEPTH`] deep
    /// ([`StoreError::BranchTooDeep`]).
    ///
    /// [`StoreError::ForkPastEnd`]: crate::StoreError::ForkPastEnd
    /// [`StoreError::BranchTooDeep`]: crate::StoreError::BranchTooDeep
    Fork {
        /// The session forked.
        parent: Arc<str>,
        /// How many of its messages the branch begins with.
        at: u64,
        /// The branch's row.
        record: SessionRecord,
    },
    /// Adds a finished message at the transcript's end, and removes the queued
    /// message it was delivered from, if any. A store may keep the messages one
    /// batch appends to a session together, as one run.
    Append {
        /// The message's place in the transcript, from 0: the number of messages
        /// it holds (after a [`Change::Truncate`], the place cut from).
        seq: u64,
        /// The message, shared with the agent that holds it.
        message: Arc<AgentMessage>,
        /// The queued message (by its queue number) this one was delivered from.
        dequeued: Option<u64>,
    },
    /// Queues a message.
    Enqueue {
        /// Which queue.
        queue: QueueKind,
        /// Its queue number.
        seq: u64,
        /// The message.
        message: AgentMessage,
    },
    /// Empties one queue.
    ClearQueue(QueueKind),
    /// Removes one queued message, by its queue number, without delivering it
    /// (an input guardrail refused it).
    Dequeue(u64),
    /// Replaces the transcript from `from` on with nothing (`0` empties it).
    Truncate {
        /// The first message to drop.
        from: u64,
    },
    /// Replaces the definition.
    SetDefinition(Definition),
    /// Sets the status.
    SetStatus(SessionStatus),
    /// Replaces the stored context ([`SessionRecord::context`]).
    SetContext(Definition),
    /// Adds to what the session, and its tenant when it has one, spent (see
    /// [`SessionStore::spent`](crate::SessionStore::spent)). Spending is kept apart
    /// from the session: deleting or truncating it takes nothing off.
    Spend {
        /// What was spent.
        spent: Spent,
        /// The session's tenant, whose spending it adds to as well.
        tenant: Option<Arc<str>>,
    },
    /// Records that the op carrying this idempotency key is applied, in the same
    /// transaction as what it changed: a retry of the op finds the key when the
    /// session is loaded (see [`StoredSession::op_keys`]) and is not applied twice.
    OpKey(Arc<str>),
}

/// Whose spending [`SessionStore::spent`](crate::SessionStore::spent) reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SpendScope {
    /// A session's, over all its runs.
    Session(String),
    /// A tenant's, over all its sessions.
    Tenant(String),
}

impl SpendScope {
    /// The scopes what `session` (of `tenant`) spends counts in: its own, and
    /// its tenant's when it has one.
    pub(crate) fn of(session: &str, tenant: Option<&str>) -> impl Iterator<Item = SpendScope> {
        std::iter::once(SpendScope::Session(session.to_owned()))
            .chain(tenant.map(|tenant| SpendScope::Tenant(tenant.to_owned())))
    }

    /// The scope's key in the store: `session:{id}` or `tenant:{id}`.
    pub fn key(&self) -> String {
        match self {
            SpendScope::Session(id) => format!("session:{id}"),
            SpendScope::Tenant(id) => format!("tenant:{id}"),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now() -> i64 {
    i64::try_from(tiller_ai::now_ms()).unwrap_or(i64::MAX)
}
