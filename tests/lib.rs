//! Cross-crate acceptance tests of Tiller. The README is included here so that its
//! Rust examples are compiled by `cargo test --workspace`.
#![doc = include_str!("../README.md")]
