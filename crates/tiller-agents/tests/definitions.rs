//! Agent definitions in the library: a folder of agent files, tools by name from the
//! host's registry with include and exclude lists, versions, and errors that name
//! the file and the field.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::agents::agent_file::AgentFileError;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::{
    Definitions, Supervisor, ToolError, ToolSet,
    agents::{DefinitionsError, LlmConfigs, ToolRegistry},
    ai::ThinkingLevel,
    run::CompactionPolicy,
    runtime::DefinitionPatch,
    tool,
};

/// The sample agent of the design the format follows: its tools named only.
const SAMPLE: &str = r#"type: object
description: |
  You answer questions from the knowledge base.
properties:
  answer:
    type: string
required:
  - answer
json_schema_extra:
  kind: agent
  name: my-agent
  version: "1.0.0"
  tools:
    - name: search
    - name: action
  structured_output: false
"#;

/// Search the knowledge base.
#[tool]
async fn search(query: String) -> Result<String, ToolError> {
    Ok(format!("3 documents about {query}"))
}

/// Read a file.
#[tool]
async fn fs_read(path: String) -> Result<String, ToolError> {
    Ok(format!("the text of {path}"))
}

/// Write a file.
#[tool]
async fn fs_write(path: String, text: String) -> Result<String, ToolError> {
    Ok(format!("{} bytes to {path}", text.len()))
}

/// A folder of its own under the temp directory, removed afterwards.
struct Folder(PathBuf);

impl Folder {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("tiller-definitions-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Folder(path)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn names(tools: &ToolSet) -> Vec<String> {
    tools
        .definitions()
        .iter()
        .map(|tool| tool.name.clone())
        .collect()
}

fn registry() -> ToolRegistry {
    ToolRegistry::new()
        .with(Arc::new(SearchTool))
        .with(Arc::new(FsReadTool))
        .with(Arc::new(FsWriteTool))
}

#[tokio::test]
async fn the_sample_loads_and_runs_with_the_hosts_search_tool() {
    let folder = Folder::new("sample");
    folder.write("my-agent.yaml", SAMPLE);
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("search", json!({"query": "agents"})));
    faux.push(FauxTurn::text("Three documents."));
    let definitions = Definitions::load_dir(folder.path())
        .unwrap()
        .with_default_model(faux.model());
    let file = definitions.get("my-agent", None).unwrap();
    assert_eq!(file.version.as_deref(), Some("1.0.0"));
    let spec = definitions
        .clone()
        .with_tools(registry())
        .spec("my-agent", None)
        .unwrap();
    assert_eq!(names(&spec.settings.code.tools), ["search", "action"]);
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor.spawn(spec).await.unwrap();
    let outcome = agent.run("What do we know about agents?").await.unwrap();
    assert_eq!(outcome.text(), "Three documents.");
    let request = &faux.requests()[1];
    assert_eq!(
        request.context.system_prompt.as_deref(),
        Some("You answer questions from the knowledge base.")
    );
    let offered: Vec<&str> = request
        .context
        .tools
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(offered, ["search", "action"]);
    supervisor.shutdown().await;

    // Without the host's tool the entry is named in the error.
    let error = definitions.spec("my-agent", None).unwrap_err();
    assert_eq!(
        error,
        DefinitionsError::Unusable(AgentFileError {
            file: folder.path().join("my-agent.yaml"),
            field: Some("json_schema_extra.tools[0]".into()),
            message: "`search` is neither a built-in (action, display_widget, update_widget) nor a tool of the host's registry (the registry is empty); a command tool needs a description and a command".into(),
        })
    );
}

#[tokio::test]
async fn include_and_exclude_narrow_the_tools() {
    let folder = Folder::new("filters");
    folder.write(
        "files.yaml",
        "type: object\ndescription: You manage files.\njson_schema_extra:\n  kind: agent\n  name: files\n  tools:\n    - name: search\n    - name: fs_read\n    - name: fs_write\n    - name: action\n  include_tools: [\"fs_*\", search]\n  exclude_tools: [fs_write]\n",
    );
    let spec = Definitions::load_dir(folder.path())
        .unwrap()
        .with_tools(registry())
        .spec("files", None)
        .unwrap();
    assert_eq!(names(&spec.settings.code.tools), ["search", "fs_read"]);
}

