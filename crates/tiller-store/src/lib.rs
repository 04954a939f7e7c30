//! Tiller's session store: what an agent's session keeps beyond the process.
//!
//! A session is one agent's conversation: every finished message in order, the
//! steering and follow-up messages still queued, the agent's definition (model,
//! system prompt, tool names, options, as JSON), its status, when it was created
//! and last changed, and the tenant and user it belongs to. A [`SessionStore`]
//! keeps sessions; three are provided:
//!
//! - [`MemoryStore`]: in the process, gone with it (the library's default);
//! - [`SqlStore`] on **SQLite** (`sqlite://PATH`): one embedded file in WAL mode,
//!   the WAL copied into the file beside the writes and kept near 64 MiB;
//! - [`SqlStore`] on **PostgreSQL** (`postgres://…`): shared by several hosts.
//!
//! Changes reach a store as [`SessionWrite`]s through a [`StoreWriter`], which
//! groups the writes of many agents into one transaction (group commit) and
//! acknowledges each once it is committed. Loading is a plain call
//! ([`SessionStore::load`]). Messages are stored as the JSON of
//! [`tiller_core::AgentMessage`]; the schema is versioned and migrated on open.
//! A file a message carries is kept once per store by its content address
//! (see [`StoredFile`]): the message's row names it.
//!
//! ```
//! use tiller_store::{Change, MemoryStore, SessionRecord, SessionStore, SessionWrite, StoreWriter};
//! use tiller_core::AgentMessage;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tiller_store::StoreError> {
//! let store = MemoryStore::new();
//! let writer = StoreWriter::new(store.clone());
//! let session = SessionRecord::new("chat-1");
//! let hi = std::sync::Arc::new(AgentMessage::user("hi"));
//! writer
//!     .write(vec![
//!         SessionWrite::new("chat-1", Change::Create(session)),
//!         SessionWrite::new("chat-1", Change::Append { seq: 0, message: hi.clone(), dequeued: None }),
//!     ])
//!     .await?;
//! let loaded = store.load("chat-1").await?.expect("stored");
//! assert_eq!(loaded.messages, vec![hi]);
//! # Ok(())
//! # }
//! ```

mod error;
mod files;
mod memory;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
mod types;
mod user_memory;
mod writer;

pub use error::StoreError;
pub use files::{FILE_ID_PREFIX, MAX_UPLOADS, StoredFile, file_id, is_file_id};
pub use memory::MemoryStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sql::SqlStore;
pub use types::{
    Branch, Change, Definition, MAX_BRANCH_DEPTH, MAX_OP_KEYS, QueueKind, Queued, SessionFilter,
    SessionInfo, SessionRecord, SessionStatus, SessionWrite, SpendScope, StoredSession,
};
pub use user_memory::{
    Embedding, MAX_EMBEDDING_DIMENSIONS, MAX_EMBEDDING_MODEL_BYTES, MAX_MEMORIES, MAX_MEMORY_BYTES,
    MAX_MEMORY_PAGE, MAX_QUERY_TERMS, MAX_RECALLED, MAX_TERM_CHARS, MAX_WORKING_MEMORY_BYTES,
    Memory, MemoryOwner, check_memory, check_working_memory, search_terms,
};
pub use writer::{Ack, StoreHealth, StoreWriter};

use std::sync::Arc;

use futures::future::BoxFuture;
use tiller_ai::FileContent;

