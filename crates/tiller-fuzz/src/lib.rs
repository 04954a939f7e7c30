//! Fuzzing Tiller's decoders of outside input on stable Rust.
//!
//! Each [`targets`] function takes arbitrary bytes and drives one decoder the way
//! production does — an OpenAI (chat or Responses), Anthropic or Gemini event stream or
//! a Bedrock binary event stream fed in random splits, tool
//! arguments streamed as partial JSON, an agent file, a tool's schema and its
//! arguments — and checks what must hold whatever the bytes: no panic, and an answer
//! that is an event or a typed error (a stream always ends with exactly one terminal
//! event, within its limits). [`mutate`] makes new inputs from the checked-in corpus
//! (`corpus/`, seeded from the recorded exchanges by `seed.py`): bit flips, splices,
//! repeated ranges, and huge or odd numbers written over digits.
//!
//! `cargo run -p tiller-fuzz -- --inputs 20000` runs every target for that many
//! inputs (the seeds first) and exits non-zero if any failed, saving each failing
//! input under `target/fuzz-failures/`.
//!
//! ```
//! tiller_fuzz::targets::openai_sse(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n");
//! tiller_fuzz::targets::partial_json(b"{\"a\": [1, 2");
//! ```

pub mod mutate;
pub mod targets;
