//! Files kept once per store, by content address.
//!
//! A file in a message ([`FileContent`]) is stored by the SHA-256 of its bytes:
//! the transcript's row names it (`sha256:<hex>` in place of the base64 data)
//! and the bytes are kept once in the store's table of files, however many
//! messages, sessions or branches carry them. Loading a transcript puts the
//! bytes back, reading each file once.
//!
//! A file can also be stored on its own ([`SessionStore::put_file`](crate::SessionStore::put_file),
//! `POST /files` over HTTP) and named by its id in a later prompt. Those
//! uploads belong to a tenant: another tenant cannot read them by id.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use std::{borrow::Cow, collections::HashMap};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use base64::{Engine, engine::general_purpose::STANDARD};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tiller_ai::FileContent;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use tiller_ai::{Content, Message};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use tiller_core::AgentMessage;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::StoreError;

/// How a stored file's id begins: `sha256:` and the 64 hex digits of its bytes'
/// SHA-256. A base64 text never holds `:`, so an id is never data.
pub const FILE_ID_PREFIX: &str = "sha256:";

/// The most files one tenant stores on its own
/// ([`SessionStore::put_file`](crate::SessionStore::put_file)); past it,
/// [`StoreError::TooManyFiles`](crate::StoreError::TooManyFiles).
pub const MAX_UPLOADS: u64 = 10_000;

/// A file stored on its own: what [`SessionStore::put_file`](crate::SessionStore::put_file)
/// answers and `POST /files` returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredFile {
    /// Its content address, `sha256:<hex>`: the id a prompt names.
    pub id: String,
    /// Its name, as last stored.
    pub name: String,
    /// Its media type.
    pub mime_type: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was first stored, in milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// The id of a file of `bytes`: `sha256:` and its SHA-256 in hex.
pub fn file_id(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut id = String::with_capacity(FILE_ID_PREFIX.len() + 64);
    id.push_str(FILE_ID_PREFIX);
    for byte in digest {
        id.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        id.push(char::from(b"0123456789abcdef"[usize::from(byte & 15)]));
    }
    id
}

