//! What can go wrong in a store.

/// Why a store could not read or write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StoreError {
    /// The URL names no store this build can open.
    #[error("unsupported store `{url}`: {reason}")]
    UnsupportedUrl {
        /// The URL, without its password.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The file an `sqlite://` URL names is not an SQLite database.
    #[error("{url} is not an SQLite database (is the path right?)")]
    NotADatabase {
        /// The URL.
        url: String,
    },
    /// The database belongs to another program: Tiller neither migrates it nor
    /// changes its settings.
    #[error("{url} is another program's database ({detail}); give Tiller a file of its own")]
    ForeignDatabase {
        /// The URL.
        url: String,
        /// What it holds instead.
        detail: String,
    },
    /// The database refused or failed.
    #[error("the session store failed: {0}")]
    Database(String),
    /// The database cannot be reached or cannot write just now (a full disk, an
    /// I/O error, a lost connection, a server restarting): the same write may
    /// succeed later, and [`StoreWriter`](crate::StoreWriter) tries it again.
    #[error("the session store is unavailable: {0}")]
    Unavailable(String),
    /// The session to create exists already.
    #[error("session `{0}` exists already")]
    SessionExists(String),
    /// The session changed does not exist.
    #[error("session `{0}` does not exist")]
    NoSuchSession(String),
    /// A fork asked for more messages than its parent holds.
    #[error("session `{session}` holds {messages} messages: it cannot be forked at {at}")]
    ForkPastEnd {
        /// The session forked.
        session: String,
        /// Where the fork was asked.
        at: u64,
        /// How many messages it holds.
        messages: u64,
    },
    /// A fork would read its transcript through more than
    /// [`MAX_BRANCH_DEPTH`](crate::MAX_BRANCH_DEPTH) sessions.
    #[error(
        "session `{session}` is a branch {depth} deep, the deepest a store reads a transcript through"
    )]
    BranchTooDeep {
        /// The session forked.
        session: String,
        /// How deep it is.
        depth: usize,
    },
    /// A stored row could not be read back.
    #[error("session `{session}` holds a row that cannot be read: {detail}")]
    Corrupt {
        /// The session.
        session: String,
        /// What is wrong.
        detail: String,
    },
    /// The session was taken over: someone claimed it after the writer did (another
    /// process, or another agent of this one, loaded it to hold it), so the
    /// writer's changes are refused and its agent must stop.
    #[error(
        "session `{session}` was taken over by another process (its epoch is {current}, this writer's {epoch})"
    )]
    TakenOver {
        /// The session.
        session: String,
        /// The epoch the refused write carried.
        epoch: u64,
        /// The session's epoch in the store.
        current: u64,
    },
    /// The store's writer has stopped (its runtime shut down).
    #[error("the session store's writer has stopped")]
    Closed,
    /// This store does not keep this kind of thing (a store of the host's own
    /// that implements only sessions): user memory, schedules' slots.
    #[error("this session store keeps no {0}")]
    Unsupported(String),
    /// A fact to remember was blank.
    #[error("a memory needs some text")]
    EmptyMemory,
    /// A fact or a working-memory document was over its limit
    /// ([`MAX_MEMORY_BYTES`](crate::MAX_MEMORY_BYTES),
    /// [`MAX_WORKING_MEMORY_BYTES`](crate::MAX_WORKING_MEMORY_BYTES)).
    #[error("a memory of {bytes} bytes is over the limit of {limit}")]
    MemoryTooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The user has [`MAX_MEMORIES`](crate::MAX_MEMORIES) facts already: one
    /// must be forgotten before another is remembered.
    #[error("the user has {limit} memories, the most a store keeps: forget some first")]
    TooManyMemories {
        /// The limit.
        limit: u64,
    },
    /// A file to store on its own was not a valid one (see
    /// [`FileContent::validate`](tiller_ai::FileContent::validate)).
    #[error("cannot store the file: {0}")]
    InvalidFile(String),
    /// The tenant stores [`MAX_UPLOADS`](crate::MAX_UPLOADS) files already:
    /// one must be deleted before another is stored.
    #[error("the tenant stores {limit} files, the most a store keeps: delete some first")]
    TooManyFiles {
        /// The limit.
        limit: u64,
    },
    /// An embedding was not one a store compares (see
    /// [`Embedding::new`](crate::Embedding::new)).
    #[error("an unusable embedding: {0}")]
    BadEmbedding(String),
}

impl StoreError {
    /// Whether the failure is the store's, not the write's: the same write may
    /// succeed once the store recovers.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}
