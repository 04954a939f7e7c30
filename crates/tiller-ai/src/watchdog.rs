//! The two waits of a response on one timer: the idle timeout, started over by each
//! event (keep-alive comments are not events), and the deadline of the whole
//! response. One timer rather than two keeps the per-event cost what it was with the
//! idle timeout alone: one reset, one poll.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::error::StreamError;
use crate::limits::{deadline_after, millis};

pub(crate) struct Watchdog {
    idle_timeout: Option<Duration>,
    /// The deadline's length and when it falls.
    deadline: Option<(Duration, Instant)>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl Watchdog {
    /// Starts the deadline now; the idle wait starts with [`Watchdog::restart`].
    /// Waits too long to represent mean "never".
    pub(crate) fn new(idle_timeout: Option<Duration>, deadline: Option<Duration>) -> Self {
        let deadline = deadline.and_then(|limit| Some((limit, deadline_after(limit)?)));
        Watchdog {
            idle_timeout,
            deadline,
            timer: deadline.map(|(_, at)| Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// Something arrived: the idle wait starts over (never past the deadline).
    pub(crate) fn restart(&mut self) {
        let idle = self.idle_timeout.and_then(deadline_after);
        let at = match (idle, self.deadline.map(|(_, at)| at)) {
            (Some(idle), Some(deadline)) => Some(idle.min(deadline)),
            (idle, deadline) => idle.or(deadline),
        };
        match (self.timer.as_mut(), at) {
            (Some(timer), Some(at)) => timer.as_mut().reset(at),
            (_, at) => self.timer = at.map(|at| Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// The error once a wait has run out; otherwise `Pending`, with the task woken
    /// when one does.
    pub(crate) fn poll_expired(&mut self, cx: &mut TaskContext<'_>) -> Poll<StreamError> {
        let Some(timer) = self.timer.as_mut() else {
            return Poll::Pending;
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(match self.deadline {
            Some((limit, at)) if Instant::now() >= at => StreamError::DeadlineExceeded {
                deadline_ms: millis(limit),
            },
            _ => StreamError::Stalled {
                idle_timeout_ms: self.idle_timeout.map_or(0, millis),
            },
        })
    }
}
