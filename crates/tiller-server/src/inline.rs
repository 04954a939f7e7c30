//! What a client may put in an agent file it sends inline (`POST /agents`,
//! `POST /sessions/{id}/resume`): it chooses only among what the operator
//! configured.
//!
//! An inline file may set the instructions, the answer's schema and the run's
//! options (thinking, temperature, token and turn limits, tool choices, approvals,
//! filters). It may name a model only from those the server serves (the default
//! model and the named LLM configurations), and tools only by name, from the
//! server's registry and the built-ins. It carries no command, no `base_url`, no
//! `api_key_env`, no tool `env` and no MCP server: each of those would make the
//! server run a program, reach a host, or send a secret where the client points.
//! Nor does it turn on `memory`, which keeps users' data in the server's store.
//! The operator can allow them with [`crate::ServerConfig::trust_inline_definitions`]
//! (`tiller serve --trust-inline-definitions`).
//!
//! These checks run on the JSON as sent, before the file is read as an agent file
//! (nothing about the server's files, programs or environment shows in the answer),
//! and again on what reading made of it. A tool the operator's definitions make
//! wait for approval waits at least as much in a client's file.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::Value;
use tiller::agents::agent_file::{AgentFile, FileTool};
use tiller::{
    AgentSpec, Definitions,
    run::{ActionTool, Approval, WidgetTool},
};

use crate::Shared;
use crate::error::Problem;
use crate::proxy::ProxyModels;

impl Shared {
    /// The agent an inline file (an agent file as JSON) makes, under the rules
    /// above unless the operator trusts inline files.
    pub(crate) fn inline_spec(&self, inline: &Value) -> Result<AgentSpec, Problem> {
        let trusted = self.config.trust_inline_definitions;
        if !trusted {
            check_file(inline)?;
        }
        let file = AgentFile::parse("inline.json", &inline.to_string()).map_err(|error| {
            Problem::invalid(
                error.field.as_ref().map(|field| format!("inline.{field}")),
                error.message,
            )
        })?;
        if !trusted {
            check_read(&file)?;
        }
        let mut spec = self.definitions.spec_of(&file)?;
        if !trusted {
            check_model(&spec, &self.proxy_models)?;
            keep_operator_approvals(&mut spec, &self.definitions);
        }
        // The operator's guardrails check a client's agent too, before its own.
        let operator = &self.config.guardrails;
        if !operator.is_empty() {
            let hooks = &mut Arc::make_mut(&mut spec.settings).code.hooks;
            hooks.guardrails = operator.clone().and(&hooks.guardrails);
        }
        Ok(spec)
    }
}

/// The keys of a tool entry a client may give: a name, and the action built-in's types.
const CLIENT_TOOL_KEYS: [&str; 2] = ["name", "types"];

/// Refuses what an inline file of a client may not carry (see the module's doc),
/// and any of it written other than as objects: a struct is also read from a
/// JSON array, whose fields have no names to check.
fn check_file(inline: &Value) -> Result<(), Problem> {
    let not_an_object = |field: &str| {
        Problem::invalid(
            Some(format!("inline{field}")),
            "an inline agent file and its settings are JSON objects",
        )
    };
    if !inline.is_object() {
        return Err(not_an_object(""));
    }
    let Some(extra) = inline.get("json_schema_extra") else {
        // Reading it says what is missing.
        return Ok(());
    };
    let Some(extra) = extra.as_object() else {
        return Err(not_an_object(".json_schema_extra"));
    };
    for key in ["api_key_env", "mcp_servers", "memory"] {
        if extra.contains_key(key) {
            return Err(operator_only(
                format!("json_schema_extra.{key}"),
                match key {
                    "api_key_env" => {
                        "a client cannot choose which of the server's variables is sent as a key"
                    }
                    "memory" => {
                        "a client cannot turn on memory: what is kept of users is the operator's to allow"
                    }
                    _ => "a client cannot start MCP servers on the server",
                },
            ));
        }
    }
    match extra.get("model") {
        None | Some(Value::String(_)) => {}
        // A model and its fallbacks, each `provider/id`, never an address.
        Some(Value::Array(models))
            if models
                .iter()
                .all(|model| model.as_str().is_some_and(|name| !name.contains("://"))) => {}
        Some(Value::Object(model)) if !model.contains_key("base_url") => {}
        Some(_) => {
            return Err(operator_only(
                "json_schema_extra.model.base_url".to_owned(),
                "a client cannot choose the server a model is called on; name one the server serves (`provider/id`)",
            ));
        }
    }
    let tools = match extra.get("tools") {
        None => return Ok(()),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(not_an_object(".json_schema_extra.tools[]")),
    };
    for (index, tool) in tools.iter().enumerate() {
        let Some(tool) = tool.as_object() else {
            return Err(not_an_object(&format!(".json_schema_extra.tools[{index}]")));
        };
        if let Some(key) = tool
            .keys()
            .find(|key| !CLIENT_TOOL_KEYS.contains(&key.as_str()))
        {
            return Err(operator_only(
                format!("json_schema_extra.tools[{index}].{key}"),
                "a client names tools only (from the server's registry and the built-ins); it cannot declare command tools",
            ));
        }
    }
    Ok(())
}

