//! Command tools on their own: arguments in on stdin, output back, paths taken from
//! the agent file's folder, and no process left behind when a call is cancelled.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{Scratch, gone, python_tool};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller::agent_file::AgentFile;
use tiller::{AgentTool, ToolContext};
use tiller::{CommandTool, ToolRegistry};
use tokio_util::sync::CancellationToken;

async fn call(tool: &dyn AgentTool, args: Value) -> Result<String, String> {
    let ctx = ToolContext::detached("call_1", CancellationToken::new(), |_| {});
    tool.execute(args, ctx)
        .await
        .map(|output| output.text_content())
        .map_err(|error| error.message().to_owned())
}

#[tokio::test]
async fn programs_and_path_arguments_are_found_from_the_agent_folder() {
    let scratch = Scratch::new();
    scratch.write(
        "tools/add.py",
        &python_tool("print(sys.argv[0], sys.argv[1:], args['a'] + args['b'])"),
    );
    let script = scratch.write("tools/where.sh", "#!/bin/sh\necho \"$0 $1\"\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = scratch.write(
        "agent.yaml",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - {name: add, description: Add, command: [python3, tools/add.py, --verbose]}\n    - {name: where, description: Where, command: [./tools/where.sh, tools/absent.txt]}\n",
    );
    // From another working directory, so nothing resolves by accident.
    std::env::set_current_dir(std::env::temp_dir()).unwrap();
    let file = AgentFile::load(&agent).unwrap();
    let tools = file.tool_set(&ToolRegistry::new()).unwrap();
    let tools: Vec<_> = tools.tools().collect();
    let folder = scratch.path().display();
    assert_eq!(
        call(tools[0].as_ref(), json!({"a": 2, "b": 3})).await,
        Ok(format!("{folder}/tools/add.py ['--verbose'] 5"))
    );
    assert_eq!(
        call(tools[1].as_ref(), json!({})).await,
        Ok(format!("{folder}/tools/where.sh tools/absent.txt")),
        "an argument naming no file of the folder is passed as written"
    );
}

#[tokio::test]
async fn a_program_that_cannot_start_or_that_dies_by_a_signal_is_an_error() {
    let missing = CommandTool::new(
        "missing",
        "Missing",
        json!({"type": "object"}),
        "/nonexistent/tool",
        vec![],
        Duration::from_secs(5),
    );
    assert_eq!(
        call(&missing, json!({})).await,
        Err(
            "could not start `/nonexistent/tool`: No such file or directory (os error 2)"
                .to_owned()
        )
    );
    let killed = CommandTool::new(
        "killed",
        "Killed",
        json!({"type": "object"}),
        "sh",
        vec!["-c".into(), "echo dying >&2; kill -9 $$".into()],
        Duration::from_secs(5),
    );
    assert_eq!(
        call(&killed, json!({})).await,
        Err("`killed` was killed by signal 9; the end of its stderr:\ndying".to_owned())
    );
}

#[tokio::test]
async fn cancelling_a_call_kills_the_program_and_its_children() {
    let scratch = Scratch::new();
    let pids = scratch.path().join("pids");
    let tool = CommandTool::new(
        "spawner",
        "Starts a child and waits",
        json!({"type": "object"}),
        "sh",
        vec![
            "-c".into(),
            format!("sleep 60 & echo $$ $! > {}; wait", pids.display()),
        ],
        Duration::from_secs(60),
    );
    let cancel = CancellationToken::new();
    let ctx = ToolContext::detached("call_1", cancel.clone(), |_| {});
    let running = tokio::spawn(async move { tool.execute(json!({}), ctx).await });
    let started = wait_for_file(&pids).await;
    cancel.cancel();
    let outcome = running.await.unwrap().map_err(|e| e.message().to_owned());
    assert_eq!(
        outcome,
        Err("`spawner` was stopped: the run was aborted and wrote nothing to stderr".to_owned())
    );
    for pid in started.split_whitespace() {
        gone(pid.parse().unwrap()).await;
    }
}

async fn wait_for_file(path: &Path) -> String {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(text) = std::fs::read_to_string(path)
                && text.ends_with('\n')
            {
                return text;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the tool never started")
}

#[tokio::test]
async fn the_example_agent_file_of_the_readme_works() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents/calculator.yaml");
    let file = AgentFile::load(&path).unwrap();
    assert_eq!(
        (file.name.as_str(), file.patch.max_turns),
        ("calculator", Some(8))
    );
    let tools = file.tool_set(&ToolRegistry::new()).unwrap();
    let add = tools.tools().next().unwrap();
    assert_eq!(
        call(add.as_ref(), json!({"a": 1234, "b": 5678})).await,
        Ok("6912".to_owned())
    );
}

#[tokio::test]
async fn a_program_asks_the_user_with_exit_status_75_and_json() {
    let asking = CommandTool::new(
        "remind",
        "Remind",
        json!({"type": "object"}),
        "sh",
        vec![
            "-c".into(),
            r#"echo '{"field": "due", "question": "When?"}'; exit 75"#.into(),
        ],
        Duration::from_secs(5),
    );
    let ctx = ToolContext::detached("call_1", CancellationToken::new(), |_| {});
    let error = asking.execute(json!({}), ctx).await.unwrap_err();
    assert!(
        matches!(&error, tiller::ToolError::NeedsInput { field, question } if field == "due" && question == "When?"),
        "{error:?}"
    );
    // Exit status 75 without the JSON is an ordinary failure.
    let failing = CommandTool::new(
        "remind",
        "Remind",
        json!({"type": "object"}),
        "sh",
        vec!["-c".into(), "echo oops; exit 75".into()],
        Duration::from_secs(5),
    );
    assert_eq!(
        call(&failing, json!({})).await,
        Err("`remind` exited with status 75 and wrote nothing to stderr".to_owned())
    );
}
