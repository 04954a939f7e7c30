//! Any host takes any request for any agent: it carries it out when it owns the
//! agent, else sends it to the agent's subject, where its owner answers. No
//! responders means no host holds the agent: the host rendezvous hashing
//! prefers is asked to bring it up, and the request is sent again. A request
//! that gets no answer (its owner died, NATS is electing) is sent again with
//! the same idempotency key until the deadline, so it is applied once or
//! refused with a retryable error — never lost, never twice.

use std::sync::Arc;
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use futures::StreamExt;
use tiller_core::{AgentEvent, RunEnd};
use tiller_runtime::{AgentError, Envelope, Op, RunOutcome};
use tokio::time::Instant;

use crate::Inner;
use crate::activate::place;
use crate::error::ClusterError;
use crate::follow::Followed;
use crate::names::{EventSubject, op_subject};
use crate::wire::{Activated, Reason, Reply, Request, Response};

/// How long one forwarded request waits for its owner's answer before it is
/// sent again.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

impl Inner {
    /// Carries out `request` on `agent` wherever it lives, bringing it up when
    /// no host holds it (but for a stop, which finds nothing to stop then).
    pub(crate) async fn request(
        self: &Arc<Self>,
        agent: &str,
        request: Request,
    ) -> Result<Response, ClusterError> {
        let deadline = Instant::now() + self.config.request_deadline;
        let mut wait = Duration::from_millis(10);
        let mut last_trouble = String::from("no host answered");
        loop {
            // Whether to try again at once (the agent was just brought up here).
            let mut at_once = false;
            let reply = match self.owned.get(agent).map(|owned| owned.clone()) {
                Some(owned) => owned.call(request.clone()).await,
                None => match self.forward(agent, &request, deadline).await {
                    Forwarded::Answered(reply) => Some(reply),
                    Forwarded::NoOwner => {
                        match place(self, agent, Reason::Request).await {
                            Activated::Here { .. } => at_once = true,
                            Activated::OwnedBy { host } => {
                                last_trouble = format!("its owner {host} does not answer yet");
                            }
                            Activated::NoSuchAgent => {
                                return Err(ClusterError::NoSuchAgent(agent.to_owned()));
                            }
                            Activated::Failed {
                                reason,
                                retry: false,
                            } => {
                                return Err(ClusterError::CannotActivate {
                                    agent: agent.to_owned(),
                                    reason,
                                });
                            }
                            Activated::Failed { reason, .. } => last_trouble = reason,
                        }
                        None
                    }
                    Forwarded::Unanswered(reason) => {
                        last_trouble = reason;
                        None
                    }
                },
            };
            match reply {
                Some(Reply::Ok(response)) => return Ok(response),
                Some(Reply::Refused(error)) => return Err(ClusterError::Agent(error)),
                Some(Reply::Forbidden(reason)) => {
                    return Err(ClusterError::Forbidden {
                        agent: agent.to_owned(),
                        reason,
                    });
                }
                Some(Reply::Unavailable(reason)) => last_trouble = reason,
                Some(Reply::NotHere) => last_trouble = "its owner is moving it".to_owned(),
                None => {}
            }
            if at_once && Instant::now() < deadline {
                continue;
            }
            if Instant::now() + wait >= deadline {
                return Err(ClusterError::Unavailable {
                    agent: agent.to_owned(),
                    reason: last_trouble,
                });
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(500));
        }
    }

    /// Sends `request` to `agent`'s subject once.
    async fn forward(&self, agent: &str, request: &Request, deadline: Instant) -> Forwarded {
        let payload = match serde_json::to_vec(request) {
            Ok(payload) => payload,
            Err(error) => return Forwarded::Unanswered(error.to_string()),
        };
        let within = ANSWER_WITHIN.min(deadline.saturating_duration_since(Instant::now()));
        let asked = async_nats::Request::new()
            .payload(payload.into())
            .timeout(Some(within.max(Duration::from_millis(1))));
        match self.client.send_request(op_subject(agent), asked).await {
            Ok(message) => {
                self.counters.forwarded();
                match serde_json::from_slice(&message.payload) {
                    Ok(reply) => Forwarded::Answered(reply),
                    Err(error) => {
                        Forwarded::Unanswered(format!("an answer could not be read: {error}"))
                    }
                }
            }
            Err(error) if error.kind() == RequestErrorKind::NoResponders => Forwarded::NoOwner,
            Err(error) => Forwarded::Unanswered(error.to_string()),
        }
    }
}

