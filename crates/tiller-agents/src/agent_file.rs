//! Agent files: an agent declared in YAML or JSON, in the JSON Schema form whose
//! `description` is the system prompt and whose `properties` are the shape of the
//! answer, with the agent's settings under `json_schema_extra`.
//!
//! ```yaml
//! type: object
//! description: |
//!   You are a helpful assistant. Use the tools when they help.
//! properties:
//!   answer: {type: string, description: Your response}
//! required: [answer]
//! json_schema_extra:
//!   kind: agent
//!   name: helper
//!   version: "1.0.0"
//!   model: openai/gpt-4o-mini         # or [openai/gpt-4o-mini, anthropic/claude-haiku-4-5]: fallbacks in order
//!   api_key_env: OPENAI_API_KEY       # only with a base_url of its own: the key to send there
//!   llm: local                        # a named LLM configuration (the library's LlmConfigs)
//!   thinking: off
//!   thinking_budgets: {low: 2048}     # tokens per level, for providers that take a budget
//!   temperature: 0.2
//!   max_tokens: 1024
//!   context_window: 4096              # the model's window, when no catalog knows it (a local server's -c)
//!   max_turns: 20
//!   tool_choice: {tool: add}          # auto (the default), none, required or {tool: name}
//!   tool_choice_after_tools: none     # once a forced call was made; the provider's default if absent
//!   tools:
//!     - name: add
//!       label: Adding                 # what interfaces show (the name if absent)
//!       description: Add two integers
//!       parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}, required: [a, b]}
//!       command: [python3, tools/add.py]
//!       timeout_ms: 10000
//!       env: [ADD_PRECISION]          # passed on besides PATH, HOME and LANG
//!     - name: action                  # a built-in, named alone
//!     - name: display_widget          # built-ins: widgets with an id, shown and updated
//!     - name: update_widget
//!     - name: search                  # named alone: taken from the host's ToolRegistry
//!     - name: ask_agent               # hand work to another agent (Definitions::with_ask_agent)
//!   approvals: {add: ask}             # per tool: always (the default), ask or never
//!   max_asks_per_tool: 3              # a tool's questions to the user in a row
//!   answers: to_tool                  # an answer goes into the waiting call (or to_model)
//!   include_tools: []                 # names or prefixes (`fs_*`) to keep; all when empty
//!   exclude_tools: []                 # names or prefixes to drop
//!   compaction:                       # when the context fills (all optional; on by default)
//!     reserve_tokens: 16384           # compact past context_window − this
//!     keep_recent_tokens: 20000       # the latest messages kept as they are
//!     llm: cheap                      # a named LLM configuration writes the summaries
//!   extra_body: {top_k: 40}           # provider-specific keys, added to each request's body
//!   compression: {max_chars: 400, keep_end_chars: 100}  # long answers cut on reload (see compress)
//!   memory:                           # the user remembered across sessions (see memory)
//!     recall_limit: 5                 # also working: true, facts: true (the defaults)
//!     embeddings: {provider: openai, model: text-embedding-3-small}  # recall by meaning too (optional)
//!   triggers:                         # events that prompt it (see trigger), or a schedule (see schedule)
//!     - {on: ticket.opened, match: {priority: high}, debounce_ms: 2000, session: "ticket-{id}"}
//!     - {cron: "0 9 * * 1-5", timezone: Europe/Oslo, session: morning}
//!   budget:                           # what a run and the agent may spend (see tiller_core::budget)
//!     run: {total_tokens: 200000, tool_calls: 50, wall_clock_ms: 600000}
//!     agent: {cost_usd: 5.0}
//!   guardrails:                       # checks by name: a Rust guardrail or another agent's definition
//!     input: [no_secrets]
//!     output: [on_topic]
//!     tool_calls: []
//! ```
//!
//! Loading checks everything a run would trip over later: unknown keys are errors,
//! every field has its type, tool names and parameter schemas are valid, and a
//! command's program exists. Each error names the file, the field and what was
//! expected.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::agent_tool::model_safe_name;
use crate::command_tool::CommandTool;
use crate::compress::Compression;
use crate::guardrail::GuardrailNames;
use crate::llm::LlmConfigs;
use crate::memory::MemoryConfig;
use crate::tool_registry::ToolRegistry;
use crate::trigger::Trigger;
use crate::{
    ActionTool, AgentSettings, AgentTool, Model, OutputSchema, ThinkingLevel, ToolChoice, ToolSet,
    ToolSetError, WidgetTool,
};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tiller_ai::ThinkingBudgets;
use tiller_core::compaction::{self, CompactionPolicy};
use tiller_core::{Answers, Approval, Budgets, ToolFilter};
#[cfg(feature = "mcp")]
use tiller_mcp::McpServer;
use tiller_runtime::{DefinitionPatch, PatchError};

