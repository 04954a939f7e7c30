//! The ids Tiller makes up: for agents and sessions a caller did not name, and for
//! tool calls a server sent without one.

/// A new id: a UUID of version 7 (RFC 9562) in its usual text form, such as
/// `019ab3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b` — random (74 bits), URL-safe, and
/// time-ordered: ids made later sort after earlier ones, across restarts and
/// processes, so they never repeat the way a counter started again from 1 does.
///
/// ```
/// let (first, second) = (tiller_ai::new_id(), tiller_ai::new_id());
/// assert_eq!(first.len(), 36);
/// assert!(first < second);
/// ```
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
mod tests {
    use super::new_id;

    #[test]
    fn ids_are_unique_and_sort_in_the_order_made() {
        let ids: Vec<String> = (0..10_000).map(|_| new_id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids);
        assert!(ids[0].chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
    }
}