#[test]
fn versions_are_kept_apart_and_the_latest_is_the_default() {
    let folder = Folder::new("versions");
    let agent = |version: &str, prompt: &str| {
        format!(
            "type: object\ndescription: {prompt}\njson_schema_extra: {{kind: agent, name: helper, version: \"{version}\"}}\n"
        )
    };
    folder.write("a.yaml", &agent("1.9.0", "Old."));
    folder.write(
        "b.json",
        &json!({
            "type": "object",
            "description": "New.",
            "json_schema_extra": {"kind": "agent", "name": "helper", "version": "1.10.0"},
        })
        .to_string(),
    );
    folder.write("notes.txt", "not an agent");
    let definitions = Definitions::load_dir(folder.path()).unwrap();
    assert_eq!(
        definitions.get("helper", None).unwrap().patch.system_prompt,
        Some("New.".into())
    );
    assert_eq!(
        definitions
            .get("helper", Some("1.9.0"))
            .unwrap()
            .patch
            .system_prompt,
        Some("Old.".into())
    );
    assert!(definitions.get("helper", Some("2.0.0")).is_none());
    assert_eq!(definitions.iter().count(), 2);

    folder.write("c.yaml", &agent("1.9.0", "Again."));
    assert_eq!(
        Definitions::load_dir(folder.path()).unwrap_err(),
        DefinitionsError::Duplicate {
            name: "helper".into(),
            version: Some("1.9.0".into()),
            first: folder.path().join("a.yaml"),
            second: folder.path().join("c.yaml"),
        }
    );
    assert_eq!(
        Definitions::new()
            .spec("helper", None)
            .unwrap_err()
            .to_string(),
        "no agent definition `helper`"
    );
}

#[test]
fn every_bad_file_is_reported_with_its_field() {
    let folder = Folder::new("bad");
    folder.write("good.yaml", SAMPLE);
    folder.write(
        "one.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: one, top_p: 0.2}\n",
    );
    folder.write(
        "two.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: two, tools: [{name: search, types: {}}]}\n",
    );
    let error = Definitions::load_dir(folder.path()).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{one}: json_schema_extra.top_p: unknown field `top_p`, expected one of kind, name, version, model, api_key_env, llm, thinking, thinking_budgets, temperature, max_tokens, context_window, structured_output, max_turns, tool_choice, tool_choice_after_tools, tools, include_tools, exclude_tools, mcp_servers, approvals, max_asks_per_tool, answers, compaction, extra_body, compression, memory, triggers, budget, guardrails at line 3, column 45\n{two}: json_schema_extra.tools[0].types: only the built-in `action` tool takes `types`",
            one = folder.path().join("one.yaml").display(),
            two = folder.path().join("two.yaml").display(),
        )
    );
    assert!(matches!(
        Definitions::load_dir(folder.path().join("absent")),
        Err(DefinitionsError::Folder { .. })
    ));
}

/// A named LLM configuration's `default_system_prompt` instructs the agents that
/// have no instructions of their own; its thinking budgets and extra body keys
/// reach the request options, the file's own keys layered over its.
#[test]
fn an_llm_configurations_house_prompt_budgets_and_extra_keys_reach_the_agent() {
    let folder = Folder::new("house-llms");
    folder.write(
        "llms.yaml",
        "house:\n  provider: faux\n  default_system_prompt: Answer in one sentence.\n  thinking_budgets: {low: 4000}\n  extra_body: {top_k: 40, min_p: 0.05}\n",
    );
    let llms = LlmConfigs::load(folder.path().join("llms.yaml")).unwrap();
    let agents = Folder::new("house-agents");
    agents.write(
        "quiet.yaml",
        "type: object\ndescription: \"\"\njson_schema_extra: {kind: agent, name: quiet, llm: house, extra_body: {min_p: 0.1}}\n",
    );
    agents.write(
        "own.yaml",
        "type: object\ndescription: You write haiku.\njson_schema_extra: {kind: agent, name: own, llm: house, thinking_budgets: {low: 5000}}\n",
    );
    let definitions = Definitions::load_dir(agents.path())
        .unwrap()
        .with_llms(llms);

    let quiet = definitions.spec("quiet", None).unwrap().settings;
    let quiet = &quiet.definition;
    assert_eq!(
        quiet.system_prompt.as_deref(),
        Some("Answer in one sentence.")
    );
    assert_eq!(quiet.run.stream.thinking_budgets.low, 4000);
    assert_eq!(
        serde_json::Value::Object(quiet.run.stream.extra_body.clone()),
        json!({"top_k": 40, "min_p": 0.1})
    );

    let own = definitions.spec("own", None).unwrap().settings;
    let own = &own.definition;
    assert_eq!(own.system_prompt.as_deref(), Some("You write haiku."));
    assert_eq!(own.run.stream.thinking_budgets.low, 5000);
}

