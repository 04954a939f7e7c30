//! A Python function as an agent tool: `@tiller.tool` gives its name,
//! description and parameter schema; a call crosses into Python with its
//! arguments and context as JSON and comes back as JSON, so no Python object
//! outlives the call on the Rust side but the function itself.

use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3_async_runtimes::TaskLocals;
use serde::Deserialize;
use serde_json::{Map, Value};
use tiller::run::ToolExecution;
use tiller::{AgentTool, ToolContext, ToolError, ToolOutput};
use tokio::sync::oneshot;

use crate::workers;

/// A tool whose code is a Python function (a `tiller.Tool`).
pub(crate) struct PyTool {
    name: String,
    description: String,
    parameters: Value,
    sequential: bool,
    /// Whether the function takes the call's context: only then is the agent's
    /// context written out for it.
    takes_context: bool,
    /// The `tiller.Tool`: `_call_sync(...)`, taking a [`Call`] and answering
    /// JSON, and for a coroutine function `_start_async(...)`, taking a
    /// [`Call`] and a [`Reply`] to answer with.
    tool: Arc<Py<PyAny>>,
    /// The event loop an async tool's coroutine runs on: the one the agent was
    /// spawned from. Without one (a blocking spawn), `_call_sync` runs it.
    event_loop: Option<TaskLocals>,
}

/// What a call hands Python: its arguments, id, whether the user approved or
/// answered it, and the agent's context (ids and states) as JSON, written only
/// for a function that takes it (else empty) and read only when it asks.
type Call = (String, String, bool, bool, String);

/// What the Python function came to, as `tiller.Tool` writes it.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Ok {
        text: String,
        #[serde(default)]
        details: Value,
        #[serde(default)]
        terminate: bool,
        #[serde(default)]
        state: Map<String, Value>,
    },
    Failed(String),
    NeedsInput {
        field: String,
        question: String,
    },
    NeedsApproval(String),
}

impl PyTool {
    /// The tool `tool` describes (a `tiller.Tool`), its async calls run on
    /// `event_loop`.
    pub(crate) fn new(tool: &Bound<'_, PyAny>, event_loop: Option<TaskLocals>) -> PyResult<Self> {
        let parameters: String = tool.getattr("parameters_json")?.extract()?;
        let parameters = serde_json::from_str(&parameters).map_err(crate::error::json)?;
        let is_async: bool = tool.getattr("is_async")?.extract()?;
        Ok(PyTool {
            name: tool.getattr("name")?.extract()?,
            description: tool.getattr("description")?.extract()?,
            parameters,
            sequential: tool.getattr("sequential")?.extract()?,
            takes_context: tool.getattr("takes_context")?.extract()?,
            tool: Arc::new(tool.clone().unbind()),
            event_loop: event_loop.filter(|_| is_async),
        })
    }

    /// Calls the function: an async one as a task of its event loop (which
    /// answers through a [`Reply`]), a plain one on one of the package's
    /// workers ([`crate::workers`]). The shard itself only hands the call over.
    async fn call(&self, call: Call) -> Result<String, PyErr> {
        let (arguments, call_id, approved, answered, context) = call;
        let Some(event_loop) = &self.event_loop else {
            // The shard takes no GIL for a plain tool's call: the worker does.
            let tool = self.tool.clone();
            let (sender, answer) = oneshot::channel();
            workers::run(move |py| {
                let call = (arguments, call_id, approved, answered, context);
                let answer = tool
                    .call_method1(py, "_call_sync", call)
                    .and_then(|a| a.extract(py));
                // The call may have been given up meanwhile; nothing waits then.
                let _ = sender.send(answer);
            })?;
            return answer.await.map_err(|_| {
                pyo3::exceptions::PyRuntimeError::new_err(
                    "the tool's worker ended without an answer",
                )
            })?;
        };
        let (reply, answer) = Reply::new();
        Python::attach(|py| {
            let start = self.tool.getattr(py, "_start_async")?;
            let options = PyDict::new(py);
            options.set_item("context", event_loop.context(py))?;
            event_loop.event_loop(py).call_method(
                "call_soon_threadsafe",
                (
                    start, arguments, call_id, approved, answered, context, reply,
                ),
                Some(&options),
            )?;
            Ok::<_, PyErr>(())
        })?;
        answer.await.map_err(|_| {
            pyo3::exceptions::PyRuntimeError::new_err("the tool ended without an answer")
        })
    }
}

/// Where an async call sends its answer (called once, from Python; dropped
/// unanswered, the call ends in an error).
#[pyclass(module = "tiller._native", frozen)]
pub(crate) struct Reply(Mutex<Option<oneshot::Sender<String>>>);

impl Reply {
    /// A reply, and where its answer arrives.
    pub(crate) fn new() -> (Reply, oneshot::Receiver<String>) {
        let (sender, answer) = oneshot::channel();
        (Reply(Mutex::new(Some(sender))), answer)
    }
}

#[pymethods]
impl Reply {
    fn __call__(&self, answer: String) {
        let sender = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(sender) = sender {
            // The call may have been given up meanwhile; nothing waits then.
            let _ = sender.send(answer);
        }
    }
}

impl AgentTool for PyTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn execution(&self) -> ToolExecution {
        if self.sequential {
            ToolExecution::Sequential
        } else {
            ToolExecution::Parallel
        }
    }

    fn execute<'a>(
        &'a self,
        args: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let context = if self.takes_context {
                serde_json::to_string(&ctx.agent().to_stored())
                    .map_err(|error| ToolError::new(error.to_string()))?
            } else {
                String::new()
            };
            let call = (
                args.to_string(),
                ctx.call_id().to_owned(),
                ctx.approved(),
                ctx.answered(),
                context,
            );
            // Given up (the run's token cancelled, or this future dropped by the
            // loop), the function hears of it.
            let mut running = Running {
                tool: self,
                call_id: Some(ctx.call_id()),
            };
            let answer = tokio::select! {
                answer = self.call(call) => answer,
                () = ctx.cancel().cancelled() => {
                    return Err(ToolError::new("the call was cancelled"));
                }
            };
            running.finished();
            let answer = answer.map_err(|error| {
                ToolError::new(format!("the Python tool `{}` failed: {error}", self.name))
            })?;
            let answer: Answer = serde_json::from_str(&answer).map_err(|error| {
                ToolError::new(format!(
                    "the Python tool `{}` answered badly: {error}",
                    self.name
                ))
            })?;
            match answer {
                Answer::Ok {
                    text,
                    details,
                    terminate,
                    state,
                } => {
                    let mut output = ToolOutput::text(text).with_details(details);
                    output.terminate = terminate;
                    output.state = state;
                    Ok(output)
                }
                Answer::Failed(message) => Err(ToolError::new(message)),
                Answer::NeedsInput { field, question } => {
                    Err(ToolError::needs_input(field, question))
                }
                Answer::NeedsApproval(reason) => Err(ToolError::needs_approval(reason)),
            }
        })
    }
}

/// A call under way: dropped before it finished, it tells the function (its
/// context's `cancelled`, and its task's cancellation when async).
struct Running<'a> {
    tool: &'a PyTool,
    /// The call's id until it finished.
    call_id: Option<&'a str>,
}

impl Running<'_> {
    fn finished(&mut self) {
        self.call_id = None;
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(call_id) = self.call_id {
            let _ = Python::attach(|py| self.tool.tool.call_method1(py, "_cancel", (call_id,)));
        }
    }
}
