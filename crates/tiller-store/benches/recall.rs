//! What recalling a user's facts costs with 100,000 of them kept, each with a
//! 384-dimension embedding: the time of one `recall` (full-text search, five
//! best facts) and of one `recall_similar` (the five nearest vectors) on SQLite
//! (FTS5 and sqlite-vec, a file under the temp directory), on PostgreSQL
//! (full-text search over a GIN index; vectors ranked in Tiller as they stream)
//! when `TILLER_POSTGRES_URL` names one or the test script can start one, and
//! in memory (every fact read) — each printed beside its floors: a read of one
//! fact by its place (`memories(owner, n, 1)`) on the same store, and for
//! vectors the ranking alone, every vector already in this process's memory.
//!
//! ```text
//! cargo bench -p tiller-store --bench recall          # -- N for N facts (default 100,000)
//! ```
//!
//! The facts are sentences of eight to twelve words drawn from 2,000, the
//! queries three such words; the vectors are random; another user's 10,000
//! facts share the store.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tiller_store::{Embedding, MemoryOwner, MemoryStore, SessionStore, SqlStore};

/// Recalls timed per store.
const QUERIES: usize = 300;

/// Of those, one in this many also recalls by vector.
const VECTOR_EVERY: usize = 5;

/// The dimensions of the facts' embeddings (as all-MiniLM-L6-v2's).
const DIMENSIONS: usize = 384;

/// The model the embeddings are kept under.
const MODEL: &str = "bench/random@384";

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

    /// A random vector (not yet of length 1).
    fn vector(&mut self) -> Vec<f32> {
        (0..DIMENSIONS)
            .map(|_| (self.next() % 2_001) as f32 / 1_000.0 - 1.0)
            .collect()
    }

    fn sentence(&mut self, words: u64) -> String {
        (0..words)
            .map(|_| word(self.next()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Remembers `facts` facts for `owner`, each with its embedding; the vectors.
async fn fill(
    store: &Arc<dyn SessionStore>,
    owner: &MemoryOwner,
    facts: usize,
    seed: u64,
) -> Vec<Embedding> {
    let mut dice = Dice(seed);
    let facts: Vec<(String, Embedding)> = (0..facts)
        .map(|_| {
            let words = 8 + dice.next() % 5;
            let text = dice.sentence(words);
            (text, Embedding::new(MODEL, dice.vector()).unwrap())
        })
        .collect();
    // One after another, as one user's agent remembers.
    for (text, embedding) in &facts {
        store.remember(owner, text, Some(embedding)).await.unwrap();
    }
    facts.into_iter().map(|(_, embedding)| embedding).collect()
}

/// The five vectors of `kept` nearest `query`, ranked in this process: the
/// floor of a ranking by vector, with nothing to read.
fn nearest(kept: &[Embedding], query: &Embedding) -> Vec<usize> {
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(6);
    for (at, embedding) in kept.iter().enumerate() {
        let score = Embedding::similarity(embedding.vector(), query.vector());
        if best.len() < 5 || score > best[best.len() - 1].0 {
            let place = best.partition_point(|(kept, _)| *kept >= score);
            best.insert(place, (score, at));
            best.truncate(5);
        }
    }
    best.into_iter().map(|(_, at)| at).collect()
}

async fn measure(name: &str, store: Arc<dyn SessionStore>, facts: usize) {
    let tenant = format!("bench-{}-{}", std::process::id(), tiller_ai::now_ms());
    let owner = MemoryOwner::new(&tenant, "ada");
    let started = Instant::now();
    let kept = fill(&store, &owner, facts, 7).await;
    fill(&store, &MemoryOwner::new(&tenant, "bob"), facts / 10, 11).await;
    let filled = started.elapsed();

    let mut dice = Dice(99);
    let mut recalls = Vec::with_capacity(QUERIES);
    let mut similar = Vec::with_capacity(QUERIES);
    let mut floor = Vec::with_capacity(QUERIES);
    let mut ranked = Vec::with_capacity(QUERIES);
    let mut found = 0;
    for round in 0..QUERIES {
        let query = dice.sentence(3);
        let started = Instant::now();
        found += store.recall(&owner, &query, 5).await.unwrap().len();
        recalls.push(started.elapsed());

        let query = Embedding::new(MODEL, dice.vector()).unwrap();
        if round % VECTOR_EVERY != 0 {
            continue;
        }
        let started = Instant::now();
        let near = store.recall_similar(&owner, &query, 5).await.unwrap();
        similar.push(started.elapsed());
        let started = Instant::now();
        let expected = nearest(&kept, &query);
        ranked.push(started.elapsed());
        if round == 0 {
            // The store found what ranking every vector here finds.
            let mut ids = Vec::new();
            for at in expected {
                let fact = store
                    .memories(&owner, at as u64, 1)
                    .await
                    .unwrap()
                    .remove(0);
                ids.push(fact.id);
            }
            let near: Vec<String> = near.into_iter().map(|fact| fact.id).collect();
            assert_eq!(near, ids, "{name}: the nearest five");
        }
    }
    let mut dice = Dice(101);
    for _ in 0..QUERIES {
        let place = dice.next() % facts as u64;
        let started = Instant::now();
        store.memories(&owner, place, 1).await.unwrap();
        floor.push(started.elapsed());
    }
    let (recall, floor) = (percentiles(&mut recalls), percentiles(&mut floor));
    let (similar, ranked) = (percentiles(&mut similar), percentiles(&mut ranked));
    println!(
        "{name}: {facts} facts remembered in {:.1} s; recall p50 {} p95 {} (floor, one fact by its place: p50 {} p95 {}); {:.1} facts found a query",
        filled.as_secs_f64(),
        show(recall.0),
        show(recall.1),
        show(floor.0),
        show(floor.1),
        found as f64 / QUERIES as f64
    );
    println!(
        "{name}: recall_similar ({DIMENSIONS} dimensions, {} queries) p50 {} p95 {} (floor, every vector ranked in memory: p50 {} p95 {})",
        QUERIES / VECTOR_EVERY,
        show(similar.0),
        show(similar.1),
        show(ranked.0),
        show(ranked.1),
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