/// How long a command tool may run when its file does not say.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// An agent, as declared in a file (made by [`AgentFile::parse`] and
/// [`AgentFile::load`]). Non-exhaustive: the `mcp` feature adds a field.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// The agent's name.
    pub name: String,
    /// The agent's version, if given.
    pub version: Option<String>,
    /// A named LLM configuration the file's own settings go over.
    pub llm: Option<String>,
    /// What the file sets of the agent's definition: the instructions (the
    /// schema's `description`), the model (`model`, as `provider/id` or its parts),
    /// `api_key_env`, `thinking`, `temperature`, `max_tokens`, `context_window`, `max_turns`,
    /// `tool_choice` and `tool_choice_after_tools`.
    pub patch: DefinitionPatch,
    /// Whether the final answer must match [`AgentFile::output_schema`].
    pub structured_output: bool,
    /// The answer's shape: an object schema of the file's `properties` and `required`.
    pub output_schema: Value,
    /// The tools it lists, in order: command tools and built-ins made at load,
    /// the others named for [`AgentFile::tool_set`] to take from a registry.
    pub tools: Vec<FileTool>,
    /// Which of its tools the agent keeps (`include_tools`, `exclude_tools`).
    pub tool_filter: ToolFilter,
    /// The MCP servers whose tools it uses (`mcp_servers`), connected by
    /// [`crate::Definitions::connect_mcp`] or [`ToolRegistry::connect_mcp`].
    #[cfg(feature = "mcp")]
    pub mcp_servers: Vec<McpServer>,
    /// Which tools' calls wait for the user's approval (`approvals`), by name.
    pub approvals: BTreeMap<String, ApprovalRule>,
    /// How many questions in a row a tool may ask the user, if the file sets it.
    pub max_asks_per_tool: Option<u32>,
    /// Where the user's answers to a tool's questions go (`answers`), if the file
    /// says.
    pub answers: Option<Answers>,
    /// When the transcript is compacted (`compaction`), if the file says.
    pub compaction: Option<CompactionPolicy>,
    /// How long answers are cut when the transcript is reloaded (`compression`),
    /// if the file says; applied where the session store is known
    /// ([`Definitions::with_session_store`](crate::Definitions::with_session_store)).
    pub compression: Option<Compression>,
    /// What the agent remembers of its user across sessions (`memory`), if the
    /// file says; applied where the session store is known, like `compression`.
    pub memory: Option<MemoryConfig>,
    /// The events that start this agent (`triggers`; see [`crate::trigger`]).
    pub triggers: Vec<Trigger>,
    /// The guardrails of its runs (`guardrails`), by name: resolved by
    /// [`Definitions::spec_of`](crate::Definitions::spec_of).
    pub guardrails: GuardrailNames,
}

/// An agent file's approval policy for one tool (the Rust-only
/// [`Approval::AskIf`] takes a predicate instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalRule {
    /// Calls run without asking.
    Always,
    /// Each call waits for the user's approval.
    Ask,
    /// Calls never run.
    Never,
}

impl From<ApprovalRule> for Approval {
    fn from(rule: ApprovalRule) -> Self {
        match rule {
            ApprovalRule::Always => Approval::Always,
            ApprovalRule::Ask => Approval::Ask,
            ApprovalRule::Never => Approval::Never,
        }
    }
}

/// A tool an agent file lists.
#[derive(Clone)]
pub enum FileTool {
    /// Made at load: a command tool, or a built-in (`action`).
    Ready(Arc<dyn AgentTool>),
    /// Named alone, to be taken from the host's [`ToolRegistry`].
    Named(String),
}

impl FileTool {
    /// The tool's name.
    pub fn name(&self) -> &str {
        match self {
            FileTool::Ready(tool) => tool.name(),
            FileTool::Named(name) => name,
        }
    }
}

impl fmt::Debug for FileTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileTool::Ready(tool) => f.debug_tuple("Ready").field(&tool.name()).finish(),
            FileTool::Named(name) => f.debug_tuple("Named").field(name).finish(),
        }
    }
}

/// A model as an agent file names it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ModelSpec {
    /// `provider/model-id`, as in `openai/gpt-4o-mini`.
    Name(String),
    /// `[primary, fallback, …]`, each `provider/model-id`.
    Names(String, Vec<String>),
    /// A provider, a model id and optionally a server.
    Parts {
        /// The provider, such as `openai`, `anthropic` or `llamacpp`.
        provider: String,
        /// The model id.
        id: String,
        /// The server, for OpenAI- or Anthropic-compatible ones.
        base_url: Option<String>,
    },
}

