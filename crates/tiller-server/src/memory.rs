//! A user's memory as a resource: what agents with `memory` keep of them across
//! sessions (see `tiller::agents::MemoryConfig`), read and deleted by the user.
//!
//! - `GET /memory`: the working-memory document and a page of the facts, oldest
//!   first (`offset`, `limit`); read page after page, it is the user's whole
//!   memory, as an export.
//! - `DELETE /memory`: every fact and the working memory.
//! - `DELETE /memory/{id}`: one fact.
//!
//! Whose memory: the caller's user, within its tenant. A caller whose token (or
//! trusted `X-User-Id`) names no user names one with `user_id`; a caller that is
//! a user cannot name another.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use tiller::store::{Memory, MemoryOwner};

use crate::Shared;
use crate::error::Problem;
use crate::sessions::{page_size, query};
use crate::tenants::Caller;

/// Whose memory, and which page of its facts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MemoryQuery {
    user_id: Option<String>,
    #[serde(default)]
    offset: u64,
    limit: Option<u32>,
}

/// `GET /memory`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct MemoryView {
    user_id: String,
    working_memory: Option<String>,
    memories: Vec<Memory>,
}

/// `DELETE /memory`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct Forgotten {
    forgotten: u64,
}

/// The memory `caller` asks for with `user_id`.
fn owner(caller: &Caller, user_id: Option<String>) -> Result<MemoryOwner, Problem> {
    let user = match (caller.context.user_id(), user_id) {
        (Some(own), Some(asked)) if own != asked => {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "a user reads and deletes their own memory only",
            ));
        }
        (Some(own), _) if !own.is_empty() => own.to_owned(),
        (_, Some(asked)) if !asked.is_empty() && asked.len() <= tiller::runtime::MAX_ID_BYTES => {
            asked
        }
        (_, Some(_)) => {
            return Err(Problem::invalid(
                Some("user_id".to_owned()),
                format!("a user id is 1 to {} bytes", tiller::runtime::MAX_ID_BYTES),
            ));
        }
        (_, None) => {
            return Err(Problem::invalid(
                Some("user_id".to_owned()),
                "memory is kept per user: name one with `user_id` (the caller's token names none)",
            ));
        }
    };
    Ok(MemoryOwner::new(
        caller.context.tenant_id_or_default(),
        user,
    ))
}

pub(crate) async fn get(
    State(shared): State<Arc<Shared>>,
    asked: Result<Query<MemoryQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<MemoryView>, Problem> {
    let caller = shared.caller(&headers)?;
    let asked = query(asked)?;
    let limit = page_size(asked.limit)?;
    let owner = owner(&caller, asked.user_id)?;
    let store = shared.supervisor.store();
    Ok(Json(MemoryView {
        working_memory: store.working_memory(&owner).await?,
        memories: store.memories(&owner, asked.offset, limit).await?,
        user_id: owner.user,
    }))
}

pub(crate) async fn delete_all(
    State(shared): State<Arc<Shared>>,
    asked: Result<Query<MemoryQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<Forgotten>, Problem> {
    let caller = shared.caller(&headers)?;
    let owner = owner(&caller, query(asked)?.user_id)?;
    let forgotten = shared.supervisor.store().forget(&owner, None).await?;
    Ok(Json(Forgotten { forgotten }))
}

pub(crate) async fn delete_one(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    asked: Result<Query<MemoryQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let caller = shared.caller(&headers)?;
    let owner = owner(&caller, query(asked)?.user_id)?;
    match shared.supervisor.store().forget(&owner, Some(&id)).await? {
        0 => Err(Problem::new(
            StatusCode::NOT_FOUND,
            "unknown-memory",
            format!("the user has no memory `{id}`"),
        )),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}
