//! [`MemoryStore`]: sessions in the process's memory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::future::{BoxFuture, ready};
use tiller_ai::FileContent;
use tiller_core::{AgentMessage, Spent};

use crate::files::{MAX_UPLOADS, described, file_id};
use crate::types::{
    Branch, Change, MAX_OP_KEYS, QueueKind, Queued, SessionFilter, SessionInfo, SessionRecord,
    SessionWrite, SpendScope, StoredSession, now,
};
use crate::user_memory::Memories;
use crate::{Embedding, Memory, MemoryOwner, SessionStore, StoreError, StoredFile};

/// Sessions kept in memory: what the library uses when no other store is given.
/// They live as long as the store; clones share them.
#[derive(Clone, Default)]
pub struct MemoryStore {
    /// Boxed: the map's table, sized ahead of its sessions, holds a pointer
    /// for each rather than a whole session.
    sessions: Arc<Mutex<HashMap<Arc<str>, Box<Session>>>>,
    /// What each scope spent, by [`SpendScope::key`].
    spending: Arc<Mutex<HashMap<String, Spent>>>,
    /// The users' memory.
    memories: Arc<Mutex<Memories>>,
    /// The latest slot claimed of each schedule.
    slots: Arc<Mutex<HashMap<String, i64>>>,
    /// Files stored on their own, by tenant and id, with their data.
    files: Arc<Mutex<Uploads>>,
}

/// Files stored on their own: by tenant and id, each with its base64 data.
type Uploads = HashMap<(String, String), (StoredFile, String)>;

struct Session {
    /// The row (its definition shared with the agent's other sessions).
    record: SessionRecord,
    messages: Transcript,
    /// Queued messages by queue number.
    queued: BTreeMap<u64, (QueueKind, AgentMessage)>,
    /// The newest idempotency keys, oldest first, at most [`MAX_OP_KEYS`].
    op_keys: VecDeque<Arc<str>>,
}

/// A session's messages: a branch's first ones shared with the session it
/// was forked from, then its own.
#[derive(Default)]
struct Transcript {
    /// What is shared, or (in a session forked from) kept to be shared.
    shared: Option<Box<Shared>>,
    /// Its own messages, after the shared ones.
    own: Vec<Arc<AgentMessage>>,
}

/// The messages a branch shares, and those its own branches will.
#[derive(Default)]
struct Shared {
    /// The first `len` of `base` begin the transcript.
    base: Arc<[Arc<AgentMessage>]>,
    len: usize,
    /// The whole transcript as it stood when it was last forked, which the
    /// next forks share while it stays so.
    frozen: Option<Arc<[Arc<AgentMessage>]>>,
}

impl Transcript {
    fn shared(&self) -> &[Arc<AgentMessage>] {
        self.shared
            .as_ref()
            .map_or(&[], |shared| &shared.base[..shared.len])
    }