/// Why an agent file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {}{message}", file.display(), field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct AgentFileError {
    /// The file.
    pub file: PathBuf,
    /// The field at fault, as a path such as `json_schema_extra.tools[0].command`.
    pub field: Option<String>,
    /// What is wrong and what was expected.
    pub message: String,
}

impl AgentFile {
    /// Reads and checks the agent file at `path`: JSON when its name ends in
    /// `.json`, YAML otherwise.
    pub fn load(path: impl AsRef<Path>) -> Result<AgentFile, AgentFileError> {
        let path = path.as_ref();
        let error = |field: Option<String>, message: String| AgentFileError {
            file: path.to_owned(),
            field,
            message,
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| error(None, format!("cannot read the file: {e}")))?;
        Self::parse(path, &text)
    }

    /// What the file sets of the definition, over the LLM configuration its
    /// `llm` names in `llms` (whose name is then the rate-limit account, unless
    /// the configuration names another).
    pub fn patch_over(&self, llms: &LlmConfigs) -> Result<DefinitionPatch, AgentFileError> {
        let base = match &self.llm {
            Some(name) => {
                let mut base = llms
                    .get(name)
                    .map_err(|error| self.error("json_schema_extra.llm", error.to_string()))?
                    .clone();
                base.account.get_or_insert_with(|| name.clone());
                base
            }
            None => DefinitionPatch::default(),
        };
        Ok(base.merged(&self.patch))
    }

    /// The agent's settings: `default_model`, with [`AgentFile::patch_over`]
    /// applied, then what [`AgentFile::apply`] sets, tools from `tools`.
    pub fn settings(
        &self,
        tools: &ToolRegistry,
        llms: &LlmConfigs,
        default_model: Option<Model>,
    ) -> Result<AgentSettings, AgentFileError> {
        let patch = self.patch_over(llms)?;
        let mut settings = AgentSettings::default();
        settings.definition.model = default_model;
        patch.apply(&mut settings.definition).map_err(|error| {
            let field = match &error {
                PatchError::MissingKey(_) if self.patch.api_key_env.is_some() => {
                    "json_schema_extra.api_key_env"
                }
                PatchError::Model(_) if self.patch.model.is_some() => "json_schema_extra.model",
                _ => "json_schema_extra.llm",
            };
            self.error(field, error.to_string())
        })?;
        self.apply(&mut settings, tools)?;
        if let Some(name) = self.compaction.as_ref().and_then(|c| c.llm.as_ref()) {
            let field = "json_schema_extra.compaction.llm";
            // From nothing: the agent's key goes to its own model only.
            let mut writer = tiller_runtime::AgentDefinition::default();
            llms.get(name)
                .map_err(|error| self.error(field, error.to_string()))?
                .apply(&mut writer)
                .map_err(|error| self.error(field, error.to_string()))?;
            let model = writer.model.ok_or_else(|| {
                self.error(
                    field,
                    format!("the LLM configuration `{name}` names no model"),
                )
            })?;
            settings.code.hooks.summarize =
                Some(compaction::model_summarizer(model, writer.run.stream));
        }
        Ok(settings)
    }

    fn error(&self, field: &str, message: String) -> AgentFileError {
        AgentFileError {
            file: self.path.clone(),
            field: Some(field.to_owned()),
            message,
        }
    }

    /// Sets what the file says in `settings` beyond its patch: the output schema
    /// (with `structured_output`), the tools (see [`AgentFile::tool_set`]) and
    /// their approvals.
    pub fn apply(
        &self,
        settings: &mut AgentSettings,
        registry: &ToolRegistry,
    ) -> Result<(), AgentFileError> {
        let definition = &mut settings.definition;
        if self.structured_output {
            definition.run.stream.output_schema = Some(self.output());
        }
        for (tool, rule) in &self.approvals {
            definition
                .run
                .approvals
                .insert(tool.clone(), (*rule).into());
        }
        if let Some(answers) = self.answers {
            definition.run.answers = answers;
        }
        if let Some(asks) = self.max_asks_per_tool {
            definition.run.max_asks_per_tool = asks;
        }
        if let Some(policy) = &self.compaction {
            definition.run.compaction = policy.clone();
        }
        settings.set_tools(self.tool_set(registry)?);
        for tool in self.approvals.keys() {
            if !settings
                .code
                .tools
                .tools()
                .any(|known| known.name() == tool)
            {
                return Err(AgentFileError {
                    file: self.path.clone(),
                    field: Some(format!("json_schema_extra.approvals.{tool}")),
                    message: format!("`{tool}` is not among the agent's tools"),
                });
            }
        }
        Ok(())
    }

