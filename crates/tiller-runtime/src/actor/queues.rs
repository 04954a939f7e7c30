//! The steering and follow-up queues: bounded, stored as they change, delivered
//! one at a time or all at once, each delivered message held in flight until it
//! joins the transcript.

use std::collections::VecDeque;

use ractor::RpcReplyPort;
use tiller_store::{Change, QueueKind};

use super::ActorState;
use crate::AgentMessage;
use crate::definition::QueueMode;
use crate::error::AgentError;

/// What one delivery of `queue` takes from `source` under `mode`, each message
/// recorded in `in_flight` until it joins the transcript.
pub(super) fn deliver_from(
    source: &mut VecDeque<(u64, AgentMessage)>,
    queue: QueueKind,
    mode: QueueMode,
    in_flight: &mut VecDeque<(QueueKind, u64, AgentMessage)>,
) -> Vec<AgentMessage> {
    let count = match mode {
        QueueMode::OneAtATime => source.len().min(1),
        QueueMode::All => source.len(),
    };
    source
        .drain(..count)
        .map(|(seq, message)| {
            in_flight.push_back((queue, seq, message.clone()));
            message
        })
        .collect()
}

impl ActorState {
    pub(super) fn enqueue(
        &mut self,
        queue: QueueKind,
        message: AgentMessage,
        reply: Option<RpcReplyPort<Result<(), AgentError>>>,
        key: Option<std::sync::Arc<str>>,
    ) {
        if let Err(full) = self.room_for(queue, &message) {
            match reply {
                Some(reply) => {
                    let _ = reply.send(Err(full));
                }
                None => {
                    tracing::warn!(agent = %self.agent.id, error = %full, "a message was not queued")
                }
            }
            return;
        }
        let seq = self.next_queue_seq;
        self.next_queue_seq += 1;
        let write = self.agent.write(Change::Enqueue {
            queue,
            seq,
            message: message.clone(),
        });
        self.queue_mut(queue).push_back((seq, message));
        if let Some(run) = self.run.as_mut() {
            run.queued = true;
        }
        let writes = self.keyed(vec![write], key);
        self.commit(writes, reply);
    }

    /// Whether `queue` has room for `message` under the settings' limits.
    pub(super) fn room_for(
        &self,
        queue: QueueKind,
        message: &AgentMessage,
    ) -> Result<(), AgentError> {
        let limits = self.settings.definition.queue_limits;
        let (held, name) = match queue {
            QueueKind::Steering => (&self.steering, "steering"),
            QueueKind::FollowUp => (&self.follow_up, "follow-up"),
        };
        let bytes = held
            .iter()
            .map(|(_, queued)| tiller_core::json_len(queued))
            .sum::<usize>()
            + tiller_core::json_len(message);
        if held.len() < limits.max_messages && bytes <= limits.max_bytes {
            return Ok(());
        }
        Err(AgentError::QueueFull {
            queue: name.into(),
            max_messages: limits.max_messages,
            max_bytes: limits.max_bytes,
        })
    }

    pub(super) fn queue_mut(&mut self, queue: QueueKind) -> &mut VecDeque<(u64, AgentMessage)> {
        match queue {
            QueueKind::Steering => &mut self.steering,
            QueueKind::FollowUp => &mut self.follow_up,
        }
    }

    /// Takes what one delivery of `queue` takes, under its mode, for the run `run`,
    /// which holds it in flight until it joins the transcript.
    pub(super) fn take(&mut self, run: u64, queue: QueueKind) -> Vec<AgentMessage> {
        let mode = self.mode(queue);
        let Some(active) = self.run.as_mut().filter(|active| active.id == run) else {
            return Vec::new();
        };
        let source = match queue {
            QueueKind::Steering => &mut self.steering,
            QueueKind::FollowUp => &mut self.follow_up,
        };
        deliver_from(source, queue, mode, &mut active.in_flight)
    }

    /// How many messages one delivery of `queue` takes.
    pub(super) fn mode(&self, queue: QueueKind) -> QueueMode {
        match queue {
            QueueKind::Steering => self.settings.definition.steering_mode,
            QueueKind::FollowUp => self.settings.definition.follow_up_mode,
        }
    }
}
