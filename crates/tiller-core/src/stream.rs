//! [`agent_loop`] and [`agent_loop_continue`]: a run as a stream of events.
//!
//! The run is polled by whoever reads the stream, on that task: nothing is spawned,
//! and dropping the stream stops the run (its model request and tools with it).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll};

use futures::Stream;
use futures::task::AtomicWaker;
use tokio_util::sync::CancellationToken;

use crate::config::LoopConfig;
use crate::event::AgentEvent;
use crate::message::AgentMessage;
use crate::run::{ContinueError, LoopContext, Prompt, check_continue, run_loop};

type RunFuture = Pin<Box<dyn Future<Output = Vec<AgentMessage>> + Send>>;

/// Starts a run with new `prompts` appended to `context`. The stream yields every
/// event and ends after `agent_end`; [`AgentLoop::result`] gives the new messages.
pub fn agent_loop(
    prompts: Vec<AgentMessage>,
    context: LoopContext,
    config: LoopConfig,
    cancel: CancellationToken,
) -> AgentLoop {
    AgentLoop::new(|sink| {
        Box::pin(async move {
            run_loop(Prompt::Messages(prompts), context, config, cancel, sink)
                .await
                .unwrap_or_default()
        })
    })
}

/// Continues from `context` as it stands, without events for its messages. Refused
/// when the context is empty or ends with an assistant message.
pub fn agent_loop_continue(
    context: LoopContext,
    config: LoopConfig,
    cancel: CancellationToken,
) -> Result<AgentLoop, ContinueError> {
    check_continue(&context)?;
    Ok(AgentLoop::new(|sink| {
        Box::pin(async move {
            run_loop(Prompt::Continue, context, config, cancel, sink)
                .await
                .unwrap_or_default()
        })
    }))
}

/// The events of a run, in order.
pub struct AgentLoop {
    run: Option<RunFuture>,
    events: Arc<EventQueue>,
    messages: Option<Vec<AgentMessage>>,
}

/// Events waiting for the reader. The run pushes them while the reader polls it,
/// so the reader needs waking only for events that arrive from elsewhere (a tool's
/// background task reporting progress, say).
#[derive(Default)]
struct EventQueue {
    events: Mutex<VecDeque<AgentEvent>>,
    reader: AtomicWaker,
    reading: AtomicBool,
}

impl EventQueue {
    fn push(&self, event: AgentEvent) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(event);
        if !self.reading.load(Ordering::Acquire) {
            self.reader.wake();
        }
    }

    fn pop(&self) -> Option<AgentEvent> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }
}

impl AgentLoop {
    fn new(start: impl FnOnce(crate::run::EventSink) -> RunFuture) -> Self {
        let events = Arc::new(EventQueue::default());
        let queue = events.clone();
        AgentLoop {
            run: Some(start(Arc::new(move |event| queue.push(event)))),
            events,
            messages: None,
        }
    }

    /// Runs to the end and returns only the messages this run added.
    pub async fn result(mut self) -> Vec<AgentMessage> {
        while futures::StreamExt::next(&mut self).await.is_some() {}
        self.messages.unwrap_or_default()
    }
}

impl Stream for AgentLoop {
    type Item = AgentEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<AgentEvent>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.events.pop() {
                return Poll::Ready(Some(event));
            }
            let Some(run) = this.run.as_mut() else {
                return Poll::Ready(None);
            };
            this.events.reader.register(cx.waker());
            this.events.reading.store(true, Ordering::Release);
            let polled = run.as_mut().poll(cx);
            this.events.reading.store(false, Ordering::Release);
            match polled {
                Poll::Ready(messages) => {
                    this.messages = Some(messages);
                    this.run = None;
                }
                Poll::Pending => {
                    return match this.events.pop() {
                        Some(event) => Poll::Ready(Some(event)),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }
}