    /// Whether it lists a tool named `name`.
    pub fn lists_tool(&self, name: &str) -> bool {
        self.tools.iter().any(|tool| tool.name() == name)
    }

    /// The file's answer schema as an output schema named after the agent (in the
    /// characters OpenAI accepts).
    pub fn output(&self) -> OutputSchema {
        let name = model_safe_name(&self.name);
        let name = if name.is_empty() {
            "answer".to_owned()
        } else {
            name
        };
        OutputSchema::new(name, self.output_schema.clone())
    }

    /// The agent's tools: those made at load, and each one named alone taken from
    /// `registry` (a registry tool named `action` replaces the built-in), less
    /// what the filters drop. A name the registry lacks is an error naming the
    /// entry, as is a tool choice naming a tool the filters dropped.
    pub fn tool_set(&self, registry: &ToolRegistry) -> Result<ToolSet, AgentFileError> {
        let error = |field: String, message: String| AgentFileError {
            file: self.path.clone(),
            field: Some(field),
            message,
        };
        let mut tools = Vec::with_capacity(self.tools.len());
        for (index, entry) in self.tools.iter().enumerate() {
            let tool = match (entry, registry.get(entry.name())) {
                (_, Some(tool)) => tool,
                (FileTool::Ready(tool), None) => tool.clone(),
                (FileTool::Named(name), None) => {
                    let known: Vec<&str> = registry.names().collect();
                    let known = if known.is_empty() {
                        "the registry is empty".to_owned()
                    } else {
                        format!("the registry has {}", known.join(", "))
                    };
                    return Err(error(
                        format!("json_schema_extra.tools[{index}]"),
                        format!(
                            "`{name}` is neither a built-in ({}) nor a tool of the host's registry ({known}); a command tool needs a description and a command",
                            BUILT_IN_TOOLS.join(", ")
                        ),
                    ));
                }
            };
            if self.tool_filter.keeps(tool.name()) {
                tools.push(tool);
            }
        }
        #[cfg(feature = "mcp")]
        for (index, server) in self.mcp_servers.iter().enumerate() {
            let client = registry.mcp(&server.name).ok_or_else(|| {
                error(
                    format!("json_schema_extra.mcp_servers[{index}]"),
                    format!(
                        "the MCP server `{}` is not connected: connect the file's servers first (Definitions::connect_mcp)",
                        server.name
                    ),
                )
            })?;
            tools.extend(
                client
                    .tools()
                    .into_iter()
                    .filter(|tool| self.tool_filter.keeps(tool.name())),
            );
        }
        let set = ToolSet::new(tools)
            .map_err(|e| error("json_schema_extra.tools".into(), e.to_string()))?;
        for (field, choice) in [
            ("tool_choice", &self.patch.tool_choice),
            (
                "tool_choice_after_tools",
                &self.patch.tool_choice_after_tools,
            ),
        ] {
            if let Some(ToolChoice::Tool(name)) = choice
                && !set.definitions().iter().any(|tool| &tool.name == name)
            {
                return Err(error(
                    format!("json_schema_extra.{field}"),
                    format!("`{name}` is not among the tools the filters keep"),
                ));
            }
        }
        Ok(set)
    }

    /// Checks `text` as the agent file at `path` (whose extension says JSON or YAML
    /// and whose folder relative tool paths start from), without reading it.
    pub fn parse(path: impl AsRef<Path>, text: &str) -> Result<AgentFile, AgentFileError> {
        let path = path.as_ref();
        let error = |field: Option<String>, message: String| AgentFileError {
            file: path.to_owned(),
            field,
            message,
        };
        let raw = if path.extension().is_some_and(|ext| ext == "json") {
            parse_json(text)
        } else {
            parse_yaml(text)
        }
        .map_err(|(field, message)| error(field, message))?;
        let folder = path.parent().unwrap_or(Path::new("."));
        raw.check(path, folder)
            .map_err(|(field, message)| error(Some(field), message))
    }
}

type FieldError = (Option<String>, String);

fn parse_yaml(text: &str) -> Result<RawAgentFile, FieldError> {
    let mut failed_at = None;
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|error| {
            failed_at = field_path(error.path());
            error.into_inner()
        })
    })
    .map_err(|error| (failed_at, error.to_string()))
}

fn parse_json(text: &str) -> Result<RawAgentFile, FieldError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de)
        .map_err(|error| (field_path(error.path()), error.inner().to_string()))
}

/// The path of a field, without the unknown last step a syntax error leaves; `None`
/// for the whole document.
fn field_path(path: &serde_path_to_error::Path) -> Option<String> {
    let path = path.to_string();
    let path = path.strip_suffix(".?").unwrap_or(&path);
    (path != "." && path != "?").then(|| path.to_owned())
}