/// Whether `id` has the form of a file id (`sha256:` and 64 lower-case hex digits).
pub fn is_file_id(id: &str) -> bool {
    id.strip_prefix(FILE_ID_PREFIX).is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// What a batch's messages hold of files, gathered while they are encoded:
/// each file's bytes by id, and which sessions name which files.
#[derive(Debug, Default)]
pub(crate) struct Blobs {
    pub(crate) bytes: HashMap<String, Vec<u8>>,
    pub(crate) named: std::collections::HashSet<(String, String)>,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// The content blocks of a message that can hold files: a user's message and a
/// tool's result.
fn blocks(message: &AgentMessage) -> &[Content] {
    match message {
        AgentMessage::Llm(Message::User(user)) => &user.content,
        AgentMessage::Llm(Message::ToolResult(result)) => &result.content,
        _ => &[],
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn blocks_mut(message: &mut AgentMessage) -> &mut [Content] {
    match message {
        AgentMessage::Llm(Message::User(user)) => &mut user.content,
        AgentMessage::Llm(Message::ToolResult(result)) => &mut result.content,
        _ => &mut [],
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// `message` of `session` as stored: each file's data replaced by its id, its
/// bytes added to `blobs`. Borrowed as it is when it holds no file. A file
/// whose data is not base64 (an id among them: a message in memory always
/// holds its files' bytes) is a [`StoreError::InvalidFile`].
pub(crate) fn by_reference<'m>(
    message: &'m AgentMessage,
    session: &str,
    blobs: &mut Blobs,
) -> Result<Cow<'m, AgentMessage>, StoreError> {
    if !blocks(message)
        .iter()
        .any(|block| matches!(block, Content::File(_)))
    {
        return Ok(Cow::Borrowed(message));
    }
    let mut stored = message.clone();
    for block in blocks_mut(&mut stored) {
        let Content::File(file) = block else { continue };
        let bytes = STANDARD.decode(&file.data).map_err(|_| {
            StoreError::InvalidFile(format!("the data of {} is not base64", file.name))
        })?;
        let id = file_id(&bytes);
        blobs.bytes.entry(id.clone()).or_insert(bytes);
        blobs.named.insert((session.to_owned(), id.clone()));
        file.data = id;
    }
    Ok(Cow::Owned(stored))
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// The ids of the files `messages` name in place of their data.
pub(crate) fn referenced<'m>(messages: impl IntoIterator<Item = &'m AgentMessage>) -> Vec<String> {
    let mut ids: Vec<String> = messages
        .into_iter()
        .flat_map(blocks)
        .filter_map(|block| match block {
            Content::File(file) if is_file_id(&file.data) => Some(file.data.clone()),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// Puts each file's data back in `message` from `found` (base64 by id); a file
/// whose bytes are missing is a [`StoreError::Corrupt`] of `session`.
pub(crate) fn restore(
    session: &str,
    message: &mut AgentMessage,
    found: &HashMap<String, String>,
) -> Result<(), StoreError> {
    for block in blocks_mut(message) {
        let Content::File(file) = block else { continue };
        if !is_file_id(&file.data) {
            continue;
        }
        let data = found.get(&file.data).ok_or_else(|| StoreError::Corrupt {
            session: session.to_owned(),
            detail: format!("the file {} ({}) is not in the store", file.name, file.data),
        })?;
        file.data.clone_from(data);
    }
    Ok(())
}

/// The [`StoredFile`] of `file`, first stored `created_at`.
pub(crate) fn described(id: String, file: &FileContent, created_at: i64) -> StoredFile {
    StoredFile {
        id,
        name: file.name.clone(),
        mime_type: file.mime_type.clone(),
        size: file.size() as u64,
        created_at,
    }
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
mod tests {
    use tiller_ai::UserMessage;

    use super::*;

    #[test]
    fn a_file_is_stored_by_its_id_and_put_back_whole() {
        let pdf = FileContent::from_bytes("report.pdf", b"%PDF-1.4 report").unwrap();
        let message = AgentMessage::Llm(UserMessage::text("read").with_file(pdf.clone()).into());
        let mut blobs = Blobs::default();
        let stored = by_reference(&message, "s", &mut blobs)
            .unwrap()
            .into_owned();
        let id = file_id(b"%PDF-1.4 report");
        assert!(is_file_id(&id));
        assert_eq!(
            blobs.bytes.get(&id).map(Vec::as_slice),
            Some(&b"%PDF-1.4 report"[..])
        );
        assert!(blobs.named.contains(&("s".to_owned(), id.clone())));
        // An id in place of the bytes is not a message's: refused.
        assert!(matches!(
            by_reference(&stored, "s", &mut blobs),
            Err(StoreError::InvalidFile(_))
        ));
        assert_eq!(referenced([&stored]), vec![id.clone()]);
        assert!(!serde_json::to_string(&stored).unwrap().contains(&pdf.data));

        let mut back = stored.clone();
        let found = HashMap::from([(id, pdf.data.clone())]);
        restore("s", &mut back, &found).unwrap();
        assert_eq!(back, message);

        let mut lost = stored;
        assert!(matches!(
            restore("s", &mut lost, &HashMap::new()),
            Err(StoreError::Corrupt { session, .. }) if session == "s"
        ));
    }

    #[test]
    fn a_message_without_files_is_borrowed() {
        let message = AgentMessage::user("hi");
        assert!(matches!(
            by_reference(&message, "s", &mut Blobs::default()).unwrap(),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn only_the_whole_form_is_an_id() {
        let id = file_id(b"x");
        assert!(is_file_id(&id));
        assert!(!is_file_id(&id[..id.len() - 1]));
        assert!(!is_file_id(&id.to_uppercase()));
        assert!(!is_file_id("JVBERi0xLjQ="));
    }
}
