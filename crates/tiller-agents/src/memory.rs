//! Memory that outlives a session, per tenant and user (never across them):
//!
//! - a **working-memory document** the agent reads at the start of each run
//!   (added to its instructions) and replaces through the built-in
//!   `update_working_memory` tool;
//! - **facts** it keeps with `remember` and finds again with `recall`: the
//!   session store's full-text search (SQLite FTS5, PostgreSQL full-text; see
//!   [`SessionStore::recall`]) and, with an embedding model
//!   ([`EmbeddingsConfig`]), their meaning: each fact is kept with its vector
//!   and a recall ranks both ways, the two rankings fused (reciprocal rank
//!   fusion), so a fact found by its words or by its meaning comes back.
//!
//! The user is the run's [`AgentContext`]: its `user_id`, within its tenant (or
//! [`DEFAULT_TENANT`](tiller_core::DEFAULT_TENANT)). An agent working for no
//! user has no memory: its tools say so, and its instructions get nothing. It is
//! set from Rust ([`MemoryConfig::applied_to`]) and agent files (`memory: {}`,
//! or `memory: {working: true, facts: true, recall_limit: 5, embeddings:
//! {provider: openai, model: text-embedding-3-small}}`).
//!
//! ```
//! use std::sync::Arc;
//! use tiller::{AgentSettings, agents::MemoryConfig, store::SessionStore};
//! # let model = tiller::faux::FauxProvider::new().model();
//! let store: Arc<dyn SessionStore> = Arc::new(tiller::store::MemoryStore::new());
//! let settings = MemoryConfig::default().applied_to(AgentSettings::new(model), store);
//! let tools: Vec<&str> = settings.code.tools.tools().map(|tool| tool.name()).collect();
//! assert_eq!(tools, ["update_working_memory", "remember", "recall"]);
//! assert!(settings.code.hooks.instructions.is_some());
//! ```

use std::sync::Arc;

use serde_json::{Value, json};
use tiller_ai::{ApiKey, EmbedPurpose, EmbeddingModel, StreamOptions};
use tiller_core::{AgentContext, AgentTool, FnTool, ToolError, ToolOutput, ToolSet, hook};
use tiller_runtime::AgentSettings;
use tiller_store::{
    Embedding, MAX_EMBEDDING_DIMENSIONS, MAX_RECALLED, Memory, MemoryOwner, SessionStore,
    StoreError,
};

/// The name of the tool that replaces the working-memory document.
pub const WORKING_MEMORY_TOOL: &str = "update_working_memory";
/// The name of the tool that keeps a fact.
pub const REMEMBER_TOOL: &str = "remember";
/// The name of the tool that finds facts kept before.
pub const RECALL_TOOL: &str = "recall";

/// The longest an embedding call may take, retries included; past it the fact
/// is kept (or the recall made) by words only.
pub const EMBED_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// What an agent remembers of its user: off unless [`MemoryConfig::applied_to`]
/// its settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// The working-memory document, read at each run's start and replaced by
    /// `update_working_memory` (default on).
    pub working: bool,
    /// Facts kept by `remember` and found by `recall` (default on).
    pub facts: bool,
    /// The most facts one `recall` answers with (default 5, at most
    /// [`MAX_RECALLED`]).
    pub recall_limit: u32,
    /// The model that embeds facts and queries, for recall by meaning as well
    /// as by words; words only when `None` (the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<EmbeddingsConfig>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            working: true,
            facts: true,
            recall_limit: 5,
            embeddings: None,
        }
    }
}

/// The embedding model of an agent's memory, as an agent file names it:
/// `{provider: openai, model: text-embedding-3-small}`; `{provider: gemini,
/// model: gemini-embedding-001}`; `{provider: bedrock, model:
/// amazon.titan-embed-text-v2:0}`; or any OpenAI-compatible server (llama.cpp,
/// vLLM, Ollama) by a name of its own and its `base_url`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsConfig {
    /// `openai`, `gemini`, `bedrock`, or a name for an OpenAI-compatible server.
    pub provider: String,
    /// The model's id.
    pub model: String,
    /// Where its API lives (the provider's own when `None`; needed for any
    /// provider but the three).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// How many dimensions to ask for, where the model can shorten its vectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// The environment variable holding its API key, sent to `base_url`
    /// whatever its host (the provider's own variable otherwise, sent only to
    /// the provider's own host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

