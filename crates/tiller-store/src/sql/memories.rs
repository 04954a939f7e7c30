//! Users' memory in SQL: `tiller_memories` holds the facts, searched through
//! SQLite's FTS5 table `tiller_memories_fts` (kept by triggers, Porter
//! stemming) or PostgreSQL's full-text search (each fact's `english` words
//! stored beside it, under a GIN index);
//! `tiller_working_memory` holds each user's document,
//! `tiller_memory_counts` how many facts each user holds (the bound, checked
//! without counting), and `tiller_memory_vectors` the facts' embeddings,
//! ranked by sqlite-vec on SQLite and in Tiller from PostgreSQL.
//!
//! A query reaches the search syntax only as [`search_terms`]: words of letters
//! and digits, quoted for FTS5, joined with `OR` (`|`), so any word found
//! counts and the best ranked come first.

use std::collections::HashMap;

use futures::TryStreamExt;
use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Connection, Row};

use super::{Backend, SqlStore, database};
use crate::types::now;
use crate::user_memory::best;
use crate::{
    Embedding, MAX_MEMORIES, MAX_MEMORY_PAGE, MAX_RECALLED, Memory, MemoryOwner, StoreError,
    check_memory, check_working_memory, search_terms,
};

impl SqlStore {
    pub(super) async fn read_working_memory(
        &self,
        owner: &MemoryOwner,
    ) -> Result<Option<String>, StoreError> {
        sqlx::query("SELECT text FROM tiller_working_memory WHERE tenant = $1 AND user_id = $2")
            .bind(&owner.tenant)
            .bind(&owner.user)
            .fetch_optional(&self.pool)
            .await
            .map_err(database)?
            .map(|row| row.try_get(0).map_err(database))
            .transpose()
    }

    pub(super) async fn write_working_memory(
        &self,
        owner: &MemoryOwner,
        text: &str,
    ) -> Result<(), StoreError> {
        check_working_memory(text)?;
        let query = if text.is_empty() {
            sqlx::query("DELETE FROM tiller_working_memory WHERE tenant = $1 AND user_id = $2")
                .bind(&owner.tenant)
                .bind(&owner.user)
        } else {
            sqlx::query(
                "INSERT INTO tiller_working_memory (tenant, user_id, text, updated_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, user_id) \
                 DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
            )
            .bind(&owner.tenant)
            .bind(&owner.user)
            .bind(text)
            .bind(now())
        };
        self.write_aside(text.len(), async |connection| {
            query.execute(&mut *connection).await.map_err(database)
        })
        .await?;
        Ok(())
    }

    pub(super) async fn insert_memory(
        &self,
        owner: &MemoryOwner,
        text: &str,
        embedding: Option<&Embedding>,
    ) -> Result<Memory, StoreError> {
        check_memory(text)?;
        let memory = Memory {
            id: tiller_ai::new_id(),
            text: text.to_owned(),
            created_at: now(),
        };
        let vector = embedding.map(Embedding::to_bytes);
        let bytes = text.len() * 4 + vector.as_ref().map_or(0, Vec::len);
        self.write_aside(bytes, async |connection| {
            self.insert_on(
                connection,
                owner,
                &memory,
                embedding.map(Embedding::model),
                vector,
            )
            .await
        })
        .await?;
        Ok(memory)
    }

