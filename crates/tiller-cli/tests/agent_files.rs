//! Agent files: a good one loads as written (YAML and JSON alike); each kind of
//! mistake stops `tiller` with exit status 2 and a message naming the file, the
//! field and what was expected.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Dialect, Scratch, finish, tiller};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller::agents::agent_file::AgentFile;
use tiller::{
    AgentTool,
    agents::ToolRegistry,
    ai::{ThinkingLevel, ToolChoice},
};
use tiller_test_support::MockServer;

const GOOD: &str = r#"type: object
description: |
  You are a helpful assistant.
  Use the tools when they help.
properties:
  answer: {type: string, description: Your response}
required: [answer]
json_schema_extra:
  kind: agent
  name: helper
  version: "1.0.0"
  model: {provider: llamacpp, id: smollm2, base_url: "http://127.0.0.1:8080/v1"}
  thinking: low
  structured_output: true
  max_turns: 20
  tool_choice: {tool: add}
  tool_choice_after_tools: none
  tools:
    - name: add
      description: Add two integers
      parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}, required: [a, b]}
      command: [python3, tools/add.py, --verbose]
      timeout_ms: 10000
    - name: stamp
      description: The time
      command: [./tools/stamp.sh]
"#;

#[test]
fn a_good_file_loads_as_written() {
    let scratch = Scratch::new();
    scratch.write("tools/add.py", "print(5)\n");
    scratch.write("tools/stamp.sh", "#!/bin/sh\ndate\n");
    let path = scratch.write("helper.yaml", GOOD);
    let file = AgentFile::load(&path).unwrap();
    assert_eq!(
        (
            file.name.as_str(),
            file.version.as_deref(),
            file.patch.system_prompt.as_deref(),
            file.patch.thinking.unwrap_or_default(),
            file.structured_output,
            file.patch.max_turns,
            file.patch.tool_choice.clone(),
            file.patch.tool_choice_after_tools.clone(),
        ),
        (
            "helper",
            Some("1.0.0"),
            Some("You are a helpful assistant.\nUse the tools when they help."),
            ThinkingLevel::Low,
            true,
            Some(20),
            Some(ToolChoice::Tool("add".into())),
            Some(ToolChoice::None),
        )
    );
    assert_eq!(
        (
            file.patch.provider.as_deref(),
            file.patch.model.as_deref(),
            file.patch.base_url.as_deref()
        ),
        (
            Some("llamacpp"),
            Some("smollm2"),
            Some("http://127.0.0.1:8080/v1")
        )
    );
    assert_eq!(
        file.output_schema,
        json!({
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "Your response"}},
            "required": ["answer"]
        })
    );
    let tools = file.tool_set(&ToolRegistry::new()).unwrap();
    let tools: Vec<&dyn AgentTool> = tools.tools().map(|t| t.as_ref()).collect();
    assert_eq!(
        tools.iter().map(|t| t.name()).collect::<Vec<_>>(),
        ["add", "stamp"]
    );
    assert_eq!(
        tools[1].parameters(),
        &json!({"type": "object", "properties": {}})
    );

    let json_path = scratch.write(
        "helper.json",
        &serde_json::to_string(&json!({
            "type": "object",
            "description": "You are terse.",
            "json_schema_extra": {
                "kind": "agent",
                "name": "terse",
                "model": "openai/gpt-4o-mini",
                "tools": [{"name": "add", "description": "Add", "command": ["python3", "tools/add.py"]}]
            }
        }))
        .unwrap(),
    );
    let file = AgentFile::load(&json_path).unwrap();
    assert_eq!(
        (
            file.name.as_str(),
            file.patch.system_prompt.as_deref(),
            file.patch.model.as_deref(),
            file.patch.thinking.unwrap_or_default()
        ),
        (
            "terse",
            Some("You are terse."),
            Some("openai/gpt-4o-mini"),
            ThinkingLevel::Off
        )
    );
}

