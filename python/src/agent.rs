//! An agent's handle for Python: every operation one `Op` sent to its actor,
//! awaited or waited for (see [`crate::runtime::finish`]).

use pyo3::prelude::*;
use tiller::run::RunHooks;
use tiller::runtime::DefinitionPatch;
use tiller::{AgentHandle, Op};

use crate::events::EventStream;
use crate::{error, runtime, turn};

/// A handle to one agent; cheap to copy, valid while the agent lives (also
/// while it hibernates).
#[pyclass(module = "tiller._native", name = "Agent", frozen)]
pub(crate) struct PyAgent {
    handle: AgentHandle,
}

impl PyAgent {
    pub(crate) fn new(handle: AgentHandle) -> Self {
        PyAgent { handle }
    }
}

#[pymethods]
impl PyAgent {
    /// The agent's id.
    #[getter]
    fn id(&self) -> String {
        self.handle.id().to_string()
    }

    /// The id of the session that keeps its conversation.
    #[getter]
    fn session_id(&self) -> String {
        self.handle.session_id().to_owned()
    }

    /// Its name, when it was given one.
    #[getter]
    fn name(&self) -> Option<String> {
        self.handle.name().map(str::to_owned)
    }

    /// Sends the `Op` written as `op` (JSON: `{"type": "prompt", "text": …}`,
    /// `steer`, `follow_up`, `answer`, `approve`, `deny`, `reset`, …); returns
    /// once it is accepted (and stored). With `key`, an idempotency key: the op
    /// sent again with it is acknowledged without being applied twice.
    #[pyo3(signature = (op, key = None, blocking = false))]
    fn submit<'py>(
        &self,
        py: Python<'py>,
        op: &str,
        key: Option<String>,
        blocking: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let op: Op = serde_json::from_str(op).map_err(|error| error::config("op", error))?;
        let agent = self.handle.clone();
        runtime::finish(py, blocking, async move {
            match key {
                Some(key) => agent.submit_keyed(op, key).await,
                None => agent.submit(op).await,
            }
            .map_err(error::agent)
        })
    }

    /// Runs `text` to the run's end: its summary as JSON. For this run alone,
    /// `until` keeps it going until it accepts a turn, `stop_when` ends it after
    /// a turn it accepts (both called with a turn's JSON), and `output` (JSON:
    /// a name and a JSON Schema) is the structured output asked for.
    #[pyo3(signature = (text, until = None, stop_when = None, output = None, blocking = false))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        text: String,
        until: Option<Py<PyAny>>,
        stop_when: Option<Py<PyAny>>,
        output: Option<&str>,
        blocking: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let agent = self.handle.clone();
        let output = output.map(turn::output_schema).transpose()?;
        runtime::finish(py, blocking, async move {
            let outcome = if until.is_none() && stop_when.is_none() && output.is_none() {
                agent.run(text).await
            } else {
                let patch = DefinitionPatch {
                    output_schema: output,
                    ..DefinitionPatch::default()
                };
                let hooks = RunHooks {
                    run_until: until.map(turn::predicate),
                    stop_when: stop_when.map(turn::predicate),
                    ..RunHooks::default()
                };
                agent.run_with_hooks(text, patch, hooks).await
            };
            let outcome = outcome.map_err(error::agent)?;
            serde_json::to_string(&outcome.summary()).map_err(error::json)
        })
    }

    /// Aborts the run going on (or gives up the calls waiting for the user).
    fn abort(&self) {
        self.handle.abort();
    }

    /// Compacts the transcript now: the compaction's report as JSON.
    #[pyo3(signature = (instructions = None, blocking = false))]
    fn compact<'py>(
        &self,
        py: Python<'py>,
        instructions: Option<String>,
        blocking: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let agent = self.handle.clone();
        runtime::finish(py, blocking, async move {
            let report = agent.compact(instructions).await.map_err(error::agent)?;
            serde_json::to_string(&report).map_err(error::json)
        })
    }

    /// The agent's state as JSON, as the server shows it.
    #[pyo3(signature = (blocking = false))]
    fn state<'py>(&self, py: Python<'py>, blocking: bool) -> PyResult<Bound<'py, PyAny>> {
        let agent = self.handle.clone();
        runtime::finish(py, blocking, async move {
            let state = agent.state().await.map_err(error::agent)?;
            serde_json::to_string(&state).map_err(error::json)
        })
    }

    /// Waits until no run is going on.
    #[pyo3(signature = (blocking = false))]
    fn wait_for_idle<'py>(&self, py: Python<'py>, blocking: bool) -> PyResult<Bound<'py, PyAny>> {
        let agent = self.handle.clone();
        runtime::finish(py, blocking, async move {
            agent.wait_for_idle().await;
            Ok(())
        })
    }

    /// Subscribes to the agent's events from now on.
    fn subscribe(&self) -> EventStream {
        EventStream::new(self.handle.subscribe())
    }
}
