//! [`SqlStore`]: sessions in SQLite or PostgreSQL, through `sqlx`'s `Any` driver
//! with run-time queries. One schema and one set of statements serve both
//! databases (`$N` parameters, `ON CONFLICT`, `BIGINT` and `TEXT` columns).
//!
//! A batch is one transaction. Consecutive message and queue inserts are sent as
//! multi-row statements; everything else in the order given. The statements built
//! at run time hold only this file's table and column names and `$N` parameters
//! (which is what `AssertSqlSafe` asserts): values are always bound.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::future::BoxFuture;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::pool::PoolConnection;
use sqlx::{AnyPool, AssertSqlSafe, Connection, Executor, Row, Transaction};
use tiller_ai::{FileContent, ModelCost};
use tiller_core::{AgentMessage, Budget, Reserved, Spent, TenantLedger};

use crate::files::{Blobs, by_reference, described, file_id, referenced, restore};
use crate::types::{
    Branch, Change, Definition, MAX_OP_KEYS, QueueKind, Queued, SessionFilter, SessionInfo,
    SessionRecord, SessionStatus, SessionWrite, SpendScope, StoredSession, now,
};
use crate::{
    Embedding, MAX_UPLOADS, Memory, MemoryOwner, SessionStore, StoreError, StoredFile, redact_url,
};

mod branches;
mod memories;
#[cfg(feature = "sqlite")]
mod vectors;

/// The schema, one migration a version; each runs once, in order, on open.
/// `{clustered}` keeps a table in its primary key's order: `WITHOUT ROWID` in SQLite
/// (one B-tree per insert instead of two), nothing in PostgreSQL.
/// A statement that starts `{sqlite}` or `{postgres}` runs on that database only.
///
/// A row of `tiller_messages` holds a run of `message_count` consecutive messages
/// from `seq` on, their JSON joined by commas (one message's JSON when the count
/// is 1): the messages one write brings in together (a spawned agent's transcript,
/// a turn's tool results) cost one row, where a row each cost SQLite most of its
/// time. Joined, every row of a session makes its transcript's JSON array.
const MIGRATIONS: &[&[&str]] = &[
    &[
        "CREATE TABLE tiller_sessions (
            id TEXT PRIMARY KEY,
            tenant_id TEXT,
            user_id TEXT,
            name TEXT,
            definition TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
        "CREATE INDEX tiller_sessions_owner ON tiller_sessions (tenant_id, user_id, updated_at)",
        "CREATE TABLE tiller_messages (
            session_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ){clustered}",
        "CREATE TABLE tiller_queued (
            session_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            queue TEXT NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ){clustered}",
    ],
    &["ALTER TABLE tiller_messages ADD COLUMN message_count BIGINT NOT NULL DEFAULT 1"],
    &["ALTER TABLE tiller_sessions ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0"],
    &[
        "ALTER TABLE tiller_sessions ADD COLUMN origin TEXT",
        "CREATE TABLE tiller_op_keys (
            session_id TEXT NOT NULL,
            op_key TEXT NOT NULL,
            at BIGINT NOT NULL,
            PRIMARY KEY (session_id, op_key)
        ){clustered}",
    ],
    &["ALTER TABLE tiller_sessions ADD COLUMN context TEXT"],
    &["CREATE TABLE tiller_spending (
            scope TEXT PRIMARY KEY,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            cost_nanos BIGINT NOT NULL,
            model_calls BIGINT NOT NULL,
            tool_calls BIGINT NOT NULL,
            wall_clock_ms BIGINT NOT NULL
        )"],
    &[
        "CREATE TABLE tiller_holds (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            cost_nanos BIGINT NOT NULL,
            model_calls BIGINT NOT NULL,
            tool_calls BIGINT NOT NULL,
            wall_clock_ms BIGINT NOT NULL,
            expires_at BIGINT NOT NULL
        )",
        "CREATE INDEX tiller_holds_tenant ON tiller_holds (tenant, expires_at)",
    ],
    &[
        // Branches (see `branches`): what a session was forked from (kept
        // when that goes), and whose rows it reads its prefix from.
        "ALTER TABLE tiller_sessions ADD COLUMN first_context TEXT",
        "ALTER TABLE tiller_sessions ADD COLUMN parent_id TEXT",
        "ALTER TABLE tiller_sessions ADD COLUMN fork_at BIGINT",
        "ALTER TABLE tiller_sessions ADD COLUMN base_id TEXT",
        "ALTER TABLE tiller_sessions ADD COLUMN base_at BIGINT",
        "ALTER TABLE tiller_sessions ADD COLUMN hidden BIGINT NOT NULL DEFAULT 0",
        "CREATE INDEX tiller_sessions_parent ON tiller_sessions (parent_id)",
        "CREATE INDEX tiller_sessions_base ON tiller_sessions (base_id)",
        "CREATE INDEX tiller_sessions_kept ON tiller_sessions (id) WHERE hidden = 1",
    ],
    // Users' memory (see `memories`): facts searched by words, and one
    // working-memory document each.
    &[
        // SQLite: an integer key of its own, which FTS5 rows point at (a
        // `VACUUM` keeps it, where it may renumber a hidden rowid).
        "{sqlite}CREATE TABLE tiller_memories (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            text TEXT NOT NULL,
            created_at BIGINT NOT NULL
        )",
        // PostgreSQL: the words of each fact kept beside it, so that a search
        // narrowed by owner first reads them rather than making them anew.
        "{postgres}CREATE TABLE tiller_memories (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            text TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            words tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
        )",
        "CREATE INDEX tiller_memories_owner ON tiller_memories (tenant, user_id, created_at, id)",
        // How many facts each user holds, kept beside them: the bound is
        // checked without counting.
        "CREATE TABLE tiller_memory_counts (
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            facts BIGINT NOT NULL,
            PRIMARY KEY (tenant, user_id)
        ){clustered}",
        "CREATE TABLE tiller_working_memory (
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            text TEXT NOT NULL,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (tenant, user_id)
        ){clustered}",
        "{sqlite}CREATE VIRTUAL TABLE tiller_memories_fts USING fts5(
            text, content = 'tiller_memories', content_rowid = 'seq',
            tokenize = 'porter unicode61'
        )",
        "{sqlite}CREATE TRIGGER tiller_memories_indexed AFTER INSERT ON tiller_memories BEGIN
            INSERT INTO tiller_memories_fts (rowid, text) VALUES (new.seq, new.text);
        END",
        "{sqlite}CREATE TRIGGER tiller_memories_unindexed AFTER DELETE ON tiller_memories BEGIN
            INSERT INTO tiller_memories_fts (tiller_memories_fts, rowid, text)
            VALUES ('delete', old.seq, old.text);
        END",
        "{postgres}CREATE INDEX tiller_memories_words ON tiller_memories USING GIN (words)",
    ],
    // Schedules: the latest slot each one fired, claimed by one host.
    &["CREATE TABLE tiller_schedule_slots (
            schedule TEXT PRIMARY KEY,
            slot BIGINT NOT NULL,
            claimed_at BIGINT NOT NULL
        )"],
    // Files: each one's bytes kept once, by content address (`sha256:<hex>`),
    // whatever messages name it; and the files tenants stored on their own.
    &[
        "{sqlite}CREATE TABLE tiller_files (
            id TEXT PRIMARY KEY,
            size BIGINT NOT NULL,
            data BLOB NOT NULL,
            created_at BIGINT NOT NULL
        )",
        "{postgres}CREATE TABLE tiller_files (
            id TEXT PRIMARY KEY,
            size BIGINT NOT NULL,
            data BYTEA NOT NULL,
            created_at BIGINT NOT NULL
        )",
        "CREATE TABLE tiller_uploads (
            tenant_id TEXT NOT NULL,
            file_id TEXT NOT NULL,
            name TEXT NOT NULL,
            mime_type TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            PRIMARY KEY (tenant_id, file_id)
        ){clustered}",
        // Which sessions' rows name which files (a kept session that takes
        // rows over takes their names too): a file no session and no upload
        // names is dropped by `prune`.
        "CREATE TABLE tiller_file_refs (
            file_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            PRIMARY KEY (file_id, session_id)
        ){clustered}",
        "CREATE INDEX tiller_file_refs_session ON tiller_file_refs (session_id)",
    ],
    // Facts' embeddings: the model's name and the vector (little-endian f32s),
    // in a table of their own, so that a search by words reads no vector and
    // one by vectors no text.
    &[
        "{sqlite}CREATE TABLE tiller_memory_vectors (
            memory_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            model TEXT NOT NULL,
            embedding BLOB NOT NULL
        )",
        "{postgres}CREATE TABLE tiller_memory_vectors (
            memory_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            model TEXT NOT NULL,
            embedding BYTEA NOT NULL
        )",
        "CREATE INDEX tiller_memory_vectors_owner ON tiller_memory_vectors (tenant, user_id, model)",
    ],
];

/// Rows per multi-row insert (three or four parameters each, under both
/// databases' parameter limits).
const ROWS_PER_INSERT: usize = 256;

/// The JSON a row of consecutive messages grows to before the next message starts
/// a row of its own (a row holds at least one message, however large).
const RUN_BYTES: usize = 64 << 10;

/// SQLite: bytes written (roughly) after which a checkpoint copies the WAL into
/// the database file, beside the writes.
const CHECKPOINT_AFTER: usize = 8 << 20;

/// SQLite: the WAL's size past which the writer lets it start over. Checkpoints
/// run beside the writes never catch up with a steady stream of them, and a WAL
/// starts over only once every frame in it is copied: past this size, the writer
/// copies what is left itself, between two transactions.
const WAL_LIMIT: u64 = 64 << 20;

/// Each SQLite connection's settings:
/// - A busy timeout of 10 s, first: the settings after it wait for a writer
///   rather than fail at once (a connection opened while another writes).
/// - 16 KiB pages (for a new file; an existing one keeps its own): a session's
///   messages share a page or two, and a B-tree has fewer pages to balance and to
///   write to the WAL. Spawning 300,000 agents went about 10% faster than with 4 KiB.
/// - WAL, synced at checkpoints (`synchronous = NORMAL`): a commit that the
///   machine loses power after may be lost, the file is never corrupt.
/// - 16 MiB of page cache.
/// - No automatic checkpoints ([`Checkpoints`] runs them), and a WAL file cut
///   back to [`WAL_LIMIT`] when it starts over.
const SQLITE_SETTINGS: &str = "PRAGMA busy_timeout = 10000; PRAGMA page_size = 16384; \
     PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA cache_size = -16384; \
     PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = 67108864";
