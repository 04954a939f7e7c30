//! OpenAI's Responses API (`POST /responses`, streamed): the API that carries a
//! reasoning model's reasoning items from one turn to the next.

mod decode;
mod request;

pub(crate) use decode::Decoder;
pub(crate) use request::request;
