//! Embedding models: a text's meaning as a vector, so that texts can be found by
//! what they mean rather than by their words (memory's `recall`).
//!
//! An [`EmbeddingModel`] speaks one of three APIs ([`EmbeddingApi`]):
//! OpenAI's `POST /embeddings`, which OpenAI-compatible servers (llama.cpp's
//! `llama-server --embeddings`, vLLM, Ollama) serve too; Gemini's
//! `batchEmbedContents`; and Bedrock's `invoke` of an embedding model (Amazon
//! Titan Text Embeddings, Cohere Embed). Requests go through the same HTTP
//! layer as a model's: the same retries, limits, key rules (a key from the
//! environment only to its provider's own host) and SigV4 signing.
//!
//! ```
//! use tiller_ai::{EmbedPurpose, EmbeddingModel};
//!
//! let local = EmbeddingModel::openai_compatible("http://127.0.0.1:8081/v1", "nomic-embed");
//! // `local.embed(&["Ada's cat is Turing"], EmbedPurpose::Document, &options).await?`
//! assert_eq!(local.name(), "openai-compatible/nomic-embed");
//! let small = EmbeddingModel::openai("text-embedding-3-small").with_dimensions(256);
//! assert_eq!(small.name(), "openai/text-embedding-3-small@256");
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::StreamError;
use crate::http;
use crate::model::Model;
use crate::options::StreamOptions;
use crate::providers::{bedrock, path_segment};

/// The most texts one [`EmbeddingModel::embed`] call takes.
pub const MAX_EMBED_TEXTS: usize = 96;

/// What the texts to embed are: what is kept, or what it is searched with.
/// Gemini and Cohere embed the two differently (`RETRIEVAL_DOCUMENT` and
/// `RETRIEVAL_QUERY`; `search_document` and `search_query`); OpenAI's API does
/// not tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedPurpose {
    /// Texts kept, to be found later.
    Document,
    /// A search for kept texts.
    Query,
}

/// The API an embedding model speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbeddingApi {
    /// `POST {base_url}/embeddings`, OpenAI's and OpenAI-compatible servers'.
    #[serde(rename = "openai")]
    OpenAi,
    /// Gemini's `models/{id}:batchEmbedContents`.
    Gemini,
    /// Bedrock's `model/{id}/invoke` (Titan Text Embeddings; Cohere Embed for
    /// ids starting `cohere.`), one text a call for Titan.
    Bedrock,
}

/// A model that turns texts into vectors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingModel {
    /// The API it speaks.
    pub api: EmbeddingApi,
    /// The provider's name: it picks the environment variable a key is read
    /// from (`openai`: `OPENAI_API_KEY`; `gemini`: `GEMINI_API_KEY`; `bedrock`:
    /// AWS credentials), as for a chat model.
    pub provider: String,
    /// The model's id, such as `text-embedding-3-small`.
    pub id: String,
    /// Where the API lives, with its version prefix.
    pub base_url: String,
    /// How many dimensions to ask for, where the model can shorten its vectors;
    /// the model's own when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
}

impl EmbeddingModel {
    fn of(api: EmbeddingApi, provider: &str, base_url: &str, id: impl Into<String>) -> Self {
        EmbeddingModel {
            api,
            provider: provider.to_owned(),
            id: id.into(),
            base_url: base_url.to_owned(),
            dimensions: None,
        }
    }

    /// An OpenAI embedding model, such as `text-embedding-3-small`.
    pub fn openai(id: impl Into<String>) -> Self {
        Self::of(
            EmbeddingApi::OpenAi,
            "openai",
            "https://api.openai.com/v1",
            id,
        )
    }

    /// A model on any server with OpenAI's `/embeddings` (llama.cpp, vLLM,
    /// Ollama), at `base_url` (such as `http://127.0.0.1:8081/v1`).
    pub fn openai_compatible(base_url: impl Into<String>, id: impl Into<String>) -> Self {
        Self::of(
            EmbeddingApi::OpenAi,
            "openai-compatible",
            &base_url.into(),
            id,
        )
    }

    /// A Gemini embedding model, such as `gemini-embedding-001`.
    pub fn gemini(id: impl Into<String>) -> Self {
        Self::of(
            EmbeddingApi::Gemini,
            "gemini",
            "https://generativelanguage.googleapis.com/v1beta",
            id,
        )
    }

    /// A Bedrock embedding model, such as `amazon.titan-embed-text-v2:0`, in the
    /// region `AWS_REGION` names (as for chat models).
    pub fn bedrock(id: impl Into<String>) -> Self {
        Self::of(
            EmbeddingApi::Bedrock,
            "bedrock",
            bedrock::DEFAULT_ENDPOINT,
            id,
        )
    }

    /// The same model at `base_url`.
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// The same model asked for vectors of `dimensions`.
    pub fn with_dimensions(mut self, dimensions: u32) -> Self {
        self.dimensions = Some(dimensions);
        self
    }

    /// What its vectors are kept under: `provider/id`, and `@dimensions` when
    /// asked for. Vectors of different names are never compared.
    pub fn name(&self) -> String {
        match self.dimensions {
            Some(dimensions) => format!("{}/{}@{dimensions}", self.provider, self.id),
            None => format!("{}/{}", self.provider, self.id),
        }
    }

