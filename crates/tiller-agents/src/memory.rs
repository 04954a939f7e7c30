//! Memory that outlives a session, per tenant and user (never across them):
//!
//! - a **working-memory document** the agent reads at the start of each run
//!   (added to its instructions) and replaces through the built-in
//!   `update_working_memory` tool;
//! - **facts** it keeps with `remember` and finds again with `recall`: the
//!   session store's full-text search (SQLite FTS5, PostgreSQL full-text; see
//!   [`SessionStore::recall`]).
//!
//! The user is the run's [`AgentContext`]: its `user_id`, within its tenant (or
//! [`DEFAULT_TENANT`](tiller_core::DEFAULT_TENANT)). An agent working for no
//! user has no memory: its tools say so, and its instructions get nothing. It is
//! set from Rust ([`MemoryConfig::applied_to`]) and agent files (`memory: {}`,
//! or `memory: {working: true, facts: true, recall_limit: 5}`).
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
use tiller_core::{AgentContext, AgentTool, FnTool, ToolError, ToolOutput, ToolSet, hook};
use tiller_runtime::AgentSettings;
use tiller_store::{MAX_RECALLED, MemoryOwner, SessionStore, StoreError};

/// The name of the tool that replaces the working-memory document.
pub const WORKING_MEMORY_TOOL: &str = "update_working_memory";
/// The name of the tool that keeps a fact.
pub const REMEMBER_TOOL: &str = "remember";
/// The name of the tool that finds facts kept before.
pub const RECALL_TOOL: &str = "recall";

/// What an agent remembers of its user: off unless [`MemoryConfig::applied_to`]
/// its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            working: true,
            facts: true,
            recall_limit: 5,
        }
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
        Ok(())
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
            added.push(remember(store.clone()));
            added.push(recall(store, self.recall_limit.clamp(1, MAX_RECALLED)));
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

fn remember(store: Arc<dyn SessionStore>) -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        REMEMBER_TOOL,
        "Keeps a fact about the user for later conversations, where `recall` finds it by its words. One self-contained fact a call.",
        json!({
            "type": "object",
            "properties": {"fact": {"type": "string", "description": "The fact, in a sentence."}},
            "required": ["fact"]
        }),
        move |args, ctx| {
            let store = store.clone();
            async move {
                let owner = owner(&ctx)?;
                let memory = store
                    .remember(&owner, &text_argument(&args, "fact"))
                    .await
                    .map_err(store_error)?;
                Ok(ToolOutput::text("Remembered.").with_details(json!({"id": memory.id})))
            }
        },
    ))
}

fn recall(store: Arc<dyn SessionStore>, limit: u32) -> Arc<dyn AgentTool> {
    Arc::new(FnTool::new(
        RECALL_TOOL,
        "Finds facts about the user kept in earlier conversations (with `remember`) that share words with `query`, best match first.",
        json!({
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Words the facts may hold."}},
            "required": ["query"]
        }),
        move |args, ctx| {
            let store = store.clone();
            async move {
                let owner = owner(&ctx)?;
                let query = text_argument(&args, "query");
                let found = store
                    .recall(&owner, &query, limit)
                    .await
                    .map_err(store_error)?;
                if found.is_empty() {
                    return Ok(ToolOutput::text(format!(
                        "Nothing remembered matches \"{query}\"."
                    )));
                }
                let lines: Vec<String> = found
                    .iter()
                    .map(|fact| format!("- {}", fact.text))
                    .collect();
                Ok(ToolOutput::text(lines.join("\n")))
            }
        },
    ))
}
