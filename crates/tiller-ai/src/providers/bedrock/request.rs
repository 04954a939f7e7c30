//! Writing a `converse-stream` request.
//!
//! `POST {base}/model/{id}/converse-stream`, where the base is the regional
//! endpoint (`https://bedrock-runtime.{region}.amazonaws.com`) or the server a
//! user names. Roles alternate: consecutive messages of one role merge, and tool
//! results become `toolResult` blocks of a user message. Files are `document`
//! blocks (PDF, CSV, Word, Excel, HTML, plain text and Markdown; others refused),
//! named by their stems in the characters Converse allows. Reasoning from a Bedrock
//! answer goes back with its signature (redacted reasoning as its data); reasoning
//! without one, or from another API, is dropped, as Bedrock would refuse it. Tool
//! ids are reduced to the characters Bedrock accepts, the same way in calls and
//! results. `ToolChoice::None` sends the tools without a choice (Bedrock has no
//! "none"): the model is free not to call them, not forbidden to. A structured
//! answer comes as a forced call of a tool whose input schema is the output
//! schema, as on Anthropic's API; the decoder reads that call as the answer's text.
//!
//! The request is signed with SigV4 ([`super::credentials`]), or carries a
//! Bedrock API key as a bearer token when one is given. When thinking is on (a
//! Claude model), the output limit leaves room for the budget, as on Anthropic's
//! own API, and a forced tool choice turns thinking off, which Claude requires.

use std::borrow::Cow;
use std::collections::HashSet;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::context::{ContextRef, Tool};
use crate::error::StreamError;
use crate::file::FileContent;
use crate::http::{self, HttpRequest};
use crate::message::{AssistantContent, Content, Message};
use crate::model::{Api, Model};
use crate::options::{StreamOptions, ToolChoice};
use crate::providers::bedrock::credentials::{self, Region};
use crate::providers::{
    OUTPUT_TOOL_DESCRIPTION, anthropic, check_files, path_segment, safe_tool_id,
};

/// The content type of AWS's binary event stream.
const EVENT_STREAM: &str = "application/vnd.amazon.eventstream";

pub(crate) fn request(
    model: &Model,
    context: ContextRef<'_>,
    options: &StreamOptions,
) -> Result<HttpRequest, StreamError> {
    check_files(model, context, |file, _| document_format(file).is_some())?;
    let body = body(model, context, options);
    post(model, "converse-stream", &body, EVENT_STREAM, options)
}

/// A POST of `body` to the `action` (`converse-stream`, `invoke`) of `model`,
/// sent to its region's endpoint, with its API key or else signed (SigV4).
pub(crate) fn post<T: serde::Serialize>(
    model: &Model,
    action: &str,
    body: &T,
    accept: &'static str,
    options: &StreamOptions,
) -> Result<HttpRequest, StreamError> {
    let region = Region::for_model(model);
    let mut routed = Cow::Borrowed(model);
    if let Some(endpoint) = region.endpoint_for(&model.base_url) {
        routed.to_mut().base_url = endpoint;
    }
    let path = format!("model/{}/{action}", path_segment(&model.id));
    let bearer = credentials::api_key(&routed, options)?.map(|key| key.bearer());
    let signed = bearer.is_none();
    let request = http::post_json(&routed, &path, body, &[("accept", accept)], bearer, options)?;
    if !signed {
        return Ok(request);
    }
    let model = routed.into_owned();
    request.signed_by(Box::new(move |url, headers, body| {
        credentials::sign(url, headers, body, &region, &model)
    }))
}

