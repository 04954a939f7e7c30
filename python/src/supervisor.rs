//! The supervisor for Python: started on Tiller's runtime, its agents spawned
//! from keyword settings, a definition or an agent file, with Python tools.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use serde::Deserialize;
use tiller::agents::ToolRegistry;
use tiller::agents::agent_file::AgentFile;
use tiller::ai::OutputSchema;
use tiller::ai::env::EnvModel;
use tiller::run::StoredContext;
use tiller::{
    AgentContext, AgentDefinition, AgentSettings, AgentSpec, AgentTool, Definitions, Supervisor,
    SupervisorConfig, ToolSet,
};

use crate::agent::PyAgent;
use crate::model::PyModel;
use crate::tool::PyTool;
use crate::{error, runtime};

/// How `tiller.Supervisor.spawn` describes an agent, as JSON.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpawnOptions {
    /// An agent file: its instructions, options and tools (the Python tools
    /// named there alone, among them).
    file: Option<PathBuf>,
    /// A serialized `AgentDefinition` (model, instructions, tool names,
    /// options); the tools it names come from Python.
    definition: Option<AgentDefinition>,
    /// The instructions, over those of `definition`.
    system_prompt: Option<String>,
    name: Option<String>,
    session: Option<String>,
    /// Who the agent works for: its ids and states.
    context: Option<StoredContext>,
    /// The structured output of each run.
    output: Option<OutputSchema>,
}

impl SpawnOptions {
    /// The agent these options describe, with `tools`, of the model `chosen`
    /// where they name none.
    async fn spec(
        self,
        chosen: EnvModel,
        tools: Vec<Arc<dyn AgentTool>>,
        supervisor: &Supervisor,
    ) -> PyResult<AgentSpec> {
        let SpawnOptions {
            file,
            definition,
            system_prompt,
            name,
            session,
            context,
            output,
        } = self;
        let mut spec = match file {
            Some(path) => {
                // The file says these itself: given beside it, they would be lost.
                let beside = [
                    ("definition", definition.is_some()),
                    ("system_prompt", system_prompt.is_some()),
                    ("output", output.is_some()),
                ];
                if let Some((field, _)) = beside.iter().find(|(_, given)| *given) {
                    return Err(error::config(
                        "options",
                        format!("`{field}` cannot be given with `file`: the agent file sets it"),
                    ));
                }
                let file =
                    AgentFile::load(&path).map_err(|error| error::config("agent_file", error))?;
                let registry = tools
                    .into_iter()
                    .fold(ToolRegistry::new(), ToolRegistry::with);
                let mut definitions = Definitions::around(&file)
                    .map_err(|error| error::config("agent_file", error))?
                    .with_tools(registry)
                    .with_default_model(chosen.model)
                    .with_default_key(chosen.api_key)
                    .with_session_store(supervisor.store().clone());
                definitions
                    .connect_mcp()
                    .await
                    .map_err(|error| error::config("agent_file", error))?;
                definitions
                    .spec_of(&file)
                    .map_err(|error| error::config("agent_file", error))?
            }
            None => AgentSpec::new(settings(chosen, definition, tools, system_prompt, output)?),
        };
        if let Some(name) = name {
            spec = spec.with_name(name);
        }
        if let Some(session) = session {
            spec = spec.with_session(session);
        }
        if let Some(context) = context {
            spec =
                spec.with_context(AgentContext::from_ids(context.ids).with_states(&context.states));
        }
        Ok(spec)
    }
}

