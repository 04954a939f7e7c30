//! The actor's ties to the session store: the state it starts from, the writes
//! it hands the store (each under the agent's claim), the acknowledgements that
//! answer callers once committed, and what happens when another process took the
//! session over.

use std::collections::VecDeque;
use std::sync::Arc;

use ractor::RpcReplyPort;
use tiller_core::{answer_open_calls, cancel_requests};
use tiller_store::{Ack, Change, QueueKind, SessionWrite, StoreError, StoredSession};

use super::ActorState;
use crate::AgentMessage;
use crate::agent::Agent;
use crate::error::AgentError;
use crate::message::AgentMsg;
use crate::message::{Internal, Signal};
use crate::settings::AgentSettings;

/// A session as an actor starts from.
pub(crate) struct Loaded {
    pub(crate) messages: Vec<Arc<AgentMessage>>,
    pub(crate) steering: VecDeque<(u64, AgentMessage)>,
    pub(crate) follow_up: VecDeque<(u64, AgentMessage)>,
    pub(crate) next_queue_seq: u64,
    /// The idempotency keys of the ops applied last, oldest first.
    pub(crate) op_keys: Vec<Arc<str>>,
}

impl Loaded {
    /// A new session's state.
    pub(crate) fn new(messages: Vec<Arc<AgentMessage>>) -> Self {
        Loaded {
            messages,
            steering: VecDeque::new(),
            follow_up: VecDeque::new(),
            next_queue_seq: 0,
            op_keys: Vec::new(),
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
        if let Some(reload) = &settings.code.on_reload {
            reload(&mut messages);
        }
        let answered = answer_open(
            agent,
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
            messages,
            steering: queue(stored.steering),
            follow_up: queue(stored.follow_up),
            next_queue_seq,
            op_keys: stored.op_keys,
        }
    }
}

/// The writes that store `messages` at their places from `from` on in `agent`'s
/// session.
pub(crate) fn appends(
    agent: &Agent,
    from: usize,
    messages: &[Arc<AgentMessage>],
) -> Vec<SessionWrite> {
    messages
        .iter()
        .enumerate()
        .map(|(n, message)| {
            agent.write(Change::Append {
                seq: (from + n) as u64,
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
    appends(agent, from, &messages[from..])
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
        let from = self.messages.len();
        self.messages.extend(results.into_iter().map(Arc::new));
        writes.extend(appends(&self.agent, from, &self.messages[from..]));
        self.commit(writes, reply);
        self.sync_waiting();
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
    /// [`ActorState::taken_over`]), then `then` hears the result.
    pub(super) fn ack(&self, then: impl FnOnce(Result<(), StoreError>) + Send + 'static) -> Ack {
        let actor = self.myself.clone();
        Box::new(move |result| {
            if let Err(error @ StoreError::TakenOver { .. }) = &result {
                let _ = actor.send_message(AgentMsg::Internal(Internal(Signal::TakenOver(
                    error.clone(),
                ))));
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
