//! The transcript as a run holds it: its messages and their token count, which
//! of them are the run's own, and where it starts in the stored transcript.

use crate::compaction::ContextTokens;
use crate::message::AgentMessage;

/// A run's transcript.
pub(super) struct History {
    messages: Vec<AgentMessage>,
    /// The first of the run's own messages.
    first_new: usize,
    /// The run's own messages a compaction replaced with its summary.
    compacted_new: Vec<AgentMessage>,
    /// The transcript's token count.
    tokens: ContextTokens,
    /// The estimate of the system prompt and the tools, which a count that is
    /// not the provider's lacks.
    overhead: u64,
    /// The place of the first message in the stored transcript.
    first_seq: u64,
}

impl History {
    /// The transcript `messages`, the first at `first_seq` of the stored one,
    /// counted as `tokens` (from the messages when `None`) beside `overhead`.
    pub(super) fn new(
        messages: Vec<AgentMessage>,
        tokens: Option<ContextTokens>,
        overhead: u64,
        first_seq: u64,
    ) -> Self {
        History {
            tokens: tokens.unwrap_or_else(|| ContextTokens::of(&messages)),
            first_new: messages.len(),
            messages,
            compacted_new: Vec::new(),
            overhead,
            first_seq,
        }
    }

    /// The messages.
    pub(super) fn messages(&self) -> &[AgentMessage] {
        &self.messages
    }

    /// Adds a message, and its tokens to the count.
    pub(super) fn push(&mut self, message: AgentMessage) {
        self.tokens = self.tokens.after(&message);
        self.messages.push(message);
    }

    /// The token count as the next request would have it.
    pub(super) fn tokens(&self) -> u64 {
        self.tokens.total
            + if self.tokens.measured {
                0
            } else {
                self.overhead
            }
    }

    /// The estimate of the system prompt and the tools.
    pub(super) fn overhead(&self) -> u64 {
        self.overhead
    }

    /// Counts `more` tokens of instructions beside the messages (what the
    /// `instructions` hook added to the system prompt).
    pub(super) fn add_overhead(&mut self, more: u64) {
        self.overhead += more;
    }

    /// The place of the first message in the stored transcript.
    pub(super) fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// The messages before `cut` replaced with `summary`, the transcript then
    /// counted as `tokens`; the summary takes the next place of the stored
    /// transcript, which this returns.
    pub(super) fn summarized(
        &mut self,
        cut: usize,
        summary: AgentMessage,
        tokens: ContextTokens,
    ) -> u64 {
        let summary_seq = self.first_seq + self.messages.len() as u64;
        let mut earlier = std::mem::take(&mut self.messages);
        let kept = earlier.split_off(cut);
        if self.first_new < cut {
            self.compacted_new.extend(earlier.drain(self.first_new..));
            self.first_new = 1;
        } else {
            self.first_new = 1 + self.first_new - cut;
        }
        self.messages = Vec::with_capacity(1 + kept.len());
        self.messages.push(summary);
        self.messages.extend(kept);
        self.first_seq = summary_seq;
        self.tokens = tokens;
        summary_seq
    }

    /// The run's own messages, taken out: those a compaction replaced, then
    /// those still in the transcript.
    pub(super) fn take_new(&mut self) -> Vec<AgentMessage> {
        let mut messages = std::mem::take(&mut self.compacted_new);
        messages.extend(self.messages.split_off(self.first_new));
        messages
    }
}
