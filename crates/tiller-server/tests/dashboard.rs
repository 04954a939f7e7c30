//! The dashboard in a real headless Chromium (Debian's `chromium`, driven over
//! WebDriver by `chromedriver`; `scripts/browser.sh install` installs both): open
//! the page, make an agent on the faux model, prompt it and see the answer stream
//! in, steer it while it works, abort a run, reset; see an agent another
//! client made and prompted join the list, its status live; and answer a run that
//! waits for the user (a call to approve, a tool's question); open an
//! evaluation's report and a run's transcript. And what a page on another
//! site gets from the user's browser: nothing (cross-site requests, WebSocket, DNS
//! rebinding and framing refused). Skipped with one line when the browser is missing,
//! unless `TILLER_LIVE=required`.

#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use std::sync::Arc;
use tiller::agents::agent_file::AgentFile;
use tiller::faux::{FauxProvider, FauxTurn};

use tiller::{
    AgentTool, Definitions, FnTool, Supervisor, ToolError, ToolOutput, agents::ToolRegistry,
    ai::Message,
};
use tiller_server::{Server, ServerConfig};
use tiller_test_support::tools::TOOLED_AGENT_FILE;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const HELPER: &str = "
type: object
description: You help.
json_schema_extra: {kind: agent, name: helper, tools: [{name: display_widget}, {name: update_widget}]}
";

/// How long a step may take to show in the page.
const STEP: Duration = Duration::from_secs(30);

/// A chromedriver and a headless Chromium session through it.
struct Browser {
    client: Client,
    _driver: Child,
}

impl Browser {
    /// Starts one, or says why not (None: skip).
    async fn start() -> Option<Browser> {
        let installed = ["chromium", "chromedriver"].iter().all(|program| {
            std::process::Command::new("which")
                .arg(program)
                .output()
                .is_ok_and(|output| output.status.success())
        });
        if !installed {
            assert!(
                !tiller_test_support::live::live_required(),
                "TILLER_LIVE=required and chromium or chromedriver is missing: run scripts/browser.sh install"
            );
            eprintln!(
                "skipping the dashboard test (no chromium and chromedriver): `scripts/browser.sh install` installs them"
            );
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // It says when it listens.
        let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
        tokio::time::timeout(STEP, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("started successfully") {
                    return;
                }
            }
            panic!("chromedriver ended without starting");
        })
        .await
        .expect("chromedriver did not start");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            // `evil.test` is a page's own name for this machine, as an outside
            // site would have.
            json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--host-resolver-rules=MAP evil.test 127.0.0.1"]}),
        );
        let client = ClientBuilder::native()
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap();
        Some(Browser {
            client,
            _driver: driver,
        })
    }

    /// Waits for the element at `xpath` to be in the page.
    async fn shows(&self, xpath: &str) {
        self.client
            .wait()
            .at_most(STEP)
            .for_element(Locator::XPath(xpath))
            .await
            .unwrap_or_else(|error| panic!("the page never showed {xpath}: {error}"));
    }

    async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    /// Types `text` in the message box and sends it.
    async fn send(&self, text: &str) {
        let input = self.client.find(Locator::Css("#text")).await.unwrap();
        input.send_keys(text).await.unwrap();
        self.click("#send-button").await;
    }
}

/// A server on a free loopback port, until stopped.
struct Served {
    port: u16,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(server: Server) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(listener, async move {
            let _ = stopped.await;
        }));
        Served { port, stop, task }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

const REMINDER: &str = "
type: object
description: You set reminders.
json_schema_extra:
  kind: agent
  name: reminder
  tools: [{name: remind}]
  approvals: {remind: ask}
";

/// A `remind` tool, labelled "Setting a reminder", that asks when, unless told.
fn remind() -> Arc<dyn AgentTool> {
    Arc::new(
        FnTool::new(
        "remind",
        "Set a reminder",
        json!({"type": "object", "properties": {"what": {"type": "string"}, "due": {"type": "string"}}, "required": ["what"]}),
        |args, _ctx| async move {
            match args["due"].as_str() {
                Some(due) => Ok(ToolOutput::text(format!("set for {due}"))),
                None => Err(ToolError::needs_input("due", "When?")),
            }
        },
    )
    .with_label("Setting a reminder"),
    )
}

