//! An agent's events for Python: read from its subscription in batches, each
//! batch one JSON array of the lean wire's envelopes (`tiller::wire`), which the
//! Python half turns into event dataclasses with one `json.loads`.
//!
//! For `async for`, a pump task hands each batch to the event loop as it is
//! made (`call_soon_threadsafe`: one wake-up of the loop a batch, nothing asked
//! back), holding at most one batch that Python has not taken; a script's
//! plain `for` reads a batch at a time, blocked with the GIL released.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{FutureExt, StreamExt};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tiller::runtime::Subscription;
use tiller::wire::{Cursor, Updates};
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use crate::runtime;

/// The most envelopes one batch carries: what is ready, up to this.
const MAX_BATCH: usize = 256;

/// A subscription to one agent's events.
#[pyclass(module = "tiller._native", frozen)]
pub(crate) struct EventStream {
    reader: Arc<Mutex<Option<Reader>>>,
    closed: CancellationToken,
    /// Whether the pump handed Python a batch it has not taken yet.
    handed: Arc<AtomicBool>,
    taken: Arc<Notify>,
}

struct Reader {
    subscription: Subscription,
    /// Which updates this reader can rebuild; a snapshot where it cannot.
    cursor: Cursor,
}

impl Reader {
    /// The next batch: a JSON array of what is ready (at least one envelope,
    /// waited for); `None` when the subscription ended or `closed` was cancelled.
    async fn batch(&mut self, closed: &CancellationToken) -> Option<Vec<u8>> {
        let first = tokio::select! {
            first = self.subscription.next() => first?,
            () = closed.cancelled() => return None,
        };
        let mut batch = Vec::with_capacity(1024);
        batch.push(b'[');
        batch.extend_from_slice(&self.cursor.frame(&first).json());
        for _ in 1..MAX_BATCH {
            match self.subscription.next().now_or_never() {
                Some(Some(envelope)) => {
                    batch.push(b',');
                    batch.extend_from_slice(&self.cursor.frame(&envelope).json());
                }
                _ => break,
            }
        }
        batch.push(b']');
        Some(batch)
    }
}

impl EventStream {
    pub(crate) fn new(subscription: Subscription) -> Self {
        EventStream {
            reader: Arc::new(Mutex::new(Some(Reader {
                subscription,
                cursor: Cursor::new(Updates::Lean),
            }))),
            closed: CancellationToken::new(),
            handed: Arc::new(AtomicBool::new(false)),
            taken: Arc::new(Notify::new()),
        }
    }
}

#[pymethods]
impl EventStream {
    /// The next batch (`bytes`: a JSON array of envelopes), waited for with
    /// the GIL released; `None` once the agent stopped or the stream was closed.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Py<PyBytes>>> {
        let (reader, closed) = (self.reader.clone(), self.closed.clone());
        let batch = runtime::wait(py, async move {
            let mut reader = reader.lock().await;
            let Some(open) = reader.as_mut() else {
                return Ok(None);
            };
            let batch = open.batch(&closed).await;
            if batch.is_none() {
                *reader = None;
            }
            Ok(batch)
        })?;
        Ok(batch.map(|batch| PyBytes::new(py, &batch).unbind()))
    }

    /// Starts handing batches to `deliver` on `event_loop` (through
    /// `call_soon_threadsafe`), then `None` once the agent stopped or the
    /// stream was closed. A batch is handed only once Python took the one
    /// before (`taken`).
    fn pump(&self, event_loop: Py<PyAny>, deliver: Py<PyAny>) -> PyResult<()> {
        let reader = self
            .reader
            .try_lock()
            .ok()
            .and_then(|mut reader| reader.take())
            .ok_or_else(|| PyRuntimeError::new_err("this stream is read already"))?;
        let (closed, handed, taken) =
            (self.closed.clone(), self.handed.clone(), self.taken.clone());
        runtime::runtime().spawn(async move {
            let mut reader = reader;
            loop {
                let batch = reader.batch(&closed).await;
                while handed.load(Ordering::Acquire) {
                    tokio::select! {
                        () = taken.notified() => {}
                        () = closed.cancelled() => break,
                    }
                }
                let end = batch.is_none();
                handed.store(true, Ordering::Release);
                let handed_over = Python::attach(|py| {
                    let batch = batch.map(|batch| PyBytes::new(py, &batch));
                    event_loop.call_method1(py, "call_soon_threadsafe", (&deliver, batch))
                });
                // A loop that closed takes nothing more.
                if end || handed_over.is_err() {
                    return;
                }
            }
        });
        Ok(())
    }

    /// Python took the batch it was handed: the pump may hand the next.
    fn taken(&self) {
        self.handed.store(false, Ordering::Release);
        self.taken.notify_one();
    }

    /// Ends the subscription: a batch being waited for ends with `None`.
    fn close(&self) {
        self.closed.cancel();
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        // The pump ends with the stream Python dropped.
        self.closed.cancel();
    }
}