    fn len(&self) -> usize {
        self.shared().len() + self.own.len()
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<AgentMessage>> {
        self.shared().iter().chain(&self.own)
    }

    /// The snapshot forks share is no more what the transcript holds from
    /// `from` on.
    fn changed_from(&mut self, from: usize) {
        if let Some(shared) = &mut self.shared
            && shared
                .frozen
                .as_ref()
                .is_some_and(|frozen| frozen.len() > from)
        {
            shared.frozen = None;
        }
    }

    /// Puts `message` at `seq`: in place of the one there, or at the end.
    fn set(&mut self, seq: usize, message: Arc<AgentMessage>) {
        self.changed_from(seq);
        let shared = self.shared().len();
        if seq < shared {
            // A shared message replaced: the branch keeps copies of them.
            let mut own: Vec<_> = self.shared().to_vec();
            own.append(&mut self.own);
            self.own = own;
            self.shared = None;
            return self.set(seq, message);
        }
        match self.own.get_mut(seq - shared) {
            Some(slot) => *slot = message,
            None => self.own.push(message),
        }
    }

    fn truncate(&mut self, from: usize) {
        self.changed_from(from);
        let shared = self.shared().len();
        if from < shared {
            if let Some(shared) = &mut self.shared {
                shared.len = from;
            }
            self.own.clear();
        } else {
            self.own.truncate(from - shared);
        }
    }

    /// A branch's transcript: the first `at` messages, shared.
    fn fork(&mut self, at: usize) -> Transcript {
        let shared = self.shared.get_or_insert_default();
        let frozen = match &shared.frozen {
            Some(frozen) if frozen.len() >= at => frozen.clone(),
            _ => {
                let base = &shared.base[..shared.len];
                let frozen: Arc<[_]> = base.iter().chain(&self.own).cloned().collect();
                shared.frozen = Some(frozen.clone());
                frozen
            }
        };
        Transcript {
            shared: Some(Box::new(Shared {
                len: at.min(frozen.len()),
                base: frozen,
                frozen: None,
            })),
            own: Vec::new(),
        }
    }
}

impl Session {
    /// The session as loaded.
    fn stored(&self) -> StoredSession {
        let queue = |kind: QueueKind| {
            self.queued
                .iter()
                .filter(|(_, (queue, _))| *queue == kind)
                .map(|(seq, (_, message))| Queued {
                    seq: *seq,
                    message: message.clone(),
                })
                .collect()
        };
        StoredSession {
            record: self.record.clone(),
            messages: self.messages.iter().cloned().collect(),
            steering: queue(QueueKind::Steering),
            follow_up: queue(QueueKind::FollowUp),
            op_keys: self.op_keys.iter().cloned().collect(),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Box<Session>>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn spending(&self) -> MutexGuard<'_, HashMap<String, Spent>> {
        self.spending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn user_memories(&self) -> MutexGuard<'_, Memories> {
        self.memories.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("sessions", &self.lock().len())
            .finish()
    }
}

/// Why `batch` cannot be applied to `sessions` as a whole, if it cannot: a
/// session created twice, a write to no session, a write at an older epoch, a
/// fork past its parent's end (as the batch's writes before it leave it).
fn refusal(
    sessions: &HashMap<Arc<str>, Box<Session>>,
    batch: &[SessionWrite],
) -> Option<StoreError> {
    let mut created = HashMap::new();
    // Transcripts' lengths as the batch changes them.
    let mut lengths: HashMap<&str, u64> = HashMap::new();
    let length = |lengths: &HashMap<&str, u64>, session: &str| {
        lengths.get(session).copied().unwrap_or_else(|| {
            sessions
                .get(session)
                .map_or(0, |found| found.messages.len() as u64)
        })
    };
    for write in batch {
        match &write.change {
            Change::Truncate { from } => {
                let cut = length(&lengths, &write.session).min(*from);
                lengths.insert(&write.session, cut);
            }
            Change::Append { seq, .. } => {
                let grown = length(&lengths, &write.session).max(seq + 1);
                lengths.insert(&write.session, grown);
            }
            _ => {}
        }
        let epoch = sessions
            .get(&write.session)
            .map(|session| session.record.epoch)
            .or_else(|| created.get(&write.session).copied());
        let refused = match (&write.change, epoch) {
            (Change::Create(_) | Change::Fork { .. }, Some(_)) => {
                StoreError::SessionExists(write.session.to_string())
            }
            (Change::Fork { parent, at, .. }, None) => match sessions.get(parent) {
                None => StoreError::NoSuchSession(parent.to_string()),
                Some(_) if length(&lengths, parent) < *at => StoreError::ForkPastEnd {
                    session: parent.to_string(),
                    at: *at,
                    messages: length(&lengths, parent),
                },
                Some(_) => {
                    created.insert(write.session.clone(), write.epoch);
                    continue;
                }
            },
            (Change::Create(_), None) => {
                created.insert(write.session.clone(), write.epoch);
                continue;
            }
            (_, None) => StoreError::NoSuchSession(write.session.to_string()),
            (_, Some(current)) if current != write.epoch => StoreError::TakenOver {
                session: write.session.to_string(),
                epoch: write.epoch,
                current,
            },
            _ => continue,
        };
        return Some(refused);
    }
    None
}

impl Session {
    /// Carries out one change of a session (a creation and a spending are
    /// made by the caller).
    fn apply(&mut self, change: &Change) {
        match change {
            Change::Create(_) | Change::Fork { .. } | Change::Spend { .. } => {}
            Change::Append {
                seq,
                message,
                dequeued,
            } => {
                self.messages
                    .set(usize::try_from(*seq).unwrap_or(usize::MAX), message.clone());
                if let Some(dequeued) = dequeued {
                    self.queued.remove(dequeued);
                }
            }
            Change::Enqueue {
                queue,
                seq,
                message,
            } => {
                self.queued.insert(*seq, (*queue, message.clone()));
            }
            Change::ClearQueue(queue) => self.queued.retain(|_, (kind, _)| kind != queue),
            Change::Dequeue(seq) => {
                self.queued.remove(seq);
            }
            Change::Truncate { from } => {
                self.messages
                    .truncate(usize::try_from(*from).unwrap_or(usize::MAX));
            }
            Change::SetDefinition(definition) => {
                self.record.definition = definition.clone();
            }
            Change::SetStatus(status) => self.record.status = *status,
            Change::SetContext(context) => self.record.context = context.clone(),
            Change::OpKey(key) => {
                if !self.op_keys.contains(key) {
                    if self.op_keys.len() == MAX_OP_KEYS {
                        self.op_keys.pop_front();
                    }
                    self.op_keys.push_back(key.clone());
                }
            }
        }
    }
}

impl SessionStore for MemoryStore {
    /// Its writes are done under a lock, at once.
    fn applies_at_once(&self) -> bool {
        true
    }

