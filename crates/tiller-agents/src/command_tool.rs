//! Command tools: a tool that is a program.
//!
//! The program runs without a shell, with the call's arguments as one JSON object on
//! its standard input. What it prints on standard output, trimmed, is the result. A
//! non-zero exit, a signal or the timeout make an error result that carries the last
//! lines of its standard error. A program that needs something only the user knows
//! exits with [`NEEDS_INPUT_EXIT`] (75) and prints `{"field": …, "question": …}` on
//! standard output: that is a [`ToolError::NeedsInput`], and the run asks the user.
//! The program runs in a process group of its own, so
//! when the call ends early (timeout, abort, the run dropped) the whole group is
//! killed, children included; on Linux it is killed too when Tiller's process dies,
//! even by `kill -9` ([`tiller_core::process`]).
//!
//! Its environment is [`BASE_ENV`] and the variables the tool names, and
//! `TILLER_CALL_ID`: the call's id, the same whenever the call is seen again (it is
//! stored before the program starts, and survives restarts). A program with an
//! outside effect (an email sent, a card charged) hands it on as an idempotency key,
//! so that a call is never carried out twice. In an evaluation's run
//! ([`tiller_core::AgentContext::is_evaluation`], as `tiller eval` makes them)
//! `TILLER_EVALUATION=1` too, so that a program can leave the world alone.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use crate::{AgentTool, ToolContext, ToolError, ToolOutput};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// How many lines of standard error an error result carries.
const STDERR_LINES: usize = 10;

/// The most bytes of standard output a result keeps, unless the tool says otherwise:
/// half the loop's default limit on a tool result, so the note saying what was cut
/// always fits.
pub const DEFAULT_MAX_OUTPUT: usize = 128 * 1024;

/// The most bytes of the end of standard error kept for an error result.
pub const STDERR_TAIL: usize = 16 * 1024;

/// The exit status with which a program asks the user for input (with
/// `{"field": …, "question": …}` on standard output).
pub const NEEDS_INPUT_EXIT: i32 = 75;

pub use tiller_core::process::BASE_ENV;

/// A tool that runs a program (see the module docs).
#[derive(Debug, Clone)]
pub struct CommandTool {
    name: String,
    label: Option<String>,
    description: String,
    parameters: Value,
    program: PathBuf,
    args: Vec<String>,
    timeout: Duration,
    env: Vec<String>,
    max_output: usize,
}

impl CommandTool {
    /// A tool named `name` that runs `program` with `args`, for at most `timeout`.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        program: impl Into<PathBuf>,
        args: Vec<String>,
        timeout: Duration,
    ) -> Self {
        CommandTool {
            name: name.into(),
            label: None,
            description: description.into(),
            parameters,
            program: program.into(),
            args,
            timeout,
            env: Vec::new(),
            max_output: DEFAULT_MAX_OUTPUT,
        }
    }

    /// Also passes these variables of Tiller's environment to the program.
    pub fn with_env(mut self, names: Vec<String>) -> Self {
        self.env = names;
        self
    }

    /// Shows `label` instead of the name in interfaces (events, the command's tool
    /// lines, the dashboard).
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Keeps at most `bytes` of standard output.
    pub fn with_max_output(mut self, bytes: usize) -> Self {
        self.max_output = bytes;
        self
    }

    async fn run(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let input = serde_json::to_vec(&args)?;
        let mut command = Command::new(&self.program);
        tiller_core::process::clean_env(&mut command, self.env.iter().map(String::as_str));
        // The call's id, stable across restarts: the key to hand an outside system
        // so that a call it has seen is not carried out twice.
        command.env("TILLER_CALL_ID", ctx.call_id());
        if ctx.agent().is_evaluation() {
            command.env("TILLER_EVALUATION", "1");
        }
        command
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        tiller_core::process::contain_tree(&mut command);
        let mut child = command.spawn().map_err(|error| {
            ToolError::new(format!(
                "could not start `{}`: {error}",
                self.program.display()
            ))
        })?;
        let mut group = ProcessGroup(child.id());
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());

        let (mut out, mut err) = (Bounded::head(self.max_output), Bounded::tail(STDERR_TAIL));
        let ended = {
            let feed = async move {
                if let Some(mut stdin) = stdin {
                    // A program that exits without reading its input is not an error.
                    let _ = stdin.write_all(&input).await;
                }
            };
            let read_out = async {
                if let Some(stdout) = stdout {
                    out.read_all(stdout).await;
                }
            };
            let read_err = async {
                if let Some(stderr) = stderr {
                    err.read_all(stderr).await;
                }
            };
            let finished = async {
                let ((), (), (), status) = tokio::join!(feed, read_out, read_err, child.wait());
                status
            };
            tokio::select! {
                status = finished => Ended::Exited(status),
                () = tokio::time::sleep(self.timeout) => Ended::TimedOut,
                () = ctx.cancel().cancelled() => Ended::Cancelled,
            }
        };

        let status = match ended {
            Ended::Exited(status) => {
                group.0 = None;
                status
            }
            Ended::TimedOut | Ended::Cancelled => {
                drop(group);
                let _ = child.kill().await;
                let message = match ended {
                    Ended::TimedOut => format!(
                        "`{}` timed out after {} ms",
                        self.name,
                        self.timeout.as_millis()
                    ),
                    _ => format!("`{}` was stopped: the run was aborted", self.name),
                };
                return Err(ToolError::new(with_stderr(message, &err.kept)));
            }
        };
        let status = status
            .map_err(|error| ToolError::new(format!("waiting for `{}`: {error}", self.name)))?;
        if status.code() == Some(NEEDS_INPUT_EXIT)
            && let Ok(asked) = serde_json::from_slice::<Value>(&out.kept)
            && let (Some(field), Some(question)) =
                (asked["field"].as_str(), asked["question"].as_str())
        {
            return Err(ToolError::needs_input(field, question));
        }
        if !status.success() {
            return Err(ToolError::new(with_stderr(
                format!("`{}` {}", self.name, failure(status)),
                &err.kept,
            )));
        }
        let text = String::from_utf8_lossy(&out.kept).trim().to_owned();
        let output = ToolOutput::text(text).with_details(json!({"exit_code": 0}));
        Ok(match out.dropped {
            0 => output,
            dropped => output.with_cut_note(dropped, self.max_output),
        })
    }
}

