//! The user's reply to a call a parked run left open: an answer merged into
//! the call (which runs again) or given as its result, an approval (the call
//! runs, once the approval is durable), or a denial. It finishes the turn the
//! run parked in.

use tiller_ai::{AssistantMessage, ToolResultMessage};

use super::{Run, execute};
use crate::event::AgentEvent;
use crate::message::AgentMessage;
use crate::request::{self, Answers, Reply, UserRequest, open_requests};

impl Run {
    /// Resolves `request` with the user's `reply` — the turn the run parked in,
    /// finished — and says whether the run must park again (a request of that
    /// turn is still open).
    pub(super) async fn reply(&mut self, request: UserRequest, reply: Reply) -> bool {
        let (message, call) = {
            let message = self
                .history
                .messages()
                .iter()
                .rev()
                .find_map(AgentMessage::as_assistant)
                .cloned()
                .unwrap_or_else(|| AssistantMessage::empty(&self.config.model));
            let call = message
                .tool_calls()
                .find(|call| call.id == request.tool_call_id())
                .cloned();
            (message, call)
        };
        let batch = match (call, request, reply) {
            (None, request, _) => {
                self.fail(format!(
                    "the call {} the request was for is not in the transcript",
                    request.tool_call_id()
                ));
                return false;
            }
            (
                Some(call),
                UserRequest::Input {
                    field,
                    question,
                    current_data,
                    ..
                },
                Reply::Answer { text, .. },
            ) => match request::merged(&call, &current_data, &field, &text)
                .filter(|_| self.config.run.answers == Answers::ToTool)
            {
                // Straight into the waiting call, committed before it runs again.
                Some(merged) => {
                    self.answered = Some(call.id.clone());
                    self.deliver(request::answer_merged(&call, &field, &text));
                    match self.durable().await {
                        Ok(()) => execute::run_batch(self, &message, vec![merged]).await,
                        Err(failure) => execute::not_durable(self, &[call], failure),
                    }
                }
                None => {
                    let result = request::answered(&call, &field, &question, &text);
                    execute::answer(self, &call, result)
                }
            },
            (Some(mut call), request, Reply::Approve { .. }) => {
                // It runs with the arguments the user approved (an answer merged
                // into them, it may be).
                if let UserRequest::Approval { args, .. } = request {
                    call.arguments = args;
                }
                self.approved = Some(call.id.clone());
                // The approval is durable before the call runs (write-ahead): after
                // a crash the call is answered "interrupted", not asked again.
                self.deliver(request::granted(&call));
                match self.durable().await {
                    Ok(()) => execute::run_batch(self, &message, vec![call]).await,
                    Err(failure) => execute::not_durable(self, &[call], failure),
                }
            }
            (Some(call), _, Reply::Deny { reason, .. }) => {
                let text = match reason {
                    Some(reason) => format!("The user denied this call: {reason}"),
                    None => "The user denied this call.".to_owned(),
                };
                execute::answer(self, &call, ToolResultMessage::text(&call, text, true))
            }
            // `check_reply` let only fitting replies through.
            (Some(call), _, Reply::Answer { .. }) => {
                let text = "The user's reply did not fit the request.";
                execute::answer(self, &call, ToolResultMessage::text(&call, text, true))
            }
        };
        self.record_batch(&batch);
        self.turns += 1;
        self.end_turn(message, batch.results);
        let parked = !open_requests(self.history.messages()).is_empty();
        if !parked {
            self.emit(AgentEvent::TurnStart);
        }
        parked
    }
}