impl EmbeddingsConfig {
    /// Why it cannot be used, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.model.trim().is_empty() {
            return Err("embeddings.model names no model".to_owned());
        }
        let known = ["openai", "gemini", "bedrock"].contains(&self.provider.as_str());
        if !known && self.base_url.is_none() {
            return Err(format!(
                "embeddings.provider `{}` is not openai, gemini or bedrock: give the OpenAI-compatible server's base_url",
                self.provider
            ));
        }
        if let Some(variable) = &self.api_key_env {
            crate::agent_file::check_variable_name(variable, "embeddings.api_key_env".to_owned())
                .map_err(|(field, message)| format!("{field}: {message}"))?;
        }
        if let Some(dimensions) = self.dimensions
            && !(1..=MAX_EMBEDDING_DIMENSIONS).contains(&(dimensions as usize))
        {
            return Err(format!(
                "embeddings.dimensions must be from 1 to {MAX_EMBEDDING_DIMENSIONS}, not {dimensions}"
            ));
        }
        Ok(())
    }

    /// The model it names.
    pub fn model(&self) -> EmbeddingModel {
        let model = match self.provider.as_str() {
            "openai" => EmbeddingModel::openai(&self.model),
            "gemini" => EmbeddingModel::gemini(&self.model),
            "bedrock" => EmbeddingModel::bedrock(&self.model),
            other => {
                let mut model = EmbeddingModel::openai_compatible(
                    self.base_url.clone().unwrap_or_default(),
                    &self.model,
                );
                other.clone_into(&mut model.provider);
                model
            }
        };
        let model = match &self.base_url {
            Some(base_url) => model.with_base_url(base_url),
            None => model,
        };
        match self.dimensions {
            Some(dimensions) => model.with_dimensions(dimensions),
            None => model,
        }
    }
}

/// An embedding model ready to embed: the model and the options its requests
/// go with (its key, when the configuration names a variable).
#[derive(Debug)]
struct Embedder {
    model: EmbeddingModel,
    name: String,
    api_key_env: Option<String>,
}

impl Embedder {
    fn of(config: &EmbeddingsConfig) -> Arc<Embedder> {
        let model = config.model();
        Arc::new(Embedder {
            name: model.name(),
            model,
            api_key_env: config.api_key_env.clone(),
        })
    }

    /// The embedding of `text` for `purpose`, within [`EMBED_DEADLINE`], or
    /// why there is none.
    async fn embed(&self, text: &str, purpose: EmbedPurpose) -> Result<Embedding, String> {
        let mut options = StreamOptions {
            response_deadline: Some(EMBED_DEADLINE),
            idle_timeout: Some(EMBED_DEADLINE),
            ..StreamOptions::default()
        };
        if let Some(variable) = &self.api_key_env {
            let key = std::env::var(variable)
                .ok()
                .filter(|key| !key.trim().is_empty())
                .ok_or_else(|| format!("{variable} holds no API key"))?;
            options.transport.api_key = Some(ApiKey::new(key.trim()));
        }
        let vector = self
            .model
            .embed(&[text], purpose, &options)
            .await
            .map_err(|error| error.to_string())?
            .pop()
            .unwrap_or_default();
        Embedding::new(self.name.clone(), vector).map_err(|error| error.to_string())
    }
}

/// Whose memory an agent of `context` reads: its user within its tenant; none
/// when it works for no user (or one whose id is empty).
pub fn owner_of(context: &AgentContext) -> Option<MemoryOwner> {
    let user = context.user_id().filter(|user| !user.is_empty())?;
    Some(MemoryOwner::new(context.tenant_id_or_default(), user))
}

impl MemoryConfig {
    /// Why this configuration cannot be used, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_RECALLED).contains(&self.recall_limit) {
            return Err(format!(
                "recall_limit must be from 1 to {MAX_RECALLED}, not {}",
                self.recall_limit
            ));
        }
        if !self.working && !self.facts {
            return Err("neither `working` nor `facts`: nothing to remember".to_owned());
        }
        match &self.embeddings {
            Some(embeddings) => embeddings.check(),
            None => Ok(()),
        }
    }

    /// `settings` remembering their user in `store`: the memory tools (those the
    /// agent has not got already) and, with `working`, instructions holding the
    /// working memory (after any instructions the settings write). The tools
    /// come with the memory, not the definition: the session does not store them.
    pub fn applied_to(
        self,
        mut settings: AgentSettings,
        store: Arc<dyn SessionStore>,
    ) -> AgentSettings {
        let mut added: Vec<Arc<dyn AgentTool>> = Vec::new();
        if self.working {
            added.push(update_working_memory(store.clone()));
            settings.code.hooks.instructions = Some(working_memory_instructions(
                store.clone(),
                settings.code.hooks.instructions.take(),
            ));
        }
        if self.facts {
            let embedder = self.embeddings.as_ref().map(Embedder::of);
            added.push(remember(store.clone(), embedder.clone()));
            added.push(recall(
                store,
                embedder,
                self.recall_limit.clamp(1, MAX_RECALLED),
            ));
        }
        let has = |name: &str| settings.code.tools.tools().any(|tool| tool.name() == name);
        added.retain(|tool| !has(tool.name()));
        let tools = settings.code.tools.tools().cloned().chain(added);
        if let Ok(tools) = ToolSet::new(tools) {
            settings.code.tools = tools;
        }
        settings
    }
}

