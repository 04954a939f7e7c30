//! What a Python caller decides a run by: a predicate over each finished turn
//! (`run_until`, `stop_when`) and the structured output it asks for.

use pyo3::prelude::*;
use serde::Serialize;
use tiller::ai::{OutputSchema, ToolCall, ToolResultMessage};
use tiller::run::hook;
use tiller::run::{StopWhen, TurnSummary};

use crate::error;

/// A finished turn as the predicate reads it (`tiller.Turn`).
#[derive(Serialize)]
struct Turn<'a> {
    turn: u32,
    text: String,
    tool_calls: Vec<&'a ToolCall>,
    tool_results: &'a [ToolResultMessage],
}

/// `predicate` (a Python callable taking a turn's JSON, answering a bool) as a
/// stop condition. It runs on the agent's thread, holding the GIL while it runs;
/// one that raises accepts the turn (its exception is printed as unraisable).
pub(crate) fn predicate(predicate: Py<PyAny>) -> StopWhen {
    hook::stop_when(move |summary: &TurnSummary<'_>| {
        let turn = Turn {
            turn: summary.turn,
            text: summary.text(),
            tool_calls: summary.tool_calls().collect(),
            tool_results: summary.tool_results,
        };
        let Ok(turn) = serde_json::to_string(&turn) else {
            return true;
        };
        Python::attach(|py| {
            match predicate
                .call1(py, (turn,))
                .and_then(|answer| answer.extract(py))
            {
                Ok(accepted) => accepted,
                Err(error) => {
                    error.write_unraisable(py, Some(predicate.bind(py)));
                    true
                }
            }
        })
    })
}

/// The structured output `output` describes (JSON: `{"name", "schema"}`).
pub(crate) fn output_schema(output: &str) -> PyResult<OutputSchema> {
    serde_json::from_str(output).map_err(|error| error::config("output", error))
}
