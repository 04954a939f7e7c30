//! Files stored on their own, to be named in prompts by id.
//!
//! - `POST /files`: `{name, mime_type, data}` (the data base64, within the body
//!   limit, and at most [`MAX_FILE_BYTES`](tiller::ai::MAX_FILE_BYTES) once
//!   decoded) is kept in the session store by its content address and
//!   answered 201 with `{id, name, mime_type, size, created_at}`. The same
//!   bytes sent again give the same id.
//! - `DELETE /files/{id}`: forgets the caller's file (conversations that carry
//!   it keep it).
//! - A prompt names a stored file as `files: [{"id": "sha256:…"}]`.
//!
//! Files belong to the caller's tenant: another tenant cannot name them.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use serde::Deserialize;
use tiller::ai::{FileContent, FileError, media_type_of};
use tiller::store::{StoredFile, is_file_id};

use crate::Shared;
use crate::error::{Problem, decode};
use crate::tenants::Caller;

/// A file in a prompt or `POST /files`: sent whole (`{name, mime_type, data}`,
/// the media type found from the name's extension when left out) or, in a
/// prompt, named by the id `POST /files` gave it (`{id}`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FilePart {
    id: Option<String>,
    name: Option<String>,
    mime_type: Option<String>,
    data: Option<String>,
}

impl FilePart {
    /// The file whole, checked: a stored one read from the store for
    /// `caller`'s tenant. A bad file, or an id the tenant has not stored, is a
    /// 422 at `field`.
    pub(crate) async fn resolve(
        self,
        shared: &Shared,
        caller: &Caller,
        field: &str,
    ) -> Result<FileContent, Problem> {
        let invalid = |detail: String| Problem::invalid(Some(field.to_owned()), detail);
        let file = match self {
            FilePart {
                id: Some(id),
                name: None,
                mime_type: None,
                data: None,
            } => {
                let tenant = caller.context.tenant_id_or_default();
                let stored = match is_file_id(&id) {
                    true => shared.supervisor.store().file(tenant, &id).await?,
                    false => None,
                };
                stored.ok_or_else(|| invalid(format!("no stored file `{id}` (see POST /files)")))?
            }
            FilePart { id: Some(_), .. } => {
                return Err(invalid(
                    "a file is `{id}` (stored) or `{name, mime_type, data}`, not both".to_owned(),
                ));
            }
            FilePart {
                id: None,
                name: Some(name),
                mime_type,
                data: Some(data),
            } => {
                let mime_type = match mime_type {
                    Some(mime_type) => mime_type,
                    None => media_type_of(&name)
                        .ok_or_else(|| {
                            invalid(FileError::UnknownType { name: name.clone() }.to_string())
                        })?
                        .to_owned(),
                };
                FileContent {
                    data,
                    mime_type,
                    name,
                }
            }
            FilePart { id: None, .. } => {
                return Err(invalid(
                    "a file is `{id}` (stored) or `{name, mime_type, data}` (data base64)"
                        .to_owned(),
                ));
            }
        };
        file.validate()
            .map_err(|error| invalid(error.to_string()))?;
        Ok(file)
    }
}

pub(crate) async fn create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<StoredFile>), Problem> {
    let caller = shared.caller(&headers)?;
    let part: FilePart = decode(body)?;
    if part.id.is_some() {
        return Err(Problem::invalid(
            Some("id".to_owned()),
            "a file's id is its content address: send `{name, mime_type, data}`",
        ));
    }
    let file = part.resolve(&shared, &caller, "data").await?;
    let tenant = caller.context.tenant_id_or_default();
    let stored = shared.supervisor.store().put_file(tenant, &file).await?;
    Ok((StatusCode::CREATED, Json(stored)))
}

pub(crate) async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, Problem> {
    let caller = shared.caller(&headers)?;
    let tenant = caller.context.tenant_id_or_default();
    match shared.supervisor.store().delete_file(tenant, &id).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(Problem::new(
            StatusCode::NOT_FOUND,
            "unknown-file",
            format!("no stored file `{id}`"),
        )),
    }
}