/// The file as written; [`RawAgentFile::check`] makes an [`AgentFile`] of it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgentFile {
    #[serde(rename = "$schema")]
    _schema: Option<String>,
    #[serde(rename = "type")]
    _object: ObjectType,
    title: Option<String>,
    description: String,
    #[serde(default)]
    properties: Map<String, Value>,
    #[serde(default)]
    required: Vec<String>,
    #[serde(rename = "additionalProperties")]
    additional_properties: Option<Value>,
    json_schema_extra: Extra,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ObjectType {
    Object,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Extra {
    #[serde(rename = "kind")]
    _kind: Kind,
    name: String,
    version: Option<String>,
    model: Option<ModelSpec>,
    api_key_env: Option<String>,
    llm: Option<String>,
    thinking: Option<ThinkingLevel>,
    thinking_budgets: Option<ThinkingBudgets>,
    temperature: Option<f32>,
    #[serde(default, deserialize_with = "at_least_one")]
    max_tokens: Option<u32>,
    #[serde(default, deserialize_with = "at_least_one")]
    context_window: Option<u32>,
    #[serde(default)]
    structured_output: bool,
    #[serde(default, deserialize_with = "at_least_one")]
    max_turns: Option<u32>,
    tool_choice: Option<ToolChoice>,
    tool_choice_after_tools: Option<ToolChoice>,
    #[serde(default)]
    tools: Vec<RawTool>,
    #[serde(default)]
    include_tools: Vec<String>,
    #[serde(default)]
    exclude_tools: Vec<String>,
    #[cfg(feature = "mcp")]
    #[serde(default)]
    mcp_servers: Vec<McpServer>,
    /// Read only to say that this build cannot connect them.
    #[cfg(not(feature = "mcp"))]
    #[serde(default)]
    mcp_servers: Vec<Value>,
    #[serde(default)]
    approvals: BTreeMap<String, ApprovalRule>,
    max_asks_per_tool: Option<u32>,
    answers: Option<Answers>,
    compaction: Option<CompactionPolicy>,
    #[serde(default)]
    extra_body: serde_json::Map<String, Value>,
    compression: Option<Compression>,
    memory: Option<MemoryConfig>,
    #[serde(default)]
    triggers: Vec<Trigger>,
    budget: Option<Budgets>,
    #[serde(default)]
    guardrails: GuardrailNames,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Agent,
}

/// A tool entry: a command tool (with `description` and `command`), or a built-in
/// named alone (`- name: action`, with `types` for the action tool).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    /// What interfaces show instead of the name.
    label: Option<String>,
    description: Option<String>,
    parameters: Option<Value>,
    command: Option<Vec<String>>,
    #[serde(default, deserialize_with = "at_least_one")]
    timeout_ms: Option<u64>,
    #[serde(default)]
    env: Vec<String>,
    /// The action tool's types and their payload schemas.
    types: Option<BTreeMap<String, Value>>,
}

/// The tools an entry may name without a command.
const BUILT_IN_TOOLS: [&str; 3] = [ActionTool::NAME, WidgetTool::DISPLAY, WidgetTool::UPDATE];

fn empty_object_schema() -> Value {
    json!({"type": "object", "properties": {}})
}