/// The working memory of the run's user, after what `before` writes.
fn working_memory_instructions(
    store: Arc<dyn SessionStore>,
    before: Option<tiller_core::Instructions>,
) -> tiller_core::Instructions {
    hook::instructions(move |context| {
        let store = store.clone();
        let before = before.as_ref().map(|write| write(context));
        let owner = owner_of(context);
        async move {
            let before = match before {
                Some(pending) => pending.await?,
                None => None,
            };
            let Some(owner) = owner else {
                return Ok(before);
            };
            let document = match store.working_memory(&owner).await {
                // A store of the host's own that keeps no memory: none to add.
                Err(StoreError::Unsupported(_)) => return Ok(before),
                read => read?,
            };
            let memory = format!(
                "## Working memory\nWhat you keep about this user across conversations. Replace it whole with `{WORKING_MEMORY_TOOL}` when you learn something lasting about them.\n<working_memory>\n{}\n</working_memory>",
                document.as_deref().unwrap_or("(empty)")
            );
            Ok(Some(match before {
                Some(before) if !before.is_empty() => format!("{before}\n\n{memory}"),
                _ => memory,
            }))
        }
    })
}

/// The owner of a tool call's memory, or why it has none.
fn owner(ctx: &tiller_core::ToolContext) -> Result<MemoryOwner, ToolError> {
    owner_of(ctx.agent()).ok_or_else(|| {
        ToolError::new("memory is kept per user, and this conversation has no user id")
    })
}

fn store_error(error: StoreError) -> ToolError {
    ToolError::new(error.to_string())
}

fn text_argument(args: &Value, name: &str) -> String {
    args[name].as_str().unwrap_or_default().to_owned()
}

fn update_working_memory(store: Arc<dyn SessionStore>) -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        WORKING_MEMORY_TOOL,
        "Replaces the user's working memory, the notes you read at the start of every conversation with them (name, preferences, ongoing goals), with `document`, whole. Keep what still holds; an empty document clears it.",
        json!({
            "type": "object",
            "properties": {"document": {"type": "string", "description": "The whole new working memory."}},
            "required": ["document"]
        }),
        move |args, ctx| {
            let store = store.clone();
            async move {
                let owner = owner(&ctx)?;
                let document = text_argument(&args, "document");
                store
                    .set_working_memory(&owner, &document)
                    .await
                    .map_err(store_error)?;
                Ok(ToolOutput::text(format!(
                    "Working memory saved ({} bytes).",
                    document.len()
                )))
            }
        },
    ))
}

fn remember(store: Arc<dyn SessionStore>, embedder: Option<Arc<Embedder>>) -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        REMEMBER_TOOL,
        "Keeps a fact about the user for later conversations, where `recall` finds it again. One self-contained fact a call.",
        json!({
            "type": "object",
            "properties": {"fact": {"type": "string", "description": "The fact, in a sentence."}},
            "required": ["fact"]
        }),
        move |args, ctx| {
            let (store, embedder) = (store.clone(), embedder.clone());
            async move {
                let owner = owner(&ctx)?;
                let fact = text_argument(&args, "fact");
                tiller_store::check_memory(&fact).map_err(store_error)?;
                // A fact whose embedding fails is kept all the same, found by
                // its words.
                let embedded = match &embedder {
                    Some(embedder) => Some(embedder.embed(&fact, EmbedPurpose::Document).await),
                    None => None,
                };
                let vector = embedded
                    .as_ref()
                    .and_then(|embedded| embedded.as_ref().ok());
                let memory = store
                    .remember(&owner, &fact, vector)
                    .await
                    .map_err(store_error)?;
                let said = match embedded {
                    Some(Err(why)) => format!(
                        "Remembered, to be found by its words only (it could not be embedded: {why})."
                    ),
                    _ => "Remembered.".to_owned(),
                };
                Ok(ToolOutput::text(said).with_details(json!({"id": memory.id})))
            }
        },
    ))
}

