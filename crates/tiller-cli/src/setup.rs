//! From options, environment and agent file to an agent's settings.
//!
//! The model is chosen as every command and host chooses it
//! ([`tiller::choose_model`]): the `--provider`/`--model`/`--base-url` options
//! over their variables, then the agent file's `model`, then a provider whose API
//! key is set; with none, the scripted faux model answers. An agent file's
//! `base_url` gets a key only when the file names one with `api_key_env`.

use std::path::Path;

use tiller::{
    ASK_AGENT_TOOL, AgentSettings, ApiKey, AskAgentConfig, Compression, DefinitionPatch,
    Definitions, DefinitionsError, LlmConfigs, Model, ModelChoice, ModelSources, Named, Supervisor,
    ToolRegistry,
};

use crate::cli::AgentOptions;
use tiller::agent_file::{AgentFile, AgentFileError};

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
    Mcp(#[from] tiller::tiller_mcp::McpError),
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
    /// The agent the options describe (connected to the MCP servers its file
    /// lists, which stay connected while its tools live). A file listing
    /// `ask_agent` asks the agent files of its own folder, run under `supervisor`.
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
            Some(file) => Some((file, file_llm(options, file, var)?)),
            None => None,
        };
        let ModelChoice {
            model,
            api_key,
            notice,
        } = choose_model(options, llm.as_ref(), var)?;
        let api_key = file_key(llm.as_ref(), var)?.or(api_key);
        // The file first, then the options over it.
        let mut settings = AgentSettings::new(model);
        settings.definition.run.stream.api_key = api_key;
        if let Some((file, llm)) = &llm {
            // Its instructions and options; the model and key are chosen above.
            let file_options = DefinitionPatch {
                provider: None,
                model: None,
                base_url: None,
                api_key_env: None,
                ..llm.clone()
            };
            file_options
                .apply(&mut settings.definition)
                .map_err(|error| SetupError::Model {
                    origin: format!("{}: json_schema_extra.llm", file.path.display()),
                    reason: error.to_string(),
                })?;
            let registry = if file.tools.iter().any(|tool| tool.name() == ASK_AGENT_TOOL) {
                delegating(file, &settings, supervisor).await?
            } else {
                let mut registry = ToolRegistry::new();
                registry.connect_mcp(&file.mcp_servers).await?;
                registry
            };
            file.apply(&mut settings, &registry)?;
            if let Some(spec) = &options.instructions_prompt {
                let arguments = options
                    .prompt_args
                    .iter()
                    .map(|(key, value)| (key.clone(), serde_json::Value::String(value.clone())))
                    .collect();
                settings.definition.system_prompt =
                    Some(registry.mcp_prompt(spec, arguments).await?);
            }
        }
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
        let compression = options
            .compress_chars
            .map(|chars| Compression::keeping(chars as usize))
            .or(file.as_ref().and_then(|file| file.compression));
        if let Some(compression) = compression {
            settings = compression.applied_to(settings, supervisor.store().clone());
        }
        let name = file.map_or_else(|| "tiller".to_owned(), |f| f.name);
        Ok(Setup {
            name,
            settings,
            notice,
        })
    }
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

/// The registry of a file that lists `ask_agent`: that of the agent files of its
/// folder (itself among them; their MCP servers connected once), which get
/// `settings`' model and key when they name no model, with `ask_agent` over them.
async fn delegating(
    file: &AgentFile,
    settings: &AgentSettings,
    supervisor: &Supervisor,
) -> Result<ToolRegistry, SetupError> {
    let folder = file.path.parent().unwrap_or(Path::new("."));
    let unusable = |error: DefinitionsError| SetupError::Model {
        origin: format!("{}: ask_agent", file.path.display()),
        reason: error.to_string(),
    };
    let mut definitions = Definitions::load_dir(folder).map_err(unusable)?;
    let definition = &settings.definition;
    if let Some(model) = &definition.model {
        definitions = definitions
            .with_default_model(model.clone())
            .with_default_key(definition.run.stream.api_key.clone());
    }
    definitions
        .connect_mcp()
        .await
        .map_err(|error| match error {
            DefinitionsError::Mcp(error) => SetupError::Mcp(error),
            error => unusable(error),
        })?;
    let definitions = definitions.with_ask_agent(supervisor, AskAgentConfig::default());
    Ok(definitions.tools().clone())
}

/// The agent file's model configuration: the one its `llm` names in `--llms` (or
/// $TILLER_LLMS), with the file's own fields over it.
fn file_llm(
    options: &AgentOptions,
    file: &AgentFile,
    var: impl Fn(&str) -> Option<String>,
) -> Result<DefinitionPatch, SetupError> {
    let llms = match (&file.llm, &options.llms) {
        (None, _) => LlmConfigs::new(),
        (Some(_), Some(path)) => load_llms(path, "--llms")?,
        (Some(_), None) => match var("TILLER_LLMS") {
            Some(path) => load_llms(Path::new(&path), "TILLER_LLMS")?,
            None => LlmConfigs::new(),
        },
    };
    Ok(file.patch_over(&llms)?)
}

fn load_llms(path: &Path, origin: &str) -> Result<LlmConfigs, SetupError> {
    LlmConfigs::load(path).map_err(|error| SetupError::Model {
        origin: format!("{origin} {}", path.display()),
        reason: error.to_string(),
    })
}

/// The model the options, the agent file and the environment (`var`) choose
/// ([`tiller::choose_model`]), each option named by its flag.
fn choose_model(
    options: &AgentOptions,
    file: Option<&(&AgentFile, DefinitionPatch)>,
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
        file: file.map(|(file, patch)| (*file, patch)),
    };
    tiller::choose_model(sources, var).map_err(|error| SetupError::Model {
        origin: error.origin,
        reason: error.reason,
    })
}

/// The key the agent file names with `api_key_env` (itself or through its LLM
/// configuration), if it names one.
fn file_key(
    file: Option<&(&AgentFile, DefinitionPatch)>,
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
    let own =
        tiller::catalog::provider(&model.provider).is_some_and(|p| p.base_url == model.base_url);
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
