//! Writing a messages request.
//!
//! Roles alternate: consecutive messages of one role merge into one turn, and tool
//! results become `tool_result` blocks of a user turn. Thinking from an Anthropic
//! response is replayed with its signature (redacted thinking as its data); thinking
//! without a signature, or from another API, is dropped because Anthropic would
//! reject it. Tool call ids are reduced to the characters Anthropic accepts, the
//! same way in calls and results. Files are `document` blocks, in user turns and
//! tool results alike: a PDF as base64, UTF-8 text of any `text/` type as plain
//! text; other files are refused. The system prompt and the last block of the
//! conversation are marked for prompt caching. The body borrows from the context.

use std::borrow::Cow;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::context::{ContextRef, Tool};
use crate::error::StreamError;
use crate::file::FileContent;
use crate::http::{self, HttpRequest};
use crate::message::{AssistantContent, Content, Message};
use crate::model::{Api, Model};
use crate::options::{StreamOptions, ToolChoice};
use crate::providers::{OUTPUT_TOOL_DESCRIPTION, check_files, safe_tool_id};

const API_VERSION: &str = "2023-06-01";
/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: u32 = 1_024;

pub(crate) fn request(
    model: &Model,
    context: ContextRef<'_>,
    options: &StreamOptions,
) -> Result<HttpRequest, StreamError> {
    check_files(model, context, |file, _| document_source(file).is_some())?;
    let auth = http::api_key(model, options)?.map(|key| ("x-api-key", key.expose().to_owned()));
    let body = body(model, context, options);
    http::post_json(
        model,
        "messages",
        &body,
        &[("anthropic-version", API_VERSION)],
        auth,
        options,
    )
}

fn body<'a>(model: &'a Model, context: ContextRef<'a>, options: &'a StreamOptions) -> Body<'a> {
    let mut turns: Vec<Turn<'a>> = Vec::with_capacity(context.messages.len());
    for message in context.messages {
        let (role, blocks) = match message {
            Message::User(user) => (
                "user",
                user.content.iter().filter_map(content_block).collect(),
            ),
            Message::Assistant(assistant) => {
                let replay_thinking = assistant.api == Api::AnthropicMessages;
                let blocks = assistant
                    .content
                    .iter()
                    .filter_map(|block| assistant_block(block, replay_thinking))
                    .collect();
                ("assistant", blocks)
            }
            Message::ToolResult(result) => {
                let block = Block::ToolResult {
                    tool_use_id: safe_tool_id(&result.tool_call_id),
                    content: result.content.iter().filter_map(content_block).collect(),
                    is_error: result.is_error,
                    cache_control: None,
                };
                ("user", vec![block])
            }
        };
        push_turn(&mut turns, role, blocks);
    }
    if let Some(last) = turns.last_mut().and_then(|turn| turn.content.last_mut()) {
        last.mark_cached();
    }

    let mut system: Vec<Block<'a>> = context
        .system_prompt
        .filter(|prompt| !prompt.is_empty())
        .map(|text| Block::Text {
            text,
            cache_control: None,
        })
        .into_iter()
        .collect();
    if let Some(block) = system.last_mut() {
        block.mark_cached();
    }

    let (max_tokens, budget) = token_limits(model, options);
    let thinking = budget.map(|budget_tokens| Thinking {
        kind: "enabled",
        budget_tokens,
    });
    let mut tools: Vec<ToolDefinition<'a>> =
        context.tools.iter().map(ToolDefinition::from).collect();
    let mut tool_choice = options
        .tool_choice
        .as_ref()
        .filter(|_| !context.tools.is_empty())
        .map(Cow::Borrowed);
    // Structured output: the answer is a call of a tool whose input schema is the
    // output schema, forced unless the caller forces a tool of its own (or thinking
    // is on, which Anthropic does not allow with a forced tool).
    if let Some(output) = &options.output_schema {
        tools.push(ToolDefinition {
            name: &output.name,
            description: OUTPUT_TOOL_DESCRIPTION,
            input_schema: &output.schema,
        });
        let forced_by_caller = options
            .tool_choice
            .as_ref()
            .is_some_and(ToolChoice::forces_a_call);
        if !forced_by_caller && thinking.is_none() {
            tool_choice = Some(Cow::Owned(if context.tools.is_empty() {
                ToolChoice::Tool(output.name.clone())
            } else {
                ToolChoice::Required
            }));
        }
    }
    Body {
        model: &model.id,
        max_tokens,
        system,
        messages: turns,
        tools,
        tool_choice: tool_choice.map(WireToolChoice),
        stream: true,
        temperature: if thinking.is_some() {
            None
        } else {
            options.temperature
        },
        thinking,
    }
}

/// The output limit and thinking budget of a Claude model (on Anthropic's API or
/// Bedrock's). A budget comes on top of the answer's own limit, within the model's
/// maximum, and always leaves room for an answer.
pub(crate) fn token_limits(model: &Model, options: &StreamOptions) -> (u32, Option<u32>) {
    let budget = model
        .reasoning
        .then(|| options.thinking_budgets.for_level(options.thinking))
        .flatten();
    let Some(budget) = budget else {
        return (options.max_tokens.unwrap_or(model.max_tokens), None);
    };
    let max_tokens = options.max_tokens.map_or(model.max_tokens, |answer| {
        answer.saturating_add(budget).min(model.max_tokens)
    });
    let budget = budget.min(max_tokens.saturating_sub(MIN_THINKING_BUDGET));
    (
        max_tokens,
        (budget >= MIN_THINKING_BUDGET).then_some(budget),
    )
}