/// Each mistake, the file holding it, and the message `tiller` must print.
const MISTAKES: &[(&str, &str, &str)] = &[
    (
        "unknown top-level key",
        "type: object\ndescription: x\ntemperature: 0.2\njson_schema_extra: {kind: agent, name: h}\n",
        "temperature: unknown field `temperature`, expected one of $schema, type, title, description, properties, required, additionalProperties, json_schema_extra at line 3, column 1",
    ),
    (
        "unknown agent setting",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  top_p: 0.2\n",
        "json_schema_extra.top_p: unknown field `top_p`, expected one of kind, name, version, model, api_key_env, llm, thinking, thinking_budgets, temperature, max_tokens, context_window, structured_output, max_turns, tool_choice, tool_choice_after_tools, tools, include_tools, exclude_tools, mcp_servers, approvals, max_asks_per_tool, answers, compaction, extra_body, compression, memory, triggers, budget, guardrails at line 6, column 3",
    ),
    (
        "unknown tool key",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - name: add\n      description: Add\n      command: [python3]\n      shell: true\n",
        "json_schema_extra.tools[0].shell: unknown field `shell`, expected one of name, label, description, parameters, command, timeout_ms, env, types at line 10, column 7",
    ),
    (
        "wrong type",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - {name: add, description: Add, command: [python3], timeout_ms: ten}\n",
        "json_schema_extra.tools[0].timeout_ms: invalid type: string \"ten\", expected a whole number of at least 1 at line 7, column 57",
    ),
    (
        "zero turns",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, max_turns: 0}\n",
        "json_schema_extra.max_turns: invalid value: integer `0`, expected a whole number of at least 1 at line 3, column 43",
    ),
    (
        "unknown thinking level",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, thinking: extreme}\n",
        "json_schema_extra.thinking: unknown variant `extreme`, expected one of off, minimal, low, medium, high, xhigh at line 3, column 53",
    ),
    (
        "unknown tool choice",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, tool_choice: any}\n",
        "json_schema_extra.tool_choice: unknown variant `any`, expected one of auto, none, required, tool at line 3, column 56",
    ),
    (
        "a tool choice naming no tool of the file",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, tool_choice: {tool: sub}, tools: [{name: add, description: Add, command: [python3]}]}\n",
        "json_schema_extra.tool_choice: `sub` is not one of the agent's tools",
    ),
    (
        "a tool choice without tools",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, tool_choice: required}\n",
        "json_schema_extra.tool_choice: the agent has no tools to choose from",
    ),
    (
        "a choice after tools that follows no forced call",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, tool_choice: auto, tool_choice_after_tools: none, tools: [{name: add, description: Add, command: [python3]}]}\n",
        "json_schema_extra.tool_choice_after_tools: applies only when tool_choice is `required` or {tool: name}",
    ),
    (
        "a tool named alone that is not a built-in",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - name: search\n",
        "json_schema_extra.tools[0]: `search` is neither a built-in (action, display_widget, update_widget) nor a tool of the host's registry (the registry is empty); a command tool needs a description and a command",
    ),
    (
        "a built-in with a command tool's field",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - {name: action, description: Do things}\n",
        "json_schema_extra.tools[0].description: a tool named alone is a built-in or a tool of the host's registry and takes no `description`; a command tool needs a `command`",
    ),
    (
        "a trigger whose session key is not closed",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  triggers:\n    - {on: order.paid, session: \"order-{id\"}\n",
        "json_schema_extra.triggers[0].session: each `{` names a field and is closed by `}`",
    ),
    (
        "a trigger's debounce past an hour",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  triggers:\n    - {on: tick, debounce_ms: 4000000}\n",
        "json_schema_extra.triggers[0].debounce_ms: at most 3600000 (an hour)",
    ),
    (
        "a command tool without a description",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - {name: add, command: [python3]}\n",
        "json_schema_extra.tools[0].description: a command tool needs a description: it is what the model reads",
    ),
    (
        "action types on a command tool",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - {name: add, description: Add, command: [python3], types: {}}\n",
        "json_schema_extra.tools[0].types: only the built-in `action` tool takes `types`",
    ),
    (
        "an action type with an unusable schema",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - {name: action, types: {chart: {type: 12}}}\n",
        "json_schema_extra.tools[0].types: action type `chart`: 12 is not valid under any of the schemas listed in the 'anyOf' keyword",
    ),
    (
        "not an agent",
        "type: object\ndescription: x\njson_schema_extra: {kind: tool, name: h}\n",
        "json_schema_extra.kind: unknown variant `tool`, expected one of agent at line 3, column 27",
    ),
    (
        "not an object schema",
        "type: array\ndescription: x\njson_schema_extra: {kind: agent, name: h}\n",
        "type: unknown variant `array`, expected one of object at line 1, column 7",
    ),
    (
        "missing name",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent}\n",
        "json_schema_extra: missing field `name` at line 3, column 21",
    ),
    (
        "missing description",
        "type: object\njson_schema_extra: {kind: agent, name: h}\n",
        "missing field `description` at line 2, column 1",
    ),
    (
        "empty command",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, tools: [{name: add, description: Add, command: []}]}\n",
        "json_schema_extra.tools[0].command: expected a program and its arguments, found an empty list",
    ),
    (
        "duplicate tool",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - {name: add, description: Add, command: [python3]}\n    - {name: add, description: Add again, command: [python3]}\n",
        "json_schema_extra.tools[1].name: two tools are named `add`",
    ),
    (
        "bad tool name",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, tools: [{name: add numbers, description: Add, command: [python3]}]}\n",
        "json_schema_extra.tools[0].name: tool name `add numbers` is invalid: use 1 to 64 letters, digits, `_` or `-`",
    ),
    (
        "bad parameters",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, tools: [{name: add, description: Add, command: [python3], parameters: {type: string}}]}\n",
        "json_schema_extra.tools[0].parameters: the parameters of tool `add` are not a valid JSON Schema of an object: the schema's `type` must be \"object\"",
    ),
    (
        "unknown model key",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, model: {provider: openai, id: gpt-4o, url: x}}\n",
        "json_schema_extra.model.url: unknown field `url`, expected one of provider, id, base_url at line 3, column 81",
    ),
    (
        "unknown model",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, model: nowhere/x}\n",
        "json_schema_extra.model: unknown model `nowhere/x`: expected `provider/model-id` with a provider among openai, anthropic, gemini, openai-responses, bedrock, openrouter, groq, deepseek, mistral, llamacpp, vllm, ollama",
    ),
    (
        "required but not a property",
        "type: object\ndescription: x\nproperties: {answer: {type: string}}\nrequired: [answer, reason]\njson_schema_extra: {kind: agent, name: h}\n",
        "required[1]: `reason` is not one of the properties",
    ),
    (
        "broken YAML",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h\n",
        "json_schema_extra: unclosed bracket '{' at line 3, column 20",
    ),
];