/// Refuses a read file holding what [`check_file`] keeps out: a second look, at
/// what reading made of it.
fn check_read(file: &AgentFile) -> Result<(), Problem> {
    let field = if file.patch.api_key_env.is_some() {
        "json_schema_extra.api_key_env"
    } else if !file.mcp_servers.is_empty() {
        "json_schema_extra.mcp_servers"
    } else if file.patch.base_url.is_some() {
        "json_schema_extra.model.base_url"
    } else if file.memory.is_some() {
        "json_schema_extra.memory"
    } else if file
        .tools
        .iter()
        .any(|tool| matches!(tool, FileTool::Ready(ready) if !is_built_in(ready.name())))
    {
        "json_schema_extra.tools"
    } else {
        return Ok(());
    };
    Err(operator_only(
        field.to_owned(),
        "a client chooses only among what the server has",
    ))
}

/// Whether `name` is a built-in a client may name: `action` and the widget tools.
fn is_built_in(name: &str) -> bool {
    name == ActionTool::NAME || WidgetTool::named(name).is_some()
}

/// Makes each of `spec`'s tools wait for approval at least as the operator's
/// definitions make it wait anywhere (`never` over `ask` over `always`): a client
/// cannot lift an approval the operator asks for a tool of the registry.
fn keep_operator_approvals(spec: &mut AgentSpec, definitions: &Definitions) {
    let names = spec.settings.definition.tools.clone();
    for name in names {
        let strictest = definitions
            .iter()
            .filter_map(|file| file.approvals.get(&name))
            .map(|rule| Approval::from(*rule))
            .max_by_key(|rule| strictness(Some(rule)));
        let Some(strictest) = strictest else {
            continue;
        };
        let approvals = &spec.settings.definition.run.approvals;
        if strictness(Some(&strictest)) > strictness(approvals.get(&name)) {
            Arc::make_mut(&mut spec.settings)
                .definition
                .run
                .approvals
                .insert(name, strictest);
        }
    }
}

/// How much an approval holds a call back: `never` over `ask` (or the Rust-only
/// predicate, at most an ask) over `always`, the default.
fn strictness(approval: Option<&Approval>) -> u8 {
    match approval {
        Some(Approval::Always) | None => 0,
        Some(Approval::Never) => 2,
        Some(_) => 1,
    }
}

/// Refuses `spec` when its model is not one `served` holds (same provider, id
/// and server).
fn check_model(spec: &AgentSpec, served: &ProxyModels) -> Result<(), Problem> {
    let definition = &spec.settings.definition;
    let Some(model) = definition
        .model
        .iter()
        .chain(&definition.fallbacks)
        .find(|model| !served.serves(model))
    else {
        return Ok(());
    };
    Err(operator_only(
        "json_schema_extra.model".to_owned(),
        &format!(
            "`{}/{}` is not a model this server serves; it serves {}",
            model.provider,
            model.id,
            served.names()
        ),
    ))
}

fn operator_only(field: String, why: &str) -> Problem {
    Problem {
        field: Some(format!("inline.{field}")),
        ..Problem::new(
            StatusCode::FORBIDDEN,
            "operator-only",
            format!("{why} (the operator can allow it: `tiller serve --trust-inline-definitions`)"),
        )
    }
}
