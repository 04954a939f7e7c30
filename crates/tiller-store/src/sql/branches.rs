//! Branches in SQL: a session forked from another at message `at` reads its
//! first `at` messages from the rows of the session it was forked from (its
//! *base*: `base_id`, read below `base_at`), and holds rows of its own from
//! `at` on. A base may itself be a branch: a transcript is read through a
//! chain of at most [`MAX_BRANCH_DEPTH`] sessions, each up to where the one
//! before it forked, so no message is copied by a fork.
//!
//! A fork splits the row whose run of messages straddles its place, so that
//! every place a branch reads up to is a row's end. When a session whose rows
//! a branch reads is truncated or deleted, the rows its branches still read
//! are handed to a *kept* session (`hidden`: no one's, never listed), which
//! takes the session's place in their chain; a kept session nothing reads any
//! more is dropped with its rows.

use std::sync::LazyLock;

use sqlx::{AssertSqlSafe, Row, Transaction};

use super::{
    Backend, RECORD_COLUMNS, RECORD_COUNT, Statement, bind_record, database, decode_run, to_i64,
    values,
};
use crate::StoreError;
use crate::types::{Branch, MAX_BRANCH_DEPTH, SessionRecord};

/// The common table expressions of session `$1`'s transcript: `chain`, the
/// sessions whose rows make it up, each with `upto`, where its rows stop
/// being `$1`'s (`NULL`: nowhere), and `visible`, those rows.
pub(super) static TRANSCRIPT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH RECURSIVE chain (id, upto, base_id, base_at, depth) AS ( \
         SELECT id, CAST(NULL AS BIGINT), base_id, base_at, 1 FROM tiller_sessions WHERE id = $1 \
         UNION ALL \
         SELECT s.id, CASE WHEN c.upto IS NULL OR c.base_at < c.upto THEN c.base_at ELSE c.upto END, \
         s.base_id, s.base_at, c.depth + 1 \
         FROM chain c JOIN tiller_sessions s ON s.id = c.base_id WHERE c.depth < {MAX_BRANCH_DEPTH}), \
         visible AS (SELECT m.session_id, m.seq, m.message_count, m.message \
         FROM tiller_messages m WHERE m.session_id IN (SELECT id FROM chain) \
         AND m.seq < coalesce((SELECT c.upto FROM chain c WHERE c.id = m.session_id), {}) ) ",
        i64::MAX
    )
});

/// What makes a `SELECT` of `tiller_sessions` rows hold them until the
/// transaction ends, where the database has it (PostgreSQL, whose writers
/// run at once: a fork, a split and a deletion of one session's rows wait for
/// each other); SQLite has one writer at a time.
fn locked(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => " FOR UPDATE",
        Backend::Sqlite => "",
    }
}

/// Creates session `session` at `epoch` as a branch of `branch.parent` from
/// its message `branch.at` on (see [`crate::Change::Fork`]).
pub(super) async fn fork(
    tx: &mut Transaction<'_, sqlx::Any>,
    backend: Backend,
    session: &str,
    epoch: u64,
    branch: &Branch,
    record: &SessionRecord,
    now: i64,
) -> Result<(), StoreError> {
    let parent = branch.parent.as_str();
    let at = to_i64(branch.at);
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT base_id, base_at, (SELECT CAST(coalesce(sum(message_count), 0) AS BIGINT) \
         FROM tiller_messages WHERE session_id = $1) FROM tiller_sessions WHERE id = $1 AND hidden = 0{}",
        locked(backend)
    )))
    .bind(parent)
    .fetch_optional(&mut **tx)
    .await
    .map_err(database)?
    .ok_or_else(|| StoreError::NoSuchSession(parent.to_owned()))?;
    let (mut base_id, base_at, own): (Option<String>, Option<i64>, i64) = (
        row.try_get(0).map_err(database)?,
        row.try_get(1).map_err(database)?,
        row.try_get(2).map_err(database)?,
    );
    let messages = base_at.unwrap_or(0) + own;
    if at > messages {
        return Err(StoreError::ForkPastEnd {
            session: parent.to_owned(),
            at: branch.at,
            messages: u64::try_from(messages).unwrap_or(0),
        });
    }
    // The session whose rows hold message `at - 1`: the parent, or, when the
    // fork is within what the parent itself shares, the one it shares them
    // with (the branch then reads through one session fewer).
    let mut base = Some(parent.to_owned());
    let mut start = base_at.unwrap_or(0);
    while at <= start && base.is_some() {
        base = base_id.take();
        let Some(next) = &base else { break };
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT base_id, base_at FROM tiller_sessions WHERE id = $1{}",
            locked(backend)
        )))
        .bind(next)
        .fetch_one(&mut **tx)
        .await
        .map_err(database)?;
        base_id = row.try_get(0).map_err(database)?;
        start = row
            .try_get::<Option<i64>, _>(1)
            .map_err(database)?
            .unwrap_or(0);
    }
    let base = base.filter(|_| at > 0);
    if let Some(base) = &base {
        let depth = chain_depth(tx, base).await?;
        if depth >= MAX_BRANCH_DEPTH {
            return Err(StoreError::BranchTooDeep {
                session: parent.to_owned(),
                depth,
            });
        }
        split_at(tx, backend, base, at).await?;
    }
    let record = SessionRecord {
        branch: Some(branch.clone()),
        ..record.clone()
    };
    let sql = format!(
        "INSERT INTO tiller_sessions ({RECORD_COLUMNS}, base_id, base_at) VALUES {}",
        values(backend, 1, RECORD_COUNT + 2)
    );
    let query = bind_record(
        sqlx::query(AssertSqlSafe(sql)),
        session,
        epoch,
        &record,
        now,
    )
    .bind(base.as_deref())
    .bind(base.as_ref().map(|_| at));
    Statement {
        query,
        creates: Some(session),
    }
    .execute(tx)
    .await
}

