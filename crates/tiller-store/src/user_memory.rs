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
    /// once, when it is remembered).
    facts: Vec<(Memory, Vec<String>)>,
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
        own.facts.push((memory.clone(), search_terms(text)));
        Ok(memory)
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
            .filter_map(|(fact, words)| {
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
                .map(|(fact, _)| fact.clone())
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
                own.facts.retain(|(fact, _)| fact.id != id);
                (before - own.facts.len()) as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