/// A model whose answer depends on the last thing the user said (or, after a
/// tool, on its result).
fn scripted() -> FauxProvider {
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        if let Some(Message::ToolResult(result)) = request.context.messages.last() {
            match result.tool_name.as_str() {
                "display_widget" => {
                    return FauxTurn::tool_call(
                        "update_widget",
                        json!({"id": "build", "data": {"done": 3}}),
                    );
                }
                "update_widget" => return FauxTurn::text("Progress shown."),
                _ => {}
            }
            let text = result.text_content();
            return match text.split_once("The user answered: ") {
                Some((_, due)) => FauxTurn::tool_call(
                    "remind",
                    json!({"what": "call Juan", "due": due.lines().next().unwrap_or_default()}),
                ),
                None => FauxTurn::text(format!("Reminder {text}.")),
            };
        }
        let said = request.last_user_text().unwrap_or_default();
        if said.contains("show progress") {
            FauxTurn::tool_call(
                "display_widget",
                json!({"id": "build", "kind": "progress", "data": {"done": 1}}),
            )
        } else if said.contains("remind me") {
            FauxTurn::tool_call("remind", json!({"what": "call Juan"}))
        } else if said.contains("wait forever") {
            FauxTurn::text("never finished").delay(Duration::from_secs(3_600))
        } else if said.contains("slowly") {
            FauxTurn::text("a slow answer, ".repeat(10))
                .chunk_size(5)
                .delay(Duration::from_millis(100))
        } else if said.contains("say bye") {
            FauxTurn::text("Bye.")
        } else {
            FauxTurn::text("Hello from the dashboard.").chunk_size(4)
        }
    });
    faux
}

