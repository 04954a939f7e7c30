//! The actor's ties to the session store: the state it starts from, the writes
//! it hands the store (each under the agent's claim), the acknowledgements that
//! answer callers once committed, and what happens when another process took the
//! session over.

use std::collections::VecDeque;
use std::sync::Arc;
use tiller_core::StoredContext;

use ractor::RpcReplyPort;
use tiller_core::compaction::CompactionSummary;
use tiller_core::{ContextTokens, answer_open_calls, cancel_requests};
use tiller_store::{Ack, Change, QueueKind, SessionWrite, StoreError, StoredSession};

use super::{ActorState, answer};
use crate::AgentMessage;
use crate::agent::Agent;
use crate::error::AgentError;
use crate::message::AgentMsg;
use crate::message::{Internal, Signal};
use crate::settings::AgentSettings;

/// A session as an actor starts from.
pub(crate) struct Loaded {
    /// The transcript the model sees: the stored one from its last compaction's
    /// summary on.
    pub(crate) messages: Vec<Arc<AgentMessage>>,
    /// The place of `messages`' first message in the stored transcript.
    pub(crate) base: u64,
    /// `messages`' token count.
    pub(crate) tokens: ContextTokens,
    pub(crate) steering: VecDeque<(u64, AgentMessage)>,
    pub(crate) follow_up: VecDeque<(u64, AgentMessage)>,
    pub(crate) next_queue_seq: u64,
    /// The idempotency keys of the ops applied last, oldest first.
    pub(crate) op_keys: Vec<Arc<str>>,
    /// The context the session stored (none for a new one).
    pub(crate) context: StoredContext,
    /// What the session spent before (read by [`Agent::state_of`] when the
    /// agent has a budget of its own).
    pub(crate) spent: tiller_core::Spent,
}

impl Loaded {
    /// A new session's state.
    pub(crate) fn new(mut messages: Vec<Arc<AgentMessage>>) -> Self {
        let base = from_last_summary(&mut messages);
        Loaded {
            tokens: ContextTokens::of(&messages),
            messages,
            base,
            steering: VecDeque::new(),
            follow_up: VecDeque::new(),
            next_queue_seq: 0,
            op_keys: Vec::new(),
            context: StoredContext::default(),
            spent: Default::default(),
        }
    }

    /// A stored session's state. Tool calls a lost run left without results (a
    /// crash, a failure) are answered with an "interrupted" error result, written to
    /// the store too.
    pub(crate) fn from_store(
        agent: &Agent,
        settings: &AgentSettings,
        stored: StoredSession,
    ) -> Self {
        let mut messages = stored.messages;
        let base = from_last_summary(&mut messages);
        if let Some(reload) = &settings.code.on_reload {
            reload(base, &mut messages);
        }
        let answered = answer_open(
            agent,
            base,
            &mut messages,
            "the agent stopped before it finished and was brought back from its session.",
        );
        if !answered.is_empty() {
            agent.runtime.writer.submit(answered, None);
        }
        let next_queue_seq = stored
            .steering
            .iter()
            .chain(&stored.follow_up)
            .map(|queued| queued.seq + 1)
            .max()
            .unwrap_or(0);
        let queue = |queued: Vec<tiller_store::Queued>| {
            queued
                .into_iter()
                .map(|queued| (queued.seq, queued.message))
                .collect()
        };
        Loaded {
            tokens: ContextTokens::of(&messages),
            messages,
            base,
            steering: queue(stored.steering),
            follow_up: queue(stored.follow_up),
            next_queue_seq,
            op_keys: stored.op_keys,
            context: stored_context(agent, &stored.record.context),
            spent: Default::default(),
        }
    }
}

/// Drops, from a whole stored transcript, what comes before its last
/// compaction's summary (the model sees the transcript from there on); the
/// summary's place, 0 when there is none.
pub(crate) fn from_last_summary(messages: &mut Vec<Arc<AgentMessage>>) -> u64 {
    let base = messages
        .iter()
        .rposition(|m| CompactionSummary::of(m).is_some())
        .unwrap_or(0);
    messages.drain(..base);
    base as u64
}

/// The writes that store `messages` at their places from `from` on in `agent`'s
/// session.
pub(crate) fn appends(
    agent: &Agent,
    from: u64,
    messages: &[Arc<AgentMessage>],
) -> Vec<SessionWrite> {
    messages
        .iter()
        .enumerate()
        .map(|(n, message)| {
            agent.write(Change::Append {
                seq: from + n as u64,
                message: message.clone(),
                dequeued: None,
            })
        })
        .collect()
}

/// Answers, with error results saying `reason`, the calls of the transcript's last
/// response that have none (a lost run made them); answers the writes that store
/// the results. Only the messages from that response on are copied.
pub(super) fn answer_open(
    agent: &Agent,
    base: u64,
    messages: &mut Vec<Arc<AgentMessage>>,
    reason: &str,
) -> Vec<SessionWrite> {
    let Some(last) = messages.iter().rposition(|m| m.as_assistant().is_some()) else {
        return Vec::new();
    };
    let mut tail: Vec<AgentMessage> = messages[last..].iter().map(|m| (**m).clone()).collect();
    let before = tail.len();
    answer_open_calls(&mut tail, reason);
    let from = messages.len();
    messages.extend(tail.drain(before..).map(Arc::new));
    appends(agent, base + from as u64, &messages[from..])
}

