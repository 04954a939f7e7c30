//! The recorded provider exchanges in `fixtures/cassettes/<provider>/<name>.json`.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// One recorded conversation: requests in order, each answered by its response.
#[derive(Debug, Clone, Deserialize)]
pub struct Cassette {
    /// The provider folder it was loaded from (`openai`, `openai-responses`,
    /// `anthropic`, `llamacpp`, `gemini`, `bedrock`).
    #[serde(skip)]
    pub provider: String,
    /// The file name without `.json`.
    #[serde(skip)]
    pub name: String,
    /// Where the recording came from.
    pub source: String,
    /// The exchanges, in order.
    pub exchanges: Vec<Exchange>,
}

/// One request and its response.
#[derive(Debug, Clone, Deserialize)]
pub struct Exchange {
    /// What was sent.
    pub request: RecordedRequest,
    /// What came back.
    pub response: RecordedResponse,
}

/// A recorded request.
#[derive(Debug, Clone, Deserialize)]
pub struct RecordedRequest {
    /// The HTTP method.
    pub method: String,
    /// The path, such as `/v1/chat/completions`.
    pub path: String,
    /// The JSON body.
    pub body: Value,
}

/// A recorded response.
#[derive(Debug, Clone, Deserialize)]
pub struct RecordedResponse {
    /// The HTTP status.
    pub status: u16,
    /// The content type.
    pub content_type: String,
    /// The body, byte for byte; base64 when `body_encoding` says so (a binary
    /// event stream).
    pub body: String,
    /// `base64` for a binary body.
    #[serde(default)]
    pub body_encoding: Option<String>,
}

impl RecordedResponse {
    /// The body's bytes, decoded from base64 when it is binary.
    pub fn bytes(&self) -> Vec<u8> {
        use base64::Engine;
        match self.body_encoding.as_deref() {
            Some("base64") => base64::engine::general_purpose::STANDARD
                .decode(&self.body)
                .unwrap_or_else(|error| panic!("a recorded base64 body: {error}")),
            _ => self.body.clone().into_bytes(),
        }
    }
}

impl Exchange {
    /// Whether the request asked for a stream of the chat-completions, Responses,
    /// messages, Gemini or Bedrock Converse API.
    pub fn is_streaming_chat(&self) -> bool {
        let path = &self.request.path;
        let streamed = self.request.body.get("stream") == Some(&Value::Bool(true));
        let api = ["/chat/completions", "/responses", "/messages"];
        (streamed && api.iter().any(|end| path.ends_with(end)))
            || path.ends_with(":streamGenerateContent")
            || path.ends_with("/converse-stream")
    }
}

impl Cassette {
    /// The folder holding the cassettes.
    pub fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/cassettes")
    }

    /// Loads `<provider>/<name>.json`.
    pub fn load(provider: &str, name: &str) -> Cassette {
        let path = Self::dir().join(provider).join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let mut cassette: Cassette = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("cannot parse {}: {e}", path.display()));
        cassette.provider = provider.to_owned();
        cassette.name = name.to_owned();
        cassette
    }

    /// Every cassette of every provider, sorted by provider and name.
    pub fn all() -> Vec<Cassette> {
        let mut all = Vec::new();
        let mut providers: Vec<_> = std::fs::read_dir(Self::dir())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        providers.sort();
        for provider in providers {
            let mut names: Vec<_> = std::fs::read_dir(Self::dir().join(&provider))
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .filter_map(|file| file.strip_suffix(".json").map(str::to_owned))
                .collect();
            names.sort();
            all.extend(names.iter().map(|name| Cassette::load(&provider, name)));
        }
        all
    }

    /// Whether every exchange is a streamed chat request (the ones a replay can drive).
    pub fn is_streaming_chat(&self) -> bool {
        self.exchanges.iter().all(Exchange::is_streaming_chat)
    }
}
