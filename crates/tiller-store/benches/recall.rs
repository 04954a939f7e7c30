//! What recalling a user's facts costs with 100,000 of them kept: the time of
//! one `recall` (full-text search, five best facts) on SQLite (FTS5, a file
//! under the temp directory), on PostgreSQL (its full-text search over a GIN
//! index) when `TILLER_POSTGRES_URL` names one or the test script can start
//! one, and in memory (every fact read) — each printed beside its floor, a
//! read of one fact by its place (`memories(owner, n, 1)`) on the same store.
//!
//! ```text
//! cargo bench -p tiller-store --bench recall          # -- N for N facts (default 100,000)
//! ```
//!
//! The facts are sentences of eight to twelve words drawn from 2,000, the
//! queries three such words; another user's 10,000 facts share the store.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tiller_store::{MemoryOwner, MemoryStore, SessionStore, SqlStore};

/// Recalls timed per store.
const QUERIES: usize = 300;

fn main() {
    let facts: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = std::env::temp_dir().join(format!("tiller-bench-recall-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sqlite = format!("sqlite://{}", dir.join("memory.db").display());
        measure(
            "sqlite",
            Arc::new(SqlStore::open(&sqlite).await.unwrap()),
            facts,
        )
        .await;
        match tiller_test_support::postgres::postgres_url() {
            Some(url) => {
                measure(
                    "postgres",
                    Arc::new(SqlStore::open(&url).await.unwrap()),
                    facts,
                )
                .await
            }
            None => println!("postgres: skipped (no TILLER_POSTGRES_URL)"),
        }
        measure("memory", Arc::new(MemoryStore::new()), facts).await;
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// A word of the vocabulary, by number.
fn word(n: u64) -> String {
    const SYLLABLES: [&str; 20] = [
        "ka", "lo", "mi", "ren", "to", "sa", "vel", "di", "nor", "pe", "gu", "ra", "fen", "li",
        "bo", "tas", "ke", "mun", "zi", "ol",
    ];
    let n = n % 2_000;
    format!(
        "{}{}{}",
        SYLLABLES[(n % 20) as usize],
        SYLLABLES[((n / 20) % 20) as usize],
        SYLLABLES[((n / 400) % 20) as usize]
    )
}

/// A small deterministic generator (xorshift).
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn sentence(&mut self, words: u64) -> String {
        (0..words)
            .map(|_| word(self.next()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

async fn fill(store: &Arc<dyn SessionStore>, owner: &MemoryOwner, facts: usize, seed: u64) {
    let mut dice = Dice(seed);
    let texts: Vec<String> = (0..facts)
        .map(|_| {
            let words = 8 + dice.next() % 5;
            dice.sentence(words)
        })
        .collect();
    // One after another, as one user's agent remembers.
    for text in texts {
        store.remember(owner, &text).await.unwrap();
    }
}

async fn measure(name: &str, store: Arc<dyn SessionStore>, facts: usize) {
    let tenant = format!("bench-{}-{}", std::process::id(), tiller_ai::now_ms());
    let owner = MemoryOwner::new(&tenant, "ada");
    let started = Instant::now();
    fill(&store, &owner, facts, 7).await;
    fill(&store, &MemoryOwner::new(&tenant, "bob"), facts / 10, 11).await;
    let filled = started.elapsed();

    let mut dice = Dice(99);
    let mut recalls = Vec::with_capacity(QUERIES);
    let mut floor = Vec::with_capacity(QUERIES);
    let mut found = 0;
    for _ in 0..QUERIES {
        let query = dice.sentence(3);
        let started = Instant::now();
        found += store.recall(&owner, &query, 5).await.unwrap().len();
        recalls.push(started.elapsed());
        let place = dice.next() % facts as u64;
        let started = Instant::now();
        store.memories(&owner, place, 1).await.unwrap();
        floor.push(started.elapsed());
    }
    let (recall, floor) = (percentiles(&mut recalls), percentiles(&mut floor));
    println!(
        "{name}: {facts} facts remembered in {:.1} s; recall p50 {} p95 {} (floor, one fact by its place: p50 {} p95 {}); {:.1} facts found a query",
        filled.as_secs_f64(),
        show(recall.0),
        show(recall.1),
        show(floor.0),
        show(floor.1),
        found as f64 / QUERIES as f64
    );
    store.forget(&owner, None).await.unwrap();
    store
        .forget(&MemoryOwner::new(&tenant, "bob"), None)
        .await
        .unwrap();
}

fn percentiles(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    (times[times.len() / 2], times[times.len() * 95 / 100])
}

fn show(time: Duration) -> String {
    if time >= Duration::from_millis(1) {
        format!("{:.2} ms", time.as_secs_f64() * 1e3)
    } else {
        format!("{} µs", time.as_micros())
    }
}
