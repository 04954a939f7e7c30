//! Anthropic's messages API.

mod decode;
mod request;

pub(crate) use decode::Decoder;
pub(crate) use request::{request, token_limits};
