//! The README, included so that its Rust example is compiled by
//! `cargo test --workspace`.
#![doc = include_str!("../README.md")]
