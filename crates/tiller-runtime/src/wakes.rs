//! Wakes of subscribers off the shards, gathered on a shard for a short window.
//!
//! Waking a task of a tokio multi-thread runtime from another thread costs a
//! worker's wake-up, and often a second worker's too: several times the cost of
//! reading the event from the socket. A shard thread therefore holds its wakes of
//! readers on threads that are not shards (the host's runtime) for
//! [`SupervisorConfig::delivery_window`] and wakes each of them once at its end,
//! with everything delivered meanwhile waiting in its queue. A reader on a shard
//! (this one, or another, whose wake-up is one current-thread runtime's) is woken
//! at once, and so is every reader when the publisher is not a shard or the
//! window is zero.
//!
//! [`SupervisorConfig::delivery_window`]: crate::SupervisorConfig::delivery_window

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;
use std::time::Duration;

/// The bit of a thread's number that says it is a shard.
const SHARD: u64 = 1 << 63;

thread_local! {
    /// This thread's number, told apart from every other thread's, with
    /// [`SHARD`] set once [`hold_here`] made it a shard.
    static THREAD: Cell<u64> = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Cell::new(NEXT.fetch_add(1, Ordering::Relaxed))
    };
    /// Set on a shard thread: how long its wakes of other threads are held.
    static WINDOW: Cell<Option<Duration>> = const { Cell::new(None) };
    /// The wakes held now, to be made when the window's timer fires.
    static HELD: RefCell<Vec<Waker>> = const { RefCell::new(Vec::new()) };
}

/// The number of the current thread, for [`wake`] to tell a reader on this
/// thread from one elsewhere.
pub(crate) fn this_thread() -> u64 {
    THREAD.with(Cell::get)
}

/// Makes the current thread a shard, holding its wakes of readers off the
/// shards for `window`; zero wakes them at once.
pub(crate) fn hold_here(window: Duration) {
    THREAD.with(|thread| thread.set(thread.get() | SHARD));
    WINDOW.with(|held| held.set((!window.is_zero()).then_some(window)));
}

/// Wakes `waker`, whose task last waited on thread `reader`: at the end of this
/// shard's current window when the reader is off the shards, else at once.
pub(crate) fn wake(waker: Waker, reader: u64) {
    let Some(window) = WINDOW.with(Cell::get).filter(|_| reader & SHARD == 0) else {
        waker.wake();
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        waker.wake();
        return;
    };
    let first = HELD.with(|held| {
        let mut held = held.borrow_mut();
        held.push(waker);
        held.len() == 1
    });
    if first {
        // One timer per window and shard, whatever the number of readers.
        runtime.spawn(async move {
            tokio::time::sleep(window).await;
            for waker in HELD.with(|held| std::mem::take(&mut *held.borrow_mut())) {
                waker.wake();
            }
        });
    }
}