    /// The chat-model description the HTTP layer reads (address, provider, key).
    fn as_model(&self) -> Model {
        Model::openai_compatible(&self.base_url, &self.id).with_provider(&self.provider)
    }

    /// The vectors of `texts`, embedded for `purpose`, in their order: at most [`MAX_EMBED_TEXTS`]
    /// a call (more is a [`StreamError::InvalidRequest`]). An answer that does
    /// not hold one vector of numbers for each text is a
    /// [`StreamError::Malformed`].
    pub async fn embed(
        &self,
        texts: &[&str],
        purpose: EmbedPurpose,
        options: &StreamOptions,
    ) -> Result<Vec<Vec<f32>>, StreamError> {
        if texts.len() > MAX_EMBED_TEXTS {
            return Err(StreamError::InvalidRequest {
                message: format!(
                    "{} texts to embed, more than the {MAX_EMBED_TEXTS} a call takes",
                    texts.len()
                ),
            });
        }
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let model = self.as_model();
        let vectors = match self.api {
            EmbeddingApi::OpenAi => {
                let mut body =
                    json!({"model": self.id, "input": texts, "encoding_format": "float"});
                if let Some(dimensions) = self.dimensions {
                    body["dimensions"] = json!(dimensions);
                }
                let auth = http::api_key(&model, options)?.map(|key| key.bearer());
                let request =
                    http::post_json(&model, "embeddings", &body, &[ACCEPT_JSON], auth, options)?;
                let answer: OpenAiAnswer = read(request, options).await?;
                let mut data = answer.data;
                data.sort_by_key(|item| item.index);
                data.into_iter().map(|item| item.embedding).collect()
            }
            EmbeddingApi::Gemini => {
                let name = format!("models/{}", self.id);
                let task = match purpose {
                    EmbedPurpose::Document => "RETRIEVAL_DOCUMENT",
                    EmbedPurpose::Query => "RETRIEVAL_QUERY",
                };
                let requests: Vec<Value> = texts
                    .iter()
                    .map(|text| {
                        let mut request = json!({"model": name, "content": {"parts": [{"text": text}]}, "taskType": task});
                        if let Some(dimensions) = self.dimensions {
                            request["outputDimensionality"] = json!(dimensions);
                        }
                        request
                    })
                    .collect();
                let auth = http::api_key(&model, options)?
                    .map(|key| ("x-goog-api-key", key.expose().to_owned()));
                let path = format!("models/{}:batchEmbedContents", path_segment(&self.id));
                let body = json!({"requests": requests});
                let request = http::post_json(&model, &path, &body, &[ACCEPT_JSON], auth, options)?;
                let answer: GeminiAnswer = read(request, options).await?;
                answer
                    .embeddings
                    .into_iter()
                    .map(|item| item.values)
                    .collect()
            }
            EmbeddingApi::Bedrock if self.id.starts_with("cohere.") => {
                let input_type = match purpose {
                    EmbedPurpose::Document => "search_document",
                    EmbedPurpose::Query => "search_query",
                };
                let body = json!({"texts": texts, "input_type": input_type});
                let request = bedrock::post(&model, "invoke", &body, JSON, options)?;
                let answer: CohereAnswer = read(request, options).await?;
                answer.embeddings
            }
            EmbeddingApi::Bedrock => {
                let mut vectors = Vec::with_capacity(texts.len());
                for text in texts {
                    let mut body = json!({"inputText": text});
                    if let Some(dimensions) = self.dimensions {
                        body["dimensions"] = json!(dimensions);
                    }
                    let request = bedrock::post(&model, "invoke", &body, JSON, options)?;
                    let answer: TitanAnswer = read(request, options).await?;
                    vectors.push(answer.embedding);
                }
                vectors
            }
        };
        if vectors.len() != texts.len() || vectors.iter().any(Vec::is_empty) {
            return Err(StreamError::Malformed {
                message: format!(
                    "{} answered {} vectors for {} texts",
                    self.provider,
                    vectors.iter().filter(|vector| !vector.is_empty()).count(),
                    texts.len()
                ),
            });
        }
        Ok(vectors)
    }
}

const JSON: &str = "application/json";

/// The `accept` header of every embedding request (signed with it on Bedrock).
const ACCEPT_JSON: (&str, &str) = ("accept", JSON);

/// The answer to `request`, read whole and decoded.
async fn read<T: for<'de> Deserialize<'de>>(
    request: http::HttpRequest,
    options: &StreamOptions,
) -> Result<T, StreamError> {
    let body = http::fetch(request, options).await?;
    serde_json::from_slice(&body).map_err(|error| StreamError::Malformed {
        message: format!("an embedding answer that is not as expected: {error}"),
    })
}

#[derive(Deserialize)]
struct OpenAiAnswer {
    data: Vec<OpenAiVector>,
}

#[derive(Deserialize)]
struct OpenAiVector {
    #[serde(default)]
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct GeminiAnswer {
    embeddings: Vec<GeminiVector>,
}

#[derive(Deserialize)]
struct GeminiVector {
    values: Vec<f32>,
}

#[derive(Deserialize)]
struct TitanAnswer {
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct CohereAnswer {
    embeddings: Vec<Vec<f32>>,
}