const _: () = assert!(WAL_LIMIT == 67108864, "SQLITE_SETTINGS' journal_size_limit");

/// The SQLite header's application id that marks a file as Tiller's ("TILL").
const APPLICATION_ID: i64 = 0x5449_4C4C;

/// Refuses, on the connection `probe`, a file that is not an SQLite database, and
/// one that another program uses: a file is Tiller's when it carries
/// [`APPLICATION_ID`], or is new (no tables), or is Tiller's from before the mark
/// (no application id, and Tiller's schema table).
async fn check_sqlite_file(probe: &mut sqlx::AnyConnection, url: &str) -> Result<(), StoreError> {
    let id: i64 = match sqlx::query("PRAGMA application_id")
        .fetch_one(&mut *probe)
        .await
        .and_then(|row| row.try_get(0))
    {
        Ok(id) => id,
        // SQLITE_NOTADB: the file's header is not SQLite's.
        Err(error) if error.as_database_error().and_then(|e| e.code()).as_deref() == Some("26") => {
            return Err(StoreError::NotADatabase {
                url: url.to_owned(),
            });
        }
        Err(error) => {
            return Err(StoreError::Database(format!("cannot open {url}: {error}")));
        }
    };
    if id == APPLICATION_ID {
        return Ok(());
    }
    let tables: Vec<String> =
        sqlx::query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&mut *probe)
            .await
            .map_err(database)?
            .iter()
            .filter_map(|row| row.try_get(0).ok())
            .collect();
    let ours =
        id == 0 && (tables.is_empty() || tables.iter().any(|table| table == "tiller_schema"));
    if ours {
        return Ok(());
    }
    let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
    Err(StoreError::ForeignDatabase {
        url: url.to_owned(),
        detail: format!(
            "application id {id:#x}, tables {}{}",
            shown.join(", "),
            if tables.len() > shown.len() {
                ", …"
            } else {
                ""
            }
        ),
    })
}

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// Sessions in an SQLite file (`sqlite://PATH`, created when missing, WAL) or a
/// PostgreSQL database (`postgres://USER:PASSWORD@HOST:PORT/DB`). Cheap to clone.
#[derive(Clone)]
pub struct SqlStore {
    pool: AnyPool,
    /// The connection batches are written on.
    writing: Arc<KeptConnection>,
    /// The connection sessions are loaded on.
    loading: Arc<KeptConnection>,
    checkpoints: Arc<Checkpoints>,
    backend: Backend,
    url: Arc<str>,
}

impl fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore").field("url", &self.url).finish()
    }
}

/// A database's failure as the store's error: [`StoreError::Unavailable`] when the
/// database could not do the work just now (see [`unavailable`]), else
/// [`StoreError::Database`].
fn database(error: sqlx::Error) -> StoreError {
    if unavailable(&error) {
        StoreError::Unavailable(error.to_string())
    } else {
        StoreError::Database(error.to_string())
    }
}

/// Whether `error` says the database is failing rather than the statement: no
/// connection, or the server's or the disk's own trouble. SQLite: a full disk,
/// an I/O error, a busy or locked database, no memory, a file it cannot open or
/// write. PostgreSQL (SQLSTATE classes): a lost connection (08), too few
/// resources such as a full disk (53), a server shutting down (57P01–57P03), a
/// system error (58), a conflict with another transaction (40001, 40P01).
fn unavailable(error: &sqlx::Error) -> bool {
    match error {
        // (A closed pool is closed for good: not among them.)
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(error) => {
            let Some(code) = error.code() else {
                return false;
            };
            match code.parse::<i32>() {
                // SQLite's extended code: the primary code is its low byte.
                // BUSY, LOCKED, NOMEM, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL.
                Ok(extended) => matches!(extended & 0xff, 5 | 6 | 7 | 8 | 10 | 13 | 14 | 15),
                Err(_) => {
                    ["08", "53", "58"]
                        .iter()
                        .any(|class| code.starts_with(class))
                        || ["57P01", "57P02", "57P03", "40001", "40P01"].contains(&&*code)
                }
            }
        }
        _ => false,
    }
}