impl AgentTool for CommandTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn label(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.name)
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn execute<'a>(
        &'a self,
        args: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(self.run(args, ctx))
    }
}

/// A pipe read to its end in bounded memory: the first (head) or the last (tail)
/// `max` bytes are kept, the rest counted.
struct Bounded {
    kept: Vec<u8>,
    max: usize,
    keep_tail: bool,
    dropped: u64,
}

impl Bounded {
    fn head(max: usize) -> Self {
        Bounded {
            kept: Vec::new(),
            max,
            keep_tail: false,
            dropped: 0,
        }
    }

    fn tail(max: usize) -> Self {
        Bounded {
            keep_tail: true,
            ..Bounded::head(max)
        }
    }

    async fn read_all(&mut self, mut pipe: impl tokio::io::AsyncRead + Unpin) {
        let mut chunk = vec![0; 8192];
        loop {
            let read = match pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let room = self.max.saturating_sub(self.kept.len());
            let kept = read.min(room);
            self.kept.extend_from_slice(&chunk[..kept]);
            if self.keep_tail && kept < read {
                self.kept.extend_from_slice(&chunk[kept..read]);
                let excess = self.kept.len() - self.max;
                self.kept.drain(..excess);
                self.dropped += excess as u64;
            } else {
                self.dropped += (read - kept) as u64;
            }
        }
    }
}

enum Ended {
    Exited(std::io::Result<ExitStatus>),
    TimedOut,
    Cancelled,
}

/// How a program failed, in words.
fn failure(status: ExitStatus) -> String {
    #[cfg(unix)]
    if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
        return format!("was killed by signal {signal}");
    }
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => format!("failed: {status}"),
    }
}

/// `message`, followed by the last lines of standard error when there are any.
fn with_stderr(message: String, stderr: &[u8]) -> String {
    let stderr = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    if lines.is_empty() {
        return format!("{message} and wrote nothing to stderr");
    }
    let tail = &lines[lines.len().saturating_sub(STDERR_LINES)..];
    format!("{message}; the end of its stderr:\n{}", tail.join("\n"))
}

/// The process group of a running program, killed on drop unless it ended by itself.
struct ProcessGroup(Option<u32>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(id) = self.0 {
            kill_group(id);
        }
    }
}

#[cfg(unix)]
#[allow(unsafe_code)]
fn kill_group(id: u32) {
    if let Ok(group) = libc::pid_t::try_from(id) {
        // SAFETY: killpg only sends a signal; no memory is involved. The group is the
        // one the child leads (`process_group(0)`), still unreaped, so its id has not
        // been reused.
        unsafe {
            libc::killpg(group, libc::SIGKILL);
        }
    }
}

#[cfg(not(unix))]
fn kill_group(_id: u32) {}