    fn apply<'a>(&'a self, batch: &'a [SessionWrite]) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut sessions = self.lock();
        // All or nothing: check every write before applying any.
        if let Some(refused) = refusal(&sessions, batch) {
            return Box::pin(ready(Err(refused)));
        }
        let now = now();
        for write in batch {
            let created = match &write.change {
                Change::Create(record) => Some((record.clone(), Transcript::default())),
                // The parent's messages, shared.
                Change::Fork { parent, at, record } => {
                    sessions.get_mut(parent).map(|parent_session| {
                        let record = SessionRecord {
                            branch: Some(Branch {
                                parent: parent.to_string(),
                                at: *at,
                            }),
                            ..record.clone()
                        };
                        let at = usize::try_from(*at).unwrap_or(usize::MAX);
                        (record, parent_session.messages.fork(at))
                    })
                }
                _ => None,
            };
            if let Some((record, messages)) = created {
                let record = SessionRecord {
                    updated_at: now,
                    epoch: write.epoch,
                    ..record
                };
                sessions.insert(
                    write.session.clone(),
                    Box::new(Session {
                        record,
                        messages,
                        queued: BTreeMap::new(),
                        op_keys: VecDeque::new(),
                    }),
                );
                continue;
            }
            if let Change::Spend { spent, tenant } = &write.change {
                let mut spending = self.spending();
                for scope in SpendScope::of(&write.session, tenant.as_deref()) {
                    *spending.entry(scope.key()).or_default() += spent;
                }
            }
            let Some(session) = sessions.get_mut(&write.session) else {
                continue;
            };
            session.record.updated_at = now;
            session.apply(&write.change);
        }
        Box::pin(ready(Ok(())))
    }

    fn working_memory<'a>(
        &'a self,
        owner: &'a MemoryOwner,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(ready(Ok(self.user_memories().working(owner))))
    }

