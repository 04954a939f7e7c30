//! Tiller's tokio runtime in a Python process, and the two ways a caller waits
//! for it: `await`, or blocked with the GIL released.

use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::{IntoPyObjectExt, Python};

/// How often a blocked wait looks for a signal (Ctrl-C) while the GIL is released.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Sets up the runtime the module's futures run on: a current-thread runtime
/// driven by a thread of its own (the agents themselves run on the
/// supervisor's shards). One thread, not a multi-thread runtime's workers,
/// which wake each other to steal work at every hand-off.
pub(crate) fn init() -> PyResult<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| {
            PyRuntimeError::new_err(format!("Tiller's runtime could not start: {error}"))
        })?;
    // The module's runtime lives as long as the process.
    let runtime: &'static tokio::runtime::Runtime = Box::leak(Box::new(runtime));
    std::thread::Builder::new()
        .name("tiller-python".to_owned())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .map_err(|error| {
            PyRuntimeError::new_err(format!("Tiller's runtime thread could not start: {error}"))
        })?;
    // Set once: a second import of the module (another interpreter) keeps the first.
    let _ = pyo3_async_runtimes::tokio::init_with_runtime(runtime);
    Ok(())
}

/// The runtime.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// `future` on Tiller's runtime: an asyncio awaitable, or with `blocking` its
/// value, waited for by [`wait`].
pub(crate) fn finish<'py, T>(
    py: Python<'py>,
    blocking: bool,
    future: impl Future<Output = PyResult<T>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    if blocking {
        wait(py, future)?.into_bound_py_any(py)
    } else {
        pyo3_async_runtimes::tokio::future_into_py(py, future)
    }
}

/// Runs `future` on Tiller's runtime and waits for it with the GIL released,
/// from any thread (a Python tool's too); a signal's exception (Ctrl-C's
/// `KeyboardInterrupt`) ends the wait and drops the future.
pub(crate) fn wait<T: Send + 'static>(
    py: Python<'_>,
    future: impl Future<Output = PyResult<T>> + Send + 'static,
) -> PyResult<T> {
    let (done, result) = mpsc::sync_channel(1);
    let task = runtime().spawn(async move {
        // The waiter may have gone (interrupted); nothing is lost then.
        let _ = done.send(future.await);
    });
    let mut result = result;
    loop {
        let (received, receiver) = py.detach(move || (result.recv_timeout(SIGNAL_CHECK), result));
        result = receiver;
        match received {
            Ok(value) => return value,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(signal) = py.check_signals() {
                    task.abort();
                    return Err(signal);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "Tiller's runtime dropped an operation before it finished",
                ));
            }
        }
    }
}
