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

/// A NATS cluster started for one test: TLS everywhere, clients verified by
/// certificate and password, users held to their subjects (see
/// `scripts/nats.sh`).
#[derive(Debug)]
pub struct NatsCluster {
    /// Its nodes' client URLs (`tls://127.0.0.1:PORT`, no secret).
    pub urls: Vec<String>,
    /// Its folder (the nodes' configuration, stores, logs and pids).
    pub dir: PathBuf,
}

impl NatsCluster {
    /// Whether the NATS tests run here (the server installed, or the tests
    /// mandatory); said once on stderr when they are skipped.
    pub fn available() -> bool {
        if !live_required() && !installed() {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "skipping the NATS tests (no server installed): `scripts/nats.sh install` installs one, or set TILLER_LIVE=required"
                );
            });
            return false;
        }
        true
    }

    /// A fresh cluster of `nodes` nodes, or `None` when the NATS tests are
    /// skipped here (said once on stderr).
    ///
    /// # Panics
    /// When the tests are mandatory and no cluster can be started.
    pub fn start(nodes: usize) -> Option<NatsCluster> {
        if !NatsCluster::available() {
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

    /// The URLs as `--cluster` takes them (no secret).
    pub fn url_list(&self) -> String {
        self.urls.join(",")
    }

    /// What user `name` (`tiller`, the hosts'; `monitor`, read-only) connects
    /// with, from its environment file.
    ///
    /// # Panics
    /// When the cluster's folder has no such user.
    pub fn user(&self, name: &str) -> NatsUser {
        NatsUser::read(&self.dir, name)
    }

    /// User `name`'s environment file as pairs: what `tiller serve` reads
    /// (`TILLER_CLUSTER` with the user's password, `TILLER_NATS_CA`, `…_CERT`,
    /// `…_KEY`).
    ///
    /// # Panics
    /// When the cluster's folder has no such user.
    pub fn env(&self, name: &str) -> Vec<(String, String)> {
        env_file(&self.dir, name)
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

impl NatsUser {
    /// User `name` of the cluster in folder `dir`.
    ///
    /// # Panics
    /// When the folder has no such user.
    pub fn read(dir: &std::path::Path, name: &str) -> NatsUser {
        let env = env_file(dir, name);
        let get = |key: &str| {
            env.iter()
                .find(|(k, _)| k == key)
                .map(|(_, value)| value.clone())
                .unwrap_or_else(|| panic!("{name}.env has no {key}"))
        };
        NatsUser {
            urls: get("TILLER_CLUSTER")
                .split(',')
                .map(str::to_owned)
                .collect(),
            ca: get("TILLER_NATS_CA").into(),
            cert: get("TILLER_NATS_CERT").into(),
            key: get("TILLER_NATS_KEY").into(),
        }
    }

    /// A NATS client connected as this user to `url` (one of [`Self::urls`],
    /// all when `None`), with `options` added.
    ///
    /// # Errors
    /// When the cluster refuses the user or cannot be reached.
    pub async fn connect(
        &self,
        url: Option<usize>,
        options: async_nats::ConnectOptions,
    ) -> Result<async_nats::Client, async_nats::ConnectError> {
        let chosen: Vec<String> = match url {
            Some(at) => vec![self.urls[at].clone()],
            None => self.urls.clone(),
        };
        let parsed: Vec<async_nats::ServerAddr> =
            chosen.iter().filter_map(|url| url.parse().ok()).collect();
        let mut options = options
            .require_tls(true)
            .add_root_certificates(self.ca.clone())
            .add_client_certificate(self.cert.clone(), self.key.clone());
        if let Some(first) = parsed.first()
            && let (Some(user), Some(password)) = (first.username(), first.password())
        {
            options = options.user_and_password(user.to_owned(), password.to_owned());
        }
        options.connect(parsed.as_slice()).await
    }
}

/// One NATS node with JetStream on loopback, with `settings` added to its
/// configuration (an `authorization` block, say), for a test of how hosts
/// connect; stopped when dropped.
#[derive(Debug)]
pub struct NatsNode {
    /// Its client URL (`nats://127.0.0.1:PORT`).
    pub url: String,
    dir: PathBuf,
    child: std::process::Child,
}

impl NatsNode {
    /// The node, or `None` when the NATS tests are skipped here.
    ///
    /// # Panics
    /// When the tests are mandatory and the node cannot be started.
    pub fn start(settings: &str) -> Option<NatsNode> {
        if !NatsCluster::available() {
            return None;
        }
        let installed = Command::new("bash")
            .arg(script())
            .arg("install")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        assert!(installed, "scripts/nats.sh install failed");
        let bin = Command::new("bash")
            .arg(script())
            .arg("bin")
            .output()
            .unwrap();
        let bin = String::from_utf8_lossy(&bin.stdout).trim().to_owned();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        let dir =
            std::env::temp_dir().join(format!("tiller-nats-node-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("node.conf");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{}\"\n}}\n{settings}\n",
                dir.join("store").display()
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the NATS node did not listen"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Some(NatsNode {
            url: format!("nats://127.0.0.1:{port}"),
            dir,
            child,
        })
    }
}

impl Drop for NatsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one user of a [`NatsCluster`] connects with.
#[derive(Clone)]
pub struct NatsUser {
    /// The client URLs with the user's name and password.
    pub urls: Vec<String>,
    /// The authority that signed the nodes' certificates.
    pub ca: PathBuf,
    /// The user's client certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

impl std::fmt::Debug for NatsUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsUser")
            .field(
                "urls",
                &format_args!("({} with a password)", self.urls.len()),
            )
            .field("ca", &self.ca)
            .finish_non_exhaustive()
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

/// User `name`'s environment file in `dir` as pairs.
fn env_file(dir: &std::path::Path, name: &str) -> Vec<(String, String)> {
    let path = dir.join(format!("{name}.env"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

fn installed() -> bool {
    script_says_installed(&script(), &[])
}

/// `scripts/nats.sh` of this workspace.
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nats.sh")
}
