//! A real NATS cluster with JetStream for the cluster tests.
//!
//! [`NatsCluster::start`] starts a fresh cluster of `n` nodes on loopback through
//! `scripts/nats.sh cluster N --owner PID` (stopped when the test process ends,
//! or when the value is dropped), so each test has its own. Without the server
//! installed, the NATS tests are skipped on a developer's machine with one line
//! on stderr, unless `TILLER_LIVE=required` (as `.ci/run` sets) makes them
//! mandatory: then the script installs the server on first use and any failure
//! fails the test. Nodes can be killed and started again, and a node's monitoring
//! port read, to play the loss of a node.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Once;

use crate::live::{live_required, script_says_installed};

/// A NATS cluster started for one test.
#[derive(Debug)]
pub struct NatsCluster {
    /// Its nodes' client URLs.
    pub urls: Vec<String>,
    /// Its folder (the nodes' configuration, stores, logs and pids).
    pub dir: PathBuf,
}

impl NatsCluster {
    /// A fresh cluster of `nodes` nodes, or `None` when the NATS tests are
    /// skipped here (said once on stderr).
    ///
    /// # Panics
    /// When the tests are mandatory and no cluster can be started.
    pub fn start(nodes: usize) -> Option<NatsCluster> {
        if !live_required() && !installed() {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "skipping the NATS tests (no server installed): `scripts/nats.sh install` installs one, or set TILLER_LIVE=required"
                );
            });
            return None;
        }
        let output = Command::new("bash")
            .arg(script())
            .args(["cluster", &nodes.to_string(), "--owner"])
            .arg(std::process::id().to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|error| panic!("could not run scripts/nats.sh: {error}"));
        let printed = String::from_utf8_lossy(&output.stdout);
        let mut lines = printed.lines();
        let (Some(urls), Some(dir)) = (lines.next(), lines.next()) else {
            panic!(
                "`scripts/nats.sh cluster {nodes}` failed ({}); its messages are above",
                output.status
            );
        };
        assert!(output.status.success(), "scripts/nats.sh cluster failed");
        Some(NatsCluster {
            urls: urls.split(',').map(str::to_owned).collect(),
            dir: PathBuf::from(dir),
        })
    }

    /// The URLs as `--cluster` takes them.
    pub fn url_list(&self) -> String {
        self.urls.join(",")
    }

    /// The pid of node `name` (`n1`, `n2`, …).
    pub fn pid(&self, name: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.join(format!("{name}.pid")))
            .ok()
            .and_then(|pid| pid.trim().parse().ok())
    }

    /// Kills node `name` (SIGKILL).
    pub fn kill(&self, name: &str) {
        if let Some(pid) = self.pid(name) {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    }

    /// Starts node `name` again, with its ports and store.
    pub fn restart(&self, name: &str) {
        let status = Command::new("bash")
            .arg(self.dir.join(format!("{name}.sh")))
            .status()
            .unwrap_or_else(|error| panic!("could not start {name} again: {error}"));
        assert!(status.success(), "could not start {name} again");
    }

    /// The monitoring port of node `name`.
    pub fn monitor_port(&self, name: &str) -> Option<u16> {
        std::fs::read_to_string(self.dir.join(format!("{name}.ports")))
            .ok()?
            .split_whitespace()
            .nth(2)?
            .parse()
            .ok()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn installed() -> bool {
    script_says_installed(&script(), &[])
}

/// `scripts/nats.sh` of this workspace.
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nats.sh")
}