fn body<'a>(model: &'a Model, context: ContextRef<'a>, options: &'a StreamOptions) -> Body<'a> {
    let mut names = DocumentNames::default();
    let mut messages: Vec<Turn<'a>> = Vec::with_capacity(context.messages.len());
    for message in context.messages {
        let (role, content) = match message {
            Message::User(user) => (
                "user",
                user.content
                    .iter()
                    .filter_map(|block| content_block(block, &mut names))
                    .collect(),
            ),
            Message::Assistant(assistant) => {
                let own = assistant.api == Api::BedrockConverseStream;
                let blocks = assistant
                    .content
                    .iter()
                    .filter_map(|block| assistant_block(block, own))
                    .collect();
                ("assistant", blocks)
            }
            Message::ToolResult(result) => {
                let mut content: Vec<Block<'a>> = result
                    .content
                    .iter()
                    .filter_map(|block| content_block(block, &mut names))
                    .collect();
                if content.is_empty() {
                    content.push(Block::Text(""));
                }
                let block = Block::ToolResult(ToolResult {
                    tool_use_id: safe_tool_id(&result.tool_call_id),
                    content,
                    status: if result.is_error { "error" } else { "success" },
                });
                ("user", vec![block])
            }
        };
        push_turn(&mut messages, role, content);
    }
    let system: Vec<Block<'a>> = context
        .system_prompt
        .filter(|prompt| !prompt.is_empty())
        .map(Block::Text)
        .into_iter()
        .collect();
    let mut tools: Vec<ToolSpec<'a>> = context.tools.iter().map(ToolSpec::from).collect();
    let mut tool_choice = options
        .tool_choice
        .as_ref()
        .filter(|_| !context.tools.is_empty())
        .and_then(|choice| match choice {
            ToolChoice::Auto => Some(WireToolChoice::Auto {}),
            ToolChoice::None => None,
            ToolChoice::Required => Some(WireToolChoice::Any {}),
            ToolChoice::Tool(name) => Some(WireToolChoice::Tool { name }),
        });
    // Claude thinks within the output limit, never while a tool is forced.
    let forced_by_caller = options
        .tool_choice
        .as_ref()
        .is_some_and(ToolChoice::forces_a_call);
    let (limit, mut thinking) = anthropic::token_limits(model, options);
    // Structured output: the answer is a call of a tool whose input schema is the
    // output schema, forced unless the caller forces a tool of its own.
    if let Some(output) = &options.output_schema {
        tools.push(ToolSpec::ToolSpec {
            name: &output.name,
            description: OUTPUT_TOOL_DESCRIPTION,
            input_schema: Json {
                json: &output.schema,
            },
        });
        if !forced_by_caller {
            tool_choice = Some(if context.tools.is_empty() {
                WireToolChoice::Tool { name: &output.name }
            } else {
                WireToolChoice::Any {}
            });
            thinking = None;
        }
    }
    if forced_by_caller {
        thinking = None;
    }
    let tool_config = (!tools.is_empty()).then_some(ToolConfig { tools, tool_choice });
    Body {
        messages,
        system,
        inference_config: InferenceConfig {
            max_tokens: if thinking.is_some() {
                Some(limit)
            } else {
                options.max_tokens
            },
            // Claude takes no temperature while it thinks.
            temperature: options.temperature.filter(|_| thinking.is_none()),
        },
        tool_config,
        additional_model_request_fields: thinking.map(|budget_tokens| AdditionalFields {
            thinking: Thinking {
                kind: "enabled",
                budget_tokens,
            },
        }),
    }
}

fn push_turn<'a>(turns: &mut Vec<Turn<'a>>, role: &'static str, content: Vec<Block<'a>>) {
    if content.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => last.content.extend(content),
        _ => turns.push(Turn { role, content }),
    }
}

fn content_block<'a>(content: &'a Content, names: &mut DocumentNames) -> Option<Block<'a>> {
    match content {
        Content::Text(text) if text.text.is_empty() => None,
        Content::Text(text) => Some(Block::Text(&text.text)),
        Content::Image(image) => Some(Block::Image(Image {
            format: image.mime_type.strip_prefix("image/").unwrap_or("png"),
            source: ImageSource { bytes: &image.data },
        })),
        Content::File(file) => Some(Block::Document(Document {
            format: document_format(file)?,
            name: names.unique(&file.name),
            source: ImageSource { bytes: &file.data },
        })),
    }
}

/// Converse's `format` of a document, for the types it takes.
fn document_format(file: &FileContent) -> Option<&'static str> {
    Some(match file.mime_type.as_str() {
        "application/pdf" => "pdf",
        "text/csv" => "csv",
        "application/msword" => "doc",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document" => "docx",
        "application/vnd.ms-excel" => "xls",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet" => "xlsx",
        "text/html" => "html",
        "text/plain" => "txt",
        "text/markdown" => "md",
        _ => return None,
    })
}

/// The longest document name Converse takes, in characters.
const MAX_DOCUMENT_NAME: usize = 200;

/// The document names of one request: Converse refuses two alike, and the whole
/// conversation goes with every request.
#[derive(Default)]
struct DocumentNames(HashSet<String>);

impl DocumentNames {
    /// `name` as Converse takes it ([`document_name`]), made unique in the
    /// request with `-2`, `-3`, … when another document has it.
    fn unique(&mut self, name: &str) -> String {
        let base = document_name(name);
        let mut candidate = base.clone();
        let mut n = 1;
        while !self.0.insert(candidate.clone()) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        candidate
    }
}