#[tokio::test]
async fn the_dashboard_streams_prompts_steers_aborts_and_resets() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let faux = scripted();
    let mut definitions = Definitions::new()
        .with_tools(ToolRegistry::new().with(remind()))
        .with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("helper.yaml", HELPER).unwrap())
        .unwrap();
    definitions
        .insert(AgentFile::parse("reminder.yaml", REMINDER).unwrap())
        .unwrap();
    let server = Server::new(
        Supervisor::start().await.unwrap(),
        definitions,
        ServerConfig::default(),
    );
    let served = Served::start(server).await;
    let base = served.base();

    browser.client.goto(&base).await.unwrap();
    browser
        .shows("//select[@id='definition']/option[@value='helper']")
        .await;
    browser
        .client
        .find(Locator::Css("#definition option[value='helper']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.click("#create-button").await;
    browser.shows("//ul[@id='agents']/li").await;
    browser
        .shows("//span[@id='status' and normalize-space()='idle']")
        .await;

    // A prompt: the user's line, then the answer streamed in.
    browser.send("hello").await;
    browser
        .shows("//div[@class='user' and normalize-space()='hello']")
        .await;
    browser
        .shows("//div[@class='assistant' and normalize-space()='Hello from the dashboard.']")
        .await;
    browser
        .shows("//span[@id='status' and normalize-space()='idle']")
        .await;

    // Opened again, the conversation can be tried again from its question,
    // edited: a branch of it runs the new one and the page opens it.
    browser.click("#agents li").await;
    browser.shows("//button[@class='retry']").await;
    browser.click(".retry").await;
    let input = browser.client.find(Locator::Css("#text")).await.unwrap();
    assert_eq!(input.prop("value").await.unwrap().as_deref(), Some("hello"));
    input.clear().await.unwrap();
    browser.send("hello again").await;
    browser
        .shows("//div[@class='user' and normalize-space()='hello again']")
        .await;
    browser
        .shows("//div[@class='assistant' and normalize-space()='Hello from the dashboard.']")
        .await;
    browser
        .shows("//div[@id='messages' and count(div[@class='user'])=1]")
        .await;
    browser.shows("//ul[@id='agents' and count(li)=2]").await;

    // A widget shown, then updated in place: one widget, its latest data.
    browser.send("show progress").await;
    browser
        .shows("//div[@class='assistant' and normalize-space()='Progress shown.']")
        .await;
    browser
        .shows(r#"//div[@id='messages' and count(div[@class='widget'])=1]/div[@class='widget' and normalize-space()='progress build: {"done":3}']"#)
        .await;
    // Reopened after another conversation, it shows its widget again, as it stands.
    let open = browser
        .client
        .find(Locator::Css("#agents li.open"))
        .await
        .unwrap()
        .attr("data-id")
        .await
        .unwrap()
        .unwrap();
    browser.click("#agents li:not(.open)").await;
    browser
        .shows(&format!("//*[@id='title' and normalize-space()!='{open}']"))
        .await;
    browser
        .shows("//div[@id='messages' and count(div[@class='widget'])=0]")
        .await;
    browser
        .click(&format!("#agents li[data-id='{open}']"))
        .await;
    browser
        .shows(&format!("//*[@id='title' and normalize-space()='{open}']"))
        .await;
    browser
        .shows(r#"//div[@id='messages' and count(div[@class='widget'])=1]/div[@class='widget' and normalize-space()='progress build: {"done":3}']"#)
        .await;

    // While it works, the same box steers it: its next turn answers the steering.
    browser.send("answer slowly").await;
    browser
        .shows("//span[@id='status' and normalize-space()='running']")
        .await;
    browser.send("now say bye").await;
    browser
        .shows("//div[@class='user' and normalize-space()='now say bye']")
        .await;
    browser
        .shows("//div[@class='assistant' and normalize-space()='Bye.']")
        .await;
    browser
        .shows("//span[@id='status' and normalize-space()='idle']")
        .await;

    // A run that would never end: Abort ends it.
    browser.send("wait forever").await;
    browser
        .shows("//span[@id='status' and normalize-space()='running']")
        .await;
    browser.click("#abort").await;
    browser
        .shows("//span[@id='status' and normalize-space()='idle']")
        .await;

    // Reset empties the conversation, in the page and in the agent.
    browser.click("#reset").await;
    browser.shows("//div[@id='messages' and not(*)]").await;

    // An agent made and prompted by another client joins the list, its status
    // following its run as it goes (from the stream of every agent).
    let http = reqwest::Client::new();
    for (path, body) in [
        (
            "/agents",
            json!({"definition": "helper", "id": "elsewhere"}),
        ),
        ("/agents/elsewhere/prompt", json!({"text": "answer slowly"})),
    ] {
        let response = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
    }
    browser
        .shows("//li[@data-id='elsewhere']/span[@class='status running']")
        .await;
    browser
        .shows("//li[@data-id='elsewhere']/span[@class='status idle']")
        .await;

    // A run that waits for the user: the call to approve, then the tool's question,
    // answered from the same box, then the call to approve again.
    browser
        .client
        .find(Locator::Css("#definition option[value='reminder']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.click("#create-button").await;
    browser
        .shows("//h2/span[@id='status' and normalize-space()='idle']")
        .await;
    browser.send("remind me to call Juan").await;
    browser
        .shows(
            r#"//div[@class='question' and normalize-space()='Run remind({"what":"call Juan"})?']"#,
        )
        .await;
    browser
        .shows("//span[@id='status' and normalize-space()='waiting_for_input']")
        .await;
    browser.click("#approve").await;
    browser
        .shows("//div[@class='question' and normalize-space()='remind asks: When?']")
        .await;
    browser.send("Friday").await;
    browser
        .shows(r#"//div[@class='question' and normalize-space()='Run remind({"due":"Friday","what":"call Juan"})?']"#)
        .await;
    browser.click("#approve").await;
    // The tool's lines show its label.
    browser
        .shows("//div[@class='tool' and normalize-space()='Setting a reminder → set for Friday']")
        .await;
    browser
        .shows("//div[@class='assistant' and normalize-space()='Reminder set for Friday.']")
        .await;
    browser
        .shows("//span[@id='status' and normalize-space()='idle']")
        .await;

    browser.client.close().await.unwrap();
    served.stop().await;
}

/// An evaluation's report opened from a file: a row per case and model, and a
/// run's transcript opened from the store by its button.
#[tokio::test]
async fn the_dashboard_shows_an_evaluation_report_and_opens_a_runs_transcript() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        FauxTurn::text(format!(
            "Echo: {}",
            request.last_user_text().unwrap_or_default()
        ))
    });
    let suite = tiller::eval::Suite::parse(
        "suite.yaml",
        "models: [scripted]\ncases:\n  - {name: kept, input: Hello, expect: [{contains: Hello}]}\n  - {name: missed, input: Bye, expect: [{contains: Hello}]}\n",
    )
    .unwrap();
    let supervisor = Supervisor::start().await.unwrap();
    let report = tiller::eval::Evaluation::new(&suite)
        .with_run("dash")
        .with_model("scripted", faux.model())
        .run(&supervisor)
        .await
        .unwrap();
    let file = std::env::temp_dir().join(format!(
        "tiller-dashboard-report-{}.json",
        std::process::id()
    ));
    std::fs::write(&file, serde_json::to_string(&report).unwrap()).unwrap();
    let server = Server::new(supervisor, Definitions::new(), ServerConfig::default());
    let served = Served::start(server).await;
    let base = served.base();

    browser.client.goto(&base).await.unwrap();
    let input = browser
        .client
        .find(Locator::Css("#report-file"))
        .await
        .unwrap();
    input.send_keys(file.to_str().unwrap()).await.unwrap();
    browser
        .shows(
            "//h2[@id='report-title' and normalize-space()='suite, run dash: 1 of 2 runs passed']",
        )
        .await;
    browser
        .shows("//table[@id='report-table']//tr[td[1]='kept' and td[2]='scripted' and td[3]='1/1']/td/button[@class='run passed']")
        .await;
    let failed = "//tr[td[1]='missed' and td[3]='0/1']/td/button[@class='run failed' and @title='the answer does not contain \"Hello\"']";
    browser.shows(failed).await;
    browser
        .client
        .find(Locator::XPath(failed))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .shows("//h2/span[@id='title' and normalize-space()='eval-dash.missed.scripted.0']")
        .await;
    browser
        .shows("//div[@id='messages' and div[@class='user']='Bye' and div[@class='assistant']='Echo: Bye']")
        .await;
    let send = browser.client.find(Locator::Css("#send")).await.unwrap();
    assert_eq!(send.attr("hidden").await.unwrap().as_deref(), Some("true"));

    browser.client.close().await.unwrap();
    let _ = std::fs::remove_file(&file);
    served.stop().await;
}

/// A page of another site, opened in the user's browser, tries what the security
/// review did against an open server on this machine: a `text/plain` POST that
/// needs no preflight, a WebSocket that prompts an agent, the server reached by
/// the site's own name (DNS rebinding), and the dashboard in a frame of its own
/// (clickjacking). Each is refused.
#[tokio::test]
async fn a_page_of_another_site_cannot_drive_the_open_server() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let faux = FauxProvider::new();
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("helper.yaml", HELPER).unwrap())
        .unwrap();
    let supervisor = Supervisor::start().await.unwrap();
    let server = Server::new(supervisor.clone(), definitions, ServerConfig::default());
    let served = Served::start(server).await;
    let port = served.port;
    let victim = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/agents"))
        .header("content-type", "application/json")
        .body(json!({"definition": "helper", "id": "victim"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(victim.status(), 201);

    // The other site: its page says `done` once every attempt has settled (the
    // socket once it was refused, or once the agent answered through it).
    let page = format!(
        r#"<!doctype html><body><p id="done"></p>
<iframe id="frame" src="http://127.0.0.1:{port}/"></iframe>
<script>
const tiller = "http://127.0.0.1:{port}";
async function attack() {{
  try {{
    await fetch(tiller + "/agents", {{method: "POST", mode: "no-cors",
      headers: {{"content-type": "text/plain"}},
      body: JSON.stringify({{definition: "helper", id: "pwned"}})}});
  }} catch (e) {{}}
  await new Promise((settled) => {{
    const socket = new WebSocket("ws://127.0.0.1:{port}/agents/victim/ws");
    socket.onopen = () => socket.send(JSON.stringify({{type: "prompt", text: "pwned"}}));
    socket.onmessage = () => {{ socket.close(); settled(); }};
    socket.onerror = () => settled();
    socket.onclose = () => settled();
  }});
  document.getElementById("done").textContent = "done";
}}
attack();
</script></body>"#
    );
    let site = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let site_port = site.local_addr().unwrap().port();
    let site_served = tokio::spawn(
        axum::serve(
            site,
            axum::Router::new().route(
                "/",
                axum::routing::get(move || {
                    let page = page.clone();
                    async move { axum::response::Html(page) }
                }),
            ),
        )
        .into_future(),
    );

    browser
        .client
        .goto(&format!("http://evil.test:{site_port}/"))
        .await
        .unwrap();
    browser
        .shows("//p[@id='done' and normalize-space()='done']")
        .await;
    let agents: Vec<String> = supervisor
        .list()
        .into_iter()
        .map(|agent| agent.id.to_string())
        .collect();
    assert_eq!(agents, ["victim"], "the POST made no agent");
    let state = supervisor.get("victim").unwrap().state().await.unwrap();
    assert!(state.messages.is_empty(), "the socket prompted nothing");
    assert!(faux.requests().is_empty());

    // The dashboard in the other site's frame: the browser shows it nothing.
    browser.client.enter_frame(0).await.unwrap();
    assert!(
        browser
            .client
            .find(Locator::Css("#create-button"))
            .await
            .is_err(),
        "the dashboard loaded in another site's frame"
    );
    browser.client.enter_parent_frame().await.unwrap();

    // The server reached by the site's own name for this machine.
    browser
        .client
        .goto(&format!("http://evil.test:{port}/"))
        .await
        .unwrap();
    let refused = browser.client.source().await.unwrap();
    assert!(refused.contains("host-not-allowed"), "{refused}");

    browser.client.close().await.unwrap();
    site_served.abort();
    served.stop().await;
}

/// The chat page of `tests/pages/chat.mjs`, bundled for the browser by the
/// esbuild of `scripts/http-clients.sh` (None: skip).
async fn chat_page() -> Option<String> {
    let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts");
    let found = Command::new(scripts.join("http-clients.sh"))
        .arg("node-modules")
        .output()
        .await
        .unwrap();
    if !found.status.success() {
        assert!(
            !tiller_test_support::live::live_required(),
            "TILLER_LIVE=required and the npm clients are missing: run scripts/http-clients.sh install"
        );
        eprintln!(
            "skipping the chat page test (no @ag-ui/client and esbuild): `scripts/http-clients.sh install` installs them"
        );
        return None;
    }
    let modules = String::from_utf8(found.stdout).unwrap();
    let modules = std::path::Path::new(modules.trim());
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pages/chat.mjs");
    let bundled = Command::new(modules.join(".bin/esbuild"))
        .arg(page)
        .args(["--bundle", "--format=esm", "--log-level=error"])
        // The page's imports are found where the npm clients are.
        .env("NODE_PATH", modules)
        .output()
        .await
        .unwrap();
    assert!(
        bundled.status.success(),
        "esbuild failed: {}",
        String::from_utf8_lossy(&bundled.stderr)
    );
    Some(String::from_utf8(bundled.stdout).unwrap())
}

/// A web app that embeds Tiller's router and serves its own chat page on AG-UI's
/// client, in the browser: the user types, the answer streams into the page, and
/// a call waiting for approval shows as a question.
#[tokio::test]
async fn a_chat_page_on_ag_uis_client_streams_the_answer_and_shows_an_approval() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let Some(script) = chat_page().await else {
        return;
    };
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello from the chat page.").chunk_size(4));
    faux.push(FauxTurn::tool_call("remove", json!({"path": "notes.txt"})));
    let mut definitions = Definitions::new().with_default_model(faux.model());
    definitions
        .insert(AgentFile::parse("tooled.yaml", TOOLED_AGENT_FILE).unwrap())
        .unwrap();
    let server = Server::new(
        Supervisor::start().await.unwrap(),
        definitions,
        ServerConfig::default(),
    );
    let page = r#"<!doctype html><meta charset="utf-8"><title>Chat</title>
<form id="form"><input id="text"><button id="send-button">Send</button></form>
<div id="log"></div><script type="module" src="/chat.js"></script>"#;
    let app = server
        .router()
        .route(
            "/chat",
            axum::routing::get(move || async move { axum::response::Html(page) }),
        )
        .route(
            "/chat.js",
            axum::routing::get(move || {
                let script = script.clone();
                async move { ([("content-type", "text/javascript")], script) }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = tokio::spawn(axum::serve(listener, app).into_future());

    browser.client.goto(&format!("{base}/chat")).await.unwrap();
    browser.shows("//input[@id='text']").await;
    browser.send("hi").await;
    browser
        .shows("//p[@class='answer' and @data-done='true' and normalize-space()='Hello from the chat page.']")
        .await;
    browser.send("Remove notes.txt").await;
    browser
        .shows("//p[@class='approval' and normalize-space()='Approve remove? `remove` waits for approval']")
        .await;
    served.abort();
}
