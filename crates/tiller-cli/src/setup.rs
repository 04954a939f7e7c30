//! From options, environment and agent file to an agent's settings.
//!
//! The model is chosen as every command and host chooses it
//! ([`tiller::agents::choose_model`]): the `--provider`/`--model`/`--base-url` options
//! over their variables, then the agent file's `model`, then a provider whose API
//! key is set; with none, the scripted faux model answers. An agent file's
//! `base_url` gets a key only when the file names one with `api_key_env`.

use std::path::Path;
use std::sync::Arc;

use tiller::{
    AgentSettings, Definitions, Model, Supervisor,
    agents::{
        ASK_AGENT_TOOL, AskAgentConfig, Compression, DefinitionsError, LlmConfigs, ModelChoice,
        ModelSources, Named, ToolRegistry,
    },
    ai::ApiKey,
    runtime::DefinitionPatch,
};

use crate::cli::AgentOptions;
use tiller::agents::agent_file::{AgentFile, AgentFileError};

/// An agent ready to spawn.
#[derive(Debug)]
pub struct Setup {
    /// Its name.
    pub name: String,
    /// Its settings.
    pub settings: AgentSettings,
    /// Said on stderr before the run: which model answers when none was chosen.
    pub notice: Option<String>,
}

/// Why the options or the agent file do not make an agent (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The agent file is unusable.
    #[error(transparent)]
    AgentFile(#[from] AgentFileError),
    /// An MCP server the agent file lists could not be connected to.
    #[error(transparent)]
    Mcp(#[from] tiller::mcp::McpError),
    /// The model named cannot be used.
    #[error("{origin}: {reason}")]
    Model {
        /// Where the model was named: an option, a variable or the agent file.
        origin: String,
        /// What is wrong.
        reason: String,
    },
}

impl Setup {
    /// The agent the options describe, assembled from its file as `tiller
    /// serve` assembles it ([`Definitions::spec_of`]): with the agent files of
    /// its folder when it names others (a guardrail, or `ask_agent`, whose agents
    /// run under `supervisor`), connected to the MCP servers the files list
    /// (which stay connected while its tools live). The options go over the file.
    pub async fn new(options: &AgentOptions, supervisor: &Supervisor) -> Result<Setup, SetupError> {
        let file = options.agent.as_deref().map(AgentFile::load).transpose()?;
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|value| !value.trim().is_empty())
        };
        // The file's model settings: its named LLM configuration with its own
        // fields over it.
        let llm = match &file {
            Some(file) => {
                let llms = file_llms(options, var)?;
                let patch = file.patch_over(&llms)?;
                Some((file, patch, llms))
            }
            None => None,
        };
        let file_patch = llm.as_ref().map(|(file, patch, _)| (*file, patch));
        let ModelChoice {
            model,
            api_key,
            notice,
        } = choose_model(options, file_patch, var)?;
        let api_key = file_key(file_patch, var)?.or(api_key);
        let mut settings = match llm {
            Some((file, patch, llms)) => {
                let Assembled {
                    agent: mut settings,
                    registry,
                } = assembled(file, llms, &model, &api_key, supervisor).await?;
                // The model and key chosen above: the options' over the file's;
                // the file's context window stays with whichever model it is.
                let mut model = model;
                if let Some(window) = patch.context_window {
                    model.context_window = window;
                }
                settings.definition.model = Some(model);
                settings.definition.run.stream.transport.api_key = api_key;
                if let Some(spec) = &options.instructions_prompt {
                    let arguments = options
                        .prompt_args
                        .iter()
                        .map(|(key, value)| (key.clone(), serde_json::Value::String(value.clone())))
                        .collect();
                    settings.definition.system_prompt =
                        Some(registry.mcp_prompt(spec, arguments).await?);
                }
                settings
            }
            None => {
                let mut settings = AgentSettings::new(model);
                settings.definition.run.stream.transport.api_key = api_key;
                settings
            }
        };
        // The options over the file.
        let flags = DefinitionPatch {
            system_prompt: options.system.clone(),
            thinking: options.thinking,
            max_turns: options.max_turns,
            max_tokens: options.max_tokens,
            context_window: context_window(options.context_window, var("TILLER_CONTEXT_WINDOW"))?,
            ..DefinitionPatch::default()
        };
        flags
            .apply(&mut settings.definition)
            .map_err(|error| SetupError::Model {
                origin: "the command line".to_owned(),
                reason: error.to_string(),
            })?;
        if options.system.as_deref() == Some("") {
            settings.definition.system_prompt = None;
        }
        if let Some(chars) = options.compress_chars {
            settings = Compression::keeping(chars as usize)
                .applied_to(settings, supervisor.store().clone());
        }
        let name = file.map_or_else(|| "tiller".to_owned(), |f| f.name);
        Ok(Setup {
            name,
            settings,
            notice,
        })
    }
}

