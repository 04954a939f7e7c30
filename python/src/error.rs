//! Tiller's errors as the Python exceptions of `tiller.errors`, each with its
//! `kind` (the Rust variant's name, in snake case) beside the message.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use tiller::{AgentError, SpawnError};

/// An exception of class `class` of `tiller.errors` (Python's, so that it has
/// docstrings and `kind`) with `message` and `kind`.
pub(crate) fn raise(class: &str, kind: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let class = py
            .import("tiller.errors")
            .and_then(|errors| errors.getattr(class))
            .and_then(|class| class.cast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(class) => PyErr::from_type(class, (message, kind.to_owned())),
            Err(error) => error,
        }
    })
}

/// An agent's refusal: `Busy` when a run is going on, else `AgentError`.
pub(crate) fn agent(error: AgentError) -> PyErr {
    // The variant's name, as serde writes it: a string, or an object's one key.
    let kind = match serde_json::to_value(&error) {
        Ok(serde_json::Value::String(kind)) => kind,
        Ok(serde_json::Value::Object(fields)) => fields.keys().next().cloned().unwrap_or_default(),
        _ => "error".to_owned(),
    };
    let class = if matches!(error, AgentError::Busy) {
        "Busy"
    } else {
        "AgentError"
    };
    raise(class, &kind, error.to_string())
}

/// A supervisor's refusal to spawn or resume.
pub(crate) fn spawn(error: SpawnError) -> PyErr {
    let kind = match &error {
        SpawnError::IdTaken(_) => "id_taken",
        SpawnError::NameTaken(_) => "name_taken",
        SpawnError::InvalidId { .. } => "invalid_id",
        SpawnError::NotOwner { .. } => "not_owner",
        SpawnError::ShutDown => "shut_down",
        SpawnError::Store(_) => "store",
        SpawnError::MissingTools { .. } => "missing_tools",
        _ => "runtime",
    };
    raise("SpawnError", kind, error.to_string())
}

/// Settings that cannot make an agent: a bad model, agent file or store URL.
pub(crate) fn config(kind: &str, message: impl std::fmt::Display) -> PyErr {
    raise("ConfigError", kind, message.to_string())
}

/// A value Tiller wrote that could not become JSON: a bug, said as such.
pub(crate) fn json(error: serde_json::Error) -> PyErr {
    PyRuntimeError::new_err(format!("Tiller could not write JSON for Python: {error}"))
}
