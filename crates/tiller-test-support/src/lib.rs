//! Test support shared by Tiller's crates: a real HTTP server on loopback that
//! answers with scripted or recorded responses (and the faults real providers
//! throw), captures every request it receives, and loads the recorded provider
//! exchanges under `fixtures/cassettes`; the server holds every request to the
//! transcript rules ([`rules`]). [`transcript`], [`events`] and [`tools`] are the
//! tests' shared kit; [`runtime`] their fixtures for agents. [`live`] finds or
//! starts the real local LLM servers of the end-to-end tests, [`postgres`] and
//! [`nats`] the PostgreSQL server and NATS clusters; [`workload`] is the
//! run the benchmarks measure; [`paced`] streams as a model does, for the
//! event-path benchmark; [`eventstream`] writes Bedrock's binary event stream.
//!
//! ```no_run
//! use tiller_test_support::{MockResponse, MockServer, sse};
//! # async fn demo() {
//! let server = MockServer::start().await;
//! server.push(MockResponse::status(429, "slow down").header("retry-after", "1"));
//! server.push(MockResponse::sse(sse::openai_text(&["Hel", "lo"])));
//! // point a model at server.base_url(), make requests, then:
//! let requests = server.requests();
//! # }
//! ```

#![allow(clippy::unwrap_used)]

mod cassette;
pub mod events;
pub mod eventstream;
pub mod heap;
pub mod hostile;
pub mod live;
pub mod nats;
pub mod paced;
pub mod postgres;
pub mod rules;
pub mod runtime;
mod server;
pub mod sqlite;
pub mod sse;
pub mod tools;
pub mod transcript;
pub mod workload;

pub use cassette::{Cassette, Exchange, RecordedRequest, RecordedResponse};
pub use server::{CapturedRequest, MockResponse, MockServer, closed_port_url};
