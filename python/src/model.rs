//! Models for Python: a built-in or OpenAI-compatible model, the one the
//! environment chooses, and the scripted `faux` model for tests and demos.

use std::time::Duration;

use pyo3::prelude::*;
use serde::Deserialize;
use serde_json::Value;
use tiller::ai::env::EnvModel;
use tiller::ai::{ApiKey, Model};
use tiller::faux::{FauxProvider, FauxTurn};

use crate::error;

/// A model and the key to send it (never shown: not in `repr`, errors or events).
#[pyclass(module = "tiller._native", name = "Model", frozen)]
#[derive(Clone)]
pub(crate) struct PyModel {
    pub(crate) chosen: EnvModel,
}

impl PyModel {
    /// The model the environment chooses, else the scripted demo model (as
    /// `tiller run` does).
    pub(crate) fn from_env_or_demo() -> PyResult<EnvModel> {
        Ok(PyModel::from_env()?.map_or_else(|| PyModel::demo().chosen, |model| model.chosen))
    }

    fn of(model: Model) -> Self {
        PyModel {
            chosen: EnvModel {
                model,
                api_key: None,
            },
        }
    }
}

#[pymethods]
impl PyModel {
    /// A model of the built-in catalog: `provider/model-id`.
    #[staticmethod]
    fn find(spec: &str) -> PyResult<Self> {
        tiller::ai::catalog::find(spec)
            .map(PyModel::of)
            .ok_or_else(|| error::config("unknown_model", format!("no built-in model `{spec}`")))
    }

    /// A model of any OpenAI-compatible server (llama.cpp, vLLM, Ollama).
    #[staticmethod]
    #[pyo3(signature = (base_url, id, api_key = None))]
    fn openai_compatible(base_url: &str, id: &str, api_key: Option<String>) -> Self {
        PyModel {
            chosen: EnvModel {
                model: Model::openai_compatible(base_url, id),
                api_key: api_key.map(ApiKey::new),
            },
        }
    }

    /// The model `TILLER_MODEL`, `TILLER_PROVIDER`, `TILLER_BASE_URL` and the
    /// providers' keys choose; `None` when none is set.
    #[staticmethod]
    fn from_env() -> PyResult<Option<Self>> {
        tiller::ai::env::from_env()
            .map(|chosen| chosen.map(|chosen| PyModel { chosen }))
            .map_err(|error| error::config("environment", error))
    }

    /// The scripted model that echoes the prompt: what answers when no provider
    /// is configured.
    #[staticmethod]
    fn demo() -> Self {
        PyModel::of(tiller::faux::demo_model())
    }

    /// The provider's name.
    #[getter]
    fn provider(&self) -> String {
        self.chosen.model.provider.to_string()
    }

    /// The model's id at its provider.
    #[getter]
    fn id(&self) -> String {
        self.chosen.model.id.to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "Model({}/{})",
            self.chosen.model.provider, self.chosen.model.id
        )
    }
}

/// A scripted model: each model call takes the next pushed turn.
#[pyclass(module = "tiller._native", name = "Faux", frozen)]
pub(crate) struct PyFaux {
    provider: FauxProvider,
}

/// A turn as the Python half writes it (`tiller.FauxTurn`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TurnSpec {
    blocks: Vec<BlockSpec>,
    chunk_size: Option<usize>,
    delay_ms: Option<f64>,
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum BlockSpec {
    Text(String),
    Thinking(String),
    ToolCall {
        id: Option<String>,
        name: String,
        arguments: Value,
    },
}

#[pymethods]
impl PyFaux {
    #[new]
    fn new() -> Self {
        PyFaux {
            provider: FauxProvider::new(),
        }
    }

    /// The model that answers from this script.
    fn model(&self) -> PyModel {
        PyModel::of(self.provider.model())
    }

    /// Queues a turn, written as JSON by `tiller.FauxTurn`.
    fn push(&self, turn: &str) -> PyResult<()> {
        let spec: TurnSpec = serde_json::from_str(turn)
            .map_err(|error| error::config("faux_turn", format!("a faux turn: {error}")))?;
        let mut turn = FauxTurn::new();
        for block in spec.blocks {
            turn = match block {
                BlockSpec::Text(text) => turn.with_text(text),
                BlockSpec::Thinking(text) => turn.with_thinking(text),
                BlockSpec::ToolCall {
                    id: Some(id),
                    name,
                    arguments,
                } => turn.with_tool_call_id(id, name, arguments),
                BlockSpec::ToolCall {
                    id: None,
                    name,
                    arguments,
                } => turn.with_tool_call(name, arguments),
            };
        }
        if let Some(chars) = spec.chunk_size {
            turn = turn.chunk_size(chars);
        }
        if let Some(ms) = spec.delay_ms {
            let delay = Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| {
                error::config(
                    "faux_turn",
                    format!("a faux turn's delay_ms must be a duration, not {ms}"),
                )
            })?;
            turn = turn.delay(delay);
        }
        if let Some(message) = spec.error {
            turn = turn.fail(message);
        }
        self.provider.push(turn);
        Ok(())
    }

    /// How many pushed turns no call has taken yet.
    fn remaining(&self) -> usize {
        self.provider.remaining()
    }
}
