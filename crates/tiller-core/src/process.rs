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
//!
//! [`contain_tree`] holds a program's whole tree, a `setsid` grandchild too:
//! where the machine lets a process make a PID namespace (root, or a user
//! namespace), the program runs as the first process of one of its own, under a
//! keeper process that waits for it and ends as it ends (its exit status, or
//! `128 + signal`). The program dies with the keeper (`PR_SET_PDEATHSIG`), and
//! when the first process of a PID namespace dies the kernel kills every other
//! process in it: an abort, a timeout or a `kill -9` of Tiller (which kills the
//! keeper) leaves nothing of the program running. Inside, the program is PID 2
//! (PID 1, the namespace's first process, only waits for it). Where no
//! namespace can be made, it is [`contain`].

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

/// [`contain`], and the program's whole tree held in a PID namespace of its
/// own where the machine allows it (see the module docs).
pub fn contain_tree(command: &mut Command) {
    contain(command);
    #[cfg(target_os = "linux")]
    keep_in_namespace(command);
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn keep_in_namespace(command: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: unshare, pipe2, fork, prctl, waitpid,
    // read, write, syscall (close_range), getrlimit, close, signal, kill, getpid
    // and _exit are, and it allocates nothing.
    unsafe {
        command.pre_exec(|| {
            // Refused (no privilege): the process group alone holds the tree.
            if libc::unshare(libc::CLONE_NEWPID) != 0 {
                return Ok(());
            }
            // The program's wait status, from the namespace's first process to
            // the keeper (closed at the program's exec).
            let mut status_pipe = [0; 2];
            if libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let [read_end, write_end] = status_pipe;
            let first = libc::fork();
            if first == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if first == 0 {
                // Only the program comes back, to exec.
                return namespace_init(write_end);
            }
            keeper(first, read_end)
        });
    }
}

/// The namespace's first process (PID 1 there, which signals from inside do
/// not reach): it dies with the keeper, starts the program as PID 2 (which goes
/// on to exec), reaps what is orphaned to it, and when the program ends tells
/// the keeper its wait status and exits — the kernel then kills whatever is
/// left in the namespace.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
unsafe fn namespace_init(write_end: libc::c_int) -> Result<(), std::io::Error> {
    // SAFETY: async-signal-safe calls only (see `keep_in_namespace`).
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        let program = libc::fork();
        if program == -1 {
            libc::_exit(127);
        }
        if program == 0 {
            return Ok(());
        }
        close_all_but(write_end);
        let mut status = 0;
        loop {
            let mut reaped = 0;
            let waited = libc::waitpid(-1, &mut reaped, 0);
            if waited == program {
                status = reaped;
                break;
            }
            if waited == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        let bytes = status.to_ne_bytes();
        libc::write(write_end, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(0)
    }
}

/// Closes every file descriptor but `kept`: with `close_range` (Linux 5.9), else
/// one by one up to the process's limit, so that no copy of the spawner's error
/// pipe stays open (it would hold `spawn` until the program ended).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
unsafe fn close_all_but(kept: libc::c_int) {
    // SAFETY: close_range, getrlimit and close are system calls, safe between
    // fork and exec.
    unsafe {
        let kept = kept.max(0) as libc::c_uint;
        let below = kept == 0
            || libc::syscall(
                libc::SYS_close_range,
                0 as libc::c_uint,
                kept - 1,
                0 as libc::c_uint,
            ) == 0;
        let above = libc::syscall(
            libc::SYS_close_range,
            kept + 1,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        ) == 0;
        if below && above {
            return;
        }
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let last = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(1 << 20) as libc::c_int
        } else {
            1 << 16
        };
        for fd in 0..last {
            if fd as libc::c_uint != kept {
                libc::close(fd);
            }
        }
    }
}

/// The keeper, outside the namespace: holds none of the program's files (its
/// pipes end when the program's do; the spawner's error pipe closes at the
/// program's exec), waits for the namespace's first process, and ends as the
/// program ended: its exit status, or killed by its signal.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
unsafe fn keeper(first: libc::pid_t, read_end: libc::c_int) -> ! {
    // SAFETY: async-signal-safe calls only (see `keep_in_namespace`).
    unsafe {
        close_all_but(read_end);
        let mut bytes = [0u8; 4];
        let mut got = 0;
        while got < bytes.len() {
            let read = libc::read(
                read_end,
                bytes[got..].as_mut_ptr().cast(),
                bytes.len() - got,
            );
            if read > 0 {
                got += read as usize;
            } else if read == 0
                || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)
            {
                break;
            }
        }
        let mut first_status = 0;
        while libc::waitpid(first, &mut first_status, 0) == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        // No status: the namespace was killed before the program ended.
        let status = if got == bytes.len() {
            i32::from_ne_bytes(bytes)
        } else {
            libc::SIGKILL
        };
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let signal = if libc::WIFSIGNALED(status) {
            libc::WTERMSIG(status)
        } else {
            libc::SIGKILL
        };
        libc::signal(signal, libc::SIG_DFL);
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal)
    }
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