/// How many sessions `session`'s transcript is read through, itself included.
async fn chain_depth(
    tx: &mut Transaction<'_, sqlx::Any>,
    session: &str,
) -> Result<usize, StoreError> {
    let depth = sqlx::query(AssertSqlSafe(format!(
        "{} SELECT CAST(max(depth) AS BIGINT) FROM chain",
        *TRANSCRIPT
    )))
    .bind(session)
    .fetch_one(&mut **tx)
    .await
    .map_err(database)?
    .try_get::<Option<i64>, _>(0)
    .map_err(database)?
    .unwrap_or(0);
    Ok(usize::try_from(depth).unwrap_or(usize::MAX))
}

/// Splits in two the row of `session`'s transcript whose run of messages
/// straddles message `at` (in whichever session of its chain holds it), so
/// that a row ends there; nothing when none does.
pub(super) async fn split_at(
    tx: &mut Transaction<'_, sqlx::Any>,
    backend: Backend,
    session: &str,
    at: i64,
) -> Result<(), StoreError> {
    let straddling = async |tx: &mut Transaction<'_, sqlx::Any>| {
        sqlx::query(AssertSqlSafe(format!(
            "{} SELECT session_id, seq, message_count, message FROM visible \
             WHERE seq < $2 AND seq + message_count > $2",
            *TRANSCRIPT
        )))
        .bind(session)
        .bind(at)
        .fetch_optional(&mut **tx)
        .await
        .map_err(database)
    };
    let Some(mut row) = straddling(tx).await? else {
        return Ok(());
    };
    if backend == Backend::Postgres {
        // Its owner held, the row is read again: another transaction may have
        // split it meanwhile.
        let owner: String = row.try_get(0).map_err(database)?;
        sqlx::query("SELECT id FROM tiller_sessions WHERE id = $1 FOR UPDATE")
            .bind(&owner)
            .fetch_optional(&mut **tx)
            .await
            .map_err(database)?;
        match straddling(tx).await? {
            Some(again) => row = again,
            None => return Ok(()),
        }
    }
    let (owner, seq, count, json): (String, i64, i64, String) = (
        row.try_get(0).map_err(database)?,
        row.try_get(1).map_err(database)?,
        row.try_get(2).map_err(database)?,
        row.try_get(3).map_err(database)?,
    );
    let array = format!("[{json}]");
    let messages: Vec<&serde_json::value::RawValue> = decode_run(&owner, &array, count)?;
    let kept = usize::try_from(at - seq).unwrap_or(0);
    let joined = |part: &[&serde_json::value::RawValue]| {
        part.iter()
            .map(|message| message.get())
            .collect::<Vec<_>>()
            .join(",")
    };
    sqlx::query(
        "UPDATE tiller_messages SET message_count = $3, message = $4 \
         WHERE session_id = $1 AND seq = $2",
    )
    .bind(&owner)
    .bind(seq)
    .bind(at - seq)
    .bind(joined(&messages[..kept]))
    .execute(&mut **tx)
    .await
    .map_err(database)?;
    sqlx::query(
        "INSERT INTO tiller_messages (session_id, seq, message_count, message) \
         VALUES ($1, $2, $3, $4)",
    )
    .bind(&owner)
    .bind(at)
    .bind(count - (at - seq))
    .bind(joined(&messages[kept..]))
    .execute(&mut **tx)
    .await
    .map_err(database)?;
    Ok(())
}

