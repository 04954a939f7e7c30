//! The threads plain Python tools run on: each stays attached to the
//! interpreter for its life (its thread state made once, the GIL taken only
//! while it runs a call), so a call costs a hand-off and no more. A worker is
//! started when every idle one has a call waiting already, up to
//! [`MAX_WORKERS`]; past that, calls wait
//! their turn. At the interpreter's exit ([`close`]) the workers finish what
//! was handed to them, take no more, and end, before the interpreter does.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The most worker threads: as many plain tools can run at once.
pub(crate) const MAX_WORKERS: usize = 64;

/// A call handed to a worker.
type Job = Box<dyn FnOnce(Python<'_>) + Send>;

struct Pool {
    jobs: VecDeque<Job>,
    idle: usize,
    threads: Vec<JoinHandle<()>>,
    closed: bool,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    jobs: VecDeque::new(),
    idle: 0,
    threads: Vec::new(),
    closed: false,
});
static READY: Condvar = Condvar::new();

fn pool() -> MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hands `job` to a worker, starting one when every worker has a job waiting
/// for it already (and fewer than [`MAX_WORKERS`] run); refused once the
/// interpreter is exiting, or when no thread could be started for it.
pub(crate) fn run(job: impl FnOnce(Python<'_>) + Send + 'static) -> PyResult<()> {
    let mut pool = pool();
    if pool.closed {
        return Err(PyRuntimeError::new_err("the Python interpreter is exiting"));
    }
    if pool.jobs.len() >= pool.idle && pool.threads.len() < MAX_WORKERS {
        let thread = std::thread::Builder::new()
            .name("tiller-python-tool".to_owned())
            .spawn(work)
            .map_err(|error| PyRuntimeError::new_err(format!("no thread for a tool: {error}")))?;
        pool.threads.push(thread);
    }
    pool.jobs.push_back(Box::new(job));
    READY.notify_one();
    Ok(())
}

/// A worker: attached once, the GIL released but while a call runs.
fn work() {
    Python::attach(|py| {
        py.detach(|| {
            while let Some(job) = next() {
                Python::attach(job);
            }
        });
    });
}

/// The next job, waiting for one; `None` once closed and drained.
fn next() -> Option<Job> {
    let mut pool = pool();
    loop {
        if let Some(job) = pool.jobs.pop_front() {
            return Some(job);
        }
        if pool.closed {
            return None;
        }
        pool.idle += 1;
        pool = READY.wait(pool).unwrap_or_else(PoisonError::into_inner);
        pool.idle -= 1;
    }
}

/// At the interpreter's exit (an `atexit` hook of the package): no more calls
/// are taken, and the workers finish theirs and end, the GIL released meanwhile.
#[pyfunction]
pub(crate) fn close(py: Python<'_>) {
    let threads = {
        let mut pool = pool();
        pool.closed = true;
        READY.notify_all();
        std::mem::take(&mut pool.threads)
    };
    py.detach(|| {
        for thread in threads {
            // A worker that panicked has ended all the same.
            let _ = thread.join();
        }
    });
}
