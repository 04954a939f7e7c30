//! Tiller in Python: the native half of the `tiller` package (`tiller._native`).
//!
//! The runtime runs in the Python process on Tiller's own tokio runtime, never on
//! the thread of the caller's event loop. Every operation is offered twice from
//! one Rust future: as an awaitable (`blocking=False`) or waited for with the GIL
//! released (`blocking=True`, for scripts; Ctrl-C interrupts the wait). What
//! crosses into Python is plain: strings, JSON text (which the Python half turns
//! into dataclasses, a batch of events in one `json.loads`) and the handles below.
//! Rust holds Python objects only as `Py` handles (a tool's function, a
//! predicate, the loop to hand events to), never a borrowed one or the GIL
//! across an await.
//!
//! The Python half (`python/tiller/`) is the API users read: `Supervisor`,
//! `Agent`, `@tiller.tool`, the event dataclasses. From Python:
//!
//! ```python
//! import asyncio, tiller
//!
//! async def main():
//!     async with await tiller.Supervisor.start() as supervisor:
//!         agent = await supervisor.spawn(system_prompt="Answer briefly.")
//!         result = await agent.run("Why is the sky blue?")
//!         print(result.text)
//!
//! asyncio.run(main())
//! ```

mod agent;
mod bench;
mod error;
mod events;
mod model;
mod runtime;
mod supervisor;
mod tool;
mod turn;
mod workers;

use pyo3::prelude::*;

/// The module `tiller._native`.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    runtime::init()?;
    module.add_class::<supervisor::PySupervisor>()?;
    module.add_class::<agent::PyAgent>()?;
    module.add_class::<events::EventStream>()?;
    module.add_class::<model::PyModel>()?;
    module.add_class::<model::PyFaux>()?;
    module.add_class::<tool::Reply>()?;
    module.add_function(wrap_pyfunction!(context_from_headers, module)?)?;
    module.add_function(wrap_pyfunction!(workers::close, module)?)?;
    module.add_function(wrap_pyfunction!(bench::queue_floor, module)?)?;
    module.add_function(wrap_pyfunction!(bench::empty_call_floor, module)?)?;
    module.add_function(wrap_pyfunction!(bench::tool_round_trips, module)?)?;
    module.add_function(wrap_pyfunction!(bench::blocking_hop_floor, module)?)?;
    module.add_function(wrap_pyfunction!(bench::loop_hop_floor, module)?)?;
    Ok(())
}

/// The context request headers give (`AgentContext::from_headers`), as the JSON
/// of its ids and states.
#[pyfunction]
fn context_from_headers(headers: Vec<(String, String)>) -> PyResult<String> {
    let context =
        tiller::AgentContext::from_headers(headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    serde_json::to_string(&context.to_stored()).map_err(error::json)
}
