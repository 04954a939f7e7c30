//! Shards: current-thread tokio runtimes, each on a thread of its own, where a
//! supervisor's agents live (see [`Shards`]).
//!
//! An agent is placed by a hash of its id, so it comes back to the same shard
//! after hibernation or a restart, and placing it reads no shared count. Its
//! actor, its run's task, its tools (which run in the run's task) and the
//! connections of its model calls (each shard thread has an HTTP client of its
//! own, [`tiller_ai::use_thread_client`]) then all run on that one thread: an
//! event read from the socket reaches the actor without waking another thread.

use std::future::Future;
use std::hash::BuildHasher;
use std::time::Duration;

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle};

/// How many shards a supervisor runs its agents on
/// ([`SupervisorConfig::shards`](crate::SupervisorConfig::shards)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shards {
    /// One per core when the supervisor starts on a multi-thread runtime; none
    /// (the agents run on that runtime) when it starts on a current-thread one,
    /// which is already a single thread — and whose clock a test may pause.
    #[default]
    Auto,
    /// This many shard threads; zero runs the agents on the runtime that
    /// starts the supervisor.
    Count(usize),
}

impl Shards {
    /// The number of shard threads this asks for, on the current runtime.
    fn threads(self) -> usize {
        let on_current_thread = || {
            Handle::try_current()
                .is_ok_and(|handle| handle.runtime_flavor() == RuntimeFlavor::CurrentThread)
        };
        match self {
            Shards::Count(count) => count,
            Shards::Auto if on_current_thread() => 0,
            Shards::Auto => {
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            }
        }
    }
}

/// A supervisor's shard threads; none means agents run on the runtime that
/// starts them.
pub(crate) struct ShardSet {
    handles: Vec<Handle>,
    /// Each shard's thread, as [`crate::wakes::this_thread`] numbers it.
    threads: Vec<u64>,
    /// Dropped with the shards: each thread then ends, dropping its tasks.
    _stop: Vec<oneshot::Sender<()>>,
    /// The one hasher of this supervisor's placements.
    hasher: std::hash::RandomState,
}

impl ShardSet {
    /// Starts the shard threads `shards` asks for, each holding its wakes of
    /// other threads for `delivery_window` ([`crate::wakes`]).
    pub(crate) fn start(shards: Shards, delivery_window: Duration) -> std::io::Result<ShardSet> {
        let count = shards.threads();
        let mut handles = Vec::with_capacity(count);
        let mut stops = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        for n in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            let (number, told) = std::sync::mpsc::sync_channel(1);
            std::thread::Builder::new()
                .name(format!("tiller-shard-{n}"))
                .spawn(move || {
                    tiller_ai::use_thread_client();
                    crate::wakes::hold_here(delivery_window);
                    let _ = number.send(crate::wakes::this_thread());
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                })?;
            threads.push(told.recv().map_err(std::io::Error::other)?);
        }
        Ok(ShardSet {
            handles,
            threads,
            _stop: stops,
            hasher: std::hash::RandomState::new(),
        })
    }

    /// Runs `future` on the shard of the agent `id` (on the current runtime,
    /// when there are no shards).
    pub(crate) fn spawn<F>(&self, id: &str, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_at(self.shard_of(id), future)
    }

    /// The shard of the agent `id` (0 when there are none).
    pub(crate) fn shard_of(&self, id: &str) -> usize {
        let count = self.handles.len().max(1) as u64;
        (self.hasher.hash_one(id) % count) as usize
    }

    /// Calls `start` in the first shard's runtime context, so that the tasks it
    /// spawns run there (in the caller's context, when there are no shards).
    pub(crate) fn on_first<R>(&self, start: impl FnOnce() -> R) -> R {
        let _entered = self.handles.first().map(Handle::enter);
        start()
    }

    /// How many shard threads there are.
    pub(crate) fn count(&self) -> usize {
        self.handles.len()
    }

    /// Runs `future` on shard `n` modulo their number (on the current runtime,
    /// when there are no shards).
    pub(crate) fn spawn_at<F>(&self, n: usize, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handles.len() {
            0 => tokio::spawn(future),
            count => self.handles[n % count].spawn(future),
        }
    }

    /// Runs `future` to its end on the shard of the agent `id`: in place when
    /// called there, or when there are no shards.
    pub(crate) async fn run<F>(&self, id: &str, future: F) -> Result<F::Output, JoinError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let shard = self.shard_of(id);
        match self.threads.get(shard) {
            Some(&thread) if thread != crate::wakes::this_thread() => {
                self.spawn_at(shard, future).await
            }
            _ => Ok(future.await),
        }
    }
}
