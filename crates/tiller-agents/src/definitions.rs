//! [`Definitions`]: agent files by name and version, read from a folder, and
//! turned into agents with the host's tools and named LLM configurations.
//!
//! ```no_run
//! use std::sync::{Arc, OnceLock};
//! use tiller::{Definitions, Supervisor, agents::{LlmConfigs, ToolRegistry}};
//!
//! # async fn run(search: Arc<dyn tiller::AgentTool>) -> Result<(), Box<dyn std::error::Error>> {
//! let definitions = Definitions::load_dir("agents")?
//!     .with_tools(ToolRegistry::new().with(search))
//!     .with_llms(LlmConfigs::load("llms.yaml")?)
//!     .with_default_model(tiller::faux::demo_model()); // for files that name no model
//! let supervisor = Supervisor::start().await?;
//! let agent = supervisor.spawn(definitions.spec("researcher", None)?).await?;
//! # let _ = agent;
//! # Ok(())
//! # }
//! ```

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::agent_file::{AgentFile, AgentFileError};
use crate::agent_tool::AgentAsTool;
use crate::compress::Compression;
use crate::guardrail::agent_guardrail;
use crate::{
    ASK_AGENT_TOOL, AgentSettings, AgentSpec, AgentTool, ApiKey, LlmConfigs, Model, Supervisor,
    ToolRegistry,
};
use tiller_core::{Guardrail, Guardrails};
#[cfg(feature = "mcp")]
use tiller_mcp::{McpError, McpServer};
use tiller_store::SessionStore;

/// Agent definitions by name, each in one or more versions, with what their
/// agents are made with: the host's tools, named LLM configurations and a model
/// for files that name none.
#[derive(Debug, Clone, Default)]
pub struct Definitions {
    /// Each name's files, oldest version first.
    by_name: BTreeMap<String, Vec<AgentFile>>,
    pub(crate) tools: ToolRegistry,
    llms: LlmConfigs,
    default_model: Option<Model>,
    /// The key passed with the default model.
    default_key: Option<ApiKey>,
    /// The store the agents' sessions are kept in, for compression's `lookup`.
    store: Option<SessionStoreRef>,
    /// The compression of files that declare none.
    compression: Option<Compression>,
    /// The Rust guardrails files may name, by name.
    guardrails: BTreeMap<String, Guardrail>,
}

/// A session store, shown by its presence alone.
#[derive(Clone)]
struct SessionStoreRef(Arc<dyn SessionStore>);

impl std::fmt::Debug for SessionStoreRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionStore")
    }
}

/// Why definitions could not be read or used. Non-exhaustive: the `mcp` feature
/// adds a variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionsError {
    /// The folder could not be read.
    #[error("cannot read the folder {}: {reason}", folder.display())]
    Folder {
        /// The folder.
        folder: PathBuf,
        /// Why.
        reason: String,
    },
    /// Files that are not valid agent definitions, each error naming its file,
    /// field and line.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<AgentFileError>),
    /// Two files define the same name and version.
    #[error("agent `{name}` version {} is defined twice: {} and {}", version.as_deref().unwrap_or("(none)"), first.display(), second.display())]
    Duplicate {
        /// The agent's name.
        name: String,
        /// The version both give.
        version: Option<String>,
        /// The file read first.
        first: PathBuf,
        /// The other file.
        second: PathBuf,
    },
    /// No definition has that name (and version).
    #[error("no agent definition `{name}`{}", version.as_deref().map(|v| format!(" version {v}")).unwrap_or_default())]
    Unknown {
        /// The name asked for.
        name: String,
        /// The version asked for.
        version: Option<String>,
    },
    /// The definition cannot be made into an agent (a model or tool it names).
    #[error(transparent)]
    Unusable(AgentFileError),
    /// An MCP server a definition lists could not be connected to.
    #[cfg(feature = "mcp")]
    #[error(transparent)]
    Mcp(#[from] McpError),
}

impl Definitions {
    /// No definitions.
    pub fn new() -> Self {
        Definitions::default()
    }

