//! [`StoreWriter`]: group commit. Writes from many agents wait in one queue; a
//! task takes everything waiting (up to [`StoreWriter::MAX_BATCH`] writes) and
//! applies it in one transaction, then acknowledges each request. Requests are
//! applied in the order they were submitted, so one agent's writes never overtake
//! each other. If a grouped transaction fails, each request is retried alone, so
//! one bad request fails only its own sender.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};

use crate::{SessionStore, SessionWrite, StoreError};

/// Told once a request is committed, or why it was not.
pub type Ack = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// The way writes reach a store, grouped into shared transactions. Cheap to clone;
/// the writing task ends when the last clone is dropped.
#[derive(Clone)]
pub struct StoreWriter {
    store: Arc<dyn SessionStore>,
    requests: mpsc::UnboundedSender<Request>,
    /// Requests submitted and not yet answered.
    pending: Arc<AtomicUsize>,
}

struct Request {
    writes: Vec<SessionWrite>,
    ack: Option<Ack>,
}

impl StoreWriter {
    /// The most writes one transaction groups.
    pub const MAX_BATCH: usize = 4096;

    /// A writer for `store`; its task runs on the current tokio runtime.
    pub fn new(store: impl SessionStore) -> Self {
        Self::for_store(Arc::new(store))
    }

    /// A writer for a shared store.
    pub fn for_store(store: Arc<dyn SessionStore>) -> Self {
        let (requests, queue) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        tokio::spawn(write_loop(store.clone(), queue, pending.clone()));
        StoreWriter {
            store,
            requests,
            pending,
        }
    }

    /// The store written to (for reads).
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// Queues `writes` without waiting; `ack` hears once they are committed.
    pub fn submit(&self, writes: Vec<SessionWrite>, ack: Option<Ack>) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(Request { ack: Some(ack), .. })) =
            self.requests.send(Request { writes, ack })
        {
            ack(Err(StoreError::Closed));
        }
    }

    /// Writes `writes` and returns once they are committed.
    pub async fn write(&self, writes: Vec<SessionWrite>) -> Result<(), StoreError> {
        let (done, committed) = oneshot::channel();
        self.submit(
            writes,
            Some(Box::new(move |result| {
                let _ = done.send(result);
            })),
        );
        committed.await.unwrap_or(Err(StoreError::Closed))
    }

    /// Returns once everything submitted before is committed (at once when
    /// nothing waits).
    pub async fn flush(&self) -> Result<(), StoreError> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.write(Vec::new()).await
    }
}

impl fmt::Debug for StoreWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreWriter").finish_non_exhaustive()
    }
}

async fn write_loop(
    store: Arc<dyn SessionStore>,
    mut queue: mpsc::UnboundedReceiver<Request>,
    pending: Arc<AtomicUsize>,
) {
    let mut batch: Vec<SessionWrite> = Vec::new();
    let mut acks: Vec<(Range<usize>, Option<Ack>)> = Vec::new();
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some(request) = next.take() {
            let start = batch.len();
            batch.extend(request.writes);
            acks.push((start..batch.len(), request.ack));
            if batch.len() < StoreWriter::MAX_BATCH {
                next = queue.try_recv().ok();
            }
        }
        let answered = acks.len();
        let result = if batch.is_empty() {
            Ok(())
        } else {
            store.apply(&batch).await
        };
        match result {
            Ok(()) => {
                // The writes go before the acks: whoever is told keeps the last
                // reference to a message written, so its memory is freed there
                // rather than on this loop's path.
                batch.clear();
                for (_, ack) in acks.drain(..) {
                    if let Some(ack) = ack {
                        ack(Ok(()));
                    }
                }
            }
            Err(error) if acks.len() == 1 => {
                tracing::warn!(%error, "a session store write failed");
                if let Some((_, Some(ack))) = acks.pop() {
                    ack(Err(error));
                }
            }
            Err(_) => {
                for (range, ack) in acks.drain(..) {
                    let result = store.apply(&batch[range]).await;
                    if let Err(error) = &result {
                        tracing::warn!(%error, "a session store write failed");
                    }
                    if let Some(ack) = ack {
                        ack(result);
                    }
                }
            }
        }
        pending.fetch_sub(answered, Ordering::AcqRel);
        batch.clear();
    }
}