#[test]
fn a_files_memory_gives_its_agents_the_tools_and_needs_the_store() {
    let agents = Folder::new("memory-agents");
    agents.write(
        "keeper.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: keeper, memory: {}}\n",
    );
    agents.write(
        "facts.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: facts, memory: {working: false, recall_limit: 3, embeddings: {provider: llamacpp, model: nomic, base_url: 'http://127.0.0.1:8081/v1'}}}\n",
    );
    let definitions = Definitions::load_dir(agents.path()).unwrap();
    let error = definitions.spec("keeper", None).unwrap_err().to_string();
    assert!(
        error.contains("json_schema_extra.memory: memory is kept in the session store"),
        "{error}"
    );
    let store: Arc<dyn tiller::store::SessionStore> = Arc::new(tiller::store::MemoryStore::new());
    let definitions = definitions.with_session_store(store);
    let keeper = definitions.spec("keeper", None).unwrap().settings;
    assert_eq!(
        names(&keeper.code.tools),
        ["update_working_memory", "remember", "recall"]
    );
    assert!(keeper.code.hooks.instructions.is_some());
    assert!(
        keeper.definition.tools.is_empty(),
        "the session does not store them"
    );
    let facts = definitions.spec("facts", None).unwrap().settings;
    assert_eq!(names(&facts.code.tools), ["remember", "recall"]);
    assert!(facts.code.hooks.instructions.is_none());

    for (memory, expected) in [
        (
            "{recall_limit: 0}",
            "json_schema_extra.memory: recall_limit must be from 1 to 50, not 0",
        ),
        (
            "{working: false, facts: false}",
            "json_schema_extra.memory: neither `working` nor `facts`: nothing to remember",
        ),
        (
            "{keep: 3}",
            "json_schema_extra.memory.keep: unknown field `keep`",
        ),
        (
            "{embeddings: {provider: llamacpp, model: nomic}}",
            "json_schema_extra.memory: embeddings.provider `llamacpp` is not openai, gemini or bedrock: give the OpenAI-compatible server's base_url",
        ),
        (
            "{embeddings: {provider: openai, model: text-embedding-3-small, dimensions: 0}}",
            "json_schema_extra.memory: embeddings.dimensions must be from 1 to 8192, not 0",
        ),
        (
            "{embeddings: {provider: openai}}",
            "json_schema_extra.memory.embeddings: missing field `model`",
        ),
    ] {
        let bad = Folder::new("memory-bad");
        bad.write(
            "one.yaml",
            &format!("type: object\ndescription: x\njson_schema_extra: {{kind: agent, name: one, memory: {memory}}}\n"),
        );
        let error = Definitions::load_dir(bad.path()).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }
}