impl SqlStore {
    /// Opens (creating an SQLite file when missing) and migrates the database `url`
    /// names.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let shown = redact_url(url);
        let unsupported = |reason: &str| StoreError::UnsupportedUrl {
            url: shown.clone(),
            reason: reason.to_owned(),
        };
        // SQLite's WAL file beside the database: its size says when it is full.
        let mut wal = None;
        let (backend, connect) = if let Some(path) = url.strip_prefix("sqlite://") {
            if !cfg!(feature = "sqlite") {
                return Err(unsupported(
                    "this build has no SQLite store (feature `sqlite`)",
                ));
            }
            if path.is_empty() || path.starts_with(':') {
                return Err(unsupported(
                    "an SQLite store needs a file path: sqlite://PATH",
                ));
            }
            let connect = if path.contains('?') {
                url.to_owned()
            } else {
                format!("{url}?mode=rwc")
            };
            let file = path.split('?').next().unwrap_or(path);
            wal = Some(std::path::PathBuf::from(format!("{file}-wal")));
            #[cfg(feature = "sqlite")]
            vectors::register().map_err(|code| {
                StoreError::Database(format!(
                    "sqlite-vec could not be registered with SQLite (error {code})"
                ))
            })?;
            (Backend::Sqlite, connect)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            if !cfg!(feature = "postgres") {
                return Err(unsupported(
                    "this build has no PostgreSQL store (feature `postgres`)",
                ));
            }
            (Backend::Postgres, url.to_owned())
        } else {
            return Err(unsupported(
                "expected memory:, sqlite://PATH or postgres://…",
            ));
        };
        let options = AnyPoolOptions::new().max_connections(match backend {
            Backend::Sqlite => 4,
            Backend::Postgres => 8,
        });
        let options = if backend == Backend::Sqlite {
            options
                .test_before_acquire(false)
                .after_connect(|connection, _| {
                    Box::pin(async move {
                        connection.execute(SQLITE_SETTINGS).await?;
                        Ok(())
                    })
                })
        } else {
            options
        };
        // One plain connection first: a pool retries a refused connection until its
        // timeout, where a wrong address (or a file that is no database) should fail
        // at once.
        let mut probe = sqlx::AnyConnection::connect(&connect)
            .await
            .map_err(|error| StoreError::Database(format!("cannot open {shown}: {error}")))?;
        if backend == Backend::Sqlite {
            check_sqlite_file(&mut probe, &shown).await?;
        }
        let _ = probe.close().await;
        let pool = options
            .connect(&connect)
            .await
            .map_err(|error| StoreError::Database(format!("cannot open {shown}: {error}")))?;
        let mut store = SqlStore {
            pool,
            writing: Arc::default(),
            loading: Arc::default(),
            checkpoints: Arc::default(),
            backend,
            url: shown.into(),
        };
        store.migrate().await?;
        if let Some(wal) = wal {
            // The page size is the file's own from its first write on.
            let page_size: i64 = sqlx::query("PRAGMA page_size")
                .fetch_one(&store.pool)
                .await
                .and_then(|row| row.try_get(0))
                .map_err(database)?;
            store.checkpoints = Arc::new(Checkpoints::new(page_size, wal));
        }
        Ok(store)
    }

    /// The bytes the sessions' and messages' tables take in the database,
    /// indexes included: SQLite's pages in use (after a [`SqlStore::checkpoint`],
    /// all of them), PostgreSQL's relations on disk.
    pub async fn bytes_held(&self) -> Result<u64, StoreError> {
        let sql = match self.backend {
            Backend::Sqlite => {
                "SELECT CAST((page_count - freelist_count) * page_size AS BIGINT) \
                 FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()"
            }
            Backend::Postgres => {
                "SELECT CAST(pg_total_relation_size('tiller_sessions') \
                 + pg_total_relation_size('tiller_messages') AS BIGINT)"
            }
        };
        let bytes: i64 = sqlx::query(sql)
            .fetch_one(&self.pool)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(database)?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    /// SQLite: copies everything in the WAL into the database file and empties the
    /// WAL, waiting for writes in progress (before a backup of the file, or to
    /// measure reads from a settled file). Nothing to do for PostgreSQL.
    pub async fn checkpoint(&self) -> Result<(), StoreError> {
        if self.backend != Backend::Sqlite {
            return Ok(());
        }
        self.writing
            .with(&self.pool, async |connection| {
                self.checkpoints
                    .run(connection, Mode::Truncate)
                    .await
                    .map_err(database)?;
                Ok(())
            })
            .await
    }

    /// Runs the migrations this database has not had yet.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(database)?;
        if self.backend == Backend::Postgres {
            // Hosts opening one database at once migrate it one after another.
            tx.execute("SELECT pg_advisory_xact_lock(7338421)")
                .await
                .map_err(database)?;
        }
        tx.execute("CREATE TABLE IF NOT EXISTS tiller_schema (version BIGINT NOT NULL)")
            .await
            .map_err(database)?;
        let current: Option<i64> = sqlx::query("SELECT max(version) FROM tiller_schema")
            .fetch_one(&mut *tx)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(database)?;
        let current = usize::try_from(current.unwrap_or(0)).unwrap_or(0);
        if current > MIGRATIONS.len() {
            return Err(StoreError::Database(format!(
                "{} has schema version {current}, newer than this build's {}",
                self.url,
                MIGRATIONS.len()
            )));
        }
        for (index, statements) in MIGRATIONS.iter().enumerate().skip(current) {
            for statement in *statements {
                let (clustered, own, other) = match self.backend {
                    Backend::Sqlite => (" WITHOUT ROWID", "{sqlite}", "{postgres}"),
                    Backend::Postgres => ("", "{postgres}", "{sqlite}"),
                };
                if statement.starts_with(other) {
                    continue;
                }
                let statement = statement
                    .trim_start_matches(own)
                    .replace("{clustered}", clustered);
                tx.execute(AssertSqlSafe(statement))
                    .await
                    .map_err(database)?;
            }
            sqlx::query("INSERT INTO tiller_schema (version) VALUES ($1)")
                .bind(index as i64 + 1)
                .execute(&mut *tx)
                .await
                .map_err(database)?;
        }
        if self.backend == Backend::Sqlite {
            // Marks the file as Tiller's (files from before the mark get it here).
            tx.execute(AssertSqlSafe(format!(
                "PRAGMA application_id = {APPLICATION_ID}"
            )))
            .await
            .map_err(database)?;
        }
        tx.commit().await.map_err(database)
    }

    async fn apply_batch(&self, batch: &[SessionWrite]) -> Result<(), StoreError> {
        self.writing
            .with(&self.pool, async |connection| {
                if self.backend == Backend::Sqlite {
                    self.checkpoints.catch_up(connection).await;
                }
                self.write(connection, batch).await
            })
            .await
    }

    /// Puts back the data of the files `messages` of `session` name by id,
    /// reading each file once.
    async fn with_files(
        &self,
        session: &str,
        messages: Vec<&mut AgentMessage>,
    ) -> Result<(), StoreError> {
        let ids = referenced(messages.iter().map(|message| &**message));
        if ids.is_empty() {
            return Ok(());
        }
        let mut found = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(ROWS_PER_INSERT) {
            let sql = format!(
                "SELECT id, data FROM tiller_files WHERE id IN ({})",
                (1..=chunk.len())
                    .map(|at| format!("${at}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(id.as_str());
            }
            for row in query.fetch_all(&self.pool).await.map_err(database)? {
                let id: String = row.try_get(0).map_err(database)?;
                let data: Vec<u8> = row.try_get(1).map_err(database)?;
                found.insert(id, STANDARD.encode(data));
            }
        }
        for message in messages {
            restore(session, message, &found)?;
        }
        Ok(())
    }

    /// Runs `work`, a write beside the sessions' (users' memory, a schedule's
    /// claim, a file), as the writer runs a batch: on SQLite on its connection
    /// when it is free, the WAL caught up first and `bytes` counted towards the
    /// next checkpoint, so that these writes too keep the WAL bounded.
    pub(super) async fn write_aside<T>(
        &self,
        bytes: usize,
        work: impl AsyncFnOnce(&mut sqlx::AnyConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let done = self
            .writing
            .with(&self.pool, async |connection| {
                if self.backend == Backend::Sqlite {
                    self.checkpoints.catch_up(connection).await;
                }
                work(connection).await
            })
            .await?;
        if self.backend == Backend::Sqlite {
            self.checkpoints.wrote(bytes, &self.pool);
        }
        Ok(done)
    }

    /// Writes `batch` in one transaction on `connection`.
    async fn write(
        &self,
        connection: &mut sqlx::AnyConnection,
        batch: &[SessionWrite],
    ) -> Result<(), StoreError> {
        let now = now();
        let mut tx = connection.begin().await.map_err(database)?;
        touch(&mut tx, self.backend, batch, now).await?;
        let mut pending = Pending {
            backend: self.backend,
            bytes: AtomicUsize::new(0),
            sessions: Vec::new(),
            messages: Vec::new(),
            runs: Vec::new(),
            queued: Vec::new(),
            dequeued: Vec::new(),
            op_keys: Vec::new(),
        };
        // In key order: two transactions touching the same tenants take their
        // rows in the same order.
        let mut spends: std::collections::BTreeMap<String, Spent> = Default::default();
        for write in batch {
            let session = &*write.session;
            match &write.change {
                Change::Append {
                    seq,
                    message,
                    dequeued,
                } => {
                    pending.append(session, *seq, message);
                    if let Some(dequeued) = dequeued {
                        pending.dequeued.push((session, *dequeued));
                    }
                }
                Change::Enqueue {
                    queue,
                    seq,
                    message,
                } => {
                    pending.queued.push((session, *seq, *queue, message));
                }
                // No foreign keys: a session and its messages may be inserted in
                // any order within the transaction.
                Change::Create(record) => pending.sessions.push((session, write.epoch, record)),
                Change::Fork { parent, at, record } => {
                    pending.flush(&mut tx).await?;
                    let branch = Branch {
                        parent: parent.to_string(),
                        at: *at,
                    };
                    branches::fork(
                        &mut tx,
                        self.backend,
                        session,
                        write.epoch,
                        &branch,
                        record,
                        now,
                    )
                    .await?;
                }
                Change::OpKey(key) => pending.op_keys.push((session, key)),
                Change::Spend { spent, tenant } => {
                    // Summed per scope, written once at the batch's end.
                    for scope in SpendScope::of(session, tenant.as_deref()) {
                        *spends.entry(scope.key()).or_default() += spent;
                    }
                }
                change => {
                    pending.flush(&mut tx).await?;
                    apply_one(&mut tx, self.backend, session, change).await?;
                }
            }
        }
        pending.flush(&mut tx).await?;
        for (scope, spent) in &spends {
            spend(&mut tx, scope, spent).await?;
        }
        tx.commit().await.map_err(database)?;
        if self.backend == Backend::Sqlite {
            self.checkpoints
                .wrote(pending.bytes.into_inner(), &self.pool);
        }
        Ok(())
    }
}

/// The files gathered so far, while one batch is encoded.
fn lock(blobs: &Mutex<Blobs>) -> MutexGuard<'_, Blobs> {
    blobs.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps the bytes of the file `id` unless they are kept already.
async fn keep_file(
    connection: &mut sqlx::AnyConnection,
    id: &str,
    data: Vec<u8>,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO tiller_files (id, size, data, created_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(data.len() as i64)
    .bind(data)
    .bind(now)
    .execute(connection)
    .await
    .map_err(database)?;
    Ok(())
}

fn json(message: &AgentMessage) -> Result<String, StoreError> {
    serde_json::to_string(message).map_err(cannot_encode)
}

fn cannot_encode(error: impl fmt::Display) -> StoreError {
    StoreError::Database(format!("cannot encode a message: {error}"))
}

/// Sets `updated_at` of every session the batch changes without creating it, and
/// fails if one of them does not exist, or holds another epoch than the batch's
/// writes to it carry (it was taken over: [`StoreError::TakenOver`]).
async fn touch(
    tx: &mut Transaction<'_, sqlx::Any>,
    backend: Backend,
    batch: &[SessionWrite],
    now: i64,
) -> Result<(), StoreError> {
    // Sessions whose first write in the batch creates them need not exist yet;
    // every other session written to must, at the epoch its writes carry.
    let mut first_write: HashMap<&str, (bool, u64)> = HashMap::new();
    for write in batch {
        let (_, epoch) = *first_write.entry(&*write.session).or_insert((
            matches!(write.change, Change::Create(_) | Change::Fork { .. }),
            write.epoch,
        ));
        if epoch != write.epoch {
            // Two claims on one session in one batch: the one behind fails when
            // the writes are retried one request at a time.
            return Err(StoreError::TakenOver {
                session: write.session.to_string(),
                epoch: write.epoch.min(epoch),
                current: write.epoch.max(epoch),
            });
        }
    }
    // By epoch, then id: one `id IN (…)` statement a chunk of sessions written
    // under one epoch (a batch holds few epochs), where a clause per session would
    // cost SQLite a temporary index to merge them.
    let mut touched: Vec<(u64, &str)> = first_write
        .into_iter()
        .filter(|(_, (creates, _))| !creates)
        .map(|(session, (_, epoch))| (epoch, session))
        .collect();
    touched.sort_unstable();
    let chunks = touched
        .chunk_by(|a, b| a.0 == b.0)
        .flat_map(|same_epoch| same_epoch.chunks(ROWS_PER_INSERT));
    for chunk in chunks {
        let sql = format!(
            "UPDATE tiller_sessions SET updated_at = {} WHERE epoch = {} AND id IN ({})",
            placeholders(backend, 1, 1),
            placeholders(backend, 2, 1),
            placeholders(backend, 3, chunk.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(now)
            .bind(to_i64(chunk[0].0));
        for (_, session) in chunk {
            query = query.bind(*session);
        }
        let updated = query
            .execute(&mut **tx)
            .await
            .map_err(database)?
            .rows_affected();
        if updated < chunk.len() as u64 {
            for (epoch, session) in chunk {
                match stored_epoch(tx, session).await? {
                    None => return Err(StoreError::NoSuchSession((*session).to_owned())),
                    Some(current) if current != *epoch => {
                        return Err(StoreError::TakenOver {
                            session: (*session).to_owned(),
                            epoch: *epoch,
                            current,
                        });
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

/// The epoch session `id` holds, or `None` when there is no such session.
async fn stored_epoch(
    connection: &mut sqlx::AnyConnection,
    id: &str,
) -> Result<Option<u64>, StoreError> {
    sqlx::query("SELECT epoch FROM tiller_sessions WHERE id = $1")
        .bind(id)
        .fetch_optional(connection)
        .await
        .and_then(|row| row.map(|row| row.try_get::<i64, _>(0)).transpose())
        .map(|epoch| epoch.map(|epoch| u64::try_from(epoch).unwrap_or(0)))
        .map_err(database)
}

/// `count` parameters numbered from `first`: `$first, $first+1, …` for PostgreSQL;
/// plain `?` for SQLite, whose named parameters cost a linear search each to bind
/// (quadratic in a statement of hundreds).
fn placeholders(backend: Backend, first: usize, count: usize) -> String {
    let mut sql = String::with_capacity(count * 4);
    push_placeholders(&mut sql, backend, first, count);
    sql
}

fn push_placeholders(sql: &mut String, backend: Backend, first: usize, count: usize) {
    for n in first..first + count {
        if n > first {
            sql.push_str(", ");
        }
        match backend {
            Backend::Sqlite => sql.push('?'),
            Backend::Postgres => {
                let _ = write!(sql, "${n}");
            }
        }
    }
}

/// `rows` rows of `columns` parameters each, as a `VALUES` list.
fn values(backend: Backend, rows: usize, columns: usize) -> String {
    let mut sql = String::with_capacity(rows * (columns * 4 + 4));
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        push_placeholders(&mut sql, backend, columns * row + 1, columns);
        sql.push(')');
    }
    sql
}

/// Inserts and deletes gathered to be sent as few statements.
struct Pending<'a> {
    backend: Backend,
    /// The bytes of JSON sent so far (counted while statements are encoded).
    bytes: AtomicUsize,
    /// New sessions with their epochs.
    sessions: Vec<(&'a str, u64, &'a SessionRecord)>,
    /// The messages to insert, in order; [`Run`]s say whose they are.
    messages: Vec<&'a AgentMessage>,
    runs: Vec<Run<'a>>,
    queued: Vec<(&'a str, u64, QueueKind, &'a AgentMessage)>,
    dequeued: Vec<(&'a str, u64)>,
    /// Idempotency keys to record.
    op_keys: Vec<(&'a str, &'a str)>,
}

/// Consecutive messages of one session among [`Pending::messages`].
struct Run<'a> {
    session: &'a str,
    /// The first one's place in the transcript.
    seq: u64,
    /// Where they are in [`Pending::messages`].
    at: Range<usize>,
}

impl<'a> Pending<'a> {
    /// Gathers `message`, at `seq` in `session`'s transcript, into the run before
    /// it when it follows that run's last message.
    fn append(&mut self, session: &'a str, seq: u64, message: &'a AgentMessage) {
        self.messages.push(message);
        let end = self.messages.len();
        match self.runs.last_mut() {
            Some(run) if run.session == session && run.seq + run.at.len() as u64 == seq => {
                run.at.end = end;
            }
            _ => self.runs.push(Run {
                session,
                seq,
                at: end - 1..end,
            }),
        }
    }

    /// The inserts of the new sessions, each with its epoch.
    fn session_inserts(
        &self,
        now: i64,
    ) -> impl Iterator<Item = Result<Statement<'_>, StoreError>> + '_ {
        let (backend, bytes) = (self.backend, &self.bytes);
        self.sessions.chunks(ROWS_PER_INSERT / 2).map(move |chunk| {
            let sql = format!(
                "INSERT INTO tiller_sessions ({RECORD_COLUMNS}) VALUES {}",
                values(backend, chunk.len(), RECORD_COUNT)
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for (session, epoch, record) in chunk {
                bytes.fetch_add(record.definition.as_json().len(), Ordering::Relaxed);
                query = bind_record(query, session, *epoch, record, now);
            }
            Ok(Statement {
                query,
                creates: Some(chunk[0].0),
            })
        })
    }

    /// The inserts of the queued messages.
    fn queued_inserts<'p>(
        &'p self,
        blobs: &'p Mutex<Blobs>,
    ) -> impl Iterator<Item = Result<Statement<'p>, StoreError>> + use<'p, 'a> {
        let (backend, bytes) = (self.backend, &self.bytes);
        self.queued.chunks(ROWS_PER_INSERT).map(move |chunk| {
            let sql = format!(
                "INSERT INTO tiller_queued (session_id, seq, queue, message) VALUES {} \
                 ON CONFLICT (session_id, seq) DO UPDATE SET queue = excluded.queue, message = excluded.message",
                values(backend, chunk.len(), 4)
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for (session, seq, queue, message) in chunk {
                let json = json(by_reference(message, session, &mut lock(blobs))?.as_ref())?;
                bytes.fetch_add(json.len(), Ordering::Relaxed);
                query = query
                    .bind(*session)
                    .bind(to_i64(*seq))
                    .bind(queue.as_str())
                    .bind(json);
            }
            Ok(Statement::new(query))
        })
    }

    /// Sends what is gathered: new sessions, messages, then queued messages, then
    /// removals from the queue (a message queued and delivered in one batch is
    /// inserted first). The inserts run as one stream of statements, so that the
    /// messages' encoding overlaps the sessions' insert too.
    async fn flush(&mut self, tx: &mut Transaction<'_, sqlx::Any>) -> Result<(), StoreError> {
        let now = now();
        let backend = self.backend;
        let bytes = &self.bytes;
        let blobs = Mutex::new(Blobs::default());
        let sessions = self.session_inserts(now);
        let mut rows = RunRows {
            messages: &self.messages,
            runs: &self.runs,
            blobs: &blobs,
            run: 0,
            done: 0,
        };
        let messages = std::iter::from_fn(move || {
            let rows = match rows.next_rows(ROWS_PER_INSERT) {
                Ok(rows) if rows.is_empty() => return None,
                Ok(rows) => rows,
                Err(error) => return Some(Err(error)),
            };
            let sql = format!(
                "INSERT INTO tiller_messages (session_id, seq, message_count, message) VALUES {} \
                 ON CONFLICT (session_id, seq) DO UPDATE \
                 SET message_count = excluded.message_count, message = excluded.message",
                values(backend, rows.len(), 4)
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for row in rows {
                bytes.fetch_add(row.json.len(), Ordering::Relaxed);
                query = query
                    .bind(row.session)
                    .bind(to_i64(row.seq))
                    .bind(row.count as i64)
                    .bind(row.json);
            }
            Some(Ok(Statement::new(query)))
        });
        let queued = self.queued_inserts(&blobs);
        let op_keys = self.op_keys.chunks(ROWS_PER_INSERT).map(|chunk| {
            let sql = format!(
                "INSERT INTO tiller_op_keys (session_id, op_key, at) VALUES {} \
                 ON CONFLICT (session_id, op_key) DO NOTHING",
                values(backend, chunk.len(), 3)
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for (session, key) in chunk {
                query = query.bind(*session).bind(*key).bind(now);
            }
            Ok(Statement::new(query))
        });
        execute_all(tx, sessions.chain(messages).chain(queued).chain(op_keys)).await?;
        let blobs = blobs.into_inner().unwrap_or_else(PoisonError::into_inner);
        for (id, data) in blobs.bytes {
            self.bytes.fetch_add(data.len(), Ordering::Relaxed);
            keep_file(tx, &id, data, now).await?;
        }
        for (session, id) in &blobs.named {
            sqlx::query(
                "INSERT INTO tiller_file_refs (file_id, session_id) VALUES ($1, $2) \
                 ON CONFLICT (file_id, session_id) DO NOTHING",
            )
            .bind(id.as_str())
            .bind(session.as_str())
            .execute(&mut **tx)
            .await
            .map_err(database)?;
        }
        for (session, seq) in &self.dequeued {
            sqlx::query("DELETE FROM tiller_queued WHERE session_id = $1 AND seq = $2")
                .bind(*session)
                .bind(to_i64(*seq))
                .execute(&mut **tx)
                .await
                .map_err(database)?;
        }
        self.sessions.clear();
        self.messages.clear();
        self.runs.clear();
        self.queued.clear();
        self.dequeued.clear();
        self.op_keys.clear();
        Ok(())
    }
}

/// A row of `tiller_messages`: `count` messages of `session` from `seq` on.
struct RunRow<'a> {
    session: &'a str,
    seq: u64,
    count: usize,
    /// Their JSON, joined by commas.
    json: String,
}

/// [`Pending`]'s runs of messages, encoded a few rows at a time: a row of
/// consecutive messages grows to about [`RUN_BYTES`] of JSON.
struct RunRows<'p, 'a> {
    messages: &'p [&'a AgentMessage],
    runs: &'p [Run<'a>],
    /// The bytes of the files the messages hold, each kept once by its id.
    blobs: &'p Mutex<Blobs>,
    /// The run being encoded.
    run: usize,
    /// How many of its messages are encoded.
    done: usize,
}

impl<'a> RunRows<'_, 'a> {
    /// At most `limit` more rows.
    fn next_rows(&mut self, limit: usize) -> Result<Vec<RunRow<'a>>, StoreError> {
        let mut rows = Vec::with_capacity(limit.min(self.runs.len() - self.run));
        while rows.len() < limit
            && let Some(run) = self.runs.get(self.run)
        {
            let first = self.done;
            let mut json = Vec::new();
            for message in &self.messages[run.at.start + first..run.at.end] {
                if self.done > first {
                    if json.len() >= RUN_BYTES {
                        break;
                    }
                    json.push(b',');
                }
                let message = by_reference(message, run.session, &mut lock(self.blobs))?;
                serde_json::to_writer(&mut json, &*message).map_err(cannot_encode)?;
                self.done += 1;
            }
            rows.push(RunRow {
                session: run.session,
                seq: run.seq + first as u64,
                count: self.done - first,
                // serde_json writes UTF-8.
                json: String::from_utf8(json).map_err(cannot_encode)?,
            });
            if self.done == run.at.len() {
                self.run += 1;
                self.done = 0;
            }
        }
        Ok(rows)
    }
}

/// A connection kept from one use to the next: taking one from the pool for each
/// use costs a wait for it, and a round trip to test it when it goes back. While
/// it is in use, other callers take one from the pool.
#[derive(Default)]
struct KeptConnection(tokio::sync::Mutex<Option<PoolConnection<sqlx::Any>>>);

impl KeptConnection {
    /// Runs `work` on the kept connection, or on a pooled one while it is busy.
    /// After a failure the connection is closed.
    async fn with<T>(
        &self,
        pool: &AnyPool,
        work: impl AsyncFnOnce(&mut sqlx::AnyConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut kept = self.0.try_lock().ok();
        let mut connection = match kept.as_mut().and_then(|kept| kept.take()) {
            Some(connection) => connection,
            None => pool.acquire().await.map_err(database)?,
        };
        let result = work(&mut connection).await;
        match (&result, &mut kept) {
            (Ok(_), Some(kept)) => **kept = Some(connection),
            (Ok(_), None) => {}
            // Closed, never reused: a connection whose statement failed may still
            // be inside the transaction it began (a failed COMMIT leaves SQLite's
            // open), and every later write on it would be a savepoint of that
            // transaction, never committed. The pool opens a new one.
            (Err(_), _) => connection.close_on_drop(),
        }
        result
    }
}

/// SQLite's checkpoints: most run in a task of their own beside the writes, and
/// the writer runs one itself when the WAL has grown past [`WAL_LIMIT`].
/// (`wal_autocheckpoint` is off: with it, the commit that fills the WAL copies it
/// into the database file while every write waits.)
#[derive(Default)]
struct Checkpoints {
    /// A WAL frame's size: a page and its header.
    frame_bytes: u64,
    /// Bytes written since the last checkpoint began.
    written: AtomicUsize,
    running: AtomicBool,
    /// The WAL is past [`WAL_LIMIT`]: the writer copies the rest of it before its
    /// next transaction, which then writes the WAL from its start again.
    full: AtomicBool,
    /// The WAL file, whose size says when it is full: the bytes written count
    /// what was asked, not the pages each commit writes to the WAL (many small
    /// writes to many sessions write far more WAL than JSON).
    wal: std::path::PathBuf,
}

impl Checkpoints {
    /// The checkpoints of a file with `page_size`-byte pages.
    fn new(page_size: i64, wal: std::path::PathBuf) -> Self {
        Checkpoints {
            frame_bytes: u64::try_from(page_size).unwrap_or(0) + 24,
            wal,
            ..Checkpoints::default()
        }
    }

    /// Counts `bytes` written, and starts a checkpoint once enough were (unless one
    /// runs); marks the WAL full once its file is past [`WAL_LIMIT`].
    fn wrote(self: &Arc<Self>, bytes: usize, pool: &AnyPool) {
        if std::fs::metadata(&self.wal).is_ok_and(|file| file.len() > WAL_LIMIT) {
            self.full.store(true, Ordering::Release);
        }
        let written = self.written.fetch_add(bytes, Ordering::AcqRel) + bytes;
        // Once the WAL is full, the writer's own checkpoint is next.
        if written < CHECKPOINT_AFTER
            || self.full.load(Ordering::Acquire)
            || self.running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.written.store(0, Ordering::Release);
        let (checkpoints, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            let state = match pool.acquire().await {
                Ok(mut connection) => checkpoints.run(&mut connection, Mode::Passive).await,
                Err(error) => Err(error),
            };
            if let Some(state) = logged(state)
                && state.wal_bytes > WAL_LIMIT
            {
                checkpoints.full.store(true, Ordering::Release);
            }
            checkpoints.running.store(false, Ordering::Release);
        });
    }

    /// When the WAL is past [`WAL_LIMIT`] and no checkpoint runs, copies all of it
    /// on `connection`, the writer's, waiting (up to the busy timeout) for readers
    /// to let go of it, and empties it, so that the next transaction writes it from
    /// its start again. A checkpoint that does not wait for readers never restarts
    /// a WAL that is read all the time.
    async fn catch_up(&self, connection: &mut sqlx::AnyConnection) {
        if !self.full.load(Ordering::Acquire) || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(state) = logged(self.run(connection, Mode::Truncate).await)
            && state.complete
        {
            self.full.store(false, Ordering::Release);
            self.written.store(0, Ordering::Release);
        }
        self.running.store(false, Ordering::Release);
    }

    /// Runs a checkpoint on `connection`.
    async fn run(
        &self,
        connection: &mut sqlx::AnyConnection,
        mode: Mode,
    ) -> Result<Checkpointed, sqlx::Error> {
        let statement = match mode {
            Mode::Passive => "PRAGMA wal_checkpoint(PASSIVE)",
            Mode::Truncate => "PRAGMA wal_checkpoint(TRUNCATE)",
        };
        let row = sqlx::query(statement).fetch_one(connection).await?;
        let (busy, frames, copied): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        Ok(Checkpointed {
            wal_bytes: u64::try_from(frames).unwrap_or(0) * self.frame_bytes,
            complete: busy == 0 && frames == copied,
        })
    }
}

/// How a checkpoint treats writers and the WAL.
enum Mode {
    /// Copies what it can without waiting for anyone.
    Passive,
    /// Waits for writers and readers, copies everything and empties the WAL.
    Truncate,
}

/// What a checkpoint left.
struct Checkpointed {
    /// The WAL's size.
    wal_bytes: u64,
    /// Every frame in the WAL is in the database file.
    complete: bool,
}

/// A checkpoint's result, with a warning when it failed (checkpoints run beside
/// the writes answer no one).
fn logged(result: Result<Checkpointed, sqlx::Error>) -> Option<Checkpointed> {
    result
        .inspect_err(|error| tracing::warn!(%error, "an SQLite checkpoint failed"))
        .ok()
}

/// A statement with its values bound.
type Bound<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// A statement to run in a batch.
struct Statement<'q> {
    query: Bound<'q>,
    /// The first session the statement creates: a unique violation names it (the
    /// batch is then retried one request at a time, and alone, the one session
    /// created is the one that exists).
    creates: Option<&'q str>,
}

impl<'q> Statement<'q> {
    fn new(query: Bound<'q>) -> Self {
        Statement {
            query,
            creates: None,
        }
    }

    async fn execute(self, tx: &mut Transaction<'_, sqlx::Any>) -> Result<(), StoreError> {
        match self.query.execute(&mut **tx).await {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(db))
                if db.is_unique_violation()
                    && let Some(session) = self.creates =>
            {
                Err(StoreError::SessionExists(session.to_owned()))
            }
            Err(error) => Err(database(error)),
        }
    }
}

/// Runs `statements` in order, each one encoded (its messages turned into JSON and
/// bound) while the one before runs on the database's side, so that the two kinds
/// of work overlap instead of taking turns.
async fn execute_all<'q>(
    tx: &mut Transaction<'_, sqlx::Any>,
    mut statements: impl Iterator<Item = Result<Statement<'q>, StoreError>>,
) -> Result<(), StoreError> {
    let Some(mut next) = statements.next().transpose()? else {
        return Ok(());
    };
    loop {
        // `join` polls the statement first: it is sent before the next is encoded.
        let (ran, following) =
            futures::join!(next.execute(tx), async { statements.next().transpose() });
        ran?;
        match following? {
            Some(statement) => next = statement,
            None => return Ok(()),
        }
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Applies a change that is not gathered.
async fn apply_one(
    tx: &mut Transaction<'_, sqlx::Any>,
    backend: Backend,
    session: &str,
    change: &Change,
) -> Result<(), StoreError> {
    let query = match change {
        Change::ClearQueue(queue) => {
            sqlx::query("DELETE FROM tiller_queued WHERE session_id = $1 AND queue = $2")
                .bind(session)
                .bind(queue.as_str())
        }
        Change::Truncate { from } => return truncate(tx, backend, session, *from).await,
        Change::Dequeue(seq) => {
            sqlx::query("DELETE FROM tiller_queued WHERE session_id = $1 AND seq = $2")
                .bind(session)
                .bind(to_i64(*seq))
        }
        Change::SetDefinition(definition) => {
            sqlx::query("UPDATE tiller_sessions SET definition = $2 WHERE id = $1")
                .bind(session)
                .bind(definition.as_json())
        }
        Change::SetStatus(status) => {
            sqlx::query("UPDATE tiller_sessions SET status = $2 WHERE id = $1")
                .bind(session)
                .bind(status.as_str())
        }
        Change::SetContext(context) => {
            sqlx::query("UPDATE tiller_sessions SET context = $2 WHERE id = $1")
                .bind(session)
                .bind(or_null(context))
        }
        Change::Create(_)
        | Change::Fork { .. }
        | Change::Spend { .. }
        | Change::Append { .. }
        | Change::Enqueue { .. }
        | Change::OpKey(_) => {
            return Ok(());
        }
    };
    query.execute(&mut **tx).await.map_err(database)?;
    Ok(())
}

/// The columns of `tiller_spending` after its scope, in order.
const SPENDING_COLUMNS: &str =
    "input_tokens, output_tokens, cost_nanos, model_calls, tool_calls, wall_clock_ms";

/// The `WHERE` clause of `filter` (its limit aside), its values numbered from
/// `$1`, and the values it binds.
fn where_of(filter: &SessionFilter) -> (String, Vec<&str>) {
    let mut conditions = Vec::new();
    let mut values: Vec<&str> = Vec::new();
    for (column, value) in [
        ("id", filter.id.as_deref()),
        ("tenant_id", filter.tenant_id.as_deref()),
        ("user_id", filter.user_id.as_deref()),
        ("status", filter.status.map(SessionStatus::as_str)),
        ("parent_id", filter.parent.as_deref()),
    ] {
        if let Some(value) = value {
            values.push(value);
            conditions.push(format!("{column} = ${}", values.len()));
        }
    }
    if let Some(after) = filter.after.as_deref() {
        values.push(after);
        conditions.push(format!("id > ${}", values.len()));
    }
    // What a deleted session's branches still read is no session of anyone's.
    conditions.push("hidden = 0".to_owned());
    (format!(" WHERE {}", conditions.join(" AND ")), values)
}

/// Adds a scope's spending to what it spent before (both databases' upsert).
const ADD_SPENDING: &str = "INSERT INTO tiller_spending \
     (scope, input_tokens, output_tokens, cost_nanos, model_calls, tool_calls, wall_clock_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (scope) DO UPDATE SET \
     input_tokens = tiller_spending.input_tokens + excluded.input_tokens, \
     output_tokens = tiller_spending.output_tokens + excluded.output_tokens, \
     cost_nanos = tiller_spending.cost_nanos + excluded.cost_nanos, \
     model_calls = tiller_spending.model_calls + excluded.model_calls, \
     tool_calls = tiller_spending.tool_calls + excluded.tool_calls, \
     wall_clock_ms = tiller_spending.wall_clock_ms + excluded.wall_clock_ms";

/// Adds `spent` to what the scope keyed `scope` spent (cost kept in billionths
/// of a dollar).
async fn spend(
    tx: &mut Transaction<'_, sqlx::Any>,
    scope: &str,
    spent: &Spent,
) -> Result<(), StoreError> {
    bind_spent(sqlx::query(ADD_SPENDING).bind(scope), spent)
        .execute(&mut **tx)
        .await
        .map_err(database)?;
    Ok(())
}

/// `query` with `spent`'s [`SPENDING_COLUMNS`] bound next, in order.
fn bind_spent<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    spent: &Spent,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    query
        .bind(to_i64(spent.input_tokens))
        .bind(to_i64(spent.output_tokens))
        .bind((spent.cost_usd * 1e9).round() as i64)
        .bind(to_i64(spent.model_calls))
        .bind(to_i64(spent.tool_calls))
        .bind(to_i64(spent.wall_clock_ms))
}

/// Drops `session`'s messages from `from` on, cutting the row whose run holds
/// message `from`; its branches keep what they read of them.
async fn truncate(
    tx: &mut Transaction<'_, sqlx::Any>,
    backend: Backend,
    session: &str,
    from: u64,
) -> Result<(), StoreError> {
    let from = to_i64(from);
    branches::split_at(tx, backend, session, from).await?;
    branches::hand_over(tx, session, from, now()).await?;
    sqlx::query("DELETE FROM tiller_messages WHERE session_id = $1 AND seq >= $2")
        .bind(session)
        .bind(from)
        .execute(&mut **tx)
        .await
        .map_err(database)?;
    // A cut within the prefix it shares: it reads less of it (none from 0),
    // and what it no more reads may be read by no one.
    let cut = sqlx::query(
        "UPDATE tiller_sessions SET base_at = $2, \
         base_id = CASE WHEN $2 = 0 THEN NULL ELSE base_id END \
         WHERE id = $1 AND base_at > $2",
    )
    .bind(session)
    .bind(from)
    .execute(&mut **tx)
    .await
    .map_err(database)?
    .rows_affected();
    if cut > 0 {
        branches::drop_unread(tx).await?;
    }
    Ok(())
}

/// A row's run of `count` messages decoded from `array`, its JSON inside brackets.
fn decode_run<'t, T: serde::Deserialize<'t>>(
    session: &str,
    array: &'t str,
    count: i64,
) -> Result<Vec<T>, StoreError> {
    let messages: Vec<T> = decode(session, array)?;
    if messages.len() as i64 != count {
        return Err(StoreError::Corrupt {
            session: session.to_owned(),
            detail: format!("a row of {count} messages holds {}", messages.len()),
        });
    }
    Ok(messages)
}

const RECORD_COLUMNS: &str = "id, tenant_id, user_id, name, definition, status, created_at, updated_at, epoch, origin, context, first_context, parent_id, fork_at";

/// How many [`RECORD_COLUMNS`] there are.
const RECORD_COUNT: usize = 14;

/// [`RECORD_COLUMNS`]' places in a row that holds no record.
const NO_RECORD: &str =
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL";

/// `query` with `record`'s [`RECORD_COLUMNS`] bound next, in order, as
/// session `session`'s at `epoch`, changed `now`.
fn bind_record<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    session: &'q str,
    epoch: u64,
    record: &'q SessionRecord,
    now: i64,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    let branch = record.branch.as_ref();
    query
        .bind(session)
        .bind(record.tenant_id.as_deref())
        .bind(record.user_id.as_deref())
        .bind(record.name.as_deref())
        .bind(record.definition.as_json())
        .bind(record.status.as_str())
        .bind(record.created_at)
        .bind(now)
        .bind(to_i64(epoch))
        .bind(origin(record))
        .bind(or_null(&record.context))
        .bind(or_null(&record.first_context))
        .bind(branch.map(|branch| branch.parent.as_str()))
        .bind(branch.map(|branch| to_i64(branch.at)))
}

/// A record's origin as stored: `NULL` for none.
fn origin(record: &SessionRecord) -> Option<&str> {
    or_null(&record.origin)
}

/// Opaque JSON as stored: `NULL` for none.
fn or_null(json: &Definition) -> Option<&str> {
    let json = json.as_json();
    (json != "null").then_some(json)
}

/// An opaque JSON column: `null` for `NULL`.
fn opaque(row: &AnyRow, column: &str) -> Result<Option<Definition>, String> {
    match row.try_get::<Option<String>, _>(column) {
        Ok(Some(text)) => Definition::stored(text)
            .map(Some)
            .map_err(|error| format!("its {column}: {error}")),
        Ok(None) => Ok(None),
        Err(error) => Err(error.to_string()),
    }
}

fn record(row: &AnyRow) -> Result<SessionRecord, StoreError> {
    let id: String = row.try_get("id").map_err(database)?;
    let corrupt = |detail: String| StoreError::Corrupt {
        session: id.clone(),
        detail,
    };
    let definition: String = row.try_get("definition").map_err(database)?;
    let status: String = row.try_get("status").map_err(database)?;
    let origin = opaque(row, "origin").map_err(corrupt)?.unwrap_or_default();
    let context = opaque(row, "context").map_err(corrupt)?.unwrap_or_default();
    let first_context = opaque(row, "first_context")
        .map_err(corrupt)?
        .unwrap_or_default();
    let parent: Option<String> = row.try_get("parent_id").map_err(database)?;
    let fork_at: Option<i64> = row.try_get("fork_at").map_err(database)?;
    Ok(SessionRecord {
        tenant_id: row.try_get("tenant_id").map_err(database)?,
        user_id: row.try_get("user_id").map_err(database)?,
        name: row.try_get("name").map_err(database)?,
        definition: Definition::stored(definition)
            .map_err(|error| corrupt(format!("its definition: {error}")))?,
        status: SessionStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("unknown status `{status}`")))?,
        created_at: row.try_get("created_at").map_err(database)?,
        updated_at: row.try_get("updated_at").map_err(database)?,
        epoch: u64::try_from(row.try_get::<i64, _>("epoch").map_err(database)?).unwrap_or(0),
        origin,
        context,
        first_context,
        branch: parent.map(|parent| Branch {
            parent,
            at: fork_at.and_then(|at| u64::try_from(at).ok()).unwrap_or(0),
        }),
        id,
    })
}

/// Stored messages (one, or an array of them) decoded.
fn decode<'t, T: serde::Deserialize<'t>>(session: &str, text: &'t str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|error| StoreError::Corrupt {
        session: session.to_owned(),
        detail: format!("a message: {error}"),
    })
}

