//! The fault suite: `tiller serve` under load while its store fails, as a
//! demanding user would meet it. A hundred clients prompt their own agents and wait
//! for each run (`?wait=true`); the store fails under them and recovers; the
//! server is killed with SIGKILL and a new one reads the store. Every prompt a
//! client was told was taken (a 200) must be in its session once, and no other:
//! a prompt refused while the store failed (503 `store-unavailable`) is not.
//! Each test prints what it acknowledged, refused and stored.

#![allow(clippy::unwrap_used, unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command as Blocking;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Scratch, Serving, exit_of, kill_hard, request};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::watch;

/// The clients, each with an agent of its own.
const CLIENTS: usize = 100;

/// Prompts acknowledged before the fault, and again after the recovery.
const ACKED_EACH_PHASE: usize = 150;

/// Prompts refused (503) while the store fails, before it recovers.
const REFUSED_BEFORE_RECOVERY: usize = 50;

/// What the clients were told, as it happens.
#[derive(Default, Clone)]
struct Told {
    /// Each agent's prompts answered 200, in order.
    acknowledged: BTreeMap<String, Vec<String>>,
    acked: usize,
    refused: usize,
}

/// One client: prompts its agent until `stop`, each prompt waiting for its run;
/// a 503 `store-unavailable` is tried again after the `Retry-After` it names.
async fn client(
    base: String,
    agent: String,
    told: Arc<watch::Sender<Told>>,
    stop: Arc<AtomicBool>,
) {
    let http = reqwest::Client::new();
    let mut n = 0;
    while !stop.load(Ordering::Acquire) {
        let text = format!("{agent} prompt {n}");
        let response = http
            .post(format!("{base}/agents/{agent}/prompt?wait=true"))
            .json(&json!({ "text": text }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let retry_after = response.headers().get("retry-after").cloned();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        match status {
            200 => {
                assert_eq!(body["end"], "completed", "{body}");
                told.send_modify(|told| {
                    told.acknowledged
                        .entry(agent.clone())
                        .or_default()
                        .push(text);
                    told.acked += 1;
                });
                n += 1;
            }
            503 => {
                assert_eq!(
                    body["type"], "urn:tiller:problem:store-unavailable",
                    "{body}"
                );
                assert_eq!(retry_after.unwrap(), "2");
                told.send_modify(|told| told.refused += 1);
                // A client's own pause before it tries again (shorter than asked:
                // the test wants many tries while the store fails).
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => panic!("{agent}: {status} {body}"),
        }
    }
}

/// The server's `/metrics`.
async fn metrics_of(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// How a store is made to fail and recover under the running server.
trait Fault {
    /// Makes the store fail for the server `pid`.
    fn fail(&mut self, pid: u32);
    /// Lets it recover.
    fn recover(&mut self, pid: u32);
}

/// Runs the load against a server of `store`, failing it with `fault` once the
/// clients have their first acknowledgements, then checks the store after a
/// SIGKILL and a restart.
async fn load_through(name: &str, store: &str, fault: &mut dyn Fault) {
    let options = ["--store", store];
    let serving = Serving::start_with(Scratch::new(), &options, &[]).await;
    let base = serving.base.clone();
    // Half the clients prompt from the start; the other half first come while
    // the store fails.
    let agents: Vec<String> = (0..CLIENTS).map(|n| format!("client-{n}")).collect();
    for agent in &agents {
        let (status, body) = request(
            Method::POST,
            format!("{base}/agents"),
            None,
            Some(json!({"definition": "helper", "id": agent})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let told = Arc::new(watch::Sender::new(Told::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let start = |agents: &[String]| -> Vec<_> {
        agents
            .iter()
            .map(|agent| {
                tokio::spawn(client(
                    base.clone(),
                    agent.clone(),
                    told.clone(),
                    stop.clone(),
                ))
            })
            .collect()
    };
    let (early, late) = agents.split_at(CLIENTS / 2);
    let mut clients = start(early);
    let mut seen = told.subscribe();
    seen.wait_for(|told| told.acked >= ACKED_EACH_PHASE)
        .await
        .unwrap();
    let pid = serving.child.id().unwrap();
    fault.fail(pid);
    // The early clients' runs park at their next write; the server says the
    // store fails once a write has failed.
    loop {
        let health = reqwest::get(format!("{base}/healthz")).await.unwrap();
        if health.status() == 503 {
            let problem: Value = health.json().await.unwrap();
            assert_eq!(problem["type"], "urn:tiller:problem:store-unavailable");
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    clients.extend(start(late));
    let before = seen
        .wait_for(|told| told.refused >= REFUSED_BEFORE_RECOVERY)
        .await
        .unwrap()
        .acked;
    let metrics = metrics_of(&base).await;
    assert!(
        metrics.contains("\ntiller_store_unavailable 1\n"),
        "{metrics}"
    );
    fault.recover(pid);
    seen.wait_for(|told| told.acked >= before + ACKED_EACH_PHASE)
        .await
        .unwrap();
    stop.store(true, Ordering::Release);
    for client in clients {
        client.await.unwrap();
    }
    let health = reqwest::get(format!("{base}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = metrics_of(&base).await;
    assert!(
        metrics.contains("\ntiller_store_unavailable 0\n"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("\ntiller_store_outages_total 0\n"),
        "{metrics}"
    );

    let mut serving = serving;
    kill_hard(serving.child.id().unwrap());
    exit_of(&mut serving.child).await;
    let serving = Serving::start_with(Scratch::new(), &options, &[]).await;
    let told = told.borrow().clone();
    let mut stored_count = 0;
    for agent in &agents {
        let (status, page) = request(
            Method::GET,
            format!("{}/sessions/{agent}/messages?limit=1000", serving.base),
            None,
            None,
        )
        .await;
        assert_eq!(status, 200, "{page}");
        let stored: Vec<String> = page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|message| message["role"] == "user")
            .map(|message| message["content"][0]["text"].as_str().unwrap().to_owned())
            .collect();
        stored_count += stored.len();
        let acknowledged = told.acknowledged.get(agent).cloned().unwrap_or_default();
        // Every acknowledged prompt, once, in order; nothing else.
        assert_eq!(stored, acknowledged, "{agent}");
    }
    eprintln!(
        "{name}: {} prompts acknowledged, {} refused with 503 while the store failed, {stored_count} stored after a SIGKILL and a restart, none missing, none twice",
        told.acked, told.refused
    );
    serving.stop().await;
}

/// A small file system of its own for the SQLite file: a tmpfs filled by a
/// file beside the database where the machine lets a test mount one (root),
/// else the server's own file-size limit (`RLIMIT_FSIZE`, set with `prlimit`).
enum SmallDisk {
    Mounted { at: PathBuf, filler: PathBuf },
    Limited { at: PathBuf },
}

impl SmallDisk {
    fn new(scratch: &Scratch) -> SmallDisk {
        let at = scratch.path().join("disk");
        std::fs::create_dir_all(&at).unwrap();
        // A file past the limit raises SIGXFSZ, which would kill the server:
        // ignored here, and so by the children too.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        }
        let mounted = Blocking::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
            .arg(&at)
            .output()
            .is_ok_and(|output| output.status.success());
        if mounted {
            let filler = at.join("filler");
            SmallDisk::Mounted { at, filler }
        } else {
            eprintln!(
                "faults: no tmpfs can be mounted here (not root); the disk fills by RLIMIT_FSIZE"
            );
            SmallDisk::Limited { at }
        }
    }

    fn path(&self) -> &Path {
        match self {
            SmallDisk::Mounted { at, .. } | SmallDisk::Limited { at } => at,
        }
    }
}

impl Fault for SmallDisk {
    fn fail(&mut self, pid: u32) {
        match self {
            SmallDisk::Mounted { filler, .. } => {
                // Fills what is free, as another program filling the disk would.
                use std::io::Write;
                let mut file = std::fs::File::create(&*filler).unwrap();
                let block = vec![0u8; 1 << 16];
                while file.write_all(&block).is_ok() {}
                let _ = file.sync_all();
            }
            SmallDisk::Limited { at } => {
                let largest = std::fs::read_dir(&*at)
                    .unwrap()
                    .flatten()
                    .filter_map(|entry| entry.metadata().ok())
                    .map(|metadata| metadata.len())
                    .max()
                    .unwrap_or(0);
                file_size_limit(pid, largest);
            }
        }
    }

    fn recover(&mut self, pid: u32) {
        match self {
            SmallDisk::Mounted { filler, .. } => std::fs::remove_file(&*filler).unwrap(),
            SmallDisk::Limited { .. } => file_size_limit(pid, libc::RLIM_INFINITY),
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if let SmallDisk::Mounted { at, .. } = self {
            let _ = Blocking::new("umount").arg("-l").arg(&*at).status();
        }
    }
}

/// Sets the soft `RLIMIT_FSIZE` of process `pid` (its hard limit stays).
fn file_size_limit(pid: u32, bytes: u64) {
    let limit = libc::rlimit64 {
        rlim_cur: bytes,
        rlim_max: libc::RLIM64_INFINITY,
    };
    // SAFETY: prlimit64 reads `limit` and writes nothing back (null old limit).
    let done = unsafe {
        libc::prlimit64(
            pid as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(done, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// SQLite on a disk that fills under load and is freed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_sqlite_loses_no_acknowledged_prompt() {
    let scratch = Scratch::new();
    let mut disk = SmallDisk::new(&scratch);
    let store = format!("sqlite://{}", disk.path().join("tiller.db").display());
    load_through("sqlite, disk full", &store, &mut disk).await;
}

/// A PostgreSQL server stopped and started again under the server's feet.
struct Restarted(String);

impl Fault for Restarted {
    fn fail(&mut self, _: u32) {
        tiller_test_support::postgres::pause(&self.0);
    }

    fn recover(&mut self, _: u32) {
        tiller_test_support::postgres::resume(&self.0);
    }
}

/// PostgreSQL restarted under load: connections cut mid-transaction, refused
/// while it is down, then a new server on the same data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_restart_under_load_loses_no_acknowledged_prompt() {
    let Some(url) = tiller_test_support::postgres::postgres_url() else {
        return;
    };
    let mut restarted = Restarted(url.clone());
    load_through("postgresql, restarted", &url, &mut restarted).await;
}

/// SIGTERM while the store stays full: the server does not wait for it
/// forever. A prompt taken as the disk fills parks at its write; the server
/// gives the store `Supervisor::SHUTDOWN_STORE_WAIT` and exits, saying the
/// writes it could not make were never acknowledged (the client got no 2xx).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_while_its_store_fails_exits_without_acknowledging() {
    let scratch = Scratch::new();
    let mut disk = SmallDisk::new(&scratch);
    let store = format!("sqlite://{}", disk.path().join("tiller.db").display());
    let mut serving = Serving::start_with(Scratch::new(), &["--store", &store], &[]).await;
    let base = serving.base.clone();
    let (status, body) = request(
        Method::POST,
        format!("{base}/agents"),
        None,
        Some(json!({"definition": "helper", "id": "parked"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let pid = serving.child.id().unwrap();
    disk.fail(pid);
    let prompt = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{base}/agents/parked/prompt?wait=true"))
            .json(&json!({"text": "never kept"}))
            .send()
            .await
            .map(|response| response.status().as_u16())
    });
    // The prompt's write fails: the store is unavailable, the run parked.
    loop {
        let health = reqwest::get(format!("{}/healthz", serving.base))
            .await
            .unwrap();
        if health.status() == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    common::terminate(pid);
    let status = tokio::time::timeout(Duration::from_secs(60), serving.child.wait())
        .await
        .expect("the server exits though its store fails")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let said = common::read_until(&mut serving.stderr, |line| line == "tiller: stopped").await;
    assert!(
        said.iter()
            .any(|line| line.contains("shutting down without the writes that wait for it")),
        "{said:?}"
    );
    // Its client was never told the prompt was taken.
    assert!(!matches!(prompt.await.unwrap(), Ok(200..=299)));
}
