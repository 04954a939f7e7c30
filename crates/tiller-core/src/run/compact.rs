//! Compaction inside a run (see [`crate::compaction`]): the oldest messages
//! replaced with a summary when the transcript passes the policy's threshold,
//! when the provider refuses a request as too long, or when asked
//! ([`Start::Compact`](super::Start::Compact), a run of nothing else).

use tiller_ai::StreamError;

use super::{Interrupted, Run};
use crate::compaction::{
    self, CompactionReason, CompactionSummary, ContextTokens, SummaryRequest, estimate_tokens,
};
use crate::event::{AgentEvent, RunEnd};
use crate::message::AgentMessage;

/// Why a compaction left the transcript as it was.
#[derive(Debug)]
pub(super) enum Unfinished {
    /// No place to cut.
    NothingToCut,
    /// The summary could not be written, for this reason (announced in
    /// `compaction_end`).
    Failed(String),
}

impl Run {
    /// A run that only compacts, with `instructions` for the summary: no model
    /// turn, its `agent_end` without messages.
    pub(super) async fn compact_only(mut self, instructions: Option<String>) -> Vec<AgentMessage> {
        let compacted = match self.resolve_key().await {
            Ok(()) => self.compact(CompactionReason::Manual, instructions).await,
            Err(interrupted) => {
                let error = match interrupted {
                    Interrupted::Panicked(panic) => {
                        format!("the API key resolver panicked: {panic}")
                    }
                    Interrupted::Aborted => StreamError::Aborted.to_string(),
                };
                Err(self.compaction_refused(CompactionReason::Manual, error))
            }
        };
        let reason = match compacted {
            // Nothing to cut is nothing to do: `compaction_end` says so.
            Ok(()) | Err(Unfinished::NothingToCut) => RunEnd::Completed,
            Err(_) if self.cancel.is_cancelled() => RunEnd::Aborted,
            Err(Unfinished::Failed(_)) => RunEnd::Error,
        };
        self.emit(AgentEvent::AgentEnd {
            messages: Vec::new(),
            reason,
            output: None,
        });
        Vec::new()
    }

    /// Replaces the oldest messages with a summary, announced by
    /// `compaction_start` and `compaction_end`; a manual compaction is
    /// announced also when there is nothing to cut.
    pub(super) async fn compact(
        &mut self,
        reason: CompactionReason,
        instructions: Option<String>,
    ) -> Result<(), Unfinished> {
        let keep = self.config.run.compaction.keep_tokens(self.window);
        let tokens_before = self.history.tokens();
        let Some(cut) = compaction::cut_point(self.history.messages(), keep) else {
            if reason == CompactionReason::Manual {
                let error =
                    "nothing to compact: the transcript is within the tokens kept as they are";
                self.compaction_refused(reason, error.to_owned());
            }
            return Err(Unfinished::NothingToCut);
        };
        self.emit(AgentEvent::CompactionStart {
            reason,
            tokens_before,
        });
        let summary = match self.summary(cut, instructions).await {
            Ok(summary) => summary,
            Err(error) => return Err(self.compaction_failed(reason, tokens_before, error)),
        };
        let messages = self.history.messages();
        let first_seq = self.history.first_seq();
        let kept = messages.len() - cut;
        let kept_tokens: u64 = messages[cut..].iter().map(estimate_tokens).sum();
        let mut payload = CompactionSummary {
            summary,
            first_seq,
            last_seq: first_seq + cut as u64 - 1,
            kept: kept as u64,
            tokens_before,
            tokens_after: 0,
        };
        let after = ContextTokens {
            total: compaction::text_tokens(payload.for_model().len()) + kept_tokens,
            measured: false,
        };
        let tokens_after = after.total + self.history.overhead();
        if tokens_after >= tokens_before {
            let error = format!(
                "the summary would not make the transcript shorter ({tokens_before} → {tokens_after} tokens)"
            );
            return Err(self.compaction_failed(reason, tokens_before, error));
        }
        payload.tokens_after = tokens_after;
        let summary = compaction::summary_message(payload);
        let summary_id = self.history.summarized(cut, summary.clone(), after);
        self.emit(AgentEvent::CompactionEnd {
            reason,
            tokens_before,
            tokens_after,
            summary_id: Some(summary_id),
            summary: Some(Box::new(summary)),
            kept: kept as u64,
            error: None,
        });
        Ok(())
    }

    /// The summary of the messages before `cut`, written by the run's
    /// summarizer (its own model when the host gave none) as the policy says,
    /// with `instructions` added; `Err` says why there is none.
    async fn summary(&self, cut: usize, instructions: Option<String>) -> Result<String, String> {
        let policy = &self.config.run.compaction;
        let max_tokens = policy.summary_tokens(self.window);
        // A manual compaction's words add to the summarizer's instructions: the
        // summary stays a summary, and keeps what the user asked besides.
        let base = policy
            .instructions
            .as_deref()
            .unwrap_or(compaction::DEFAULT_INSTRUCTIONS);
        let instructions = match instructions.filter(|asked| !asked.trim().is_empty()) {
            Some(asked) => compaction::with_request(base, &asked),
            None => base.to_owned(),
        };
        let budget = u64::from(self.window)
            .saturating_sub(u64::from(max_tokens) + (instructions.len() as u64).div_ceil(4) + 64);
        let summarize = self.config.hooks.summarize.clone().unwrap_or_else(|| {
            if let Some(llm) = &policy.llm {
                tracing::warn!(
                    llm,
                    "the compaction policy names an LLM configuration the host did not resolve into RunHooks::summarize; the run's own model writes the summary"
                );
            }
            compaction::model_summarizer(self.config.model.clone(), self.options.clone())
        });
        let earlier = &self.history.messages()[..cut];
        let request = SummaryRequest {
            instructions,
            conversation: compaction::render(earlier, budget),
            messages: earlier.to_vec(),
            max_tokens,
        };
        match self
            .call_back(summarize(request, self.cancel.child_token()))
            .await
        {
            Ok(Ok(summary)) => Ok(compaction::cut_to_tokens(summary, max_tokens)),
            Ok(Err(error)) => Err(error.to_string()),
            Err(Interrupted::Panicked(panic)) => Err(format!("the summarizer panicked: {panic}")),
            Err(Interrupted::Aborted) => Err(StreamError::Aborted.to_string()),
        }
    }

    /// Announces a compaction that could not start, with both its events.
    pub(super) fn compaction_refused(&self, reason: CompactionReason, error: String) -> Unfinished {
        let tokens_before = self.history.tokens();
        self.emit(AgentEvent::CompactionStart {
            reason,
            tokens_before,
        });
        self.compaction_failed(reason, tokens_before, error)
    }

    /// Announces a compaction that failed, the transcript left as it was.
    fn compaction_failed(
        &self,
        reason: CompactionReason,
        tokens_before: u64,
        error: String,
    ) -> Unfinished {
        tracing::warn!(?reason, %error, "compaction failed");
        self.emit(AgentEvent::CompactionEnd {
            reason,
            tokens_before,
            tokens_after: tokens_before,
            summary_id: None,
            summary: None,
            kept: 0,
            error: Some(error.clone()),
        });
        Unfinished::Failed(error)
    }
}