#[test]
fn a_files_compaction_policy_and_context_window_reach_the_agent() {
    let folder = Folder::new("compaction-llms");
    folder.write("llms.yaml", "cheap:\n  provider: faux\n");
    let llms = LlmConfigs::load(folder.path().join("llms.yaml")).unwrap();
    let agents = Folder::new("compaction-agents");
    agents.write(
        "long.yaml",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: long\n  llm: cheap\n  context_window: 2048\n  compaction: {reserve_tokens: 512, keep_recent_tokens: 256, llm: cheap}\n",
    );
    agents.write(
        "plain.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: plain, compaction: {enabled: false}}\n",
    );
    agents.write(
        "lost.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: lost, compaction: {llm: remote}}\n",
    );
    let definitions = Definitions::load_dir(agents.path())
        .unwrap()
        .with_llms(llms);

    let long = definitions.spec("long", None).unwrap().settings;
    assert_eq!(
        long.definition.run.compaction,
        CompactionPolicy {
            reserve_tokens: 512,
            keep_recent_tokens: 256,
            llm: Some("cheap".into()),
            ..CompactionPolicy::default()
        }
    );
    assert_eq!(long.definition.model.as_ref().unwrap().context_window, 2048);
    // The named configuration writes the summaries.
    assert!(long.code.hooks.summarize.is_some());

    let plain = definitions.spec("plain", None).unwrap().settings;
    assert!(!plain.definition.run.compaction.enabled);
    assert!(plain.code.hooks.summarize.is_none());

    let lost = definitions.spec("lost", None).unwrap_err().to_string();
    assert!(
        lost.contains("json_schema_extra.compaction.llm: ") && lost.contains("remote"),
        "{lost}"
    );

    let bad = Folder::new("compaction-bad");
    bad.write(
        "one.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: one, compaction: {keep: 3}}\n",
    );
    let error = Definitions::load_dir(bad.path()).unwrap_err().to_string();
    assert!(
        error.contains("json_schema_extra.compaction.keep: unknown field `keep`"),
        "{error}"
    );
}

#[tokio::test]
async fn a_file_names_an_llm_configuration_and_overrides_its_fields() {
    let folder = Folder::new("llms");
    folder.write(
        "llms.yaml",
        "local:\n  base_url: \"http://127.0.0.1:9/v1\"\n  model: smollm2\n  temperature: 0.7\n  max_tokens: 512\nscripted:\n  provider: faux\n  thinking: low\n",
    );
    let llms = LlmConfigs::load(folder.path().join("llms.yaml")).unwrap();
    let agents = Folder::new("llm-agents");
    agents.write(
        "careful.yaml",
        "type: object\ndescription: You are careful.\njson_schema_extra: {kind: agent, name: careful, llm: local, temperature: 0.1}\n",
    );
    agents.write(
        "scripted.yaml",
        "type: object\ndescription: You are scripted.\njson_schema_extra: {kind: agent, name: scripted, llm: scripted, max_tokens: 64}\n",
    );
    agents.write(
        "lost.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: lost, llm: remote}\n",
    );
    let definitions = Definitions::load_dir(agents.path())
        .unwrap()
        .with_llms(llms);

    let careful = definitions.spec("careful", None).unwrap().settings;
    assert_eq!(
        DefinitionPatch::of(&careful.definition),
        DefinitionPatch {
            provider: Some("openai-compatible".into()),
            model: Some("smollm2".into()),
            base_url: Some("http://127.0.0.1:9/v1".into()),
            temperature: Some(0.1),
            max_tokens: Some(512),
            thinking: Some(ThinkingLevel::Off),
            ..DefinitionPatch::default()
        }
    );

    // The resolved configuration is in the agent's state.
    let scripted = definitions.spec("scripted", None).unwrap();
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor.spawn(scripted).await.unwrap();
    let state = agent.state().await.unwrap();
    assert_eq!(
        DefinitionPatch::of(&state.definition),
        DefinitionPatch {
            provider: Some("faux".into()),
            model: Some("faux".into()),
            base_url: Some("faux://local".into()),
            max_tokens: Some(64),
            thinking: Some(ThinkingLevel::Low),
            ..DefinitionPatch::default()
        }
    );
    supervisor.shutdown().await;

    assert_eq!(
        definitions.spec("lost", None).unwrap_err().to_string(),
        format!(
            "{}: json_schema_extra.llm: no LLM configuration `remote` (known: local, scripted)",
            agents.path().join("lost.yaml").display()
        )
    );
}