    /// Inserts `memory` for `owner` on `connection`, within the bound, with its
    /// embedding (the model's name and the vector's bytes) if it has one.
    async fn insert_on(
        &self,
        connection: &mut sqlx::AnyConnection,
        owner: &MemoryOwner,
        memory: &Memory,
        model: Option<&str>,
        vector: Option<Vec<u8>>,
    ) -> Result<(), StoreError> {
        let mut tx = connection.begin().await.map_err(database)?;
        // The count first, a write from the start: it takes the owner's row
        // (SQLite's write lock; PostgreSQL's row lock), so no two inserts pass
        // the bound, and SQLite never has to upgrade a read to a write.
        let counted = sqlx::query(
            "INSERT INTO tiller_memory_counts (tenant, user_id, facts) VALUES ($1, $2, 1) \
             ON CONFLICT (tenant, user_id) DO UPDATE SET facts = tiller_memory_counts.facts + 1 \
             WHERE tiller_memory_counts.facts < $3",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(i64::try_from(MAX_MEMORIES).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(database)?
        .rows_affected();
        if counted == 0 {
            return Err(StoreError::TooManyMemories {
                limit: MAX_MEMORIES,
            });
        }
        sqlx::query(
            "INSERT INTO tiller_memories (id, tenant, user_id, text, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&memory.id)
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(&memory.text)
        .bind(memory.created_at)
        .execute(&mut *tx)
        .await
        .map_err(database)?;
        if let (Some(model), Some(vector)) = (model, vector) {
            sqlx::query(
                "INSERT INTO tiller_memory_vectors (memory_id, tenant, user_id, model, embedding) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&memory.id)
            .bind(&owner.tenant)
            .bind(&owner.user)
            .bind(model)
            .bind(vector)
            .execute(&mut *tx)
            .await
            .map_err(database)?;
        }
        tx.commit().await.map_err(database)
    }

    pub(super) async fn search_memories(
        &self,
        owner: &MemoryOwner,
        query: &str,
        limit: u32,
    ) -> Result<Vec<Memory>, StoreError> {
        let terms = search_terms(query);
        if terms.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::from(limit.min(MAX_RECALLED));
        let (sql, search) = match self.backend {
            Backend::Sqlite => (
                // CROSS JOIN: SQLite reads the index's matches first, then
                // each one's row (not every row of the owner, each asked
                // whether it matches).
                "SELECT m.id, m.text, m.created_at FROM tiller_memories_fts AS f \
                 CROSS JOIN tiller_memories AS m ON m.seq = f.rowid \
                 WHERE tiller_memories_fts MATCH $3 AND m.tenant = $1 AND m.user_id = $2 \
                 ORDER BY bm25(tiller_memories_fts), m.created_at DESC LIMIT $4",
                terms
                    .iter()
                    .map(|term| format!("\"{term}\""))
                    .collect::<Vec<_>>()
                    .join(" OR "),
            ),
            Backend::Postgres => (
                "SELECT id, text, created_at FROM tiller_memories \
                 WHERE tenant = $1 AND user_id = $2 \
                 AND words @@ to_tsquery('english', $3) \
                 ORDER BY ts_rank(words, to_tsquery('english', $3)) DESC, \
                 created_at DESC LIMIT $4",
                terms.join(" | "),
            ),
        };
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(&owner.tenant)
            .bind(&owner.user)
            .bind(search)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(database)?;
        rows.iter().map(memory_of).collect()
    }

    /// The facts of `owner` with an embedding of `query`'s model, most alike
    /// first. SQLite ranks them itself (sqlite-vec's `vec_distance_cosine`);
    /// from PostgreSQL (no pgvector) every such embedding is read as it
    /// streams and ranked here, keeping the best `limit`, then their texts.
    pub(super) async fn similar_memories(
        &self,
        owner: &MemoryOwner,
        query: &Embedding,
        limit: u32,
    ) -> Result<Vec<Memory>, StoreError> {
        let limit = limit.min(MAX_RECALLED);
        if limit == 0 {
            return Ok(Vec::new());
        }
        if self.backend == Backend::Sqlite {
            let vector = query.to_bytes();
            let rows = sqlx::query(
                "SELECT m.id, m.text, m.created_at FROM \
                 (SELECT memory_id, vec_distance_cosine(embedding, $5) AS distance \
                  FROM tiller_memory_vectors \
                  WHERE tenant = $1 AND user_id = $2 AND model = $3 AND length(embedding) = $4 \
                  ORDER BY distance LIMIT $6) AS v \
                 JOIN tiller_memories AS m ON m.id = v.memory_id \
                 ORDER BY v.distance, m.created_at DESC",
            )
            .bind(&owner.tenant)
            .bind(&owner.user)
            .bind(query.model())
            .bind(vector.len() as i64)
            .bind(vector)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(database)?;
            return rows.iter().map(memory_of).collect();
        }
        let mut rows = sqlx::query(
            "SELECT memory_id, embedding FROM tiller_memory_vectors \
             WHERE tenant = $1 AND user_id = $2 AND model = $3",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(query.model())
        .fetch(&self.pool);
        let mut scored = Vec::new();
        let mut vector = Vec::with_capacity(query.vector().len());
        while let Some(row) = rows.try_next().await.map_err(database)? {
            let stored: Vec<u8> = row.try_get(1).map_err(database)?;
            if stored.len() != query.vector().len() * 4 {
                continue;
            }
            vector.clear();
            vector.extend(Embedding::vector_of(&stored));
            let score = Embedding::similarity(query.vector(), &vector);
            scored.push((score, row.try_get::<String, _>(0).map_err(database)?));
            if scored.len() >= 4 * MAX_RECALLED as usize {
                scored = best(scored.into_iter(), limit);
            }
        }
        let ranked = best(scored.into_iter(), limit);
        if ranked.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT id, text, created_at FROM tiller_memories \
             WHERE tenant = $1 AND user_id = $2 AND id IN ({})",
            (3..3 + ranked.len())
                .map(|at| format!("${at}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut texts = sqlx::query(AssertSqlSafe(sql))
            .bind(&owner.tenant)
            .bind(&owner.user);
        for (_, id) in &ranked {
            texts = texts.bind(id.as_str());
        }
        let mut found: HashMap<String, Memory> = texts
            .fetch_all(&self.pool)
            .await
            .map_err(database)?
            .iter()
            .map(|row| memory_of(row).map(|memory| (memory.id.clone(), memory)))
            .collect::<Result<_, _>>()?;
        Ok(ranked
            .into_iter()
            .filter_map(|(_, id)| found.remove(&id))
            .collect())
    }

    pub(super) async fn page_memories(
        &self,
        owner: &MemoryOwner,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<Memory>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, text, created_at FROM tiller_memories WHERE tenant = $1 AND user_id = $2 \
             ORDER BY created_at, id LIMIT $3 OFFSET $4",
        )
        .bind(&owner.tenant)
        .bind(&owner.user)
        .bind(i64::from(limit.min(MAX_MEMORY_PAGE)))
        .bind(i64::try_from(offset).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(database)?;
        rows.iter().map(memory_of).collect()
    }

    pub(super) async fn delete_memories(
        &self,
        owner: &MemoryOwner,
        id: Option<&str>,
    ) -> Result<u64, StoreError> {
        self.write_aside(0, async |connection| {
            self.delete_on(connection, owner, id).await
        })
        .await
    }

    /// Deletes `owner`'s fact `id` (every one, and the working memory, when
    /// `None`) on `connection`; how many facts went.
    async fn delete_on(
        &self,
        connection: &mut sqlx::AnyConnection,
        owner: &MemoryOwner,
        id: Option<&str>,
    ) -> Result<u64, StoreError> {
        let mut tx = connection.begin().await.map_err(database)?;
        let deleted = match id {
            Some(id) => {
                sqlx::query(
                    "DELETE FROM tiller_memory_vectors \
                     WHERE tenant = $1 AND user_id = $2 AND memory_id = $3",
                )
                .bind(&owner.tenant)
                .bind(&owner.user)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(database)?;
                let deleted = sqlx::query(
                    "DELETE FROM tiller_memories WHERE tenant = $1 AND user_id = $2 AND id = $3",
                )
                .bind(&owner.tenant)
                .bind(&owner.user)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(database)?
                .rows_affected();
                sqlx::query(
                    "UPDATE tiller_memory_counts SET facts = facts - $3 \
                     WHERE tenant = $1 AND user_id = $2",
                )
                .bind(&owner.tenant)
                .bind(&owner.user)
                .bind(i64::try_from(deleted).unwrap_or(0))
                .execute(&mut *tx)
                .await
                .map_err(database)?;
                deleted
            }
            None => {
                for table in [
                    "tiller_working_memory",
                    "tiller_memory_counts",
                    "tiller_memory_vectors",
                ] {
                    sqlx::query(AssertSqlSafe(format!(
                        "DELETE FROM {table} WHERE tenant = $1 AND user_id = $2"
                    )))
                    .bind(&owner.tenant)
                    .bind(&owner.user)
                    .execute(&mut *tx)
                    .await
                    .map_err(database)?;
                }
                sqlx::query("DELETE FROM tiller_memories WHERE tenant = $1 AND user_id = $2")
                    .bind(&owner.tenant)
                    .bind(&owner.user)
                    .execute(&mut *tx)
                    .await
                    .map_err(database)?
                    .rows_affected()
            }
        };
        tx.commit().await.map_err(database)?;
        Ok(deleted)
    }
}

/// A row of `id, text, created_at`.
fn memory_of(row: &AnyRow) -> Result<Memory, StoreError> {
    Ok(Memory {
        id: row.try_get(0).map_err(database)?,
        text: row.try_get(1).map_err(database)?,
        created_at: row.try_get(2).map_err(database)?,
    })
}