impl SessionStore for SqlStore {
    fn apply<'a>(&'a self, batch: &'a [SessionWrite]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<StoredSession>, StoreError>> {
        Box::pin(async move {
            // One statement, and one row when nothing is queued (a round trip to
            // the database is most of a load, and each row is a hand-off between
            // threads): the session's row with its messages as one JSON array,
            // then its queued messages.
            let sql = format!(
                "{transcript} SELECT 0 AS kind, 0 AS seq, NULL AS queue, \
                 (SELECT '[' || string_agg(message, ',' ORDER BY seq) || ']' \
                  FROM visible) AS message, {RECORD_COLUMNS} \
                 FROM tiller_sessions WHERE id = $1 AND hidden = 0 \
                 UNION ALL \
                 SELECT 2, seq, queue, message, {NO_RECORD} FROM tiller_queued WHERE session_id = $1 \
                 UNION ALL \
                 SELECT 3, at, NULL, op_key, {NO_RECORD} FROM (SELECT at, op_key FROM tiller_op_keys \
                  WHERE session_id = $1 ORDER BY at DESC, op_key LIMIT {MAX_OP_KEYS}) AS newest \
                 ORDER BY kind, seq",
                transcript = *branches::TRANSCRIPT
            );
            let query = sqlx::query(AssertSqlSafe(sql)).bind(id);
            let rows = self
                .loading
                .with(&self.pool, async |connection| {
                    query.fetch_all(connection).await.map_err(database)
                })
                .await?;
            let mut rows = rows.iter();
            let Some(first) = rows.next() else {
                return Ok(None);
            };
            let kind: i32 = first.try_get(0).map_err(database)?;
            if kind != 0 {
                // Queued messages left of a session that no longer exists.
                return Ok(None);
            }
            let record = record(first)?;
            let mut messages = match first.try_get::<Option<String>, _>(3).map_err(database)? {
                Some(text) => decode::<Vec<AgentMessage>>(id, &text)?,
                None => Vec::new(),
            };
            let mut steering = Vec::new();
            let mut follow_up = Vec::new();
            let mut op_keys = Vec::new();
            for row in rows {
                let seq: i64 = row.try_get(1).map_err(database)?;
                let text: String = row.try_get(3).map_err(database)?;
                if row.try_get::<i32, _>(0).map_err(database)? == 3 {
                    op_keys.push(Arc::from(text));
                    continue;
                }
                let stored = decode(id, &text)?;
                let queue: String = row.try_get(2).map_err(database)?;
                let queued = Queued {
                    seq: u64::try_from(seq).unwrap_or_default(),
                    message: stored,
                };
                match QueueKind::parse(&queue) {
                    Some(QueueKind::Steering) => steering.push(queued),
                    Some(QueueKind::FollowUp) => follow_up.push(queued),
                    None => {
                        return Err(StoreError::Corrupt {
                            session: id.to_owned(),
                            detail: format!("unknown queue `{queue}`"),
                        });
                    }
                }
            }
            let held = messages.iter_mut().chain(
                steering
                    .iter_mut()
                    .chain(&mut follow_up)
                    .map(|queued| &mut queued.message),
            );
            self.with_files(id, held.collect()).await?;
            Ok(Some(StoredSession {
                record,
                messages: messages.into_iter().map(Arc::new).collect(),
                steering,
                follow_up,
                op_keys,
            }))
        })
    }

    fn claim<'a>(
        &'a self,
        id: &'a str,
        epoch: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<StoredSession>, StoreError>> {
        Box::pin(async move {
            // The claim first: a writer of the claim before is refused from its
            // commit on, so what is loaded next is all it wrote.
            let claim = match epoch {
                None => sqlx::query(
                    "UPDATE tiller_sessions SET epoch = epoch + 1 WHERE id = $1 RETURNING epoch",
                )
                .bind(id),
                Some(epoch) => sqlx::query(
                    "UPDATE tiller_sessions SET epoch = $2 WHERE id = $1 AND epoch <= $2 \
                     RETURNING epoch",
                )
                .bind(id)
                .bind(to_i64(epoch)),
            };
            let claimed = self
                .loading
                .with(&self.pool, async |connection| {
                    let row = claim
                        .fetch_optional(&mut *connection)
                        .await
                        .map_err(database)?;
                    let Some(row) = row else {
                        // No session, or a newer claim on it.
                        return match (stored_epoch(connection, id).await?, epoch) {
                            (Some(current), Some(epoch)) => Err(StoreError::TakenOver {
                                session: id.to_owned(),
                                epoch,
                                current,
                            }),
                            _ => Ok(None),
                        };
                    };
                    let claimed: i64 = row.try_get(0).map_err(database)?;
                    // The keys past the newest `MAX_OP_KEYS` are forgotten here,
                    // once per holder, rather than on every write.
                    sqlx::query(AssertSqlSafe(format!(
                        "DELETE FROM tiller_op_keys WHERE session_id = $1 AND op_key NOT IN \
                         (SELECT op_key FROM tiller_op_keys WHERE session_id = $1 \
                          ORDER BY at DESC, op_key LIMIT {MAX_OP_KEYS})"
                    )))
                    .bind(id)
                    .execute(&mut *connection)
                    .await
                    .map_err(database)?;
                    Ok(Some(u64::try_from(claimed).unwrap_or(0)))
                })
                .await?;
            let Some(claimed) = claimed else {
                return Ok(None);
            };
            let mut stored = self.load(id).await?;
            if let Some(stored) = &mut stored {
                // The holder's epoch, even when a newer claim came meanwhile: its
                // writes are then refused, as they must be.
                stored.record.epoch = claimed;
            }
            Ok(stored)
        })
    }

    fn count<'a>(&'a self, filter: &'a SessionFilter) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let (filtered, values) = where_of(filter);
            let sql = format!("SELECT count(*) FROM tiller_sessions{filtered}");
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for value in values {
                query = query.bind(value);
            }
            let row = query.fetch_one(&self.pool).await.map_err(database)?;
            let count: i64 = row.try_get(0).map_err(database)?;
            Ok(u64::try_from(count).unwrap_or(0))
        })
    }

    fn list<'a>(
        &'a self,
        filter: &'a SessionFilter,
    ) -> BoxFuture<'a, Result<Vec<SessionInfo>, StoreError>> {
        Box::pin(async move {
            let (filtered, values) = where_of(filter);
            let mut sql = format!(
                "SELECT {RECORD_COLUMNS}, coalesce(base_at, 0) + (SELECT CAST(coalesce(sum(message_count), 0) AS BIGINT) \
                 FROM tiller_messages m WHERE m.session_id = s.id) AS messages \
                 FROM tiller_sessions s{filtered}"
            );
            sql.push_str(if filter.after.is_some() {
                " ORDER BY id"
            } else {
                " ORDER BY updated_at DESC, id"
            });
            if let Some(limit) = filter.limit {
                sql.push_str(&format!(" LIMIT {limit}"));
            }
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for value in values {
                query = query.bind(value);
            }
            let rows = query.fetch_all(&self.pool).await.map_err(database)?;
            // A row that cannot be read is left out (and logged), not the list.
            Ok(rows
                .iter()
                .filter_map(|row| {
                    let info = record(row).and_then(|record| {
                        let messages: i64 = row.try_get("messages").map_err(database)?;
                        Ok(SessionInfo {
                            record,
                            messages: u64::try_from(messages).unwrap_or_default(),
                        })
                    });
                    info.inspect_err(|error| {
                        tracing::warn!(%error, "a session that cannot be read is left out of a list");
                    })
                    .ok()
                })
                .collect())
        })
    }

    fn messages<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Arc<AgentMessage>>, StoreError>> {
        Box::pin(async move {
            // From the row whose run holds message `from`: the last row to start
            // at or before it (one more row than `limit` when that run ends before).
            let rows = sqlx::query(AssertSqlSafe(format!(
                "{} SELECT seq, message_count, message FROM visible \
                 WHERE seq >= coalesce((SELECT max(seq) FROM visible WHERE seq <= $2), 0) \
                 ORDER BY seq LIMIT $3",
                *branches::TRANSCRIPT
            )))
            .bind(id)
            .bind(to_i64(from))
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await
            .map_err(database)?;
            let mut page = Vec::new();
            for row in &rows {
                let seq: i64 = row.try_get(0).map_err(database)?;
                let count: i64 = row.try_get(1).map_err(database)?;
                let json: String = row.try_get(2).map_err(database)?;
                let skipped = usize::try_from(to_i64(from) - seq).unwrap_or(0);
                page.extend(
                    decode_run::<AgentMessage>(id, &format!("[{json}]"), count)?
                        .into_iter()
                        .skip(skipped),
                );
                if page.len() >= limit as usize {
                    break;
                }
            }
            page.truncate(limit as usize);
            self.with_files(id, page.iter_mut().collect()).await?;
            Ok(page.into_iter().map(Arc::new).collect())
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            // `{id}/…` by its first characters: `LIKE` would read `%` and `_` in
            // an id as patterns.
            let prefix = format!("{id}/");
            let length = i32::try_from(prefix.chars().count()).unwrap_or(i32::MAX);
            let mut tx = self.pool.begin().await.map_err(database)?;
            let existed =
                sqlx::query("SELECT id FROM tiller_sessions WHERE id = $1 AND hidden = 0")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(database)?
                    .is_some();
            branches::hand_all_over(
                &mut tx,
                self.backend,
                "(id = $1 OR substr(id, 1, $3) = $2)",
                |query| query.bind(id).bind(&prefix).bind(length),
            )
            .await?;
            for (table, column) in [
                ("tiller_messages", "session_id"),
                ("tiller_queued", "session_id"),
                ("tiller_op_keys", "session_id"),
                ("tiller_sessions", "id"),
            ] {
                sqlx::query(AssertSqlSafe(format!(
                    "DELETE FROM {table} WHERE {column} = $1 OR substr({column}, 1, $3) = $2"
                )))
                .bind(id)
                .bind(&prefix)
                .bind(length)
                .execute(&mut *tx)
                .await
                .map_err(database)?;
            }
            // What the sessions spent goes with them (their tenant's stays).
            let scope = SpendScope::Session(id.to_owned()).key();
            let prefix = format!("{scope}/");
            let length = i32::try_from(prefix.chars().count()).unwrap_or(i32::MAX);
            sqlx::query(
                "DELETE FROM tiller_spending WHERE scope = $1 OR substr(scope, 1, $3) = $2",
            )
            .bind(&scope)
            .bind(&prefix)
            .bind(length)
            .execute(&mut *tx)
            .await
            .map_err(database)?;
            branches::drop_unread(&mut tx).await?;
            tx.commit().await.map_err(database)?;
            Ok(existed)
        })
    }

    fn prune(&self, before: i64) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            const OLD: &str = "SELECT id FROM tiller_sessions \
                 WHERE status = 'closed' AND updated_at < $1 AND hidden = 0";
            let mut tx = self.pool.begin().await.map_err(database)?;
            branches::hand_all_over(
                &mut tx,
                self.backend,
                "status = 'closed' AND updated_at < $1",
                |query| query.bind(before),
            )
            .await?;
            sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM tiller_spending WHERE scope IN (SELECT 'session:' || id FROM ({OLD}) AS old)"
            )))
            .bind(before)
            .execute(&mut *tx)
            .await
            .map_err(database)?;
            for table in ["tiller_messages", "tiller_queued", "tiller_op_keys"] {
                sqlx::query(AssertSqlSafe(format!(
                    "DELETE FROM {table} WHERE session_id IN ({OLD})"
                )))
                .bind(before)
                .execute(&mut *tx)
                .await
                .map_err(database)?;
            }
            let pruned = sqlx::query(
                "DELETE FROM tiller_sessions WHERE status = 'closed' AND updated_at < $1 AND hidden = 0",
            )
            .bind(before)
            .execute(&mut *tx)
            .await
            .map_err(database)?
            .rows_affected();
            branches::drop_unread(&mut tx).await?;
            // Files that no upload and no session names any more. On
            // PostgreSQL, writes that name a file wait (each inserts it, or
            // tries to): none is dropped under a message committed beside.
            if self.backend == Backend::Postgres {
                sqlx::query("LOCK TABLE tiller_files IN SHARE ROW EXCLUSIVE MODE")
                    .execute(&mut *tx)
                    .await
                    .map_err(database)?;
            }
            for sweep in [
                "DELETE FROM tiller_file_refs WHERE NOT EXISTS \
                 (SELECT 1 FROM tiller_sessions WHERE id = tiller_file_refs.session_id)",
                "DELETE FROM tiller_files \
                 WHERE NOT EXISTS (SELECT 1 FROM tiller_uploads WHERE file_id = tiller_files.id) \
                 AND NOT EXISTS (SELECT 1 FROM tiller_file_refs WHERE file_id = tiller_files.id)",
            ] {
                sqlx::query(sweep)
                    .execute(&mut *tx)
                    .await
                    .map_err(database)?;
            }
            tx.commit().await.map_err(database)?;
            Ok(pruned)
        })
    }

    fn spent<'a>(&'a self, scope: &'a SpendScope) -> BoxFuture<'a, Result<Spent, StoreError>> {
        Box::pin(async move {
            let sql = format!("SELECT {SPENDING_COLUMNS} FROM tiller_spending WHERE scope = $1");
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(scope.key())
                .fetch_optional(&self.pool)
                .await
                .map_err(database)?;
            row.as_ref().map_or(Ok(Spent::default()), spending_of)
        })
    }

    fn working_memory<'a>(
        &'a self,
        owner: &'a MemoryOwner,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(self.read_working_memory(owner))
    }

    fn set_working_memory<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.write_working_memory(owner, text))
    }

    fn remember<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        text: &'a str,
        embedding: Option<&'a Embedding>,
    ) -> BoxFuture<'a, Result<Memory, StoreError>> {
        Box::pin(self.insert_memory(owner, text, embedding))
    }

    fn recall_similar<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        query: &'a Embedding,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        Box::pin(self.similar_memories(owner, query, limit))
    }

    fn recall<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        query: &'a str,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        Box::pin(self.search_memories(owner, query, limit))
    }

    fn memories<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        Box::pin(self.page_memories(owner, offset, limit))
    }

    fn forget<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.delete_memories(owner, id))
    }

    fn put_file<'a>(
        &'a self,
        tenant: &'a str,
        file: &'a FileContent,
    ) -> BoxFuture<'a, Result<StoredFile, StoreError>> {
        Box::pin(async move {
            file.validate()
                .map_err(|error| StoreError::InvalidFile(error.to_string()))?;
            let bytes = file.bytes();
            let id = file_id(&bytes);
            let now = now();
            let created_at = self
                .write_aside(bytes.len(), async |connection| {
                    let mut tx = connection.begin().await.map_err(database)?;
                    let held: i64 = sqlx::query(
                        "SELECT count(*) FROM tiller_uploads WHERE tenant_id = $1 AND file_id <> $2",
                    )
                    .bind(tenant)
                    .bind(id.as_str())
                    .fetch_one(&mut *tx)
                    .await
                    .and_then(|row| row.try_get(0))
                    .map_err(database)?;
                    if held >= MAX_UPLOADS as i64 {
                        return Err(StoreError::TooManyFiles { limit: MAX_UPLOADS });
                    }
                    keep_file(&mut tx, &id, bytes, now).await?;
                    let row = sqlx::query(
                        "INSERT INTO tiller_uploads (tenant_id, file_id, name, mime_type, created_at) \
                         VALUES ($1, $2, $3, $4, $5) \
                         ON CONFLICT (tenant_id, file_id) DO UPDATE \
                         SET name = excluded.name, mime_type = excluded.mime_type \
                         RETURNING created_at",
                    )
                    .bind(tenant)
                    .bind(id.as_str())
                    .bind(file.name.as_str())
                    .bind(file.mime_type.as_str())
                    .bind(now)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(database)?;
                    let created_at: i64 = row.try_get(0).map_err(database)?;
                    tx.commit().await.map_err(database)?;
                    Ok(created_at)
                })
                .await?;
            Ok(described(id, file, created_at))
        })
    }

    fn file<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<FileContent>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT u.name, u.mime_type, f.data FROM tiller_uploads u \
                 JOIN tiller_files f ON f.id = u.file_id \
                 WHERE u.tenant_id = $1 AND u.file_id = $2",
            )
            .bind(tenant)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(database)?;
            let Some(row) = row else { return Ok(None) };
            Ok(Some(FileContent {
                name: row.try_get(0).map_err(database)?,
                mime_type: row.try_get(1).map_err(database)?,
                data: STANDARD.encode(row.try_get::<Vec<u8>, _>(2).map_err(database)?),
            }))
        })
    }

    fn delete_file<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let deleted = self
                .write_aside(0, async |connection| {
                    sqlx::query("DELETE FROM tiller_uploads WHERE tenant_id = $1 AND file_id = $2")
                        .bind(tenant)
                        .bind(id)
                        .execute(&mut *connection)
                        .await
                        .map_err(database)
                })
                .await?
                .rows_affected();
            Ok(deleted > 0)
        })
    }

    fn claim_slot<'a>(
        &'a self,
        schedule: &'a str,
        slot: i64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            // One statement: the row is made, or moved on to a later slot, by
            // one claim alone.
            let claimed = self
                .write_aside(schedule.len(), async |connection| {
                    sqlx::query(
                        "INSERT INTO tiller_schedule_slots (schedule, slot, claimed_at) VALUES ($1, $2, $3) \
                         ON CONFLICT (schedule) DO UPDATE SET slot = excluded.slot, claimed_at = excluded.claimed_at \
                         WHERE tiller_schedule_slots.slot < excluded.slot",
                    )
                    .bind(schedule)
                    .bind(slot)
                    .bind(now())
                    .execute(&mut *connection)
                    .await
                    .map_err(database)
                })
                .await?
                .rows_affected();
            Ok(claimed == 1)
        })
    }

    fn ledger(self: Arc<Self>) -> Option<Arc<dyn TenantLedger>> {
        // One SQLite file is one process's: its tallies stay in memory.
        (self.backend == Backend::Postgres).then_some(self as Arc<dyn TenantLedger>)
    }
}

