//! What a store keeps of a user beyond any one session: a working-memory
//! document and the facts an agent chose to remember, per tenant and user (never
//! across them). [`SessionStore`](crate::SessionStore)'s memory methods read
//! and change them; `tiller_agents::MemoryConfig` gives agents the tools.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::StoreError;

/// The most bytes one remembered fact holds.
pub const MAX_MEMORY_BYTES: usize = 4 << 10;

/// The most bytes a working-memory document holds.
pub const MAX_WORKING_MEMORY_BYTES: usize = 16 << 10;

/// The most facts a store keeps for one user (of one tenant).
pub const MAX_MEMORIES: u64 = 100_000;

/// The most facts one recall answers with.
pub const MAX_RECALLED: u32 = 50;

/// The most facts one page of [`SessionStore::memories`](crate::SessionStore::memories) holds.
pub const MAX_MEMORY_PAGE: u32 = 1_000;

/// The most words of a recall's query that are searched for.
pub const MAX_QUERY_TERMS: usize = 32;

/// The longest word of a recall's query that is searched for, in characters
/// (longer ones are left out: no fact's word is that long, and PostgreSQL
/// refuses a word past 2 KiB).
pub const MAX_TERM_CHARS: usize = 64;

/// The most dimensions an [`Embedding`] has.
pub const MAX_EMBEDDING_DIMENSIONS: usize = 8_192;

/// The longest name of the model an [`Embedding`] comes from, in bytes.
pub const MAX_EMBEDDING_MODEL_BYTES: usize = 256;

/// A text's embedding: the model that made it (only embeddings of the same
/// model are compared) and its vector, scaled to length 1, so that a dot
/// product is the cosine similarity.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    model: String,
    vector: Vec<f32>,
}

impl Embedding {
    /// The embedding `vector` of the model `model` (1 to
    /// [`MAX_EMBEDDING_MODEL_BYTES`]), scaled to length 1; a vector with no
    /// dimension, more than [`MAX_EMBEDDING_DIMENSIONS`], one that is not a
    /// number or infinite, or of length 0, is a [`StoreError::BadEmbedding`].
    pub fn new(model: impl Into<String>, mut vector: Vec<f32>) -> Result<Self, StoreError> {
        let model = model.into();
        let bad = |why: String| Err(StoreError::BadEmbedding(why));
        if model.is_empty() || model.len() > MAX_EMBEDDING_MODEL_BYTES {
            return bad(format!(
                "a model's name is 1 to {MAX_EMBEDDING_MODEL_BYTES} bytes"
            ));
        }
        if vector.is_empty() || vector.len() > MAX_EMBEDDING_DIMENSIONS {
            return bad(format!(
                "{} dimensions, not 1 to {MAX_EMBEDDING_DIMENSIONS}",
                vector.len()
            ));
        }
        let length = vector
            .iter()
            .map(|value| f64::from(*value) * f64::from(*value))
            .sum::<f64>()
            .sqrt();
        if !length.is_finite() || length == 0.0 {
            return bad("a vector of length 0, or not of numbers".to_owned());
        }
        for value in &mut vector {
            *value = (f64::from(*value) / length) as f32;
        }
        Ok(Embedding { model, vector })
    }

    /// The model it comes from.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Its vector, of length 1.
    pub fn vector(&self) -> &[f32] {
        &self.vector
    }

    /// The cosine similarity of two vectors of length 1 and of the same
    /// dimensions (`-1` to `1`).
    pub fn similarity(a: &[f32], b: &[f32]) -> f32 {
        // Eight sums side by side, which the compiler keeps in vector
        // registers (one running sum would be added one product at a time).
        let (a_lanes, a_rest) = a.as_chunks::<8>();
        let (b_lanes, b_rest) = b.as_chunks::<8>();
        let mut sums = [0.0_f32; 8];
        for (a, b) in a_lanes.iter().zip(b_lanes) {
            for lane in 0..8 {
                sums[lane] += a[lane] * b[lane];
            }
        }
        let rest: f32 = a_rest.iter().zip(b_rest).map(|(a, b)| a * b).sum();
        sums.iter().sum::<f32>() + rest
    }

    /// Its vector as stored: little-endian `f32`s, one after another.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        self.vector
            .iter()
            .flat_map(|value| value.to_le_bytes())
            .collect()
    }

    /// A vector stored by [`Embedding::to_bytes`].
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn vector_of(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
        bytes
            .chunks_exact(4)
            .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
    }
}

/// Whose memory: a user of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MemoryOwner {
    /// The tenant.
    pub tenant: String,
    /// The user, within the tenant.
    pub user: String,
}

impl MemoryOwner {
    /// The user `user` of the tenant `tenant`.
    pub fn new(tenant: impl Into<String>, user: impl Into<String>) -> Self {
        MemoryOwner {
            tenant: tenant.into(),
            user: user.into(),
        }
    }
}