impl ActorState {
    /// Answers the requests waiting for the user with "cancelled" error results
    /// (an abort while parked), so that the agent takes prompts again; `reply`
    /// hears once they are stored, with `writes` (the abort's own).
    pub(super) fn give_up_requests(
        &mut self,
        mut writes: Vec<SessionWrite>,
        reply: Option<RpcReplyPort<Result<(), AgentError>>>,
    ) {
        let results = cancel_requests(&self.messages, "the user gave up on the request.");
        let (from, seq) = (self.messages.len(), self.next_seq());
        self.messages.extend(results.into_iter().map(Arc::new));
        self.count_from(from);
        writes.extend(appends(&self.agent, seq, &self.messages[from..]));
        // The status first: the reply may be sent before `commit` returns.
        self.sync_waiting();
        self.commit(writes, reply);
    }

    /// Forks the session at message `at` into session `branch` (see
    /// [`Op::Fork`](crate::Op::Fork)): once every write before is committed,
    /// the branch is read from the store and written with the op's key.
    pub(super) fn fork(
        &mut self,
        at: u64,
        branch: String,
        reply: Option<RpcReplyPort<Result<(), AgentError>>>,
        key: Option<Arc<str>>,
    ) {
        let messages = self.next_seq();
        let refused = crate::branch::check_branch(&branch).and_then(|()| {
            if at > messages {
                return Err(StoreError::ForkPastEnd {
                    session: self.agent.session.to_string(),
                    at,
                    messages,
                }
                .into());
            }
            Ok(())
        });
        if let Err(error) = refused {
            return answer(reply, Err(error));
        }
        // The key is written with the branch, and remembered once it is.
        let key_write = key.clone().map(|key| self.agent.write(Change::OpKey(key)));
        let writer = self.agent.runtime.writer.clone();
        let parent = self.agent.session.clone();
        let actor = self.myself.clone();
        tokio::spawn(async move {
            let forked = async {
                writer.flush().await?;
                let mut writes =
                    vec![crate::branch::fork_write(&**writer.store(), &parent, at, &branch).await?];
                writes.extend(key_write);
                writer.write(writes).await?;
                Ok(())
            };
            let result = forked.await;
            if let (Ok(()), Some(key)) = (&result, key) {
                let _ = actor.send_message(AgentMsg::Internal(Internal(Signal::Applied(key))));
            }
            if let Some(reply) = reply {
                let _ = reply.send(result);
            }
        });
    }

    /// The place in the stored transcript of the next message added.
    pub(super) fn next_seq(&self) -> u64 {
        self.base + self.messages.len() as u64
    }

    /// Adds the messages of the transcript from `from` on to its token count.
    pub(super) fn count_from(&mut self, from: usize) {
        self.tokens = self.messages[from..]
            .iter()
            .fold(self.tokens, |tokens, message| tokens.after(message));
    }

    /// Hands `writes` to the store; `reply` hears once they are committed.
    pub(super) fn commit(
        &self,
        writes: Vec<SessionWrite>,
        reply: Option<RpcReplyPort<Result<(), AgentError>>>,
    ) {
        let ack = self.ack(move |result| {
            if let Some(reply) = reply {
                let _ = reply.send(result.map_err(AgentError::from));
            }
        });
        self.agent.runtime.writer.submit(writes, Some(ack));
    }

    /// The acknowledgement of the actor's writes: a write refused because the
    /// session was taken over is told to the actor first (see
    /// [`ActorState::taken_over`]), or, when that actor was put away since, stops
    /// the agent here; then `then` hears the result.
    pub(super) fn ack(&self, then: impl FnOnce(Result<(), StoreError>) + Send + 'static) -> Ack {
        let actor = self.myself.clone();
        let agent = self.agent.clone();
        Box::new(move |result| {
            if let Err(error @ StoreError::TakenOver { .. }) = &result {
                let told = agent
                    .route
                    .live()
                    .is_some_and(|live| live.get_id() == actor.get_id())
                    && actor
                        .send_message(AgentMsg::Internal(Internal(Signal::TakenOver(
                            error.clone(),
                        ))))
                        .is_ok();
                if !told {
                    let reason = error.to_string();
                    tracing::warn!(agent = %agent.id, %reason, "agent stopped");
                    agent.stop(reason);
                }
            }
            then(result);
        })
    }

    /// Another process took the session over: this agent may no longer act for it,
    /// and stops.
    pub(super) fn taken_over(&mut self, error: StoreError) {
        let reason = error.to_string();
        tracing::warn!(agent = %self.agent.id, %reason, "agent stopped");
        if let Some(run) = &self.run {
            run.token.cancel();
        }
        self.agent.stop(reason);
    }

    /// Forgets the transcript, both queues and the error; the writes that say so.
    pub(super) fn clear(&mut self) -> Vec<SessionWrite> {
        self.messages.clear();
        self.base = 0;
        self.tokens = ContextTokens::default();
        self.steering.clear();
        self.follow_up.clear();
        self.error = None;
        vec![
            self.agent.write(Change::Truncate { from: 0 }),
            self.agent.write(Change::ClearQueue(QueueKind::Steering)),
            self.agent.write(Change::ClearQueue(QueueKind::FollowUp)),
        ]
    }
}

/// The context a session stored: none for a session that stored none (made
/// before contexts were kept) or whose context cannot be read (said in the log).
fn stored_context(agent: &Agent, stored: &tiller_store::Definition) -> StoredContext {
    if stored.as_json() == "null" {
        return StoredContext::default();
    }
    stored.decode().unwrap_or_else(|error| {
        tracing::warn!(session = %agent.session, %error, "the session's stored context is unreadable; starting without it");
        StoredContext::default()
    })
}