impl RawAgentFile {
    fn check(self, path: &Path, folder: &Path) -> Result<AgentFile, (String, String)> {
        let extra = self.json_schema_extra;
        if extra.name.trim().is_empty() {
            return Err(("json_schema_extra.name".into(), "must not be empty".into()));
        }
        if let Some(name) = &extra.api_key_env {
            check_variable_name(name, "json_schema_extra.api_key_env".into())?;
        }
        for (index, name) in self.required.iter().enumerate() {
            if !self.properties.contains_key(name) {
                return Err((
                    format!("required[{index}]"),
                    format!("`{name}` is not one of the properties"),
                ));
            }
        }
        let tools = extra
            .tools
            .into_iter()
            .enumerate()
            .map(|(index, tool)| tool.check(index, folder))
            .collect::<Result<Vec<_>, _>>()?;
        check_tools(&tools)?;
        check_tool_choices(&extra.tool_choice, &extra.tool_choice_after_tools, &tools)?;
        check_mcp_servers(&extra.mcp_servers)?;
        if let Some(memory) = &extra.memory {
            memory
                .check()
                .map_err(|message| ("json_schema_extra.memory".to_owned(), message))?;
        }
        let mut triggers = extra.triggers;
        for (index, trigger) in triggers.iter_mut().enumerate() {
            let scheduled = trigger.every.is_some() || trigger.cron.is_some();
            match (scheduled, trigger.on.is_empty()) {
                (true, true) => trigger.on = crate::schedule::schedule_topic(&extra.name, index),
                (true, false) => {
                    return Err((
                        format!("json_schema_extra.triggers[{index}].on"),
                        "a trigger answers an event (`on`) or fires on a schedule (`every`, `cron`), not both".to_owned(),
                    ));
                }
                (false, true) => {
                    return Err((
                        format!("json_schema_extra.triggers[{index}]"),
                        "a trigger needs `on` (an event's topic), `every` or `cron`".to_owned(),
                    ));
                }
                (false, false) => {}
            }
            trigger.check().map_err(|(field, message)| {
                (
                    format!("json_schema_extra.triggers[{index}].{field}"),
                    message,
                )
            })?;
        }

        let output_schema = output_schema(
            self.properties,
            self.required,
            self.title,
            self.additional_properties,
        );
        let (provider, model, base_url, fallbacks) = match extra.model {
            None => (None, None, None, None),
            Some(ModelSpec::Name(name)) => (None, Some(name), None, None),
            Some(ModelSpec::Names(name, fallbacks)) => (None, Some(name), None, Some(fallbacks)),
            Some(ModelSpec::Parts {
                provider,
                id,
                base_url,
            }) => (Some(provider), Some(id), base_url, None),
        };
        let instructions = self.description.trim_end();
        let patch = DefinitionPatch {
            provider,
            model,
            base_url,
            api_key_env: extra.api_key_env,
            system_prompt: (!instructions.is_empty()).then(|| instructions.to_owned()),
            temperature: extra.temperature,
            max_tokens: extra.max_tokens,
            context_window: extra.context_window,
            thinking: extra.thinking,
            thinking_budgets: extra.thinking_budgets,
            extra_body: extra.extra_body,
            max_turns: extra.max_turns,
            tool_choice: extra.tool_choice,
            tool_choice_after_tools: extra.tool_choice_after_tools,
            output_schema: None,
            default_system_prompt: None,
            fallbacks,
            budget: extra.budget,
            account: None,
        };
        Ok(AgentFile {
            path: path.to_owned(),
            name: extra.name,
            version: extra.version,
            llm: extra.llm,
            patch,
            structured_output: extra.structured_output,
            output_schema,
            tools,
            tool_filter: ToolFilter {
                include: extra.include_tools,
                exclude: extra.exclude_tools,
            },
            #[cfg(feature = "mcp")]
            mcp_servers: in_folder_servers(extra.mcp_servers, folder),
            approvals: extra.approvals,
            max_asks_per_tool: extra.max_asks_per_tool,
            answers: extra.answers,
            compaction: extra.compaction,
            compression: extra.compression,
            memory: extra.memory,
            triggers,
            guardrails: extra.guardrails,
        })
    }
}

/// The MCP servers a file lists, checked: each usable, no two of one name (a
/// build without MCP refuses any).
#[cfg(feature = "mcp")]
fn check_mcp_servers(servers: &[McpServer]) -> Result<(), (String, String)> {
    for (index, server) in servers.iter().enumerate() {
        let field = format!("json_schema_extra.mcp_servers[{index}]");
        server.check().map_err(|message| (field.clone(), message))?;
        if servers[..index]
            .iter()
            .any(|other| other.name == server.name)
        {
            return Err((
                format!("{field}.name"),
                format!("another MCP server is named `{}`", server.name),
            ));
        }
    }
    Ok(())
}

/// A build without MCP refuses a file listing MCP servers.
#[cfg(not(feature = "mcp"))]
fn check_mcp_servers(servers: &[Value]) -> Result<(), (String, String)> {
    if servers.is_empty() {
        return Ok(());
    }
    Err((
        "json_schema_extra.mcp_servers".to_owned(),
        "this build of Tiller has no MCP support: enable the `mcp` feature".to_owned(),
    ))
}

/// A stdio server's program and files, found as a command tool's are: from
/// the agent file's folder.
#[cfg(feature = "mcp")]
fn in_folder_servers(servers: Vec<McpServer>, folder: &Path) -> Vec<McpServer> {
    servers
        .into_iter()
        .map(|mut server| {
            let mut command = std::mem::take(&mut server.command).into_iter();
            server.command = command
                .next()
                .map(|program| resolve(&program, folder).to_string_lossy().into_owned())
                .into_iter()
                .chain(command.map(|arg| in_folder(arg, folder)))
                .collect();
            server
        })
        .collect()
}

