//! What the Python benches (python/benches) measure Tiller against, in the same
//! run: the floors of a hand-off to Python and of a call into it, and a Python
//! tool's round trip through the same code an agent's call takes.

use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tiller::ai::CancellationToken;
use tiller::{AgentTool, ToolContext};

use crate::runtime;
use crate::tool::{PyTool, Reply};

/// The floor of delivering events to an `async for`: a Rust thread handing
/// `events` copies of `payload` to `queue` (an `asyncio.Queue` of the running
/// `event_loop`), one `call_soon_threadsafe(queue.put_nowait, bytes)` each,
/// `spacing_us` apart. Returns at once; the caller awaits the queue.
#[pyfunction]
pub(crate) fn queue_floor(
    event_loop: Py<PyAny>,
    queue: Py<PyAny>,
    events: usize,
    spacing_us: u64,
    payload: Vec<u8>,
) -> PyResult<()> {
    std::thread::Builder::new()
        .name("tiller-bench-floor".to_owned())
        .spawn(move || {
            for _ in 0..events {
                std::thread::sleep(Duration::from_micros(spacing_us));
                let handed = Python::attach(|py| {
                    let put = queue.getattr(py, "put_nowait")?;
                    event_loop.call_method1(
                        py,
                        "call_soon_threadsafe",
                        (put, PyBytes::new(py, &payload)),
                    )
                });
                if handed.is_err() {
                    return;
                }
            }
        })
        .map(|_| ())
        .map_err(|error| pyo3::exceptions::PyRuntimeError::new_err(error.to_string()))
}

/// The floor of a call into Python: seconds per call of `function` (taking no
/// arguments) from a thread of Tiller's runtime, `calls` times in a row.
#[pyfunction]
pub(crate) fn empty_call_floor(py: Python<'_>, function: Py<PyAny>, calls: usize) -> PyResult<f64> {
    runtime::wait(py, async move {
        let started = Instant::now();
        for _ in 0..calls {
            Python::attach(|py| function.call0(py))?;
        }
        Ok(started.elapsed().as_secs_f64() / calls as f64)
    })
}

/// The floor of any hand-off to a waiting thread and back, as a plain tool's
/// call to a worker takes: seconds per round trip of an empty closure through
/// tokio's blocking pool (a thread woken there, a task woken back), from a
/// thread of Tiller's runtime, `calls` times in a row.
#[pyfunction]
pub(crate) fn blocking_hop_floor(py: Python<'_>, calls: usize) -> PyResult<f64> {
    runtime::wait(py, async move {
        let started = Instant::now();
        for _ in 0..calls {
            tokio::task::spawn_blocking(|| ())
                .await
                .map_err(|error| pyo3::exceptions::PyRuntimeError::new_err(error.to_string()))?;
        }
        Ok(started.elapsed().as_secs_f64() / calls as f64)
    })
}

/// The floor of an async tool's hand-off: seconds per round trip through the
/// caller's running event loop (`call_soon_threadsafe` of a reply that answers
/// at once), from a thread of Tiller's runtime, `calls` times in a row.
#[pyfunction]
pub(crate) fn loop_hop_floor(py: Python<'_>, calls: usize) -> PyResult<Bound<'_, PyAny>> {
    let event_loop = pyo3_async_runtimes::tokio::get_current_locals(py)?;
    runtime::finish(py, false, async move {
        let started = Instant::now();
        for _ in 0..calls {
            let (reply, answer) = Reply::new();
            Python::attach(|py| {
                event_loop
                    .event_loop(py)
                    .call_method1("call_soon_threadsafe", (reply, ""))
                    .map(|_| ())
            })?;
            answer
                .await
                .map_err(|error| pyo3::exceptions::PyRuntimeError::new_err(error.to_string()))?;
        }
        Ok(started.elapsed().as_secs_f64() / calls as f64)
    })
}

/// Seconds per round trip of the Python tool `tool` (a `tiller.Tool` taking no
/// arguments): Rust asks, Python runs it, Rust has the result, `calls` times in
/// a row, through the code an agent's call takes. An async tool runs on the
/// caller's event loop (awaited: the loop must run meanwhile).
#[pyfunction]
pub(crate) fn tool_round_trips<'py>(
    py: Python<'py>,
    tool: &Bound<'py, PyAny>,
    calls: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let event_loop = pyo3_async_runtimes::tokio::get_current_locals(py).ok();
    let blocking = event_loop.is_none();
    let tool = PyTool::new(tool, event_loop)?;
    runtime::finish(py, blocking, async move {
        let started = Instant::now();
        for n in 0..calls {
            let ctx = ToolContext::detached(format!("call-{n}"), CancellationToken::new(), |_| {});
            tool.execute(serde_json::json!({}), ctx)
                .await
                .map_err(|error| pyo3::exceptions::PyRuntimeError::new_err(error.to_string()))?;
        }
        Ok(started.elapsed().as_secs_f64() / calls as f64)
    })
}