#[tokio::test]
async fn a_files_fallbacks_budget_and_guardrails_reach_the_agent_and_trip_its_run() {
    let folder = Folder::new("guarded-llms");
    folder.write(
        "llms.yaml",
        "tiered:\n  model: [openai/gpt-4o-mini, anthropic/claude-3-5-haiku-latest]\n  budget: {run: {model_calls: 5}}\n",
    );
    let llms = LlmConfigs::load(folder.path().join("llms.yaml")).unwrap();
    let agents = Folder::new("guarded-agents");
    agents.write(
        "tiered.yaml",
        "type: object\ndescription: \"\"\njson_schema_extra: {kind: agent, name: tiered, llm: tiered}\n",
    );
    agents.write(
        "support.yaml",
        r#"type: object
description: You answer support questions.
json_schema_extra:
  kind: agent
  name: support
  budget: {run: {total_tokens: 50000, tool_calls: 10}, agent: {cost_usd: 2.5}}
  guardrails: {input: [no_secrets, judge], output: [judge]}
"#,
    );
    agents.write(
        "judge.yaml",
        "type: object\ndescription: You decide whether a text is about support.\njson_schema_extra: {kind: agent, name: judge}\n",
    );
    agents.write(
        "broken.yaml",
        "type: object\ndescription: \"\"\njson_schema_extra: {kind: agent, name: broken, guardrails: {output: [nobody]}}\n",
    );
    let faux = FauxProvider::new();
    let no_secrets = tiller::run::Guardrail::new("no_secrets", |input| async move {
        Ok(if input.text.contains("password") {
            tiller::run::Verdict::Fail {
                reason: "a password".into(),
            }
        } else {
            tiller::run::Verdict::Pass
        })
    });
    let definitions = Definitions::load_dir(agents.path())
        .unwrap()
        .with_llms(llms)
        .with_default_model(faux.model())
        .with_guardrail(no_secrets);

    // The configuration's list: its model, then its fallbacks; its name is the
    // rate-limit account.
    let tiered = definitions.spec("tiered", None).unwrap().settings;
    let tiered = &tiered.definition;
    assert_eq!(tiered.model.as_ref().unwrap().id, "gpt-4o-mini");
    let fallbacks: Vec<_> = tiered
        .fallbacks
        .iter()
        .map(|m| m.provider.as_str())
        .collect();
    assert_eq!(fallbacks, ["anthropic"]);
    assert_eq!(tiered.run.budget.run.model_calls, Some(5));
    assert_eq!(tiered.run.stream.account.as_deref(), Some("tiered"));

    let support = definitions.spec("support", None).unwrap();
    let budget = support.settings.definition.run.budget;
    assert_eq!(
        (
            budget.run.total_tokens,
            budget.run.tool_calls,
            budget.agent.cost_usd
        ),
        (Some(50_000), Some(10), Some(2.5))
    );
    let guardrails = &support.settings.code.hooks.guardrails;
    let input: Vec<_> = guardrails.input.iter().map(|g| g.name()).collect();
    assert_eq!(input, ["no_secrets", "judge"]);

    let error = definitions.spec("broken", None).unwrap_err().to_string();
    assert!(
        error.ends_with(
            "broken.yaml: json_schema_extra.guardrails.output[0]: no guardrail or agent definition is named `nobody`"
        ),
        "{error}"
    );

    // The judge passes the question, the agent answers, the judge fails the answer.
    let supervisor = Supervisor::start().await.unwrap();
    let agent = supervisor.spawn(support).await.unwrap();
    faux.push(FauxTurn::text(
        r#"{"pass": true, "reason": "a support question"}"#,
    ));
    faux.push(FauxTurn::text("Try turning it off and on again."));
    faux.push(FauxTurn::text(r#"{"pass": false, "reason": "too glib"}"#));
    let outcome = agent.run("My router is down.").await.unwrap();
    assert_eq!(outcome.end, tiller::RunEnd::GuardrailTripped);
    let tripped = outcome.guardrail_tripped.unwrap();
    assert_eq!(
        (
            tripped.stage,
            tripped.guardrail.as_str(),
            tripped.reason.as_str()
        ),
        (tiller::run::GuardrailStage::Output, "judge", "too glib")
    );
    // The input checks run together; the first failure in list order is the one
    // reported, and the agent's model is never asked.
    faux.push(FauxTurn::text(r#"{"pass": true, "reason": "fine by me"}"#));
    let outcome = agent.run("The password is hunter2.").await.unwrap();
    assert_eq!(outcome.end, tiller::RunEnd::GuardrailTripped);
    assert_eq!(outcome.guardrail_tripped.unwrap().guardrail, "no_secrets");
    assert_eq!(faux.requests().len(), 4);
    assert_eq!(faux.remaining(), 0);
}