fn push_turn<'a>(turns: &mut Vec<Turn<'a>>, role: &'static str, blocks: Vec<Block<'a>>) {
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => last.content.extend(blocks),
        _ => turns.push(Turn {
            role,
            content: blocks,
        }),
    }
}

fn content_block(content: &Content) -> Option<Block<'_>> {
    match content {
        Content::Text(text) if text.text.is_empty() => None,
        Content::Text(text) => Some(Block::Text {
            text: &text.text,
            cache_control: None,
        }),
        Content::Image(image) => Some(Block::Image {
            source: ImageSource {
                kind: "base64",
                media_type: &image.mime_type,
                data: &image.data,
            },
            cache_control: None,
        }),
        Content::File(file) => Some(Block::Document {
            source: document_source(file)?,
            title: &file.name,
            cache_control: None,
        }),
    }
}

/// A document's source: a PDF as base64, UTF-8 text (plain, Markdown, CSV,
/// HTML…) as plain text; `None` for what Anthropic does not take.
fn document_source(file: &FileContent) -> Option<DocumentSource<'_>> {
    if file.is_pdf() {
        Some(DocumentSource::Base64 {
            media_type: &file.mime_type,
            data: &file.data,
        })
    } else if file.mime_type.starts_with("text/") {
        let text = String::from_utf8(file.bytes()).ok()?;
        Some(DocumentSource::Text {
            media_type: "text/plain",
            data: text,
        })
    } else {
        None
    }
}

fn assistant_block(block: &AssistantContent, replay_thinking: bool) -> Option<Block<'_>> {
    match block {
        AssistantContent::Text(text) if text.text.is_empty() => None,
        AssistantContent::Text(text) => Some(Block::Text {
            text: &text.text,
            cache_control: None,
        }),
        AssistantContent::Thinking(thinking) => {
            let signature = thinking.signature.as_deref().filter(|_| replay_thinking)?;
            Some(if thinking.redacted {
                Block::RedactedThinking { data: signature }
            } else {
                Block::Thinking {
                    thinking: &thinking.thinking,
                    signature,
                }
            })
        }
        AssistantContent::ToolCall(call) => Some(Block::ToolUse {
            id: safe_tool_id(&call.id),
            name: &call.name,
            input: if call.arguments.is_object() {
                Cow::Borrowed(&call.arguments)
            } else {
                Cow::Owned(Value::Object(Map::new()))
            },
        }),
    }
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<Block<'a>>,
    messages: Vec<Turn<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ToolDefinition<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
}

/// `{"type": "auto" | "none" | "any"}` or `{"type": "tool", "name": ...}`.
struct WireToolChoice<'a>(Cow<'a, ToolChoice>);

impl Serialize for WireToolChoice<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Choice<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            name: Option<&'a str>,
        }
        let (kind, name) = match &*self.0 {
            ToolChoice::Auto => ("auto", None),
            ToolChoice::None => ("none", None),
            ToolChoice::Required => ("any", None),
            ToolChoice::Tool(name) => ("tool", Some(name.as_str())),
        };
        Choice { kind, name }.serialize(serializer)
    }
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
    Image {
        source: ImageSource<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
    Document {
        source: DocumentSource<'a>,
        title: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: &'a str,
        input: Cow<'a, Value>,
    },
    ToolResult {
        tool_use_id: Cow<'a, str>,
        content: Vec<Block<'a>>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
}

/// `{"type": "base64", "media_type": "application/pdf", "data": …}` or
/// `{"type": "text", "media_type": "text/plain", "data": …}`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum DocumentSource<'a> {
    Base64 {
        media_type: &'a str,
        data: &'a str,
    },
    Text {
        media_type: &'static str,
        data: String,
    },
}

impl Block<'_> {
    /// Marks the block as the end of a cacheable prefix, where Anthropic allows it.
    fn mark_cached(&mut self) {
        match self {
            Block::Text { cache_control, .. }
            | Block::Image { cache_control, .. }
            | Block::Document { cache_control, .. }
            | Block::ToolResult { cache_control, .. } => {
                *cache_control = Some(CacheControl { kind: "ephemeral" });
            }
            Block::Thinking { .. } | Block::RedactedThinking { .. } | Block::ToolUse { .. } => {}
        }
    }
}

#[derive(Serialize)]
struct CacheControl {
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct ImageSource<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    media_type: &'a str,
    data: &'a str,
}

#[derive(Serialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}

#[derive(Serialize)]
struct ToolDefinition<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

impl<'a> From<&'a Tool> for ToolDefinition<'a> {
    fn from(tool: &'a Tool) -> Self {
        ToolDefinition {
            name: &tool.name,
            description: &tool.description,
            input_schema: &tool.parameters,
        }
    }
}