/// Keeps sessions. Implementations apply a batch of writes atomically and in
/// order; [`StoreWriter`] is how the runtime reaches them.
pub trait SessionStore: Send + Sync + 'static {
    /// Applies `batch` in order, all or nothing.
    fn apply<'a>(&'a self, batch: &'a [SessionWrite]) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Whether [`SessionStore::apply`] is done before it returns (a store in
    /// memory): its [`StoreWriter`] then applies each request where it is
    /// submitted, with no hand-off to its task. False by default.
    fn applies_at_once(&self) -> bool {
        false
    }

    /// The session `id` as stored, or `None` when there is none. Reading claims
    /// nothing: see [`SessionStore::claim`] for a session an agent will hold.
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<StoredSession>, StoreError>>;

    /// Takes session `id` over and loads it: its epoch becomes `epoch`, or rises by
    /// one when `None`, so that from now on the store refuses writes made under the
    /// claim before (one writer per session: an agent of another process that held
    /// it stops at its next write). The loaded record carries the new epoch, which
    /// the new holder's writes carry. [`StoreError::TakenOver`] when the session's
    /// epoch is past `epoch` already (a newer claim won). `None` when there is no
    /// such session.
    fn claim<'a>(
        &'a self,
        id: &'a str,
        epoch: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<StoredSession>, StoreError>>;

    /// The sessions matching `filter`, most recently changed first. A session
    /// whose row cannot be read is left out (and logged), not the whole list; a
    /// page may then hold fewer than its limit.
    fn list<'a>(
        &'a self,
        filter: &'a SessionFilter,
    ) -> BoxFuture<'a, Result<Vec<SessionInfo>, StoreError>>;

    /// How many sessions `filter` matches, its `limit` aside (a quota's count:
    /// no session is read). By default the length of [`SessionStore::list`].
    fn count<'a>(&'a self, filter: &'a SessionFilter) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let all = SessionFilter {
                limit: None,
                ..filter.clone()
            };
            Ok(self.list(&all).await?.len() as u64)
        })
    }

    /// At most `limit` stored messages of session `id`, in order, from its
    /// message `from` (a place in the transcript, from 0): a page of a long
    /// transcript without loading the rest. Empty past the end or for no session.
    fn messages<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Arc<tiller_core::AgentMessage>>, StoreError>>;

    /// Deletes session `id` and its sub-agents' sessions (`{id}/…`), with their
    /// messages and queues, at once; whether `id` existed.
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Deletes every closed session last changed before `before` (milliseconds
    /// since the Unix epoch), with its messages and queues, and the files that
    /// no stored message or upload names any more; how many sessions went.
    fn prune(&self, before: i64) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// What `scope` spent, as [`Change::Spend`] counted it: zero for a scope
    /// that spent nothing (and from a store that does not count).
    fn spent<'a>(
        &'a self,
        scope: &'a SpendScope,
    ) -> BoxFuture<'a, Result<tiller_core::Spent, StoreError>> {
        let _ = scope;
        Box::pin(futures::future::ready(Ok(tiller_core::Spent::default())))
    }

    /// The working-memory document of `owner`; `None` when there is none.
    /// [`StoreError::Unsupported`] by default (a store that keeps no memory).
    fn working_memory<'a>(
        &'a self,
        owner: &'a MemoryOwner,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        let _ = owner;
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "user memory".to_owned(),
        ))))
    }

    /// Replaces the working-memory document of `owner` with `text` (at most
    /// [`MAX_WORKING_MEMORY_BYTES`]); an empty `text` removes it.
    fn set_working_memory<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (owner, text);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "user memory".to_owned(),
        ))))
    }

    /// Keeps the fact `text` for `owner` (see [`check_memory`]), with its
    /// `embedding` if it has one, durably before it returns; at most
    /// [`MAX_MEMORIES`] a user.
    fn remember<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        text: &'a str,
        embedding: Option<&'a Embedding>,
    ) -> BoxFuture<'a, Result<Memory, StoreError>> {
        let _ = (owner, text, embedding);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "user memory".to_owned(),
        ))))
    }

    /// At most `limit` (up to [`MAX_RECALLED`]) facts of `owner` that share words
    /// with `query` ([`search_terms`]; full-text search in SQL, with stemming),
    /// best match first.
    fn recall<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        query: &'a str,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        let _ = (owner, query, limit);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "user memory".to_owned(),
        ))))
    }

    /// At most `limit` (up to [`MAX_RECALLED`]) facts of `owner` kept with an
    /// embedding of `query`'s model, most like `query` first (cosine
    /// similarity).
    fn recall_similar<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        query: &'a Embedding,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        let _ = (owner, query, limit);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "embeddings".to_owned(),
        ))))
    }

    /// A page of `owner`'s facts, oldest first: at most `limit` (up to
    /// [`MAX_MEMORY_PAGE`]) after the first `offset`.
    fn memories<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        let _ = (owner, offset, limit);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "user memory".to_owned(),
        ))))
    }

    /// Forgets `owner`'s fact `id`, or, with `None`, every fact and the working
    /// memory; how many facts went.
    fn forget<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let _ = (owner, id);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "user memory".to_owned(),
        ))))
    }

    /// Claims `slot` (milliseconds since the Unix epoch) of the schedule named
    /// `schedule` for the caller: `true` for the one claim that wins, whichever
    /// process of those sharing the store makes it; `false` for every other,
    /// and for a slot no later than one claimed before. The store keeps the
    /// latest claimed slot of each schedule only.
    fn claim_slot<'a>(
        &'a self,
        schedule: &'a str,
        slot: i64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (schedule, slot);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "schedules' slots".to_owned(),
        ))))
    }

    /// Keeps `file` for `tenant` on its own, durably before it returns, by its
    /// content address ([`file_id`]): storing the same bytes again keeps them
    /// once and gives the same id (the name and media type are the last given).
    /// A tenant stores at most [`MAX_UPLOADS`] files.
    /// The file is then named by its id in a prompt ([`SessionStore::file`]).
    fn put_file<'a>(
        &'a self,
        tenant: &'a str,
        file: &'a FileContent,
    ) -> BoxFuture<'a, Result<StoredFile, StoreError>> {
        let _ = (tenant, file);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "files".to_owned(),
        ))))
    }

    /// The file `id` that `tenant` stored with [`SessionStore::put_file`], whole;
    /// `None` when `tenant` stored none of that id (another tenant's is none).
    fn file<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<FileContent>, StoreError>> {
        let _ = (tenant, id);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "files".to_owned(),
        ))))
    }

    /// Forgets `tenant`'s stored file `id`; whether there was one. Transcripts
    /// that carry the same bytes keep them.
    fn delete_file<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (tenant, id);
        Box::pin(futures::future::ready(Err(StoreError::Unsupported(
            "files".to_owned(),
        ))))
    }

    /// This store as the [`TenantLedger`](tiller_core::TenantLedger) of
    /// tenants' budgets, when every process that shares it should hold and
    /// count through it (PostgreSQL: the hosts of a cluster): a tenant's budget
    /// is then one figure for all of them. `None` (in memory, SQLite): each
    /// process's tallies stay in its memory.
    fn ledger(self: Arc<Self>) -> Option<Arc<dyn tiller_core::TenantLedger>> {
        None
    }
}

/// The time `age` ago, in milliseconds since the Unix epoch (saturating): the
/// `before` of [`SessionStore::prune`] for sessions closed longer than `age`.
pub fn ago(age: std::time::Duration) -> i64 {
    let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    types::now().saturating_sub(age)
}

/// Whether `session` is `id` or a sub-agent's session under it (`{id}/…`).
pub fn is_within(session: &str, id: &str) -> bool {
    session
        .strip_prefix(id)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Opens the store a URL names: `memory:`, `sqlite://PATH` (created when missing)
/// or `postgres://USER@HOST:PORT/DB`.
pub async fn open(url: &str) -> Result<Arc<dyn SessionStore>, StoreError> {
    if url == "memory:" || url == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    {
        Ok(Arc::new(SqlStore::open(url).await?))
    }
    #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
    {
        Err(StoreError::UnsupportedUrl {
            url: redact_url(url),
            reason: "this build has no SQL store (features `sqlite`, `postgres`)".to_owned(),
        })
    }
}

/// `url` without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn a_password_never_reaches_a_message() {
        assert_eq!(
            redact_url("postgres://tiller:s3cret@127.0.0.1:5432/db"),
            "postgres://tiller@127.0.0.1:5432/db"
        );
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
    }
}