#[tokio::test]
async fn each_mistake_exits_2_naming_file_field_and_expectation() {
    let scratch = Scratch::new();
    for (index, (mistake, text, message)) in MISTAKES.iter().enumerate() {
        let path = scratch.write(&format!("agent-{index}.yaml"), text);
        let run = finish(tiller(&["run", "--agent", path.to_str().unwrap(), "hi"])).await;
        assert_eq!(
            (run.code(), run.stdout.as_str(), run.stderr.as_str()),
            (
                Some(2),
                "",
                format!("tiller: {}: {message}\n", path.display()).as_str()
            ),
            "{mistake}"
        );
    }
}

#[tokio::test]
async fn a_missing_program_a_missing_file_and_broken_json_exit_2() {
    let scratch = Scratch::new();
    let missing_program = scratch.write(
        "agent.yaml",
        "type: object\ndescription: x\njson_schema_extra: {kind: agent, name: h, tools: [{name: go, description: Go, command: [./tools/go.sh, --fast]}]}\n",
    );
    let broken_json = scratch.write(
        "agent.json",
        r#"{"type": "object", "description": "x", "json_schema_extra": {"kind": "agent", "name": "h",}}"#,
    );
    let nowhere = scratch.path().join("nowhere.yaml");
    let cases = [
        (
            &missing_program,
            format!(
                "json_schema_extra.tools[0].command[0]: no such program: {}",
                scratch.path().join("tools/go.sh").display()
            ),
        ),
        (
            &broken_json,
            "json_schema_extra: trailing comma at line 1 column 91".to_owned(),
        ),
        (
            &nowhere,
            "cannot read the file: No such file or directory (os error 2)".to_owned(),
        ),
    ];
    for (path, message) in cases {
        let run = finish(tiller(&["run", "--agent", path.to_str().unwrap(), "hi"])).await;
        assert_eq!(
            (run.code(), run.stderr),
            (Some(2), format!("tiller: {}: {message}\n", path.display()))
        );
    }
}

