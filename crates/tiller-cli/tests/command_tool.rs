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
use tiller::agents::agent_file::AgentFile;
use tiller::agents::{CommandTool, ToolRegistry};
use tiller::{AgentTool, ToolContext};
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
    scratch.write("remind.py", &python_tool("print(sys.argv[0])"));
    let script = scratch.write("tools/where.sh", "#!/bin/sh\necho \"$0 $1\"\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = scratch.write(
        "agent.yaml",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: h\n  tools:\n    - {name: add, description: Add, command: [python3, tools/add.py, --verbose]}\n    - {name: where, description: Where, command: [./tools/where.sh, tools/absent.txt]}\n    - {name: remind, description: Remind, command: [python3, remind.py]}\n",
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
    // A bare name of a file beside the agent file is that file too.
    assert_eq!(
        call(tools[2].as_ref(), json!({})).await,
        Ok(format!("{folder}/remind.py"))
    );
    // A stdio MCP server's program and files are found the same way.
    let reader = scratch.write(
        "reader.yaml",
        "type: object\ndescription: x\njson_schema_extra:\n  kind: agent\n  name: r\n  mcp_servers:\n    - {name: notes, command: [python3, remind.py, --port, ./tools/add.py]}\n",
    );
    assert_eq!(
        AgentFile::load(&reader).unwrap().mcp_servers[0].command,
        [
            "python3".to_owned(),
            format!("{folder}/remind.py"),
            "--port".to_owned(),
            format!("{folder}/tools/add.py")
        ]
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

/// The processes whose command line holds `marker`.
fn running(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
                String::from_utf8_lossy(&line)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .collect()
}

/// The process of each marker, once each has started (at most ten seconds).
async fn started_all(markers: &[&str]) -> Vec<i32> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let pids: Vec<Vec<i32>> = markers.iter().map(|marker| running(marker)).collect();
            if pids.iter().all(|pids| pids.len() == 1) {
                return pids.concat();
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the program's children never started")
}

/// A program that starts a child, and a grandchild in a session of its own
/// (`setsid`, out of the program's process group), then waits: cancelling the
/// call kills all three.
#[tokio::test]
async fn cancelling_a_call_kills_the_program_and_all_it_started() {
    let scratch = Scratch::new();
    let started = scratch.path().join("started");
    // A script, so that only the processes it starts hold the markers.
    let script = scratch.write(
        "spawner.sh",
        &format!(
            "sleep 6061 & setsid sleep 6062 & echo up > {}; wait\n",
            started.display()
        ),
    );
    let tool = CommandTool::new(
        "spawner",
        "Starts a child and a grandchild of its own session, and waits",
        json!({"type": "object"}),
        "sh",
        vec![script.to_str().unwrap().into()],
        Duration::from_secs(60),
    );
    let cancel = CancellationToken::new();
    let ctx = ToolContext::detached("call_1", cancel.clone(), |_| {});
    let running_call = tokio::spawn(async move { tool.execute(json!({}), ctx).await });
    wait_for_file(&started).await;
    let pids = started_all(&["sleep 6061", "sleep 6062"]).await;
    cancel.cancel();
    let outcome = running_call
        .await
        .unwrap()
        .map_err(|e| e.message().to_owned());
    assert_eq!(
        outcome,
        Err("`spawner` was stopped: the run was aborted and wrote nothing to stderr".to_owned())
    );
    for pid in pids {
        gone(pid).await;
    }
}

/// `tiller run` killed with SIGKILL while a command tool runs: the program and
/// the grandchild it started in a session of its own die with it.
#[tokio::test]
async fn a_killed_tiller_takes_the_programs_whole_tree_with_it() {
    let scratch = Scratch::new();
    scratch.write(
        "tools/spawner.sh",
        "sleep 6071 & setsid sleep 6072 & echo up > \"$(dirname \"$0\")/started\"; wait\n",
    );
    let agent = scratch.write(
        "agent.yaml",
        &common::agent_yaml(
            "    - name: spawner\n      description: Starts and waits\n      command: [sh, tools/spawner.sh]\n",
        ),
    );
    let server = tiller_test_support::MockServer::start().await;
    server.push(common::Dialect::OpenAi.tool_call("call_1", "spawner", json!({})));
    let mut child = common::Dialect::OpenAi
        .tiller(&server, "run", &["--agent", agent.to_str().unwrap(), "go"])
        .spawn()
        .unwrap();
    wait_for_file(&scratch.path().join("tools/started")).await;
    let pids = started_all(&["sleep 6071", "sleep 6072"]).await;
    common::kill_hard(child.id().unwrap());
    common::exit_of(&mut child).await;
    for pid in pids {
        gone(pid).await;
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
