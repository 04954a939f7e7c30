//! Tiller's MCP client against MCP servers no one here wrote, from the npm registry
//! (`scripts/mcp.sh install`): the reference filesystem server over stdio, and the
//! reference "everything" server over stdio and over streamable HTTP; and servers
//! built with the official Python SDK (PyPI `mcp`): one whose tools change, one
//! that reads its environment, floods its stderr and dawdles. Skipped with one
//! line when they are missing, unless `TILLER_LIVE=required`.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_core::{AgentTool, ToolContext, ToolOutput};
use tiller_mcp::{McpClient, McpServer};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

/// The folder holding the servers' commands, if installed.
fn servers(test: &str) -> Option<PathBuf> {
    tiller_test_support::live::installed("mcp.sh", "bin", test)
}

/// A fresh folder under the system's temporary one, removed when dropped.
struct Folder(PathBuf);

impl Folder {
    fn new(name: &str) -> Folder {
        let path = std::env::temp_dir().join(format!("tiller-mcp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        // The server resolves links: compare with the folder as it sees it.
        Folder(path.canonicalize().unwrap())
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

fn tool(client: &McpClient, name: &str) -> Arc<dyn AgentTool> {
    client
        .tools()
        .into_iter()
        .find(|tool| tool.name() == name)
        .unwrap_or_else(|| panic!("no tool {name}"))
}

/// Calls `tool` with `args` outside a loop; its progress updates are collected.
async fn call(
    tool: &Arc<dyn AgentTool>,
    args: Value,
) -> (Result<ToolOutput, String>, Vec<ToolOutput>) {
    let updates = Arc::new(Mutex::new(Vec::new()));
    let seen = updates.clone();
    let ctx = ToolContext::detached("call-1", CancellationToken::new(), move |update| {
        seen.lock().unwrap().push(update);
    });
    let result = tool
        .execute(args, ctx)
        .await
        .map_err(|error| error.message().to_owned());
    let updates = updates.lock().unwrap().clone();
    (result, updates)
}

#[tokio::test]
async fn the_filesystem_servers_tools_read_files_and_excluded_ones_are_not_offered() {
    let Some(bin) = servers("the MCP filesystem server test") else {
        return;
    };
    let folder = Folder::new("fs");
    std::fs::write(folder.path().join("notes.txt"), "The meeting is at 10.").unwrap();
    let server = McpServer::stdio(
        "fs",
        bin.join("mcp-server-filesystem").to_str().unwrap(),
        [folder.path().to_str().unwrap()],
    )
    .excluding(["write_*", "edit_file", "move_file", "create_directory"]);
    let client = McpClient::connect(server).await.unwrap();

    let mut names: Vec<String> = client
        .tools()
        .iter()
        .map(|tool| tool.name().to_owned())
        .collect();
    names.sort();
    assert!(names.contains(&"fs_read_text_file".to_owned()), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|name| name.contains("write") || name == "fs_edit_file" || name == "fs_move_file"),
        "{names:?}"
    );
    let read = tool(&client, "fs_read_text_file");
    assert_eq!(read.parameters()["type"], "object");

    let path = folder.path().join("notes.txt");
    let (output, _) = call(&read, json!({"path": path})).await;
    assert_eq!(output.unwrap().text_content(), "The meeting is at 10.");
    // Outside its folder: the server's error result is the tool's error.
    let (refused, _) = call(&read, json!({"path": "/etc/hostname"})).await;
    let refused = refused.unwrap_err();
    assert!(
        refused.contains("denied") || refused.contains("outside"),
        "{refused}"
    );
    client.close();
}

#[tokio::test]
async fn a_killed_server_is_reported_then_reconnected_to() {
    let Some(bin) = servers("the MCP reconnection test") else {
        return;
    };
    let server = McpServer::stdio(
        "every",
        bin.join("mcp-server-everything").to_str().unwrap(),
        ["stdio"],
    )
    .with_prefix("")
    .including(["echo"])
    .with_reconnect_delays(Duration::from_millis(300), Duration::from_millis(600));
    let client = McpClient::connect(server).await.unwrap();
    let echo = tool(&client, "echo");
    let (said, _) = call(&echo, json!({"message": "first"})).await;
    assert_eq!(said.unwrap().text_content(), "Echo: first");

    let first = client.process_id().unwrap();
    let changed = client.changed();
    std::process::Command::new("kill")
        .args(["-9", &first.to_string()])
        .status()
        .unwrap();
    changed.await;
    // Gone (the first reconnection waits 300 ms): a call says so.
    assert!(!client.is_connected());
    let (refused, _) = call(&echo, json!({"message": "meanwhile"})).await;
    let refused = refused.unwrap_err();
    assert!(refused.contains("not connected"), "{refused}");
    while !client.is_connected() {
        client.changed().await;
    }
    assert_ne!(client.process_id(), Some(first));
    let (said, _) = call(&echo, json!({"message": "again"})).await;
    assert_eq!(said.unwrap().text_content(), "Echo: again");
    client.close();
}

/// `mcp-server-everything streamableHttp` on a free port, until dropped.
struct HttpServer {
    _child: tokio::process::Child,
    url: String,
}

impl HttpServer {
    async fn start(bin: &Path) -> HttpServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = tokio::process::Command::new(bin.join("mcp-server-everything"))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("listening on port") {
                    return;
                }
            }
            panic!("the server ended before listening");
        })
        .await
        .expect("the server did not start listening");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HttpServer {
            _child: child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

#[tokio::test]
async fn over_streamable_http_calls_report_progress_and_return_images() {
    let Some(bin) = servers("the MCP streamable HTTP test") else {
        return;
    };
    let server = HttpServer::start(&bin).await;
    let client = McpClient::connect(
        McpServer::http("every", &server.url)
            .with_header("x-tiller-test", "1")
            .including([
                "get-sum",
                "get-tiny-image",
                "trigger-long-running-operation",
            ]),
    )
    .await
    .unwrap();
    let mut names: Vec<String> = client
        .tools()
        .iter()
        .map(|tool| tool.name().to_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "every_get-sum",
            "every_get-tiny-image",
            "every_trigger-long-running-operation"
        ]
    );

    let (sum, _) = call(&tool(&client, "every_get-sum"), json!({"a": 2, "b": 3})).await;
    assert!(sum.unwrap().text_content().contains('5'));

    let (image, _) = call(&tool(&client, "every_get-tiny-image"), json!({})).await;
    let image = image.unwrap();
    let png = image.content.iter().find_map(|content| match content {
        tiller_ai::Content::Image(image) => Some(image.mime_type.clone()),
        _ => None,
    });
    assert_eq!(png.as_deref(), Some("image/png"));

    let (done, updates) = call(
        &tool(&client, "every_trigger-long-running-operation"),
        json!({"duration": 0.3, "steps": 3}),
    )
    .await;
    assert!(done.unwrap().text_content().contains("completed"));
    let progress: Vec<(Value, Value)> = updates
        .iter()
        .map(|update| {
            (
                update.details["progress"].clone(),
                update.details["total"].clone(),
            )
        })
        .collect();
    assert_eq!(
        progress,
        [
            (json!(1.0), json!(3.0)),
            (json!(2.0), json!(3.0)),
            (json!(3.0), json!(3.0))
        ]
    );

    // An aborted run's call ends at once (the server is sent MCP's cancellation).
    let long = tool(&client, "every_trigger-long-running-operation");
    let cancel = CancellationToken::new();
    let abort = cancel.clone();
    let ctx = ToolContext::detached("call-2", cancel, move |_| abort.cancel());
    let cancelled = long
        .execute(json!({"duration": 60, "steps": 600}), ctx)
        .await
        .map_err(|error| error.message().to_owned());
    assert_eq!(cancelled.unwrap_err(), "cancelled");
    client.close();
}

#[tokio::test]
async fn a_server_that_cannot_start_or_answer_is_a_typed_error() {
    let missing = McpClient::connect(McpServer::stdio(
        "ghost",
        "/nonexistent/tiller-mcp-server",
        Vec::<String>::new(),
    ))
    .await
    .err()
    .unwrap();
    assert!(
        matches!(&missing, tiller_mcp::McpError::Spawn { server, .. } if server == "ghost"),
        "{missing:?}"
    );
    // A program that never speaks MCP: the handshake's bound.
    let silent = McpClient::connect(
        McpServer::stdio("silent", "sleep", ["30"])
            .with_connect_timeout(Duration::from_millis(200)),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(
        silent,
        tiller_mcp::McpError::Timeout {
            server: "silent".to_owned(),
            after: Duration::from_millis(200)
        }
    );
    // A program that fails before it answers: its error says what it wrote.
    let failing = McpClient::connect(McpServer::stdio(
        "failing",
        "sh",
        [
            "-c",
            "echo starting >&2; echo 'no config at ./mcp.json' >&2; exit 3",
        ],
    ))
    .await
    .err()
    .unwrap();
    let tiller_mcp::McpError::Connect { server, detail } = &failing else {
        panic!("{failing:?}");
    };
    assert_eq!(server, "failing");
    assert!(
        detail.ends_with("; the end of its stderr:\nstarting\nno config at ./mcp.json"),
        "{detail}"
    );
}

#[tokio::test]
async fn a_server_that_says_its_tools_changed_is_listed_again() {
    let Some(python) =
        tiller_test_support::live::installed("mcp.sh", "python", "the MCP tool list test")
    else {
        return;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/servers/growing.py");
    let client = McpClient::connect(
        McpServer::stdio("grow", python.to_str().unwrap(), [script.to_str().unwrap()])
            .with_prefix(""),
    )
    .await
    .unwrap();
    let names = |client: &McpClient| {
        let mut names: Vec<String> = client
            .tools()
            .iter()
            .map(|tool| tool.name().to_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&client), ["unlock"]);
    let changed = client.changed();
    let (unlocked, _) = call(&tool(&client, "unlock"), json!({})).await;
    assert!(unlocked.unwrap().text_content().contains("unlocked"));
    // Bounded so that a notification never seen fails the test rather than hanging it.
    tokio::time::timeout(Duration::from_secs(60), changed)
        .await
        .expect("the tool list was never read again");
    assert_eq!(names(&client), ["secret", "unlock"]);
    let (secret, _) = call(&tool(&client, "secret"), json!({})).await;
    assert!(secret.unwrap().text_content().contains("42"));
    client.close();
}

/// The unruly Python server (`tests/servers/unruly.py`), if Python's MCP SDK is
/// installed, configured by `configure`.
async fn unruly(test: &str, configure: impl FnOnce(McpServer) -> McpServer) -> Option<McpClient> {
    let python = tiller_test_support::live::installed("mcp.sh", "python", test)?;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/servers/unruly.py");
    let server = McpServer::stdio(
        "unruly",
        python.to_str().unwrap(),
        [script.to_str().unwrap()],
    )
    .with_prefix("");
    Some(McpClient::connect(configure(server)).await.unwrap())
}

/// A stdio server starts with the clean environment command tools get (PATH,
/// HOME, LANG), plus the variables it is given or is passed by name; nothing else
/// of Tiller's (provider keys live there).
#[tokio::test]
async fn a_stdio_server_gets_a_clean_environment_and_what_it_is_passed() {
    // Cargo sets it for every test process.
    let Ok(manifest) = std::env::var("CARGO_MANIFEST_DIR") else {
        panic!("cargo sets CARGO_MANIFEST_DIR");
    };
    let Some(client) = unruly("the MCP environment test", |server| {
        server.with_env("GREETING", "hello")
    })
    .await
    else {
        return;
    };
    let variable = tool(&client, "variable");
    for (name, expected) in [
        ("CARGO_MANIFEST_DIR", "<unset>"),
        ("GREETING", "hello"),
        ("PATH", std::env::var("PATH").unwrap().as_str()),
    ] {
        let (value, _) = call(&variable, json!({"name": name})).await;
        assert_eq!(value.unwrap().text_content(), expected, "{name}");
    }
    client.close();

    let Some(passing) = unruly("the MCP environment test", |server| {
        server.passing_env("CARGO_MANIFEST_DIR")
    })
    .await
    else {
        return;
    };
    let (value, _) = call(
        &tool(&passing, "variable"),
        json!({"name": "CARGO_MANIFEST_DIR"}),
    )
    .await;
    assert_eq!(value.unwrap().text_content(), manifest);
    passing.close();
}

/// A server's stderr is read to its end whatever it holds (a line of many MiB,
/// bytes that are not UTF-8), a bounded piece of each line kept: the server
/// never finds its stderr closed, and its calls go on being answered.
#[tokio::test]
async fn a_server_flooding_its_stderr_goes_on_working() {
    let Some(client) = unruly("the MCP stderr test", |server| server).await else {
        return;
    };
    let shout = tool(&client, "shout");
    for _ in 0..2 {
        let (said, _) = call(&shout, json!({"megabytes": 16})).await;
        assert_eq!(said.unwrap().text_content(), "done");
    }
    client.close();
}

/// A call the server does not answer within the call timeout fails with an error
/// that says so, and the server is told to stop it; the next call is answered.
#[tokio::test]
async fn a_call_past_its_timeout_fails_and_the_server_goes_on() {
    let Some(client) = unruly("the MCP call timeout test", |server| {
        server.with_call_timeout(Duration::from_millis(300))
    })
    .await
    else {
        return;
    };
    let dawdle = tool(&client, "dawdle");
    let (late, _) = call(&dawdle, json!({"seconds": 30})).await;
    assert_eq!(
        late.unwrap_err(),
        "MCP server `unruly`: `dawdle` did not answer within 300 ms, and was cancelled"
    );
    let (prompt, _) = call(&dawdle, json!({"seconds": 0})).await;
    assert_eq!(prompt.unwrap().text_content(), "finally");
    client.close();
}

/// The everything server's resources are read through `{prefix}read_resource`
/// (which the exclude list drops like any tool), and its prompts, filled with
/// their arguments, are text a run can take as its instructions.
#[tokio::test]
async fn resources_are_read_through_a_tool_and_prompts_become_text() {
    let Some(bin) = servers("the MCP resources and prompts test") else {
        return;
    };
    let everything = || {
        McpServer::stdio(
            "every",
            bin.join("mcp-server-everything").to_str().unwrap(),
            ["stdio"],
        )
    };
    let client = McpClient::connect(everything().including(["echo", "read_resource"]))
        .await
        .unwrap();
    let names: Vec<String> = client.tools().iter().map(|t| t.name().to_owned()).collect();
    assert_eq!(names, ["every_echo", "every_read_resource"]);
    let resources = client.resources();
    let first = resources
        .first()
        .expect("the everything server offers resources");
    let reader = tool(&client, "every_read_resource");
    assert!(
        reader.description().contains(&first.uri),
        "{}",
        reader.description()
    );
    let (read, _) = call(&reader, json!({"uri": first.uri})).await;
    let text = read.unwrap().text_content();
    assert!(
        text.starts_with(&format!("[resource {}]\n", first.uri))
            && text.len() > first.uri.len() + 12,
        "{text}"
    );
    let (missing, _) = call(&reader, json!({"uri": "demo://no/such/thing"})).await;
    assert!(missing.unwrap_err().contains("could not be read"));

    let names: Vec<String> = client.prompts().into_iter().map(|p| p.name).collect();
    assert!(
        names.iter().any(|n| n == "simple-prompt") && names.iter().any(|n| n == "args-prompt"),
        "{names:?}"
    );
    assert_eq!(
        client
            .prompt("simple-prompt", Default::default())
            .await
            .unwrap(),
        "This is a simple prompt without arguments."
    );
    let city = json!({"city": "Paris"}).as_object().unwrap().clone();
    assert_eq!(
        client.prompt("args-prompt", city).await.unwrap(),
        "What's weather in Paris?"
    );
    assert!(matches!(
        client.prompt("no-such-prompt", Default::default()).await,
        Err(tiller_mcp::McpError::Prompt { .. })
    ));
    client.close();

    let without = McpClient::connect(everything().including(["echo"]))
        .await
        .unwrap();
    assert!(
        without
            .tools()
            .iter()
            .all(|t| t.name() != "every_read_resource")
    );
    without.close();

    // Single resources (by name and by URI) and prompts withheld by name.
    let listed = || async {
        let all = McpClient::connect(everything()).await.unwrap();
        let resources = all.resources();
        all.close();
        resources
    };
    let resources = listed().await;
    let (by_name, by_uri) = (&resources[0], &resources[1]);
    let client = McpClient::connect(everything().excluding_components([
        by_name.name.as_str(),
        by_uri.uri.as_str(),
        "simple-*",
    ]))
    .await
    .unwrap();
    let kept: Vec<String> = client.resources().into_iter().map(|r| r.uri).collect();
    assert_eq!(kept.len(), resources.len() - 2, "{kept:?}");
    assert!(!kept.contains(&by_name.uri) && !kept.contains(&by_uri.uri));
    let reader = tool(&client, "every_read_resource");
    assert!(
        !reader
            .description()
            .contains(&format!("- {} (", by_name.uri))
    );
    for withheld in [&by_name.uri, &by_uri.uri] {
        let (read, _) = call(&reader, json!({"uri": withheld})).await;
        assert_eq!(read.unwrap_err(), format!("`{withheld}` is not offered"));
    }
    let (read, _) = call(&reader, json!({"uri": kept[0]})).await;
    assert!(read.is_ok());
    let names: Vec<String> = client.prompts().into_iter().map(|p| p.name).collect();
    assert!(
        !names.iter().any(|n| n == "simple-prompt") && names.iter().any(|n| n == "args-prompt"),
        "{names:?}"
    );
    assert!(matches!(
        client.prompt("simple-prompt", Default::default()).await,
        Err(tiller_mcp::McpError::Prompt { .. })
    ));
    client.close();
}