/// A row of [`SPENDING_COLUMNS`] (sums of them, too) as what was spent.
fn spending_of(row: &AnyRow) -> Result<Spent, StoreError> {
    let column = |index: usize| -> Result<u64, StoreError> {
        let value: i64 = row.try_get(index).map_err(database)?;
        Ok(u64::try_from(value).unwrap_or(0))
    };
    Ok(Spent {
        input_tokens: column(0)?,
        output_tokens: column(1)?,
        cost_usd: column(2)? as f64 / 1e9,
        model_calls: column(3)?,
        tool_calls: column(4)?,
        wall_clock_ms: column(5)?,
    })
}

/// How long a hold counts when no one settles it (its host died mid-call):
/// longer than any model call.
const HOLD_LIFETIME_MS: i64 = 30 * 60 * 1_000;

/// How long a hold is kept after it stopped counting, so that a late
/// settlement still finds it (and one tried again finds it gone).
const HOLD_KEPT_MS: i64 = 24 * 60 * 60 * 1_000;

/// The database's clock in milliseconds since the Unix epoch (PostgreSQL):
/// every host's holds expire by the same clock.
const NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

/// The sums of a tenant's holds that still count.
const HELD: &str = "SELECT CAST(coalesce(sum(input_tokens), 0) AS BIGINT), \
     CAST(coalesce(sum(output_tokens), 0) AS BIGINT), CAST(coalesce(sum(cost_nanos), 0) AS BIGINT), \
     CAST(coalesce(sum(model_calls), 0) AS BIGINT), CAST(coalesce(sum(tool_calls), 0) AS BIGINT), \
     CAST(coalesce(sum(wall_clock_ms), 0) AS BIGINT) FROM tiller_holds WHERE tenant = $1 AND expires_at > ";

