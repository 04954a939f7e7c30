//! OpenAI chat completions, as spoken by OpenAI and compatible servers (llama.cpp,
//! vLLM, Ollama's `/v1`, OpenRouter, Groq, DeepSeek, Mistral).

mod decode;
mod request;

pub(crate) use decode::Decoder;
pub(crate) use request::{
    DataUrl, IMAGE_OMITTED, TOOL_IMAGES, reasoning_effort, request, tool_result_text,
};