/// The answer's schema: an object of the file's `properties` and `required`,
/// with its `title` and `additionalProperties` when it gives them.
fn output_schema(
    properties: serde_json::Map<String, Value>,
    required: Vec<String>,
    title: Option<String>,
    additional: Option<Value>,
) -> Value {
    let mut schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
    });
    if let Some(title) = title {
        schema["title"] = Value::String(title);
    }
    if let Some(additional) = additional {
        schema["additionalProperties"] = additional;
    }
    schema
}

/// A named tool must be one of the file's tools, a choice needs tools to choose
/// from, and the choice after tools only follows a choice that forces a call.
fn check_tool_choices(
    choice: &Option<ToolChoice>,
    after: &Option<ToolChoice>,
    tools: &[FileTool],
) -> Result<(), (String, String)> {
    for (field, choice) in [("tool_choice", choice), ("tool_choice_after_tools", after)] {
        let field = format!("json_schema_extra.{field}");
        match choice {
            Some(_) if tools.is_empty() => {
                return Err((field, "the agent has no tools to choose from".into()));
            }
            Some(ToolChoice::Tool(name)) if !tools.iter().any(|tool| tool.name() == name) => {
                return Err((field, format!("`{name}` is not one of the agent's tools")));
            }
            _ => {}
        }
    }
    if after.is_some() && !choice.as_ref().is_some_and(ToolChoice::forces_a_call) {
        return Err((
            "json_schema_extra.tool_choice_after_tools".into(),
            "applies only when tool_choice is `required` or {tool: name}".into(),
        ));
    }
    Ok(())
}

impl RawTool {
    fn check(self, index: usize, folder: &Path) -> Result<FileTool, (String, String)> {
        let field = |name: &str| format!("json_schema_extra.tools[{index}].{name}");
        let Some(command) = self.command else {
            return self.named(index);
        };
        if self.types.is_some() {
            return Err((
                field("types"),
                "only the built-in `action` tool takes `types`".into(),
            ));
        }
        let Some(description) = self.description else {
            return Err((
                field("description"),
                "a command tool needs a description: it is what the model reads".into(),
            ));
        };
        let mut command = command.into_iter();
        let Some(program) = command.next() else {
            return Err((
                field("command"),
                "expected a program and its arguments, found an empty list".into(),
            ));
        };
        let program = resolve(&program, folder);
        if program.components().count() > 1 && !program.is_file() {
            return Err((
                format!("json_schema_extra.tools[{index}].command[0]"),
                format!("no such program: {}", program.display()),
            ));
        }
        let args = command.map(|arg| in_folder(arg, folder)).collect();
        let timeout = self
            .timeout_ms
            .map_or(DEFAULT_TOOL_TIMEOUT, Duration::from_millis);
        for (at, name) in self.env.iter().enumerate() {
            check_variable_name(name, format!("json_schema_extra.tools[{index}].env[{at}]"))?;
        }
        let tool = CommandTool::new(
            self.name,
            description,
            self.parameters.unwrap_or_else(empty_object_schema),
            program,
            args,
            timeout,
        )
        .with_env(self.env);
        Ok(FileTool::Ready(Arc::new(match self.label {
            Some(label) => tool.with_label(label),
            None => tool,
        })))
    }

    /// A tool named alone: a built-in, or one of the host's registry. It takes
    /// none of a command tool's fields.
    fn named(self, index: usize) -> Result<FileTool, (String, String)> {
        let field = |name: &str| format!("json_schema_extra.tools[{index}].{name}");
        for (name, given) in [
            ("label", self.label.is_some()),
            ("description", self.description.is_some()),
            ("parameters", self.parameters.is_some()),
            ("timeout_ms", self.timeout_ms.is_some()),
            ("env", !self.env.is_empty()),
        ] {
            if given {
                return Err((
                    field(name),
                    format!(
                        "a tool named alone is a built-in or a tool of the host's registry and takes no `{name}`; a command tool needs a `command`"
                    ),
                ));
            }
        }
        if self.name != ActionTool::NAME {
            if self.types.is_some() {
                return Err((
                    field("types"),
                    "only the built-in `action` tool takes `types`".into(),
                ));
            }
            return Ok(match WidgetTool::named(&self.name) {
                Some(widget) => FileTool::Ready(Arc::new(widget)),
                None => FileTool::Named(self.name),
            });
        }
        let tool = ActionTool::with_types(self.types.unwrap_or_default())
            .map_err(|error| (field("types"), error))?;
        Ok(FileTool::Ready(Arc::new(tool)))
    }
}

/// An environment variable's name: letters, digits and `_`, not starting with a digit.
pub(crate) fn check_variable_name(name: &str, field: String) -> Result<(), (String, String)> {
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err((
            field,
            format!("`{name}` is not an environment variable's name"),
        ))
    }
}

