//! Real LLM servers on this machine, for the end-to-end tests.
//!
//! [`LocalServer::base_url`] gives the address of a running server: the one named by
//! the server's environment variable (`TILLER_LLAMA_SERVER_URL`,
//! `TILLER_LLAMA_CPP_PYTHON_URL`) when it is set, else one started for this test
//! process by `scripts/local-llm.sh start SERVER --owner PID`, which stops it when
//! the process ends.
//!
//! Whether the live stage runs is [`LocalServer::is_available`]: with
//! `TILLER_LIVE=required` (as `.ci/run` sets) every live test runs, installing its
//! server on first use, and a server that cannot be installed or started fails the
//! test. Otherwise a live test runs when its server is named by its variable or
//! installed (`scripts/local-llm.sh install`), and is skipped when not, with one line
//! on stderr saying how to run it, so the suite stays quick on a fresh machine.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Once, OnceLock};

use tiller_ai::Model;

/// The model name both servers serve.
pub const MODEL_ID: &str = "smollm2";

/// A kind of local server `scripts/local-llm.sh` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalServer {
    /// llama.cpp's own `llama-server`: 4 parallel slots, usage chunks, no tool calls
    /// with this model.
    LlamaServer,
    /// llama-cpp-python's server: one request at a time, streams tool calls when the
    /// request names the tool.
    LlamaCppPython,
    /// `llama-server` serving embeddings (`/v1/embeddings`, mean pooling) of the
    /// same model.
    LlamaEmbeddings,
}

impl LocalServer {
    /// The server's name, as the script takes it.
    pub fn name(self) -> &'static str {
        match self {
            LocalServer::LlamaServer => "llama-server",
            LocalServer::LlamaCppPython => "llama-cpp-python",
            LocalServer::LlamaEmbeddings => "llama-embeddings",
        }
    }

    /// The variable that may name an already running server.
    pub fn url_variable(self) -> &'static str {
        match self {
            LocalServer::LlamaServer => "TILLER_LLAMA_SERVER_URL",
            LocalServer::LlamaCppPython => "TILLER_LLAMA_CPP_PYTHON_URL",
            LocalServer::LlamaEmbeddings => "TILLER_LLAMA_EMBEDDINGS_URL",
        }
    }

    /// Whether this server's live tests run here (see the module docs); a test
    /// returns at once when not. The first skip in a test process says so on stderr,
    /// in one line the test harness does not capture.
    pub fn is_available(self) -> bool {
        if live_required() || self.named() {
            return true;
        }
        let installed = self.is_installed();
        if !installed {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                let missing: Vec<&str> = [LocalServer::LlamaServer, LocalServer::LlamaCppPython]
                    .into_iter()
                    .filter(|server| !server.named() && !server.is_installed())
                    .map(LocalServer::name)
                    .collect();
                let _ = writeln!(
                    std::io::stderr(),
                    "skipping the live tests of {} (not installed): `scripts/local-llm.sh install` installs them (about 20 minutes), or set TILLER_LIVE=required to install them on first use",
                    missing.join(" and ")
                );
            });
        }
        installed
    }

    /// Whether `scripts/local-llm.sh` has this server and the model installed; asked
    /// of the script once per server and process.
    fn is_installed(self) -> bool {
        static LLAMA_SERVER: OnceLock<bool> = OnceLock::new();
        static LLAMA_CPP_PYTHON: OnceLock<bool> = OnceLock::new();
        let cell = match self {
            // The same program and model.
            LocalServer::LlamaServer | LocalServer::LlamaEmbeddings => &LLAMA_SERVER,
            LocalServer::LlamaCppPython => &LLAMA_CPP_PYTHON,
        };
        *cell.get_or_init(|| self.ask_installed())
    }

    fn ask_installed(self) -> bool {
        script_says_installed(&script(), &[self.name()])
    }

    /// Whether this server's variable names a running server.
    fn named(self) -> bool {
        std::env::var(self.url_variable()).is_ok_and(|url| !url.trim().is_empty())
    }

    /// The base URL (ending in `/v1`) of a running server of this kind, started on
    /// the first call if no variable names one.
    ///
    /// # Panics
    /// When the server cannot be installed or started; the script's own message
    /// has been printed to stderr.
    pub fn base_url(self) -> String {
        static LLAMA_SERVER: OnceLock<String> = OnceLock::new();
        static LLAMA_CPP_PYTHON: OnceLock<String> = OnceLock::new();
        static LLAMA_EMBEDDINGS: OnceLock<String> = OnceLock::new();
        let cell = match self {
            LocalServer::LlamaServer => &LLAMA_SERVER,
            LocalServer::LlamaCppPython => &LLAMA_CPP_PYTHON,
            LocalServer::LlamaEmbeddings => &LLAMA_EMBEDDINGS,
        };
        cell.get_or_init(|| match std::env::var(self.url_variable()) {
            Ok(url) if !url.trim().is_empty() => url.trim().trim_end_matches('/').to_owned(),
            _ => self.start(),
        })
        .clone()
    }

    /// The served model, as a Tiller model.
    pub fn model(self) -> Model {
        Model::openai_compatible(self.base_url(), MODEL_ID).with_provider(self.name())
    }

    fn start(self) -> String {
        start_with(&script(), &["start", self.name()], "http://")
    }
}

/// Whether `script installed ARGS` says what it installs is there.
pub(crate) fn script_says_installed(script: &Path, args: &[&str]) -> bool {
    Command::new("bash")
        .arg(script)
        .arg("installed")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs `script ARGS --owner PID` (this process's id, so the server stops when it
/// ends) and answers the URL it prints, which must start with `scheme`.
///
/// # Panics
/// When the script fails; its own messages are on stderr.
pub(crate) fn start_with(script: &Path, args: &[&str], scheme: &str) -> String {
    let output = Command::new("bash")
        .arg(script)
        .args(args)
        .arg("--owner")
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|error| panic!("could not run {}: {error}", script.display()));
    let url = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(
        output.status.success() && url.starts_with(scheme),
        "`{} {}` failed ({}); its messages are above",
        script.display(),
        args.join(" "),
        output.status
    );
    url
}

/// Whether `TILLER_LIVE=required` makes the live stage mandatory.
pub fn live_required() -> bool {
    std::env::var("TILLER_LIVE").is_ok_and(|value| value.trim() == "required")
}

/// `scripts/local-llm.sh` of this workspace.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/local-llm.sh")
}

/// What `scripts/SCRIPT WHAT` prints (a path), if the component it names is
/// installed; else `None`, after saying on stderr that `test` is skipped and how to
/// install it, or failing when `TILLER_LIVE=required`.
pub fn installed(script: &str, what: &str, test: &str) -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(script);
    let output = Command::new(&path).arg(what).output().ok();
    let printed = output
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok());
    if printed.is_none() {
        assert!(
            !live_required(),
            "TILLER_LIVE=required and {test} needs what `scripts/{script} install` installs"
        );
        eprintln!("skipping {test} (not installed): `scripts/{script} install` installs it");
    }
    printed.map(|printed| PathBuf::from(printed.trim()))
}