/// A remembered fact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    /// Its id (a time-ordered UUID).
    pub id: String,
    /// The fact, as the agent wrote it.
    pub text: String,
    /// When it was remembered, in milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// A fact as it may be stored: not blank, at most [`MAX_MEMORY_BYTES`].
pub fn check_memory(text: &str) -> Result<(), StoreError> {
    if text.trim().is_empty() {
        return Err(StoreError::EmptyMemory);
    }
    within(text, MAX_MEMORY_BYTES)
}

/// A working-memory document as it may be stored: at most
/// [`MAX_WORKING_MEMORY_BYTES`] (empty clears it).
pub fn check_working_memory(text: &str) -> Result<(), StoreError> {
    within(text, MAX_WORKING_MEMORY_BYTES)
}

fn within(text: &str, limit: usize) -> Result<(), StoreError> {
    if text.len() > limit {
        return Err(StoreError::MemoryTooLarge {
            bytes: text.len(),
            limit,
        });
    }
    Ok(())
}

/// The words a recall searches for: the query's runs of letters and digits,
/// lowercased, each once, at most [`MAX_QUERY_TERMS`] of them, none longer
/// than [`MAX_TERM_CHARS`]. Nothing else of the query reaches a database's
/// search syntax.
pub fn search_terms(query: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in query.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() || word.chars().nth(MAX_TERM_CHARS).is_some() {
            continue;
        }
        let word = word.to_lowercase();
        if !terms.contains(&word) {
            terms.push(word);
            if terms.len() == MAX_QUERY_TERMS {
                break;
            }
        }
    }
    terms
}

/// The memory of the users of a store kept in the process
/// ([`MemoryStore`](crate::MemoryStore)'s).
#[derive(Default)]
pub(crate) struct Memories {
    by_owner: HashMap<MemoryOwner, OwnMemories>,
}

#[derive(Default)]
struct OwnMemories {
    working: Option<String>,
    /// Oldest first, each with its words ([`search_terms`] of its text, made
    /// once, when it is remembered) and its embedding, if it has one.
    facts: Vec<(Memory, Vec<String>, Option<Embedding>)>,
}

impl Memories {
    pub(crate) fn working(&self, owner: &MemoryOwner) -> Option<String> {
        self.by_owner.get(owner)?.working.clone()
    }

    pub(crate) fn set_working(
        &mut self,
        owner: &MemoryOwner,
        text: &str,
    ) -> Result<(), StoreError> {
        check_working_memory(text)?;
        let own = self.by_owner.entry(owner.clone()).or_default();
        own.working = (!text.is_empty()).then(|| text.to_owned());
        Ok(())
    }

    pub(crate) fn remember(
        &mut self,
        owner: &MemoryOwner,
        text: &str,
        embedding: Option<&Embedding>,
    ) -> Result<Memory, StoreError> {
        check_memory(text)?;
        let own = self.by_owner.entry(owner.clone()).or_default();
        if own.facts.len() as u64 >= MAX_MEMORIES {
            return Err(StoreError::TooManyMemories {
                limit: MAX_MEMORIES,
            });
        }
        let memory = Memory {
            id: tiller_ai::new_id(),
            text: text.to_owned(),
            created_at: crate::types::now(),
        };
        own.facts
            .push((memory.clone(), search_terms(text), embedding.cloned()));
        Ok(memory)
    }

    /// The facts whose embeddings (of `query`'s model) are most like `query`,
    /// most alike first.
    pub(crate) fn recall_similar(
        &self,
        owner: &MemoryOwner,
        query: &Embedding,
        limit: u32,
    ) -> Vec<Memory> {
        let Some(own) = self.by_owner.get(owner) else {
            return Vec::new();
        };
        let scored = own.facts.iter().filter_map(|(fact, _, embedding)| {
            let embedding = embedding
                .as_ref()
                .filter(|e| e.model == query.model && e.vector.len() == query.vector.len())?;
            Some((
                Embedding::similarity(&embedding.vector, &query.vector),
                fact,
            ))
        });
        best(scored, limit)
            .into_iter()
            .map(|(_, fact)| fact.clone())
            .collect()
    }