/// A command element as a path: relative ones with a directory part are taken from
/// the agent file's folder; a bare program name is left for `PATH`.
fn resolve(element: &str, folder: &Path) -> PathBuf {
    match beside(element, folder) {
        Some(path) if element.contains('/') => path,
        _ => PathBuf::from(element),
    }
}

/// An argument naming a file of the agent's `folder` (`tools/add.py`,
/// `remind.py`) as that file, wherever Tiller runs from; any other as it is.
fn in_folder(arg: String, folder: &Path) -> String {
    match beside(&arg, folder) {
        Some(file) if file.exists() => file.to_string_lossy().into_owned(),
        _ => arg,
    }
}

/// A relative `element` as a path in `folder`; `None` for an absolute one.
fn beside(element: &str, folder: &Path) -> Option<PathBuf> {
    let path = Path::new(element);
    path.is_relative()
        .then(|| folder.join(path.strip_prefix(".").unwrap_or(path)))
}

/// The tools' names and schemas checked as the runtime will (the named ones by
/// name only); a fault is reported by the tool's position.
fn check_tools(tools: &[FileTool]) -> Result<(), (String, String)> {
    let names: Vec<String> = tools.iter().map(|tool| tool.name().to_owned()).collect();
    let placeholder = |name: &str| -> Arc<dyn AgentTool> {
        Arc::new(crate::FnTool::new(
            name,
            "",
            empty_object_schema(),
            |_, _| async { Ok(crate::ToolOutput::default()) },
        ))
    };
    let set = ToolSet::new(tools.iter().map(|tool| match tool {
        FileTool::Ready(tool) => tool.clone(),
        FileTool::Named(name) => placeholder(name),
    }));
    let error = match set {
        Ok(_) => return Ok(()),
        Err(error) => error,
    };
    // The first tool of a name, or for a duplicate the second.
    let position = |name: &str, duplicate: bool| {
        let mut found = names.iter().enumerate().filter(|(_, n)| *n == name);
        let found = if duplicate {
            found.nth(1)
        } else {
            found.next()
        };
        found.map_or(0, |(index, _)| index)
    };
    Err(match &error {
        ToolSetError::InvalidName(name) => (
            format!("json_schema_extra.tools[{}].name", position(name, false)),
            error.to_string(),
        ),
        ToolSetError::DuplicateName(name) => (
            format!("json_schema_extra.tools[{}].name", position(name, true)),
            error.to_string(),
        ),
        ToolSetError::InvalidSchema { name, .. } => (
            format!(
                "json_schema_extra.tools[{}].parameters",
                position(name, false)
            ),
            error.to_string(),
        ),
    })
}

/// A whole number of at least 1, whatever the scalar was written as.
fn at_least_one<'de, D, N>(deserializer: D) -> Result<Option<N>, D::Error>
where
    D: Deserializer<'de>,
    N: TryFrom<u64>,
{
    struct AtLeastOne;

    impl Visitor<'_> for AtLeastOne {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a whole number of at least 1")
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<u64, E> {
            if value == 0 {
                return Err(E::invalid_value(de::Unexpected::Unsigned(0), &self));
            }
            Ok(value)
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<u64, E> {
            match u64::try_from(value) {
                Ok(value) => self.visit_u64(value),
                Err(_) => Err(E::invalid_value(de::Unexpected::Signed(value), &self)),
            }
        }
    }

    let value = deserializer.deserialize_any(AtLeastOne)?;
    N::try_from(value)
        .map(Some)
        .map_err(|_| de::Error::invalid_value(de::Unexpected::Unsigned(value), &"a smaller number"))
}

impl<'de> Deserialize<'de> for ModelSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ModelSpecVisitor)
    }
}

struct ModelSpecVisitor;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelParts {
    provider: String,
    id: String,
    base_url: Option<String>,
}

impl<'de> Visitor<'de> for ModelSpecVisitor {
    type Value = ModelSpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "`provider/model-id`, a list of them (the first, then its fallbacks), or a mapping with provider, id and base_url",
        )
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<ModelSpec, E> {
        Ok(ModelSpec::Name(value.to_owned()))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<ModelSpec, A::Error> {
        let mut names: Vec<String> = Vec::new();
        while let Some(name) = seq.next_element()? {
            names.push(name);
        }
        if names.is_empty() {
            return Err(de::Error::invalid_length(0, &"at least one model"));
        }
        let primary = names.remove(0);
        Ok(ModelSpec::Names(primary, names))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ModelSpec, A::Error> {
        let parts = ModelParts::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(ModelSpec::Parts {
            provider: parts.provider,
            id: parts.id,
            base_url: parts.base_url,
        })
    }
}
