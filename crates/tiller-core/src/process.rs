//! Child processes that tools start — a command tool's program, a stdio MCP
//! server — die with the process that started them.
//!
//! [`contain`] makes a command's child lead a process group of its own, so that it
//! and whatever it starts can be killed together, and kills it when dropped. On
//! Linux the child also asks the kernel for `SIGKILL` when its parent dies
//! (`PR_SET_PDEATHSIG`), so a `kill -9` of the agent's process takes it down too,
//! rather than leaving it orphaned, still running. The kernel sends that signal
//! when the *thread* that started the child ends: Tiller starts children from its
//! runtime's worker threads, which live as long as the runtime (a host calling
//! [`contain`] from a thread that ends sooner kills its children with it). The
//! signal reaches the child itself, not the processes it forks in turn, and a
//! set-user-id program clears it.

use tokio::process::Command;

/// The variables every program a tool starts gets (when Tiller has them).
pub const BASE_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// Gives `command` a clean environment: [`BASE_ENV`] and the variables `pass`
/// names, from this process's, and nothing else (no provider keys).
pub fn clean_env<'a>(command: &mut Command, pass: impl IntoIterator<Item = &'a str>) {
    command.env_clear();
    for name in BASE_ENV.into_iter().chain(pass) {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
}

/// Sets up `command` so that its child dies with this process (see the module
/// docs): a process group of its own, killed on drop, and on Linux the
/// parent-death signal.
pub fn contain(command: &mut Command) {
    command.kill_on_drop(true);
    #[cfg(unix)]
    command.process_group(0);
    #[cfg(target_os = "linux")]
    die_with_parent(command);
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: prctl, getppid and _exit are, and it
    // allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the signal was asked for: nobody will send it.
            if u32::try_from(libc::getppid()) != Ok(parent) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}
