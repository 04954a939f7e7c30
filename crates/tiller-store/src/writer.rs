//! [`StoreWriter`]: group commit. Writes from many agents wait in one queue; a
//! task takes everything waiting (up to [`StoreWriter::MAX_BATCH`] writes) and
//! applies it in one transaction, then acknowledges each request. Requests are
//! applied in the order they were submitted, so one agent's writes never overtake
//! each other. If a grouped transaction fails, each request is retried alone, so
//! one bad request fails only its own sender.
//!
//! A store that applies writes at once ([`SessionStore::applies_at_once`]: the
//! in-memory store) gains nothing from a shared transaction: while nothing waits
//! in the queue, each request is applied and acknowledged where it is submitted,
//! before `submit` returns, without waking the task (which, for agents on other
//! threads, would be a round trip between threads per write).
//!
//! A store that is failing ([`StoreError::Unavailable`]: a full disk, a lost
//! connection) fails nobody: the writer keeps the writes, tries them again after
//! a wait that doubles from [`StoreWriter::FIRST_RETRY`] to
//! [`StoreWriter::MAX_RETRY`], and answers them once they are committed. Until
//! then [`StoreWriter::health`] says the store is unavailable, so a host can
//! refuse new work instead of taking what it cannot keep.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
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
    health: StoreHealth,
}

struct Request {
    writes: Vec<SessionWrite>,
    ack: Option<Ack>,
}

impl StoreWriter {
    /// The most writes one transaction groups.
    pub const MAX_BATCH: usize = 4096;

    /// The wait before a write the store could not take is tried again.
    pub const FIRST_RETRY: Duration = Duration::from_millis(20);

    /// The longest wait between two tries of a write, while the store fails.
    pub const MAX_RETRY: Duration = Duration::from_secs(2);

    /// A writer for `store`; its task runs on the current tokio runtime.
    pub fn new(store: impl SessionStore) -> Self {
        Self::for_store(Arc::new(store))
    }

    /// A writer for a shared store.
    pub fn for_store(store: Arc<dyn SessionStore>) -> Self {
        let (requests, queue) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let health = StoreHealth::default();
        tokio::spawn(write_loop(
            store.clone(),
            queue,
            pending.clone(),
            health.clone(),
        ));
        StoreWriter {
            store,
            requests,
            pending,
            health,
        }
    }

    /// Whether the store takes writes now, as the writer last found it.
    pub fn health(&self) -> &StoreHealth {
        &self.health
    }

    /// The store written to (for reads).
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// Queues `writes` without waiting; `ack` hears once they are committed (a
    /// store that applies writes at once: before this returns, unless earlier
    /// writes wait in the queue).
    pub fn submit(&self, writes: Vec<SessionWrite>, ack: Option<Ack>) {
        if self.store.applies_at_once() && self.pending.load(Ordering::Acquire) == 0 {
            match self.store.apply(&writes).now_or_never() {
                // Unavailable: queued below, to be tried again.
                Some(Err(error)) if error.is_unavailable() => {}
                Some(result) => {
                    // The writes go before the ack, as in the task.
                    drop(writes);
                    if let Some(ack) = ack {
                        ack(result);
                    }
                    return;
                }
                None => {}
            }
        }
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
    health: StoreHealth,
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
        let durable = Durable {
            store: &*store,
            health: &health,
            queue: &queue,
        };
        let result = if batch.is_empty() {
            Ok(())
        } else {
            durable.apply(&batch).await
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
                    let result = durable.apply(&batch[range]).await;
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

/// A store's writes, tried until the store takes them.
struct Durable<'a> {
    store: &'a dyn SessionStore,
    health: &'a StoreHealth,
    queue: &'a mpsc::UnboundedReceiver<Request>,
}

impl Durable<'_> {
    /// Applies `batch`, trying again while the store is unavailable; the result
    /// once it is committed or refused for itself. Only a writer every handle of
    /// which is gone gives up, unavailable.
    async fn apply(&self, batch: &[SessionWrite]) -> Result<(), StoreError> {
        let mut wait = StoreWriter::FIRST_RETRY;
        loop {
            match self.store.apply(batch).await {
                Err(error) if error.is_unavailable() => {
                    self.health.failed(&error);
                    if self.queue.is_closed() {
                        return Err(error);
                    }
                    tracing::debug!(%error, retry_in_ms = wait.as_millis() as u64, "the session store failed again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(StoreWriter::MAX_RETRY);
                }
                result => {
                    self.health.answered();
                    return result;
                }
            }
        }
    }
}

/// Whether a store takes writes, as its writer found them: shared, cheap to
/// clone and to read (a host reads it before each request that would write).
#[derive(Clone, Default)]
pub struct StoreHealth(Arc<HealthState>);

#[derive(Default)]
struct HealthState {
    unavailable: AtomicBool,
    failures: AtomicU64,
    outages: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl StoreHealth {
    /// Whether the store's last answer was that it cannot write (its writes wait
    /// to be tried again).
    pub fn is_unavailable(&self) -> bool {
        self.0.unavailable.load(Ordering::Acquire)
    }

    /// How many tries of a write the store failed, since the writer started.
    pub fn failures(&self) -> u64 {
        self.0.failures.load(Ordering::Relaxed)
    }

    /// How many times the store became unavailable, since the writer started.
    pub fn outages(&self) -> u64 {
        self.0.outages.load(Ordering::Relaxed)
    }

    /// The store's error while it is unavailable.
    pub fn error(&self) -> Option<String> {
        if !self.is_unavailable() {
            return None;
        }
        self.0
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn failed(&self, error: &StoreError) {
        self.0.failures.fetch_add(1, Ordering::Relaxed);
        *self
            .0
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
        if !self.0.unavailable.swap(true, Ordering::AcqRel) {
            self.0.outages.fetch_add(1, Ordering::Relaxed);
            tracing::error!(%error, "the session store is unavailable; writes wait for it");
        }
    }

    fn answered(&self) {
        // A load first: the usual answer, while all is well, writes nothing.
        if self.0.unavailable.load(Ordering::Acquire)
            && self.0.unavailable.swap(false, Ordering::AcqRel)
        {
            tracing::info!("the session store is available again");
        }
    }
}

impl fmt::Debug for StoreHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreHealth")
            .field("unavailable", &self.is_unavailable())
            .field("failures", &self.failures())
            .field("outages", &self.outages())
            .finish()
    }
}