fn recall(
    store: Arc<dyn SessionStore>,
    embedder: Option<Arc<Embedder>>,
    limit: u32,
) -> Arc<dyn AgentTool> {
    let description = match embedder {
        Some(_) => {
            "Finds facts about the user kept in earlier conversations (with `remember`) that share words or meaning with `query`, best match first."
        }
        None => {
            "Finds facts about the user kept in earlier conversations (with `remember`) that share words with `query`, best match first."
        }
    };
    Arc::new(FnTool::new(
        RECALL_TOOL,
        description,
        json!({
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Words the facts may hold."}},
            "required": ["query"]
        }),
        move |args, ctx| {
            let (store, embedder) = (store.clone(), embedder.clone());
            async move {
                let owner = owner(&ctx)?;
                let query = text_argument(&args, "query");
                let by_words = store
                    .recall(&owner, &query, limit)
                    .await
                    .map_err(store_error)?;
                // By meaning as well, when it can be had: words alone otherwise.
                let by_meaning = match &embedder {
                    None => Ok(None),
                    Some(embedder) => match embedder.embed(&query, EmbedPurpose::Query).await {
                        Ok(embedding) => store
                            .recall_similar(&owner, &embedding, limit)
                            .await
                            .map(Some)
                            .map_err(|error| error.to_string()),
                        Err(why) => Err(format!("the query could not be embedded: {why}")),
                    },
                };
                let (found, unembedded) = match by_meaning {
                    Ok(None) => (by_words, None),
                    Ok(Some(by_meaning)) => (fused(&[by_meaning, by_words], limit), None),
                    Err(why) => (by_words, Some(why)),
                };
                let mut lines: Vec<String> = found
                    .iter()
                    .map(|fact| format!("- {}", fact.text))
                    .collect();
                if lines.is_empty() {
                    lines.push(format!("Nothing remembered matches \"{query}\"."));
                }
                if let Some(why) = unembedded {
                    lines.push(format!("(Found by words only: {why}.)"));
                }
                Ok(ToolOutput::text(lines.join("\n")))
            }
        },
    ))
}

/// Reciprocal rank fusion of `rankings` (each best first): a fact's score is
/// the sum of `1 / (60 + its rank)` over the rankings that hold it; the best
/// `limit`, ties to the earlier ranking's order.
fn fused(rankings: &[Vec<Memory>], limit: u32) -> Vec<Memory> {
    let mut scored: Vec<(f64, &Memory)> = Vec::new();
    for ranking in rankings {
        for (rank, fact) in ranking.iter().enumerate() {
            let score = 1.0 / (60.0 + rank as f64 + 1.0);
            match scored.iter_mut().find(|(_, kept)| kept.id == fact.id) {
                Some((kept, _)) => *kept += score,
                None => scored.push((score, fact)),
            }
        }
    }
    // A stable sort: equal scores keep the order they were met in.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored
        .into_iter()
        .take(limit as usize)
        .map(|(_, fact)| fact.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(id: &str) -> Memory {
        Memory {
            id: id.to_owned(),
            text: id.to_owned(),
            created_at: 0,
        }
    }

    #[test]
    fn rankings_are_fused_by_reciprocal_rank() {
        let ids = |found: Vec<Memory>| found.into_iter().map(|f| f.id).collect::<Vec<_>>();
        let by_meaning = vec![fact("a"), fact("b"), fact("c")];
        let by_words = vec![fact("c"), fact("d")];
        assert_eq!(
            ids(fused(&[by_meaning.clone(), by_words.clone()], 5)),
            ["c", "a", "b", "d"]
        );
        assert_eq!(ids(fused(&[by_meaning, by_words], 2)), ["c", "a"]);
        assert!(fused(&[vec![], vec![]], 5).is_empty());
    }

    #[test]
    fn an_embeddings_configuration_names_what_is_wrong() {
        let config =
            |provider: &str, base_url: Option<&str>, dimensions: Option<u32>| EmbeddingsConfig {
                provider: provider.to_owned(),
                model: "m".to_owned(),
                base_url: base_url.map(str::to_owned),
                dimensions,
                api_key_env: None,
            };
        assert_eq!(config("openai", None, Some(256)).check(), Ok(()));
        assert_eq!(
            config("openai", None, Some(256)).model().name(),
            "openai/m@256"
        );
        let local = config("llamacpp", Some("http://127.0.0.1:8081/v1"), None);
        assert_eq!(local.check(), Ok(()));
        assert_eq!(
            (local.model().name(), local.model().base_url),
            (
                "llamacpp/m".to_owned(),
                "http://127.0.0.1:8081/v1".to_owned()
            )
        );
        assert!(
            config("llamacpp", None, None)
                .check()
                .unwrap_err()
                .contains("base_url")
        );
        assert!(
            config("openai", None, Some(0))
                .check()
                .unwrap_err()
                .contains("dimensions")
        );
    }
}