    fn set_working_memory<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(ready(self.user_memories().set_working(owner, text)))
    }

    fn remember<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        text: &'a str,
        embedding: Option<&'a Embedding>,
    ) -> BoxFuture<'a, Result<Memory, StoreError>> {
        Box::pin(ready(self.user_memories().remember(owner, text, embedding)))
    }

    fn recall_similar<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        query: &'a Embedding,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        Box::pin(ready(Ok(self
            .user_memories()
            .recall_similar(owner, query, limit))))
    }

    fn recall<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        query: &'a str,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        Box::pin(ready(Ok(self.user_memories().recall(owner, query, limit))))
    }

    fn memories<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        offset: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Memory>, StoreError>> {
        Box::pin(ready(Ok(self.user_memories().page(owner, offset, limit))))
    }

    fn forget<'a>(
        &'a self,
        owner: &'a MemoryOwner,
        id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(ready(Ok(self.user_memories().forget(owner, id))))
    }

    fn put_file<'a>(
        &'a self,
        tenant: &'a str,
        file: &'a FileContent,
    ) -> BoxFuture<'a, Result<StoredFile, StoreError>> {
        Box::pin(ready((|| {
            file.validate()
                .map_err(|error| StoreError::InvalidFile(error.to_string()))?;
            let id = file_id(&file.bytes());
            let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
            let held = files
                .keys()
                .filter(|(owner, other)| owner == tenant && *other != id)
                .count();
            if held as u64 >= MAX_UPLOADS {
                return Err(StoreError::TooManyFiles { limit: MAX_UPLOADS });
            }
            let created_at = files
                .get(&(tenant.to_owned(), id.clone()))
                .map_or_else(now, |(stored, _)| stored.created_at);
            let stored = described(id.clone(), file, created_at);
            files.insert((tenant.to_owned(), id), (stored.clone(), file.data.clone()));
            Ok(stored)
        })()))
    }

    fn file<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<FileContent>, StoreError>> {
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let file = files
            .get(&(tenant.to_owned(), id.to_owned()))
            .map(|(stored, data)| FileContent {
                data: data.clone(),
                mime_type: stored.mime_type.clone(),
                name: stored.name.clone(),
            });
        Box::pin(ready(Ok(file)))
    }

    fn delete_file<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let deleted = files.remove(&(tenant.to_owned(), id.to_owned())).is_some();
        Box::pin(ready(Ok(deleted)))
    }

    fn claim_slot<'a>(
        &'a self,
        schedule: &'a str,
        slot: i64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let claimed = match slots.get_mut(schedule) {
            Some(latest) if *latest >= slot => false,
            Some(latest) => {
                *latest = slot;
                true
            }
            None => {
                slots.insert(schedule.to_owned(), slot);
                true
            }
        };
        Box::pin(ready(Ok(claimed)))
    }

    fn spent<'a>(&'a self, scope: &'a SpendScope) -> BoxFuture<'a, Result<Spent, StoreError>> {
        let spending = self.spending();
        Box::pin(ready(Ok(spending
            .get(&scope.key())
            .copied()
            .unwrap_or_default())))
    }

    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<StoredSession>, StoreError>> {
        Box::pin(ready(Ok(self
            .lock()
            .get(id)
            .map(|session| session.stored()))))
    }

    fn claim<'a>(
        &'a self,
        id: &'a str,
        epoch: Option<u64>,
    ) -> BoxFuture<'a, Result<Option<StoredSession>, StoreError>> {
        let mut sessions = self.lock();
        let Some(session) = sessions.get_mut(id) else {
            return Box::pin(ready(Ok(None)));
        };
        let current = session.record.epoch;
        let claimed = match epoch {
            None => current + 1,
            Some(epoch) if epoch >= current => epoch,
            Some(epoch) => {
                return Box::pin(ready(Err(StoreError::TakenOver {
                    session: id.to_owned(),
                    epoch,
                    current,
                })));
            }
        };
        session.record.epoch = claimed;
        Box::pin(ready(Ok(Some(session.stored()))))
    }

    fn list<'a>(
        &'a self,
        filter: &'a SessionFilter,
    ) -> BoxFuture<'a, Result<Vec<SessionInfo>, StoreError>> {
        let mut found: Vec<SessionInfo> = self
            .lock()
            .values()
            .filter(|session| {
                let record = &session.record;
                filter.id.as_ref().is_none_or(|id| record.id == *id)
                    && filter
                        .tenant_id
                        .as_ref()
                        .is_none_or(|tenant| record.tenant_id.as_ref() == Some(tenant))
                    && filter
                        .user_id
                        .as_ref()
                        .is_none_or(|user| record.user_id.as_ref() == Some(user))
                    && filter.status.is_none_or(|status| record.status == status)
                    && filter.parent.as_ref().is_none_or(|parent| {
                        record
                            .branch
                            .as_ref()
                            .is_some_and(|branch| branch.parent == *parent)
                    })
                    && filter
                        .after
                        .as_ref()
                        .is_none_or(|after| record.id.as_str() > after.as_str())
            })
            .map(|session| SessionInfo {
                record: session.record.clone(),
                messages: session.messages.len() as u64,
            })
            .collect();
        if filter.after.is_some() {
            found.sort_by(|a, b| a.record.id.cmp(&b.record.id));
        } else {
            found.sort_by(|a, b| {
                b.record
                    .updated_at
                    .cmp(&a.record.updated_at)
                    .then_with(|| a.record.id.cmp(&b.record.id))
            });
        }
        if let Some(limit) = filter.limit {
            found.truncate(limit as usize);
        }
        Box::pin(ready(Ok(found)))
    }

    fn messages<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Arc<AgentMessage>>, StoreError>> {
        let page = self.lock().get(id).map_or_else(Vec::new, |session| {
            let from = usize::try_from(from).unwrap_or(usize::MAX);
            session
                .messages
                .iter()
                .skip(from)
                .take(limit as usize)
                .cloned()
                .collect()
        });
        Box::pin(ready(Ok(page)))
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let mut sessions = self.lock();
        let existed = sessions.contains_key(id);
        sessions.retain(|session, _| !crate::is_within(session, id));
        drop(sessions);
        // What the sessions spent goes with them (their tenant's stays).
        self.spending().retain(|scope, _| {
            scope
                .strip_prefix("session:")
                .is_none_or(|session| !crate::is_within(session, id))
        });
        Box::pin(ready(Ok(existed)))
    }

    fn prune(&self, before: i64) -> BoxFuture<'_, Result<u64, StoreError>> {
        let mut sessions = self.lock();
        let held = sessions.len();
        let mut pruned = Vec::new();
        sessions.retain(|id, session| {
            let kept = session.record.status != crate::SessionStatus::Closed
                || session.record.updated_at >= before;
            if !kept {
                pruned.push(SpendScope::Session(id.to_string()).key());
            }
            kept
        });
        let count = (held - sessions.len()) as u64;
        drop(sessions);
        let mut spending = self.spending();
        for scope in pruned {
            spending.remove(&scope);
        }
        Box::pin(ready(Ok(count)))
    }
}
