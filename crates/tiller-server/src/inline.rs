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
//! The operator can allow them with [`crate::ServerConfig::trust_inline_definitions`]
//! (`tiller serve --trust-inline-definitions`).
//!
//! These checks run on the JSON as sent, before the file is read as an agent file:
//! nothing about the server's files, programs or environment shows in the answer.

use axum::http::StatusCode;
use serde_json::Value;
use tiller::AgentSpec;

use crate::error::Problem;
use crate::proxy::ProxyModels;

/// The keys of a tool entry a client may give: a name, and the action built-in's types.
const CLIENT_TOOL_KEYS: [&str; 2] = ["name", "types"];

/// Refuses what an inline file of a client may not carry (see the module's doc).
pub(crate) fn check_file(inline: &Value) -> Result<(), Problem> {
    let Some(extra) = inline.get("json_schema_extra").and_then(Value::as_object) else {
        // Not an agent file: reading it says why.
        return Ok(());
    };
    for key in ["api_key_env", "mcp_servers"] {
        if extra.contains_key(key) {
            return Err(operator_only(
                format!("json_schema_extra.{key}"),
                match key {
                    "api_key_env" => {
                        "a client cannot choose which of the server's variables is sent as a key"
                    }
                    _ => "a client cannot start MCP servers on the server",
                },
            ));
        }
    }
    if extra
        .get("model")
        .and_then(Value::as_object)
        .is_some_and(|model| model.contains_key("base_url"))
    {
        return Err(operator_only(
            "json_schema_extra.model.base_url".to_owned(),
            "a client cannot choose the server a model is called on; name one the server serves",
        ));
    }
    let tools = extra.get("tools").and_then(Value::as_array);
    for (index, tool) in tools.into_iter().flatten().enumerate() {
        let Some(tool) = tool.as_object() else {
            continue;
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

/// Refuses `spec` when its model is not one `served` holds (same provider, id
/// and server).
pub(crate) fn check_model(spec: &AgentSpec, served: &ProxyModels) -> Result<(), Problem> {
    let Some(model) = &spec.settings.model else {
        return Ok(());
    };
    if served.serves(model) {
        return Ok(());
    }
    Err(Problem {
        field: Some("inline.json_schema_extra.model".to_owned()),
        ..Problem::new(
            StatusCode::FORBIDDEN,
            "operator-only",
            format!(
                "`{}/{}` is not a model this server serves; it serves {}",
                model.provider,
                model.id,
                served.names()
            ),
        )
    })
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