/// A file that names another agent file of its folder as its input guardrail:
/// `tiller run --agent` asks that agent first, and ends the run on its refusal
/// without asking the agent's own model.
#[tokio::test]
async fn tiller_run_asks_the_guardrail_agent_its_file_names() {
    let scratch = Scratch::new();
    let guarded = scratch.write(
        "guarded.yaml",
        "type: object\ndescription: You answer support questions.\njson_schema_extra: {kind: agent, name: guarded, guardrails: {input: [judge]}}\n",
    );
    scratch.write(
        "judge.yaml",
        "type: object\ndescription: You decide whether a text is about support.\njson_schema_extra: {kind: agent, name: judge}\n",
    );
    let server = MockServer::start().await;
    server.respond_with(|request| {
        let system = request.body["messages"][0]["content"]
            .as_str()
            .unwrap_or("");
        let asked = Dialect::OpenAi.last_user_text(request);
        if system.starts_with("You decide") {
            let verdict = if asked.contains("password") {
                r#"{"pass": false, "reason": "a password"}"#
            } else {
                r#"{"pass": true, "reason": "a support question"}"#
            };
            Dialect::OpenAi.text(&[verdict])
        } else {
            Dialect::OpenAi.text(&["Restart the router."])
        }
    });
    let run = |prompt: &str| {
        let args = ["--agent", guarded.to_str().unwrap(), prompt];
        finish(Dialect::OpenAi.tiller(&server, "run", &args))
    };

    let refused = run("My password is hunter2.").await;
    assert_eq!(refused.code(), Some(1), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("[the input guardrail `judge` tripped: a password]"),
        "{}",
        refused.stderr
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "the agent's own model was never asked");

    let answered = run("My router is down.").await;
    assert_eq!(answered.code(), Some(0), "{}", answered.stderr);
    assert_eq!(answered.stdout, "Restart the router.\n");
    let asked: Vec<String> = server.requests()[1..]
        .iter()
        .map(|request| {
            let system = request.body["messages"][0]["content"].as_str().unwrap();
            system
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert_eq!(asked, ["You decide", "You answer"]);
}

/// `--user` gives an agent file's `memory` its user: what one run keeps (in the
/// store, without `--session`) the next run, a new process and a new
/// conversation, reads in its instructions; another user does not.
#[tokio::test]
async fn a_files_memory_keeps_a_user_from_one_run_to_the_next() {
    let scratch = Scratch::new();
    let keeper = scratch.write(
        "keeper.yaml",
        "type: object\ndescription: You help.\njson_schema_extra: {kind: agent, name: keeper, memory: {}}\n",
    );
    let store = format!("sqlite://{}", scratch.path().join("tiller.db").display());
    let server = MockServer::start().await;
    let run = |user: &str, prompt: &str| {
        let args = [
            "--agent",
            keeper.to_str().unwrap(),
            "--store",
            &store,
            "--user",
            user,
            prompt,
        ];
        finish(Dialect::OpenAi.tiller(&server, "run", &args))
    };
    server.push(Dialect::OpenAi.tool_call(
        "c1",
        "update_working_memory",
        json!({"document": "Name: Ada"}),
    ));
    server.push(Dialect::OpenAi.text(&["Hello, Ada."]));
    let first = run("ada", "My name is Ada.").await;
    assert_eq!(
        (first.code(), first.stdout.as_str()),
        (Some(0), "Hello, Ada.\n"),
        "{}",
        first.stderr
    );

    server.push(Dialect::OpenAi.text(&["You are Ada."]));
    assert_eq!(run("ada", "Who am I?").await.code(), Some(0));
    server.push(Dialect::OpenAi.text(&["I do not know."]));
    assert_eq!(run("bob", "Who am I?").await.code(), Some(0));
    let memory_of = |index: usize| {
        let system = server.requests()[index].body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let start = system.find("<working_memory>\n").unwrap() + "<working_memory>\n".len();
        let end = system.find("\n</working_memory>").unwrap();
        system[start..end].to_owned()
    };
    assert_eq!(
        [memory_of(0), memory_of(2), memory_of(3)],
        ["(empty)", "Name: Ada", "(empty)"]
    );
}