/// An agent's settings as [`assembled`] makes them, with the registry its
/// tools came from.
struct Assembled {
    agent: AgentSettings,
    registry: ToolRegistry,
}

/// The agent of `file` as `tiller serve` makes it: [`Definitions::spec_of`] over
/// the definitions [`Definitions::around`] it, with `llms`, the chosen model
/// and key for files naming no model, and the session store (for the file's
/// `compression`).
async fn assembled(
    file: &AgentFile,
    llms: LlmConfigs,
    model: &Model,
    api_key: &Option<ApiKey>,
    supervisor: &Supervisor,
) -> Result<Assembled, SetupError> {
    let unusable = |error: DefinitionsError| match error {
        DefinitionsError::Unusable(error) => SetupError::AgentFile(error),
        DefinitionsError::Mcp(error) => SetupError::Mcp(error),
        error => SetupError::Model {
            origin: format!("{}: the agent files beside it", file.path.display()),
            reason: error.to_string(),
        },
    };
    let mut definitions = Definitions::around(file)
        .map_err(unusable)?
        .with_llms(llms)
        .with_default_model(model.clone())
        .with_default_key(api_key.clone())
        .with_session_store(supervisor.store().clone());
    definitions.connect_mcp().await.map_err(unusable)?;
    if file.lists_tool(ASK_AGENT_TOOL) {
        definitions = definitions.with_ask_agent(supervisor, AskAgentConfig::default());
    }
    let spec = definitions.spec_of(file).map_err(unusable)?;
    Ok(Assembled {
        agent: Arc::unwrap_or_clone(spec.settings),
        registry: definitions.tools().clone(),
    })
}

/// The context window `--context-window` gives, else `$TILLER_CONTEXT_WINDOW`
/// (`variable`), if either does.
fn context_window(
    option: Option<u32>,
    variable: Option<String>,
) -> Result<Option<u32>, SetupError> {
    let Some(value) = variable.filter(|_| option.is_none()) else {
        return Ok(option);
    };
    match value.trim().parse::<u32>() {
        Ok(window) if window > 0 => Ok(Some(window)),
        _ => Err(SetupError::Model {
            origin: "TILLER_CONTEXT_WINDOW".to_owned(),
            reason: format!("`{value}` is not a number of tokens (a whole number above 0)"),
        }),
    }
}

/// The named LLM configurations of `--llms` (or $TILLER_LLMS), if either is
/// given: the file, its compaction and the agents beside it may name one.
fn file_llms(
    options: &AgentOptions,
    var: impl Fn(&str) -> Option<String>,
) -> Result<LlmConfigs, SetupError> {
    match &options.llms {
        Some(path) => load_llms(path, "--llms"),
        None => match var("TILLER_LLMS") {
            Some(path) => load_llms(Path::new(&path), "TILLER_LLMS"),
            None => Ok(LlmConfigs::new()),
        },
    }
}

fn load_llms(path: &Path, origin: &str) -> Result<LlmConfigs, SetupError> {
    LlmConfigs::load(path).map_err(|error| SetupError::Model {
        origin: format!("{origin} {}", path.display()),
        reason: error.to_string(),
    })
}

