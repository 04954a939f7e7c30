//! A real PostgreSQL server for the store tests.
//!
//! [`postgres_url`] gives the URL of a running server: `TILLER_POSTGRES_URL` when it
//! is set, else a throwaway cluster started once for this test process by
//! `scripts/postgres.sh start --owner PID` (stopped when the process ends). Without
//! either, the PostgreSQL tests are skipped on a developer's machine with one line on
//! stderr, unless `TILLER_LIVE=required` (as `.ci/run` sets) makes them mandatory:
//! then the script installs the server on first use and any failure fails the test.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Once, OnceLock};

use crate::live::{live_required, script_says_installed, start_with};

/// The URL of a running PostgreSQL server, or `None` when the PostgreSQL tests are
/// skipped here (said once on stderr).
///
/// # Panics
/// When the tests are mandatory and no server can be installed or started.
pub fn postgres_url() -> Option<String> {
    if let Ok(url) = std::env::var("TILLER_POSTGRES_URL")
        && !url.trim().is_empty()
    {
        return Some(url.trim().to_owned());
    }
    if !live_required() && !installed() {
        static SAID: Once = Once::new();
        SAID.call_once(|| {
            let _ = writeln!(
                std::io::stderr(),
                "skipping the PostgreSQL tests (no server installed): `scripts/postgres.sh install` installs one, or set TILLER_POSTGRES_URL or TILLER_LIVE=required"
            );
        });
        return None;
    }
    static URL: OnceLock<String> = OnceLock::new();
    Some(URL.get_or_init(start).clone())
}

/// Stops the server at `url` (one [`postgres_url`] started) as an operator
/// restarting it would: its connections are cut, its data kept.
///
/// # Panics
/// When the script fails.
pub fn pause(url: &str) {
    run(&["pause", url]);
}

/// Starts the server [`pause`] stopped again, on the same port.
///
/// # Panics
/// When the script fails.
pub fn resume(url: &str) {
    run(&["resume", url]);
}

fn run(args: &[&str]) {
    let status = std::process::Command::new(script())
        .args(args)
        .status()
        .unwrap_or_else(|error| panic!("scripts/postgres.sh: {error}"));
    assert!(
        status.success(),
        "`scripts/postgres.sh {}` failed",
        args.join(" ")
    );
}

fn installed() -> bool {
    script_says_installed(&script(), &[])
}

fn start() -> String {
    start_with(&script(), &["start"], "postgres://")
}

/// `scripts/postgres.sh` of this workspace.
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/postgres.sh")
}
