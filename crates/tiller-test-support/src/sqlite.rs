//! A fresh SQLite file for one test, in a folder of its own removed afterwards.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// A temporary SQLite store location; the folder goes when this is dropped (keep it
/// alive as long as the store is used).
#[derive(Debug)]
pub struct TempSqlite {
    dir: PathBuf,
    url: String,
}

impl TempSqlite {
    /// A new, empty location under the temp directory.
    ///
    /// # Panics
    /// When the folder cannot be made.
    pub fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tiller-sqlite-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", dir.display()));
        let url = format!("sqlite://{}", dir.join("sessions.db").display());
        TempSqlite { dir, url }
    }

    /// The store's URL, `sqlite://…/sessions.db`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Default for TempSqlite {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempSqlite {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