/// Settings of the model `chosen` over `definition` (or none), with `tools`
/// (every tool the definition names among them), the instructions and the
/// output schema.
fn settings(
    chosen: EnvModel,
    definition: Option<AgentDefinition>,
    tools: Vec<Arc<dyn AgentTool>>,
    system_prompt: Option<String>,
    output: Option<OutputSchema>,
) -> PyResult<AgentSettings> {
    let mut settings = AgentSettings::from(chosen);
    if let Some(mut definition) = definition {
        if definition.model.is_none() {
            definition.model = settings.definition.model.take();
            definition.run.stream.transport.api_key =
                settings.definition.run.stream.transport.api_key.take();
        }
        settings.definition = definition;
    }
    let named = std::mem::take(&mut settings.definition.tools);
    let tools = ToolSet::new(tools).map_err(|error| error::config("tools", error))?;
    let missing: Vec<&str> = named
        .iter()
        .map(String::as_str)
        .filter(|name| !tools.definitions().iter().any(|tool| tool.name == *name))
        .collect();
    if !missing.is_empty() {
        return Err(error::config(
            "definition",
            format!(
                "the definition names tools no Python tool is: {}",
                missing.join(", ")
            ),
        ));
    }
    settings = settings.with_tools(tools);
    if let Some(prompt) = system_prompt {
        settings = settings.with_system_prompt(prompt);
    }
    if let Some(output) = output {
        settings = settings.with_output_schema(output);
    }
    Ok(settings)
}

/// A supervisor of agents, its sessions in memory, SQLite or PostgreSQL.
#[pyclass(module = "tiller._native", name = "Supervisor", frozen)]
pub(crate) struct PySupervisor {
    supervisor: Supervisor,
}

#[pymethods]
impl PySupervisor {
    /// Starts a supervisor keeping sessions at `store` (`sqlite://PATH`,
    /// `postgres://…`), in memory when `None`.
    #[staticmethod]
    #[pyo3(signature = (store = None, blocking = false))]
    fn start(py: Python<'_>, store: Option<String>, blocking: bool) -> PyResult<Bound<'_, PyAny>> {
        runtime::finish(py, blocking, async move {
            let supervisor = match store {
                Some(url) => {
                    let store = tiller::store::open(&url)
                        .await
                        .map_err(|error| error::config("store", error))?;
                    Supervisor::with_store(SupervisorConfig::default(), store).await
                }
                None => Supervisor::start().await,
            };
            Ok(PySupervisor {
                supervisor: supervisor.map_err(error::spawn)?,
            })
        })
    }

    /// Spawns an agent with the `tiller.Tool`s `tools` and the JSON `options`
    /// ([`SpawnOptions`]); its model `model`, else the environment's, else the
    /// scripted demo model. With a `session` the store holds, the agent resumes it.
    #[pyo3(signature = (model, tools, options, blocking = false))]
    fn spawn<'py>(
        &self,
        py: Python<'py>,
        model: Option<Bound<'py, PyModel>>,
        tools: Vec<Bound<'py, PyAny>>,
        options: &str,
        blocking: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options: SpawnOptions =
            serde_json::from_str(options).map_err(|error| error::config("options", error))?;
        // Async tools run on the loop the agent is spawned from.
        let event_loop = if blocking {
            None
        } else {
            Some(pyo3_async_runtimes::tokio::get_current_locals(py)?)
        };
        let tools = tools
            .iter()
            .map(|tool| Ok(Arc::new(PyTool::new(tool, event_loop.clone())?) as Arc<dyn AgentTool>))
            .collect::<PyResult<Vec<_>>>()?;
        let chosen = match model {
            Some(model) => model.get().chosen.clone(),
            None => PyModel::from_env_or_demo()?,
        };
        let supervisor = self.supervisor.clone();
        runtime::finish(py, blocking, async move {
            let spec = options.spec(chosen, tools, &supervisor).await?;
            let handle = supervisor.spawn(spec).await.map_err(error::spawn)?;
            Ok(PyAgent::new(handle))
        })
    }

    /// The live agent with this id, if any.
    fn get(&self, id: &str) -> Option<PyAgent> {
        self.supervisor.get(id).map(PyAgent::new)
    }

    /// The live agent with this name, if any.
    fn find(&self, name: &str) -> Option<PyAgent> {
        self.supervisor.find(name).map(PyAgent::new)
    }

    /// How many agents are live.
    fn __len__(&self) -> usize {
        self.supervisor.len()
    }

    /// Stops every agent (their sessions stay in the store) and the supervisor.
    #[pyo3(signature = (blocking = false))]
    fn shutdown<'py>(&self, py: Python<'py>, blocking: bool) -> PyResult<Bound<'py, PyAny>> {
        let supervisor = self.supervisor.clone();
        runtime::finish(py, blocking, async move {
            supervisor.shutdown().await;
            Ok(())
        })
    }
}
