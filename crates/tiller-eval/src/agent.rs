//! The agents a suite runs: the one under test with each model, and the
//! judges, made from their files as `tiller run --agent FILE` makes them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tiller_agents::agent_file::AgentFile;
use tiller_agents::{Definitions, LlmConfigs, ModelSources, Named, choose_model};
use tiller_ai::Model;
use tiller_core::ToolSet;
use tiller_runtime::AgentSettings;
use tiller_store::SessionStore;

use crate::suite::{AgentSource, ModelEntry, Suite};
use crate::{EvalError, Evaluation};

/// The agent under test with one of the suite's models.
pub(crate) struct Subject {
    /// The model's label in the report.
    pub(crate) label: String,
    /// The agent's settings with that model.
    pub(crate) settings: AgentSettings,
}

/// The agent under test with each of the suite's models (or the one chosen when
/// the suite lists none), in the suite's order.
pub(crate) async fn subjects(
    suite: &Suite,
    setup: &Evaluation<'_>,
    store: &Arc<dyn SessionStore>,
) -> Result<Vec<Subject>, EvalError> {
    let mut folder = None;
    let file = match &suite.agent {
        Some(source) => Some(load(source, suite, &mut folder)?),
        None => None,
    };
    let assembled = match &file {
        Some(file) => Some(assembled(file, store).await?),
        None => None,
    };
    let file = file.as_ref().zip(assembled.as_ref());
    if suite.models.is_empty() {
        let (settings, model) = agent(file, None, setup)?;
        let label = format!("{}/{}", model.provider, model.id);
        return Ok(vec![Subject { label, settings }]);
    }
    let mut subjects = Vec::with_capacity(suite.models.len());
    for (at, entry) in suite.models.iter().enumerate() {
        let (settings, _) = agent(file, Some((at, entry)), setup)?;
        subjects.push(Subject {
            label: entry.label().to_owned(),
            settings,
        });
    }
    Ok(subjects)
}

/// The judges' agents, by source, each with the model its file (or the
/// environment) chooses and the answer a judge gives as its output.
pub(crate) async fn judges(
    suite: &Suite,
    setup: &Evaluation<'_>,
    store: &Arc<dyn SessionStore>,
) -> Result<BTreeMap<AgentSource, AgentSettings>, EvalError> {
    let mut judges = BTreeMap::new();
    let mut folder = None;
    for case in &suite.cases {
        let Some(source) = suite.judge_of(case) else {
            continue;
        };
        if judges.contains_key(&source) {
            continue;
        }
        let file = load(&source, suite, &mut folder)?;
        let definitions = assembled(&file, store).await?;
        let (mut settings, _) = agent(Some((&file, &definitions)), None, setup)?;
        // A judge reads the conversation it is given; it runs nothing.
        settings.code.tools = ToolSet::default();
        judges.insert(
            source,
            settings.with_output_schema(crate::judge::verdict_schema()),
        );
    }
    Ok(judges)
}

/// The agent file `source` names: a file, or a definition of the suite's
/// `agents` folder (read into `folder` the first time).
fn load(
    source: &AgentSource,
    suite: &Suite,
    folder: &mut Option<Definitions>,
) -> Result<AgentFile, EvalError> {
    let unusable = |error: String| EvalError::Agent(error);
    match source {
        AgentSource::File(path) => AgentFile::load(path).map_err(|e| unusable(e.to_string())),
        AgentSource::Definition { name, version } => {
            let definitions = match folder {
                Some(definitions) => definitions,
                None => {
                    // Checked when the suite was read: a definition comes with a folder.
                    let path = suite.agents.as_deref().unwrap_or(Path::new("."));
                    folder.insert(Definitions::load_dir(path).map_err(|e| unusable(e.to_string()))?)
                }
            };
            definitions
                .get(name, version.as_deref())
                .cloned()
                .ok_or_else(|| unusable(format!("the suite's `agents` folder has no {source}")))
        }
    }
}

/// The definitions `file` is assembled with ([`Definitions::around`]),
/// connected to the MCP servers they list once, whatever the model.
async fn assembled(
    file: &AgentFile,
    store: &Arc<dyn SessionStore>,
) -> Result<Definitions, EvalError> {
    #[cfg_attr(not(feature = "mcp"), allow(unused_mut))]
    let mut definitions = Definitions::around(file)
        .map_err(|error| EvalError::Agent(error.to_string()))?
        .with_session_store(store.clone());
    #[cfg(feature = "mcp")]
    definitions
        .connect_mcp()
        .await
        .map_err(|error| EvalError::Agent(error.to_string()))?;
    Ok(definitions)
}

/// The agent of `file` with its definitions (a plain one without), with the
/// model `entry` names (the host's own model of that label first), else the one
/// the file or the environment chooses.
fn agent(
    file: Option<(&AgentFile, &Definitions)>,
    entry: Option<(usize, &ModelEntry)>,
    setup: &Evaluation<'_>,
) -> Result<(AgentSettings, Model), EvalError> {
    let (file, definitions) = file.unzip();
    let patch = file
        .map(|file| file.patch_over(&LlmConfigs::new()))
        .transpose()
        .map_err(|error| EvalError::Agent(error.to_string()))?;
    let (model, api_key) = match entry {
        Some((_, entry)) if setup.models.contains_key(entry.label()) => {
            (setup.models[entry.label()].clone(), None)
        }
        _ => {
            let mut sources = ModelSources {
                file: file.zip(patch.as_ref()),
                ..ModelSources::default()
            };
            if let Some((at, entry)) = entry {
                let named = |value: &Option<String>, field: &str| {
                    value.clone().map(|value| Named {
                        source: format!("models[{at}].{field}: {value}"),
                        value,
                    })
                };
                match entry {
                    ModelEntry::Named(name) => sources.model = named(&Some(name.clone()), "model"),
                    ModelEntry::Parts(parts) => {
                        sources.provider = named(&parts.provider, "provider");
                        sources.model = named(&parts.model, "model");
                        sources.base_url = named(&parts.base_url, "base_url");
                    }
                }
            }
            let chosen = choose_model(sources, |name| (setup.var)(name))
                .map_err(|error| EvalError::Model(error.to_string()))?;
            (chosen.model, chosen.api_key)
        }
    };
    let mut settings = match file.zip(definitions) {
        None => AgentSettings::new(model.clone()),
        Some((file, definitions)) => {
            // The chosen model for the files beside it that name none.
            let spec = definitions
                .clone()
                .with_default_model(model.clone())
                .with_default_key(api_key.clone())
                .spec_of(file)
                .map_err(|error| EvalError::Agent(error.to_string()))?;
            Arc::unwrap_or_clone(spec.settings)
        }
    };
    let mut chosen = model.clone();
    if let Some(window) = patch.and_then(|patch| patch.context_window) {
        chosen.context_window = window;
    }
    settings.definition.model = Some(chosen);
    settings.definition.run.stream.transport.api_key = api_key;
    Ok((settings, model))
}
