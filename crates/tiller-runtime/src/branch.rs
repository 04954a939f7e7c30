//! Branches: a session forked from another at one of its messages
//! ([`Op::Fork`](crate::Op::Fork)), to try the conversation again from there.
//! The store shares the messages before the fork point (see
//! [`Change::Fork`]); the branch's context is the one its line began with
//! and the states its transcript's tool results set up to that point, so that
//! its agent starts where the original stood.

use tiller_core::StoredContext;
use tiller_store::{
    Change, Definition, SessionFilter, SessionRecord, SessionStore, SessionWrite, StoreError,
};

use crate::AgentError;

/// Forks session `parent` of `store`, one no agent holds, at message `at`
/// into session `branch` (see [`Op::Fork`](crate::Op::Fork), by which an
/// agent forks the session it holds, after its own writes).
pub async fn fork_stored(
    store: &dyn SessionStore,
    parent: &str,
    at: u64,
    branch: &str,
) -> Result<(), AgentError> {
    check_branch(branch)?;
    let write = fork_write(store, parent, at, branch).await?;
    store.apply(&[write]).await?;
    Ok(())
}

/// Refuses a branch id that cannot name a session.
pub(crate) fn check_branch(branch: &str) -> Result<(), AgentError> {
    crate::check_id("session", branch).map_err(|error| AgentError::InvalidBranch {
        reason: error.to_string(),
    })
}

/// The write that makes session `branch` from the first `at` messages of
/// session `parent`, as the store holds them: the parent's owner, agent and
/// origin, and the context as it stood at message `at`.
pub(crate) async fn fork_write(
    store: &dyn SessionStore,
    parent: &str,
    at: u64,
    branch: &str,
) -> Result<SessionWrite, AgentError> {
    let info = store
        .list(&SessionFilter::only(parent))
        .await?
        .pop()
        .ok_or_else(|| StoreError::NoSuchSession(parent.to_owned()))?;
    let past_end = |messages: u64| StoreError::ForkPastEnd {
        session: parent.to_owned(),
        at,
        messages,
    };
    if at > info.messages {
        return Err(past_end(info.messages).into());
    }
    let limit = u32::try_from(at).map_err(|_| past_end(info.messages))?;
    let prefix = store.messages(parent, 0, limit).await?;
    let record = info.record;
    let first = first_context(&record);
    let mut context = first.clone();
    for message in &prefix {
        if let Some(result) = message.as_tool_result() {
            for (name, value) in &result.state {
                context.states.insert(name.clone(), value.clone());
            }
        }
    }
    if context.ids.session_id.is_some() {
        context.ids.session_id = Some(branch.to_owned());
    }
    let encoded = |context: &StoredContext| Definition::new(context).unwrap_or_default();
    let record = SessionRecord {
        tenant_id: record.tenant_id,
        user_id: record.user_id,
        definition: record.definition,
        origin: record.origin,
        context: encoded(&context),
        first_context: encoded(&first),
        ..SessionRecord::new(branch)
    };
    Ok(SessionWrite::new(
        branch,
        Change::Fork {
            parent: parent.into(),
            at,
            record,
        },
    ))
}

/// The context `record`'s line began with; for a session stored before that
/// was kept, its context's ids with no state.
fn first_context(record: &SessionRecord) -> StoredContext {
    let decoded = |stored: &Definition| stored.decode::<StoredContext>().ok();
    match decoded(&record.first_context) {
        Some(first) => first,
        None => StoredContext {
            ids: decoded(&record.context).unwrap_or_default().ids,
            ..StoredContext::default()
        },
    }
}