/// Locks `tenant`'s spending row for the transaction (made at zero when it is
/// missing) and reads it: every ledger step of a tenant takes this lock first.
async fn lock_spending(
    tx: &mut Transaction<'_, sqlx::Any>,
    tenant: &str,
) -> Result<Spent, StoreError> {
    let scope = SpendScope::Tenant(tenant.to_owned()).key();
    sqlx::query(
        "INSERT INTO tiller_spending (scope, input_tokens, output_tokens, cost_nanos, \
         model_calls, tool_calls, wall_clock_ms) VALUES ($1, 0, 0, 0, 0, 0, 0) \
         ON CONFLICT (scope) DO NOTHING",
    )
    .bind(&scope)
    .execute(&mut **tx)
    .await
    .map_err(database)?;
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT {SPENDING_COLUMNS} FROM tiller_spending WHERE scope = $1 FOR UPDATE"
    )))
    .bind(&scope)
    .fetch_one(&mut **tx)
    .await
    .map_err(database)?;
    spending_of(&row)
}

/// A ledger step of the store, its error as the ledger reports it.
fn ledger_step<'a, T>(
    step: impl Future<Output = Result<T, StoreError>> + Send + 'a,
) -> BoxFuture<'a, Result<T, String>> {
    Box::pin(async move { step.await.map_err(|error| error.to_string()) })
}

