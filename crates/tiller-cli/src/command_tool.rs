//! Command tools: a tool that is a program.
//!
//! The program runs without a shell, with the call's arguments as one JSON object on
//! its standard input. What it prints on standard output, trimmed, is the result. A
//! non-zero exit, a signal or the timeout make an error result that carries the last
//! lines of its standard error. The program runs in a process group of its own, so
//! when the call ends early (timeout, abort, the run dropped) the whole group is
//! killed, children included.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tiller::{AgentTool, ToolContext, ToolError, ToolOutput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// How many lines of standard error an error result carries.
const STDERR_LINES: usize = 10;

/// A tool that runs a program (see the module docs).
#[derive(Debug, Clone)]
pub struct CommandTool {
    name: String,
    description: String,
    parameters: Value,
    program: PathBuf,
    args: Vec<String>,
    timeout: Duration,
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
            description: description.into(),
            parameters,
            program: program.into(),
            args,
            timeout,
        }
    }

    /// The program run.
    pub fn program(&self) -> &PathBuf {
        &self.program
    }

    /// Its arguments.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// How long a call may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn run(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let input = serde_json::to_vec(&args)?;
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(unix)]
        command.process_group(0);
        let mut child = command.spawn().map_err(|error| {
            ToolError::new(format!(
                "could not start `{}`: {error}",
                self.program.display()
            ))
        })?;
        let mut group = ProcessGroup(child.id());
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());

        let (mut out, mut err) = (Vec::new(), Vec::new());
        let ended = {
            let feed = async move {
                if let Some(mut stdin) = stdin {
                    // A program that exits without reading its input is not an error.
                    let _ = stdin.write_all(&input).await;
                }
            };
            let read_out = async {
                if let Some(mut stdout) = stdout {
                    let _ = stdout.read_to_end(&mut out).await;
                }
            };
            let read_err = async {
                if let Some(mut stderr) = stderr {
                    let _ = stderr.read_to_end(&mut err).await;
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
                return Err(ToolError::new(with_stderr(message, &err)));
            }
        };
        let status = status
            .map_err(|error| ToolError::new(format!("waiting for `{}`: {error}", self.name)))?;
        if !status.success() {
            return Err(ToolError::new(with_stderr(
                format!("`{}` {}", self.name, failure(status)),
                &err,
            )));
        }
        let text = String::from_utf8_lossy(&out).trim().to_owned();
        Ok(ToolOutput::text(text).with_details(json!({"exit_code": 0})))
    }
}

impl AgentTool for CommandTool {
    fn name(&self) -> &str {
        &self.name
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