/// Hands the rows of `session` from message `from` on that its branches
/// still read to a kept session, which takes `session`'s place in their
/// chain, before `session` drops them (a truncation from `from`, or, from 0,
/// its deletion). A row must not straddle `from` ([`split_at`] first).
pub(super) async fn hand_over(
    tx: &mut Transaction<'_, sqlx::Any>,
    session: &str,
    from: i64,
    now: i64,
) -> Result<(), StoreError> {
    let read_to: Option<i64> = sqlx::query(
        "SELECT CAST(max(base_at) AS BIGINT) FROM tiller_sessions WHERE base_id = $1 AND base_at > $2",
    )
    .bind(session)
    .bind(from)
    .fetch_one(&mut **tx)
    .await
    .map_err(database)?
    .try_get(0)
    .map_err(database)?;
    let Some(read_to) = read_to else {
        return Ok(());
    };
    let row = sqlx::query("SELECT base_id, base_at FROM tiller_sessions WHERE id = $1")
        .bind(session)
        .fetch_one(&mut **tx)
        .await
        .map_err(database)?;
    let (base_id, base_at): (Option<String>, Option<i64>) = (
        row.try_get(0).map_err(database)?,
        row.try_get(1).map_err(database)?,
    );
    // Past its own first message, the kept rows go on from `session`'s (its
    // branches then read through one session more); otherwise they take its
    // place in the chain.
    let (kept_base, kept_at) = if from > base_at.unwrap_or(0) {
        let depth = chain_depth(tx, session).await?;
        if depth + 2 > MAX_BRANCH_DEPTH {
            return Err(StoreError::BranchTooDeep {
                session: session.to_owned(),
                depth,
            });
        }
        (Some(session.to_owned()), Some(from))
    } else {
        (base_id, base_at)
    };
    // A control character: no id a client may send.
    let kept = format!("\u{1}kept/{}", tiller_ai::new_id());
    sqlx::query(
        "INSERT INTO tiller_sessions (id, definition, status, created_at, updated_at, epoch, hidden, base_id, base_at) \
         VALUES ($1, 'null', 'closed', $2, $2, 0, 1, $3, $4)",
    )
    .bind(&kept)
    .bind(now)
    .bind(kept_base.as_deref())
    .bind(kept_at)
    .execute(&mut **tx)
    .await
    .map_err(database)?;
    sqlx::query(
        "UPDATE tiller_messages SET session_id = $1 WHERE session_id = $2 AND seq >= $3 AND seq < $4",
    )
    .bind(&kept)
    .bind(session)
    .bind(from)
    .bind(read_to)
    .execute(&mut **tx)
    .await
    .map_err(database)?;
    // The kept rows' files: named by the kept session too.
    sqlx::query(
        "INSERT INTO tiller_file_refs (file_id, session_id) \
         SELECT file_id, $1 FROM tiller_file_refs WHERE session_id = $2 \
         ON CONFLICT (file_id, session_id) DO NOTHING",
    )
    .bind(&kept)
    .bind(session)
    .execute(&mut **tx)
    .await
    .map_err(database)?;
    sqlx::query("UPDATE tiller_sessions SET base_id = $1 WHERE base_id = $2 AND base_at > $3")
        .bind(&kept)
        .bind(session)
        .bind(from)
        .execute(&mut **tx)
        .await
        .map_err(database)?;
    Ok(())
}

/// [`hand_over`]s from 0 the rows of every session `which` (an SQL condition
/// on `tiller_sessions`, its values bound by `bind`) picks that branches
/// read, before those sessions are deleted.
pub(super) async fn hand_all_over<'q>(
    tx: &mut Transaction<'_, sqlx::Any>,
    backend: Backend,
    which: &str,
    bind: impl Fn(Query<'q>) -> Query<'q>,
) -> Result<(), StoreError> {
    let now = crate::types::now();
    if backend == Backend::Postgres {
        // Held until deleted: a fork of one of them made meanwhile waits, and
        // then finds it gone, or is seen here.
        let sql = format!("SELECT id FROM tiller_sessions WHERE {which} FOR UPDATE");
        bind(sqlx::query(AssertSqlSafe(sql)))
            .fetch_all(&mut **tx)
            .await
            .map_err(database)?;
    }
    // A session handed over may be read by the kept session of another that
    // is: until none is read.
    for _ in 0..=MAX_BRANCH_DEPTH {
        let sql = format!(
            "SELECT id FROM tiller_sessions WHERE {which} AND hidden = 0 AND EXISTS \
             (SELECT 1 FROM tiller_sessions b WHERE b.base_id = tiller_sessions.id)"
        );
        let read: Vec<String> = bind(sqlx::query(AssertSqlSafe(sql)))
            .fetch_all(&mut **tx)
            .await
            .map_err(database)?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(database)?;
        if read.is_empty() {
            break;
        }
        for session in &read {
            hand_over(tx, session, 0, now).await?;
        }
    }
    Ok(())
}

/// A query of `sqlx`'s `Any` driver.
type Query<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// Drops the kept sessions no branch reads any more, with their rows (and
/// those the dropping leaves unread in turn).
pub(super) async fn drop_unread(tx: &mut Transaction<'_, sqlx::Any>) -> Result<(), StoreError> {
    const UNREAD: &str = "SELECT id FROM tiller_sessions WHERE hidden = 1 AND NOT EXISTS \
         (SELECT 1 FROM tiller_sessions b WHERE b.base_id = tiller_sessions.id)";
    for _ in 0..MAX_BRANCH_DEPTH {
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM tiller_messages WHERE session_id IN ({UNREAD})"
        )))
        .execute(&mut **tx)
        .await
        .map_err(database)?;
        let dropped = sqlx::query(
            "DELETE FROM tiller_sessions WHERE hidden = 1 AND NOT EXISTS \
             (SELECT 1 FROM tiller_sessions b WHERE b.base_id = tiller_sessions.id)",
        )
        .execute(&mut **tx)
        .await
        .map_err(database)?
        .rows_affected();
        if dropped == 0 {
            break;
        }
    }
    Ok(())
}
