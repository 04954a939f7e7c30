//! Amazon Bedrock's Converse API, streamed (`converse-stream`): requests signed
//! with SigV4, answers in AWS's binary event stream.

mod credentials;
mod decode;
mod request;

pub(crate) use credentials::DEFAULT_ENDPOINT;
pub(crate) use decode::Decoder;
pub(crate) use request::{post, request};