/// A file's name as Converse takes it: its stem, in ASCII letters and digits,
/// single spaces, hyphens, parentheses and square brackets, at most
/// [`MAX_DOCUMENT_NAME`] characters less room for a suffix (`Q3 report.v2.pdf` →
/// `Q3 report-v2`).
fn document_name(name: &str) -> String {
    let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
    let mut out = String::with_capacity(stem.len());
    for c in stem.chars().take(MAX_DOCUMENT_NAME - 8) {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '-' | '(' | ')' | '[' | ']') {
            c
        } else if c.is_whitespace() {
            ' '
        } else {
            '-'
        };
        if !(c == ' ' && (out.is_empty() || out.ends_with(' '))) {
            out.push(c);
        }
    }
    let trimmed = out.trim_end();
    if trimmed.is_empty() {
        "document".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// A block of an assistant message; `own` when Bedrock wrote it, so its reasoning
/// goes back.
fn assistant_block(block: &AssistantContent, own: bool) -> Option<Block<'_>> {
    match block {
        AssistantContent::Text(text) if text.text.is_empty() => None,
        AssistantContent::Text(text) => Some(Block::Text(&text.text)),
        AssistantContent::Thinking(thinking) => {
            let signature = thinking.signature.as_deref().filter(|_| own)?;
            Some(Block::ReasoningContent(if thinking.redacted {
                Reasoning::RedactedContent(signature)
            } else {
                Reasoning::ReasoningText {
                    text: &thinking.thinking,
                    signature,
                }
            }))
        }
        AssistantContent::ToolCall(call) => Some(Block::ToolUse(ToolUse {
            tool_use_id: safe_tool_id(&call.id),
            name: &call.name,
            input: if call.arguments.is_object() {
                Cow::Borrowed(&call.arguments)
            } else {
                Cow::Owned(Value::Object(Map::new()))
            },
        })),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    messages: Vec<Turn<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<Block<'a>>,
    inference_config: InferenceConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    additional_model_request_fields: Option<AdditionalFields>,
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'a str,
    content: Vec<Block<'a>>,
}

/// `{"text": …}`, `{"image": …}`, `{"toolUse": …}`, `{"toolResult": …}` or
/// `{"reasoningContent": …}`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Block<'a> {
    Text(&'a str),
    Image(Image<'a>),
    Document(Document<'a>),
    ToolUse(ToolUse<'a>),
    ToolResult(ToolResult<'a>),
    ReasoningContent(Reasoning<'a>),
}

#[derive(Serialize)]
struct Image<'a> {
    format: &'a str,
    source: ImageSource<'a>,
}

#[derive(Serialize)]
struct Document<'a> {
    format: &'static str,
    name: String,
    source: ImageSource<'a>,
}

/// The bytes of an image or a document, base64-encoded.
#[derive(Serialize)]
struct ImageSource<'a> {
    bytes: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolUse<'a> {
    tool_use_id: Cow<'a, str>,
    name: &'a str,
    input: Cow<'a, Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolResult<'a> {
    tool_use_id: Cow<'a, str>,
    content: Vec<Block<'a>>,
    status: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Reasoning<'a> {
    ReasoningText { text: &'a str, signature: &'a str },
    RedactedContent(&'a str),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InferenceConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    tools: Vec<ToolSpec<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice<'a>>,
}

/// `{"toolSpec": {"name", "description", "inputSchema": {"json": …}}}`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum ToolSpec<'a> {
    ToolSpec {
        name: &'a str,
        description: &'a str,
        #[serde(rename = "inputSchema")]
        input_schema: Json<'a>,
    },
}

#[derive(Serialize)]
struct Json<'a> {
    json: &'a Value,
}

impl<'a> From<&'a Tool> for ToolSpec<'a> {
    fn from(tool: &'a Tool) -> Self {
        ToolSpec::ToolSpec {
            name: &tool.name,
            description: &tool.description,
            input_schema: Json {
                json: &tool.parameters,
            },
        }
    }
}

/// `{"auto": {}}`, `{"any": {}}` or `{"tool": {"name": …}}`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum WireToolChoice<'a> {
    Auto {},
    Any {},
    Tool { name: &'a str },
}

#[derive(Serialize)]
struct AdditionalFields {
    thinking: Thinking,
}

#[derive(Serialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}