/// The model the options, the agent file and the environment (`var`) choose
/// ([`tiller::agents::choose_model`]), each option named by its flag.
fn choose_model(
    options: &AgentOptions,
    file: Option<(&AgentFile, &DefinitionPatch)>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<ModelChoice, SetupError> {
    let named = |value: &Option<String>, flag: &str| {
        value.clone().map(|value| Named {
            source: format!("--{flag} {value}"),
            value,
        })
    };
    let sources = ModelSources {
        provider: named(&options.provider, "provider"),
        model: named(&options.model, "model"),
        base_url: named(&options.base_url, "base-url"),
        file,
    };
    tiller::agents::choose_model(sources, var).map_err(|error| SetupError::Model {
        origin: error.origin,
        reason: error.reason,
    })
}

/// The key the agent file names with `api_key_env` (itself or through its LLM
/// configuration), if it names one.
fn file_key(
    file: Option<(&AgentFile, &DefinitionPatch)>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<ApiKey>, SetupError> {
    let Some((file, name)) = file.and_then(|(f, llm)| Some((f, llm.api_key_env.as_deref()?)))
    else {
        return Ok(None);
    };
    let field = if file.patch.api_key_env.is_some() {
        "api_key_env"
    } else {
        "llm"
    };
    var(name)
        .map(|key| Some(ApiKey::new(key.trim())))
        .ok_or_else(|| SetupError::Model {
            origin: format!("{}: json_schema_extra.{field}", file.path.display()),
            reason: format!("{name} is not set"),
        })
}

/// The display name of a model: `provider/id`, and the server when it is not the
/// provider's own.
pub fn describe(model: &Model) -> String {
    let own = tiller::ai::catalog::provider(&model.provider)
        .is_some_and(|p| p.base_url == model.base_url);
    if own || model.provider == "faux" {
        format!("{}/{}", model.provider, model.id)
    } else {
        format!("{}/{} at {}", model.provider, model.id, model.base_url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// What makes an agent: its definition, its tools, its guardrails and its
    /// hooks, in a form to compare.
    fn described(settings: &AgentSettings) -> serde_json::Value {
        let code = &settings.code;
        let guardrails = &code.hooks.guardrails;
        let names = |list: &[tiller::run::Guardrail]| -> Vec<String> {
            list.iter().map(|g| g.name().to_owned()).collect()
        };
        serde_json::json!({
            "definition": serde_json::to_value(&settings.definition).unwrap(),
            "tools": code.tools.definitions().iter().map(|tool| tool.name.clone()).collect::<Vec<_>>(),
            "guardrails": [names(&guardrails.input), names(&guardrails.output), names(&guardrails.tool_calls)],
            "summarizer": code.hooks.summarize.is_some(),
            "on_reload": code.on_reload.is_some(),
        })
    }

    #[tokio::test]
    async fn the_command_and_the_server_assemble_the_same_agent_from_one_file() {
        let folder = std::env::temp_dir().join(format!("tiller-assemble-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&folder);
        let agents = folder.join("agents");
        std::fs::create_dir_all(&agents).unwrap();
        let write = |name: &str, text: &str| {
            let path = folder.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let llms = write(
            "llms.yaml",
            "cheap: {model: openai/gpt-4o-mini, max_tokens: 512}\n",
        );
        let file = agents.join("support.yaml");
        std::fs::write(
            &file,
            r#"type: object
description: You answer support questions.
json_schema_extra:
  kind: agent
  name: support
  model: {provider: llamacpp, id: smollm2, base_url: "http://127.0.0.1:9/v1"}
  context_window: 4096
  max_turns: 7
  tools:
    - {name: stamp, description: The time, command: [date]}
  approvals: {stamp: ask}
  compaction: {llm: cheap}
  compression: {max_chars: 400, keep_end_chars: 100}
  budget: {run: {model_calls: 5}}
  guardrails: {input: [judge], output: [judge]}
"#,
        )
        .unwrap();
        std::fs::write(
            agents.join("judge.yaml"),
            "type: object\ndescription: You judge.\njson_schema_extra: {kind: agent, name: judge}\n",
        )
        .unwrap();
        // Which model a command takes from the environment differs from the
        // server's by design (over the file, not under it).
        let set: Vec<&str> = ["TILLER_PROVIDER", "TILLER_MODEL", "TILLER_BASE_URL"]
            .into_iter()
            .chain(["TILLER_CONTEXT_WINDOW"])
            .filter(|name| std::env::var_os(name).is_some())
            .collect();
        assert!(set.is_empty(), "unset {set:?} to run this test");
        let supervisor = Supervisor::start().await.unwrap();

        let options = AgentOptions {
            agent: Some(file),
            llms: Some(llms.clone()),
            ..AgentOptions::default()
        };
        let command = Setup::new(&options, &supervisor).await.unwrap();
        let served = crate::serve::connected_definitions(Some(&agents), Some(&llms))
            .await
            .map_err(|_| "the folder does not load")
            .unwrap()
            .with_session_store(supervisor.store().clone())
            .spec("support", None)
            .unwrap();

        let command = described(&command.settings);
        assert_eq!(command, described(&served.settings));
        assert_eq!(
            command["guardrails"],
            serde_json::json!([["judge"], ["judge"], []])
        );
        assert_eq!(command["definition"]["model"]["context_window"], 4096);
        assert_eq!(
            (&command["summarizer"], &command["on_reload"]),
            (&serde_json::json!(true), &serde_json::json!(true))
        );
        supervisor.shutdown().await;
        let _ = std::fs::remove_dir_all(&folder);
    }

    fn chosen(options: AgentOptions, env: &[(&str, &str)]) -> Result<(String, bool), String> {
        let env: HashMap<&str, &str> = env.iter().copied().collect();
        choose_model(&options, None, |name| {
            env.get(name).map(|v| (*v).to_owned())
        })
        .map(|chosen| (describe(&chosen.model), chosen.notice.is_some()))
        .map_err(|error| error.to_string())
    }

    #[test]
    fn options_override_their_variables_and_keys_alone_pick_a_default() {
        let options = |model: &str| AgentOptions {
            model: Some(model.to_owned()),
            ..AgentOptions::default()
        };
        assert_eq!(
            chosen(
                options("anthropic/claude-haiku-4-5"),
                &[("TILLER_MODEL", "openai/gpt-4.1")]
            ),
            Ok(("anthropic/claude-haiku-4-5".to_owned(), false))
        );
        assert_eq!(
            chosen(
                AgentOptions::default(),
                &[("TILLER_MODEL", "openai/gpt-4.1")]
            ),
            Ok(("openai/gpt-4.1".to_owned(), false))
        );
        assert_eq!(
            chosen(AgentOptions::default(), &[("OPENAI_API_KEY", "sk-test")]),
            Ok(("openai/gpt-4o-mini".to_owned(), false))
        );
        assert_eq!(
            chosen(AgentOptions::default(), &[]),
            Ok(("faux/faux".to_owned(), true))
        );
        let faux = AgentOptions {
            provider: Some("faux".to_owned()),
            ..AgentOptions::default()
        };
        assert_eq!(
            chosen(faux, &[("OPENAI_API_KEY", "sk-test")]),
            Ok(("faux/faux".to_owned(), false))
        );
    }

    #[test]
    fn a_base_url_makes_a_compatible_model_of_the_provider() {
        let options = AgentOptions {
            base_url: Some("http://127.0.0.1:9/v1".to_owned()),
            model: Some("smollm2".to_owned()),
            ..AgentOptions::default()
        };
        assert_eq!(
            chosen(options.clone(), &[]),
            Ok((
                "openai-compatible/smollm2 at http://127.0.0.1:9/v1".to_owned(),
                false
            ))
        );
        let anthropic = AgentOptions {
            provider: Some("anthropic".to_owned()),
            ..options
        };
        assert_eq!(
            chosen(anthropic, &[]),
            Ok((
                "anthropic/smollm2 at http://127.0.0.1:9/v1".to_owned(),
                false
            ))
        );
    }

    #[test]
    fn a_key_follows_a_base_url_only_when_the_user_chose_it() {
        let env = |name: &str| (name == "ANTHROPIC_API_KEY").then(|| "sk-ant".to_owned());
        let chosen = AgentOptions {
            provider: Some("anthropic".to_owned()),
            base_url: Some("http://127.0.0.1:9/v1".to_owned()),
            ..AgentOptions::default()
        };
        let chosen = choose_model(&chosen, None, env).unwrap();
        assert_eq!(chosen.api_key, Some(ApiKey::new("sk-ant")));
        let own = choose_model(&AgentOptions::default(), None, env).unwrap();
        assert_eq!(
            (own.model.provider.as_str(), own.api_key),
            ("anthropic", None),
            "at the provider's own address the request reads the key itself"
        );
    }

    #[test]
    fn a_bad_model_names_where_it_came_from() {
        let options = AgentOptions {
            model: Some("gpt-4o".to_owned()),
            ..AgentOptions::default()
        };
        assert_eq!(
            chosen(options, &[]),
            Err("--model gpt-4o: name the provider too (`provider/model-id`), or give a provider or a base URL".to_owned())
        );
        assert_eq!(
            chosen(AgentOptions::default(), &[("TILLER_MODEL", "nowhere/x")]),
            Err("TILLER_MODEL=nowhere/x: unknown model `nowhere/x`: expected `provider/model-id` with a provider among openai, anthropic, gemini, openai-responses, bedrock, openrouter, groq, deepseek, mistral, llamacpp, vllm, ollama".to_owned())
        );
    }
}