    /// The definitions `file` is assembled with when it is run alone (`tiller
    /// run --agent FILE`): when it names other agents (a guardrail, or the
    /// `ask_agent` tool), every file of its folder, as `tiller serve --agents
    /// FOLDER` reads them; else the file alone.
    pub fn around(file: &AgentFile) -> Result<Self, DefinitionsError> {
        let names_others = !file.guardrails.is_empty() || file.lists_tool(ASK_AGENT_TOOL);
        match file.path.parent() {
            Some(folder) if names_others => {
                let folder = if folder.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    folder
                };
                Definitions::load_dir(folder)
            }
            _ => {
                let mut alone = Definitions::new();
                alone.insert(file.clone())?;
                Ok(alone)
            }
        }
    }

    /// Reads every `.yaml`, `.yml` and `.json` file of `folder` (not its
    /// subfolders). Every file is checked; the errors of all bad files come back
    /// together.
    pub fn load_dir(folder: impl AsRef<Path>) -> Result<Self, DefinitionsError> {
        let folder = folder.as_ref();
        let unreadable = |error: std::io::Error| DefinitionsError::Folder {
            folder: folder.to_owned(),
            reason: error.to_string(),
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(folder)
            .map_err(unreadable)?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| {
                path.is_file()
                    && path
                        .extension()
                        .is_some_and(|ext| ext == "yaml" || ext == "yml" || ext == "json")
            })
            .collect();
        paths.sort();
        let mut definitions = Definitions::new();
        let mut invalid = Vec::new();
        for path in paths {
            match AgentFile::load(&path) {
                Ok(file) => definitions.insert(file)?,
                Err(error) => invalid.push(error),
            }
        }
        if invalid.is_empty() {
            Ok(definitions)
        } else {
            Err(DefinitionsError::Invalid(invalid))
        }
    }

    /// The same definitions taking the tools their files name alone from
    /// `tools`.
    pub fn with_tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = tools;
        self
    }

    /// The same definitions resolving the `llm` their files name in `llms`.
    pub fn with_llms(mut self, llms: LlmConfigs) -> Self {
        self.llms = llms;
        self
    }

    /// Connects to every MCP server the definitions list (once per name), so that
    /// their agents get its tools; the connections stay up while the definitions
    /// (or a clone of them) live.
    #[cfg(feature = "mcp")]
    pub async fn connect_mcp(&mut self) -> Result<(), DefinitionsError> {
        let servers: Vec<McpServer> = self
            .iter()
            .flat_map(|file| file.mcp_servers.iter().cloned())
            .collect();
        self.tools.connect_mcp(&servers).await?;
        Ok(())
    }

    /// Every definition (its latest version) as a tool that runs an agent of it
    /// under `supervisor` ([`AgentAsTool`]), named after the definition.
    pub fn agent_tools(
        &self,
        supervisor: &Supervisor,
    ) -> Result<Vec<Arc<dyn AgentTool>>, DefinitionsError> {
        self.latest()
            .map(|file| {
                let spec = self.spec(&file.name, file.version.as_deref())?;
                let about = about(file);
                let description = format!(
                    "Asks the agent `{}` (it answers with its final answer). {about}",
                    file.name
                );
                Ok(Arc::new(AgentAsTool::new(
                    supervisor.clone(),
                    spec,
                    &file.name,
                    description.trim_end(),
                )) as Arc<dyn AgentTool>)
            })
            .collect()
    }

    /// Every definition (its latest version) as an MCP prompt whose text is its
    /// instructions, named after it (what `tiller mcp` offers beside its tools).
    #[cfg(feature = "mcp")]
    pub fn prompts(&self) -> Vec<tiller_mcp::ServedPrompt> {
        self.latest()
            .map(|file| tiller_mcp::ServedPrompt {
                name: file.name.clone(),
                description: Some(
                    format!(
                        "The instructions of the agent `{}`. {}",
                        file.name,
                        about(file)
                    )
                    .trim_end()
                    .to_owned(),
                ),
                text: file.patch.system_prompt.clone().unwrap_or_default(),
            })
            .collect()
    }

    /// The latest version of each definition, by name.
    pub(crate) fn latest(&self) -> impl Iterator<Item = &AgentFile> {
        self.by_name.values().filter_map(|versions| versions.last())
    }

    /// The tool of these definitions' registry named `name` (such as the
    /// `ask_agent` that `with_ask_agent` added).
    pub fn tool(&self, name: &str) -> Option<Arc<dyn AgentTool>> {
        self.tools.get(name)
    }

    /// The registry their agents take tools from (with the MCP connections made
    /// by [`Definitions::connect_mcp`]).
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The same definitions giving `model` to agents whose file names none.
    pub fn with_default_model(mut self, model: Model) -> Self {
        self.default_model = Some(model);
        self
    }

    /// The model agents whose file names none get.
    pub fn default_model(&self) -> Option<&Model> {
        self.default_model.as_ref()
    }

    /// The same definitions passing `key` with the default model (the key
    /// [`tiller_ai::env::from_env`] chose with it, say); agents of files naming a
    /// model of their own do not get it.
    pub fn with_default_key(mut self, key: Option<ApiKey>) -> Self {
        self.default_key = key;
        self
    }

    /// The same definitions knowing the store their agents' sessions are kept in
    /// (the supervisor's): needed to compress reloaded transcripts, whose `lookup`
    /// tool reads from it. `tiller serve` and the command set it.
    pub fn with_session_store(mut self, store: Arc<dyn SessionStore>) -> Self {
        self.store = Some(SessionStoreRef(store));
        self
    }

    /// The same definitions compressing reloaded transcripts as `compression`
    /// says, for the files that declare no `compression` of their own (once they
    /// know the session store).
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = Some(compression);
        self
    }

    /// The same definitions with a Rust guardrail that files may name
    /// (`guardrails: {input: [name]}`); a name no guardrail has is the
    /// definition of that name, asked as an [`agent_guardrail`].
    pub fn with_guardrail(mut self, guardrail: Guardrail) -> Self {
        self.guardrails
            .insert(guardrail.name().to_owned(), guardrail);
        self
    }

    /// The guardrails `file` names, each a registered one or the definition of
    /// that name (its latest version).
    fn guardrails_of(&self, file: &AgentFile) -> Result<Guardrails, DefinitionsError> {
        let names = &file.guardrails;
        let mut guardrails = Guardrails {
            input_beside: names.input_beside,
            ..Guardrails::default()
        };
        for (stage, field, listed) in names.stages() {
            for (index, name) in listed.iter().enumerate() {
                let guardrail = match self.guardrails.get(name) {
                    Some(guardrail) => guardrail.clone(),
                    None => {
                        let at = format!("json_schema_extra.guardrails.{field}[{index}]");
                        self.judge(file, at, name)?
                    }
                };
                guardrails.add(stage, guardrail);
            }
        }
        Ok(guardrails)
    }

    /// The definition `name`, which `file` names at `field`, as a guardrail.
    fn judge(
        &self,
        file: &AgentFile,
        field: String,
        name: &str,
    ) -> Result<Guardrail, DefinitionsError> {
        let unusable = |message: String| {
            DefinitionsError::Unusable(AgentFileError {
                file: file.path.clone(),
                field: Some(field.clone()),
                message,
            })
        };
        if name == file.name {
            return Err(unusable("an agent cannot be its own guardrail".to_owned()));
        }
        let judge = self.get(name, None).ok_or_else(|| {
            unusable(format!(
                "no guardrail or agent definition is named `{name}`"
            ))
        })?;
        let settings = self.file_settings(judge)?;
        Ok(agent_guardrail(name, &settings))
    }

    /// The settings of `file` ([`AgentFile::settings`]) with these definitions'
    /// tools, LLM configurations and default model, and the default key when
    /// they run on the default model (its context window changed or not) with
    /// no key of their own.
    fn file_settings(&self, file: &AgentFile) -> Result<AgentSettings, DefinitionsError> {
        let mut settings = file
            .settings(&self.tools, &self.llms, self.default_model.clone())
            .map_err(DefinitionsError::Unusable)?;
        let definition = &mut settings.definition;
        let same = |a: &Model, b: &Model| {
            (&a.provider, &a.id, &a.base_url) == (&b.provider, &b.id, &b.base_url)
        };
        let on_default = match (&definition.model, &self.default_model) {
            (Some(model), Some(default)) => same(model, default),
            (None, None) => true,
            _ => false,
        };
        if definition.run.stream.transport.api_key.is_none() && on_default {
            definition.run.stream.transport.api_key = self.default_key.clone();
        }
        Ok(settings)
    }

    /// The key passed with the default model.
    pub fn default_key(&self) -> Option<&ApiKey> {
        self.default_key.as_ref()
    }

    /// The named LLM configurations the files may use.
    pub fn llms(&self) -> &LlmConfigs {
        &self.llms
    }

    /// Adds a definition; the same name and version twice is an error.
    pub fn insert(&mut self, file: AgentFile) -> Result<(), DefinitionsError> {
        let versions = self.by_name.entry(file.name.clone()).or_default();
        match versions.binary_search_by(|known| compare_versions(&known.version, &file.version)) {
            Ok(at) => Err(DefinitionsError::Duplicate {
                name: file.name,
                version: file.version,
                first: versions[at].path.clone(),
                second: file.path,
            }),
            Err(at) => {
                versions.insert(at, file);
                Ok(())
            }
        }
    }

    /// The latest version of `name`, or the given one.
    pub fn get(&self, name: &str, version: Option<&str>) -> Option<&AgentFile> {
        let versions = self.by_name.get(name)?;
        match version {
            None => versions.last(),
            Some(version) => versions
                .iter()
                .find(|file| file.version.as_deref() == Some(version)),
        }
    }

    /// Every definition, by name, oldest version first.
    pub fn iter(&self) -> impl Iterator<Item = &AgentFile> {
        self.by_name.values().flatten()
    }

    /// An agent of the definition `name` (its latest version, or `version`): its
    /// settings from the file ([`AgentFile::settings`]), with these definitions'
    /// tools, LLM configurations and default model.
    pub fn spec(&self, name: &str, version: Option<&str>) -> Result<AgentSpec, DefinitionsError> {
        let file = self
            .get(name, version)
            .ok_or_else(|| DefinitionsError::Unknown {
                name: name.to_owned(),
                version: version.map(str::to_owned),
            })?;
        self.spec_of(file)
    }

    /// A spec for an agent of `file` (one not necessarily in this set, such as a
    /// definition sent inline), with this set's tools, LLM configurations and
    /// default model.
    pub fn spec_of(&self, file: &AgentFile) -> Result<AgentSpec, DefinitionsError> {
        let mut settings = self.file_settings(file)?;
        if let (Some(compression), Some(store)) =
            (file.compression.or(self.compression), &self.store)
        {
            settings = compression.applied_to(settings, store.0.clone());
        }
        if let Some(memory) = &file.memory {
            let store = self.store.as_ref().ok_or_else(|| {
                DefinitionsError::Unusable(AgentFileError {
                    file: file.path.clone(),
                    field: Some("json_schema_extra.memory".to_owned()),
                    message: "memory is kept in the session store, and none is known here (Definitions::with_session_store)".to_owned(),
                })
            })?;
            settings = memory.clone().applied_to(settings, store.0.clone());
        }
        let guardrails = self.guardrails_of(file)?;
        if !guardrails.is_empty() {
            settings.code.hooks.guardrails = guardrails;
        }
        Ok(AgentSpec::new(settings))
    }
}