/// A tenant's budget as one figure for every process on one PostgreSQL: each
/// hold is made under a lock on the tenant's spending row, against what its
/// row and every unexpired hold say (by the database's clock); settling a hold
/// removes it and writes what it used in one transaction, once however often
/// it is tried.
impl TenantLedger for SqlStore {
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        budget: &'a Budget,
        input: u64,
        output: u64,
        prices: &'a ModelCost,
    ) -> BoxFuture<'a, Result<Reserved, String>> {
        ledger_step(async move {
            let mut tx = self.pool.begin().await.map_err(database)?;
            let spent = lock_spending(&mut tx, tenant).await?;
            sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM tiller_holds WHERE tenant = $1 AND expires_at <= {NOW_MS} - $2"
            )))
            .bind(tenant)
            .bind(HOLD_KEPT_MS)
            .execute(&mut *tx)
            .await
            .map_err(database)?;
            let row = sqlx::query(AssertSqlSafe(format!("{HELD}{NOW_MS}")))
                .bind(tenant)
                .fetch_one(&mut *tx)
                .await
                .map_err(database)?;
            let taken = spent.plus(&spending_of(&row)?);
            let room = match budget.room(&taken, input, prices) {
                Ok(room) => room,
                Err((limit, max, spent)) => return Ok(Reserved::Refused(limit, max, spent)),
            };
            let hold = Spent::at_most(input, room.map_or(output, |room| room.min(output)), prices);
            let id = tiller_ai::new_id();
            let insert = format!(
                "INSERT INTO tiller_holds (id, tenant, {SPENDING_COLUMNS}, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, {NOW_MS} + $9)"
            );
            bind_spent(
                sqlx::query(AssertSqlSafe(insert)).bind(&id).bind(tenant),
                &hold,
            )
            .bind(HOLD_LIFETIME_MS)
            .execute(&mut *tx)
            .await
            .map_err(database)?;
            tx.commit().await.map_err(database)?;
            Ok(Reserved::Held { id, hold, spent })
        })
    }

    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
        used: &'a Spent,
    ) -> BoxFuture<'a, Result<(), String>> {
        ledger_step(async move {
            let mut tx = self.pool.begin().await.map_err(database)?;
            lock_spending(&mut tx, tenant).await?;
            let removed = sqlx::query("DELETE FROM tiller_holds WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(database)?
                .rows_affected();
            // Gone: settled before (this is a retry whose first commit went
            // through), and not to be counted twice.
            if removed == 1 {
                spend(&mut tx, &SpendScope::Tenant(tenant.to_owned()).key(), used).await?;
            }
            tx.commit().await.map_err(database)
        })
    }

    fn add<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
        spent: &'a Spent,
    ) -> BoxFuture<'a, Result<(), String>> {
        ledger_step(async move {
            let mut tx = self.pool.begin().await.map_err(database)?;
            // A hold that never counted marks the addition made: tried again
            // (its first reply lost), it finds the mark and adds nothing.
            let marked = sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO tiller_holds (id, tenant, {SPENDING_COLUMNS}, expires_at) \
                 VALUES ($1, $2, 0, 0, 0, 0, 0, 0, {NOW_MS}) ON CONFLICT (id) DO NOTHING"
            )))
            .bind(id)
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .map_err(database)?
            .rows_affected();
            if marked == 1 {
                spend(&mut tx, &SpendScope::Tenant(tenant.to_owned()).key(), spent).await?;
            }
            tx.commit().await.map_err(database)
        })
    }
}
