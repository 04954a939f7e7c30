//! Google's Gemini API: `streamGenerateContent` with `alt=sse`, the key sent as
//! `x-goog-api-key`.

mod decode;
mod request;

pub(crate) use decode::Decoder;
pub(crate) use request::request;