/// What one forwarded request came to.
enum Forwarded {
    Answered(Reply),
    /// No host answers on the agent's subject.
    NoOwner,
    /// No answer in time, or NATS failed.
    Unanswered(String),
}

/// Carries out `op` (one that starts a run) and waits for the run to end, from
/// the agent's event stream: the outcome is the `agent_end` that follows the
/// op, or, when a failover ran the turn again, the new owner's.
pub(crate) async fn run(
    inner: &Arc<Inner>,
    subject: &EventSubject,
    op: Op,
    key: &str,
    on_behalf: crate::Principal,
) -> Result<RunOutcome, ClusterError> {
    if !op.starts_run() {
        return Err(ClusterError::Agent(AgentError::CannotStart(
            tiller_core::ContinueError::EmptyPrompt,
        )));
    }
    let mut events = crate::follow::follow(inner, subject, None).await?;
    inner
        .request(
            &subject.agent,
            Request::Submit {
                op,
                key: key.to_owned(),
                on_behalf,
            },
        )
        .await?;
    let mut compactions = Vec::new();
    let (mut budget_exceeded, mut guardrail_tripped) = (None, None);
    while let Some(followed) = events.next().await {
        let Followed::Event { json, .. } = followed else {
            continue;
        };
        let Ok(text) = std::str::from_utf8(&json) else {
            continue;
        };
        match Envelope::type_in(text) {
            "compaction_end" => {
                if let Ok(envelope) = serde_json::from_str::<Envelope>(text)
                    && let tiller_runtime::Delivered::Event(event) = envelope.event
                {
                    compactions.extend(event.compaction_report());
                }
            }
            "budget_exceeded" | "guardrail_tripped" => {
                if let Ok(envelope) = serde_json::from_str::<Envelope>(text)
                    && let tiller_runtime::Delivered::Event(event) = envelope.event
                {
                    budget_exceeded = event.budget_exceeded().or(budget_exceeded);
                    guardrail_tripped = event.guardrail_tripped().or(guardrail_tripped);
                }
            }
            "agent_end" => {
                let Ok(envelope) = serde_json::from_str::<Envelope>(text) else {
                    continue;
                };
                if let tiller_runtime::Delivered::Event(AgentEvent::AgentEnd {
                    messages,
                    reason,
                    output,
                }) = envelope.event
                {
                    // A hand-off pauses the run; it goes on elsewhere.
                    if reason == RunEnd::Paused {
                        continue;
                    }
                    return Ok(RunOutcome {
                        messages,
                        end: reason,
                        output,
                        compactions,
                        conversation: Vec::new(),
                        budget_exceeded,
                        guardrail_tripped,
                    });
                }
            }
            "agent_stopped" => {
                let reason = serde_json::from_str::<Envelope>(text)
                    .ok()
                    .and_then(|envelope| match envelope.event {
                        tiller_runtime::Delivered::Notice(
                            tiller_runtime::Notice::AgentStopped { reason },
                        ) => Some(reason),
                        _ => None,
                    })
                    .unwrap_or_default();
                return Err(ClusterError::Agent(AgentError::Stopped { reason }));
            }
            _ => {}
        }
    }
    Err(ClusterError::Unavailable {
        agent: subject.agent.clone(),
        reason: "its event stream ended before the run did".to_owned(),
    })
}

/// Stops `agent` for good wherever it lives; whether there was one.
pub(crate) async fn stop(inner: &Arc<Inner>, agent: &str) -> Result<bool, ClusterError> {
    match inner.request(agent, Request::Stop).await {
        Ok(_) => Ok(true),
        Err(ClusterError::NoSuchAgent(_)) => Ok(false),
        Err(error) => Err(error),
    }
}