    /// The facts sharing most words with `query`, newest first among equals: a
    /// word matches itself and itself with an `s` (no other stemming).
    pub(crate) fn recall(&self, owner: &MemoryOwner, query: &str, limit: u32) -> Vec<Memory> {
        let terms = search_terms(query);
        let Some(own) = self.by_owner.get(owner) else {
            return Vec::new();
        };
        let same = |a: &str, b: &str| {
            a == b || a.strip_suffix('s') == Some(b) || b.strip_suffix('s') == Some(a)
        };
        let mut scored: Vec<(usize, &Memory)> = own
            .facts
            .iter()
            .filter_map(|(fact, words, _)| {
                let score = terms
                    .iter()
                    .filter(|term| words.iter().any(|word| same(term, word)))
                    .count();
                (score > 0).then_some((score, fact))
            })
            .collect();
        scored.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.created_at.cmp(&a.1.created_at)));
        scored
            .into_iter()
            .take(limit.min(MAX_RECALLED) as usize)
            .map(|(_, fact)| fact.clone())
            .collect()
    }

    pub(crate) fn page(&self, owner: &MemoryOwner, offset: u64, limit: u32) -> Vec<Memory> {
        self.by_owner.get(owner).map_or_else(Vec::new, |own| {
            own.facts
                .iter()
                .skip(usize::try_from(offset).unwrap_or(usize::MAX))
                .take(limit.min(MAX_MEMORY_PAGE) as usize)
                .map(|(fact, _, _)| fact.clone())
                .collect()
        })
    }

    pub(crate) fn forget(&mut self, owner: &MemoryOwner, id: Option<&str>) -> u64 {
        match id {
            None => self
                .by_owner
                .remove(owner)
                .map_or(0, |own| own.facts.len() as u64),
            Some(id) => {
                let Some(own) = self.by_owner.get_mut(owner) else {
                    return 0;
                };
                let before = own.facts.len();
                own.facts.retain(|(fact, _, _)| fact.id != id);
                (before - own.facts.len()) as u64
            }
        }
    }
}

/// The `limit` (at most [`MAX_RECALLED`]) best scored of `scored`, best
/// first, keeping only so many while it reads them.
pub(crate) fn best<T>(scored: impl Iterator<Item = (f32, T)>, limit: u32) -> Vec<(f32, T)> {
    let limit = limit.min(MAX_RECALLED) as usize;
    let mut kept: Vec<(f32, T)> = Vec::with_capacity(limit + 1);
    for (score, item) in scored {
        if kept.len() == limit && kept.last().is_none_or(|(worst, _)| score <= *worst) {
            continue;
        }
        let at = kept.partition_point(|(kept, _)| *kept >= score);
        kept.insert(at, (score, item));
        kept.truncate(limit);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_embedding_is_scaled_to_length_one_and_checked() {
        let embedding = Embedding::new("m", vec![3.0, 4.0]).unwrap();
        assert_eq!(embedding.vector(), [0.6, 0.8]);
        let same = Embedding::new("m", vec![6.0, 8.0]).unwrap();
        assert!((Embedding::similarity(embedding.vector(), same.vector()) - 1.0).abs() < 1e-6);
        assert_eq!(
            Embedding::vector_of(&embedding.to_bytes()).collect::<Vec<_>>(),
            embedding.vector()
        );
        for (model, vector) in [
            ("m", vec![]),
            ("m", vec![0.0, 0.0]),
            ("m", vec![f32::NAN, 1.0]),
            ("m", vec![f32::INFINITY]),
            ("", vec![1.0]),
            ("m", vec![1.0; MAX_EMBEDDING_DIMENSIONS + 1]),
        ] {
            assert!(
                matches!(
                    Embedding::new(model, vector),
                    Err(StoreError::BadEmbedding(_))
                ),
                "{model}"
            );
        }
    }

    #[test]
    fn the_best_are_kept_best_first() {
        let scored = [0.1, 0.9, 0.5, 0.7, 0.2].into_iter().zip(0..);
        assert_eq!(best(scored, 3), [(0.9, 1), (0.7, 3), (0.5, 2)]);
        assert!(best([(1.0, ())].into_iter(), 0).is_empty());
    }

    #[test]
    fn a_query_is_reduced_to_its_words() {
        assert_eq!(
            search_terms("What's the user's NAME? name \"OR\" * -x"),
            ["what", "s", "the", "user", "name", "or", "x"]
        );
        assert!(search_terms("  ?!* ").is_empty());
        let long = "x".repeat(MAX_TERM_CHARS + 1);
        assert_eq!(search_terms(&format!("{long} name")), ["name"]);
        let long = "w ".repeat(10) + &(0..100).map(|i| format!("t{i} ")).collect::<String>();
        assert_eq!(search_terms(&long).len(), MAX_QUERY_TERMS);
    }

    #[test]
    fn facts_and_documents_have_their_bounds() {
        assert_eq!(check_memory(" \n"), Err(StoreError::EmptyMemory));
        assert_eq!(check_memory("The user is Ada"), Ok(()));
        assert_eq!(
            check_memory(&"x".repeat(MAX_MEMORY_BYTES + 1)),
            Err(StoreError::MemoryTooLarge {
                bytes: MAX_MEMORY_BYTES + 1,
                limit: MAX_MEMORY_BYTES
            })
        );
        assert_eq!(check_working_memory(""), Ok(()));
        assert!(check_working_memory(&"x".repeat(MAX_WORKING_MEMORY_BYTES)).is_ok());
    }
}
