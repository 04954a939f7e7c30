//! What a branch costs the store: 1,000 forks of one 1,000-message session
//! (one at each of its messages, so that each cuts the transcript somewhere
//! else), beside 1,000 copies of it (target: the forks under 1% of the
//! copies), on SQLite (a file under the temp directory) and, when
//! `TILLER_POSTGRES_URL` names one, PostgreSQL; and in memory, whose branches
//! share one snapshot of the session's messages.
//!
//! ```text
//! cargo bench -p tiller-runtime --bench branches
//! ```

#![allow(clippy::unwrap_used)]

#[global_allocator]
static HEAP: tiller_test_support::heap::Counting = tiller_test_support::heap::Counting;

use std::sync::Arc;
use std::time::Instant;

use tiller_ai::faux::FauxProvider;
use tiller_core::AgentMessage;
use tiller_store::{
    Change, MemoryStore, SessionRecord, SessionStore, SessionWrite, SqlStore, StoreWriter,
};
use tiller_test_support::workload::transcript;

/// Messages in the session forked.
const MESSAGES: usize = 1_000;

/// Forks made, and copies the forks are set beside.
const FORKS: usize = 1_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir =
            std::env::temp_dir().join(format!("tiller-bench-branches-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sqlite = format!("sqlite://{}", dir.join("sessions.db").display());
        in_sql("sqlite", &sqlite).await;
        match tiller_test_support::postgres::postgres_url() {
            Some(url) => in_sql("postgres", &url).await,
            None => println!("postgres: skipped (no TILLER_POSTGRES_URL)"),
        }
        in_memory().await;
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// The 1,000 messages: a conversation's five questions and answers, again
/// and again.
fn messages() -> Vec<Arc<AgentMessage>> {
    let faux = FauxProvider::new();
    transcript(&faux.model())
        .into_iter()
        .cycle()
        .take(MESSAGES)
        .map(Arc::new)
        .collect()
}

/// Writes session `id` with `messages`, as an agent writes a conversation: a
/// message or two a commit.
async fn write_session(writer: &StoreWriter, id: &str, messages: &[Arc<AgentMessage>]) {
    let record = SessionRecord {
        definition: serde_json::json!({"model": "faux/scripted", "system_prompt": "You are a helpful assistant."}).into(),
        ..SessionRecord::new(id)
    };
    writer
        .write(vec![SessionWrite::new(id, Change::Create(record))])
        .await
        .unwrap();
    for (pair, two) in messages.chunks(2).enumerate() {
        let writes = two
            .iter()
            .enumerate()
            .map(|(n, message)| {
                SessionWrite::new(
                    id,
                    Change::Append {
                        seq: (pair * 2 + n) as u64,
                        message: message.clone(),
                        dequeued: None,
                    },
                )
            })
            .collect();
        writer.write(writes).await.unwrap();
    }
}

/// Forks `parent` at each of its messages; how long they took.
async fn fork_each(store: &dyn SessionStore, parent: &str) -> std::time::Duration {
    let started = Instant::now();
    for n in 0..FORKS {
        let at = (n % MESSAGES + 1) as u64;
        tiller_runtime::fork_stored(store, parent, at, &format!("{parent}-branch-{n}"))
            .await
            .unwrap();
    }
    started.elapsed()
}

async fn in_sql(name: &str, url: &str) {
    let store = Arc::new(SqlStore::open(url).await.unwrap());
    let writer = StoreWriter::for_store(store.clone());
    let messages = messages();
    let run = tiller_ai::new_id();
    let held = async || {
        store.checkpoint().await.unwrap();
        store.bytes_held().await.unwrap()
    };
    let before = held().await;
    write_session(&writer, &format!("{run}-original"), &messages).await;
    let original = held().await;
    write_session(&writer, &format!("{run}-copy"), &messages).await;
    let copy = held().await - original;
    let took = fork_each(&*store, &format!("{run}-original")).await;
    let forks = held().await - original - copy;
    println!(
        "{name}: session of {MESSAGES} messages {} B; one copy {copy} B; {FORKS} forks {forks} B \
         = {:.3}% of {FORKS} copies (target < 1%); {:.0} µs a fork",
        original - before,
        100.0 * forks as f64 / (copy as f64 * FORKS as f64),
        took.as_secs_f64() * 1e6 / FORKS as f64
    );
}

async fn in_memory() {
    let store = Arc::new(MemoryStore::new());
    let writer = StoreWriter::for_store(store.clone());
    let faux_messages = messages();
    // Its own messages, as a conversation's are (not the ones `messages` made).
    let fresh = || -> Vec<Arc<AgentMessage>> {
        faux_messages
            .iter()
            .map(|message| Arc::new((**message).clone()))
            .collect()
    };
    let original = fresh();
    write_session(&writer, "original", &original).await;
    let before = tiller_test_support::heap::live();
    write_session(&writer, "copy", &fresh()).await;
    let copy = tiller_test_support::heap::live() - before;
    let before = tiller_test_support::heap::live();
    let took = fork_each(&*store, "original").await;
    let forks = tiller_test_support::heap::live() - before;
    println!(
        "memory: one copy {copy} B of heap; {FORKS} forks {forks} B = {:.3}% of {FORKS} copies \
         (target < 1%); {:.0} µs a fork",
        100.0 * forks as f64 / (copy as f64 * FORKS as f64),
        took.as_secs_f64() * 1e6 / FORKS as f64
    );
}
