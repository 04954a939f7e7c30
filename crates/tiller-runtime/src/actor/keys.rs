//! The idempotency keys an agent remembers: the newest
//! [`MAX_OP_KEYS`] of its session, loaded with it, so that an op retried after a
//! timeout — in this process, or in another after a failover — is acknowledged
//! without being applied twice. A key is remembered once its op is applied, and
//! written with the op's change.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use tiller_store::MAX_OP_KEYS;

#[derive(Default)]
pub(super) struct OpKeys {
    seen: HashSet<Arc<str>>,
    /// The same keys, oldest first, for forgetting the oldest.
    order: VecDeque<Arc<str>>,
}

impl OpKeys {
    /// The keys a session was loaded with, oldest first.
    pub(super) fn loaded(keys: Vec<Arc<str>>) -> Self {
        let mut remembered = OpKeys::default();
        for key in keys {
            remembered.remember(key);
        }
        remembered
    }

    /// Whether no key is remembered.
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Whether the op with `key` was applied.
    pub(super) fn seen(&self, key: &str) -> bool {
        self.seen.contains(key)
    }

    /// Remembers `key`, forgetting the oldest past [`MAX_OP_KEYS`].
    pub(super) fn remember(&mut self, key: Arc<str>) {
        if !self.seen.insert(key.clone()) {
            return;
        }
        self.order.push_back(key);
        if self.order.len() > MAX_OP_KEYS
            && let Some(oldest) = self.order.pop_front()
        {
            self.seen.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_keys_are_remembered_and_the_oldest_forgotten() {
        let key = |n: usize| Arc::<str>::from(format!("k{n}"));
        let mut keys = OpKeys::loaded((0..MAX_OP_KEYS).map(key).collect());
        assert!(keys.seen("k0"));
        keys.remember(key(5));
        assert!(keys.seen("k0"));
        keys.remember(key(MAX_OP_KEYS));
        assert!(!keys.seen("k0"));
        assert!(keys.seen("k1"));
        assert!(keys.seen(&format!("k{MAX_OP_KEYS}")));
    }
}