/// A definition in a line: its output schema's title, else its instructions'
/// first line.
fn about(file: &AgentFile) -> String {
    file.output_schema["title"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| {
            file.patch
                .system_prompt
                .as_deref()
                .and_then(|prompt| prompt.lines().next())
                .unwrap_or_default()
                .to_owned()
        })
}

/// Versions compared by their dot-separated parts, numbers as numbers; no version
/// comes first.
fn compare_versions(a: &Option<String>, b: &Option<String>) -> Ordering {
    let (a, b) = match (a, b) {
        (None, None) => return Ordering::Equal,
        (None, Some(_)) => return Ordering::Less,
        (Some(_), None) => return Ordering::Greater,
        (Some(a), Some(b)) => (a, b),
    };
    let mut left = a.split('.');
    let mut right = b.split('.');
    loop {
        match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    _ => x.cmp(y),
                };
                if order != Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_their_numbers() {
        let v = |s: &str| Some(s.to_owned());
        assert_eq!(
            compare_versions(&v("1.10.0"), &v("1.9.3")),
            Ordering::Greater
        );
        assert_eq!(compare_versions(&v("2"), &v("2.0")), Ordering::Less);
        assert_eq!(compare_versions(&None, &v("0.1")), Ordering::Less);
        assert_eq!(compare_versions(&v("1.0.0"), &v("1.0.0")), Ordering::Equal);
    }
}
