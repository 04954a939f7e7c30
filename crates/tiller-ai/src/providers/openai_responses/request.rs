//! Writing a Responses request.
//!
//! The system prompt is `instructions`; the conversation is `input`, a list of
//! items: user messages (`input_text`, `input_image`, `input_file`; no audio), and for each assistant
//! message its reasoning items, its text as `message` items and its calls as
//! `function_call` items, each answered by a `function_call_output` tied by
//! `call_id`. Items from a Responses answer go back as they came: a message and a
//! call with their item ids, a reasoning item whole, with its `encrypted_content`;
//! reasoning from another API is dropped. Images returned by tools follow the
//! outputs as a user message; files in tool results are refused. Nothing is stored at OpenAI (`store: false`): a
//! reasoning model's reasoning comes back encrypted instead, to be sent again.

use std::borrow::Cow;

use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::context::{ContextRef, Tool};
use crate::error::StreamError;
use crate::http::{self, HttpRequest};
use crate::message::{AssistantContent, Content, ImageContent, Message};
use crate::model::{Api, Model};
use crate::options::{OutputSchema, StreamOptions, ToolChoice};
use crate::providers::check_files;
use crate::providers::openai::{
    DataUrl, IMAGE_OMITTED, TOOL_IMAGES, reasoning_effort, tool_result_text,
};

pub(crate) fn request(
    model: &Model,
    context: ContextRef<'_>,
    options: &StreamOptions,
) -> Result<HttpRequest, StreamError> {
    check_files(model, context, |file, in_tool_result| {
        !in_tool_result && !file.is_audio()
    })?;
    let auth = http::api_key(model, options)?.map(|key| key.bearer());
    let body = body(model, context, options);
    http::post_json(model, "responses", &body, &[], auth, options)
}

fn body<'a>(model: &'a Model, context: ContextRef<'a>, options: &'a StreamOptions) -> Body<'a> {
    let accepts_images = model.accepts_images();
    let mut input: Vec<Item<'a>> = Vec::with_capacity(context.messages.len());
    let mut tool_images: Vec<&'a ImageContent> = Vec::new();
    for message in context.messages {
        if !matches!(message, Message::ToolResult(_)) {
            flush_tool_images(&mut input, &mut tool_images);
        }
        match message {
            Message::User(user) => {
                let content: Vec<InputPart<'a>> = user
                    .content
                    .iter()
                    .filter_map(|content| input_part(content, accepts_images))
                    .collect();
                if !content.is_empty() {
                    input.push(Item::Message {
                        role: "user",
                        content,
                    });
                }
            }
            Message::Assistant(assistant) => {
                let own = assistant.api == Api::OpenAiResponses;
                let reasoning: Vec<Option<Item<'a>>> = assistant
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        AssistantContent::Thinking(thinking) => {
                            Some(reasoning_item(thinking.signature.as_deref()).filter(|_| own))
                        }
                        _ => None,
                    })
                    .collect();
                // Item ids refer to the reasoning before them: without all of it
                // (nothing is stored to find it by), they go without their ids.
                let with_ids = own && reasoning.iter().all(Option::is_some);
                let mut reasoning = reasoning.into_iter().flatten();
                for block in &assistant.content {
                    let item = match block {
                        AssistantContent::Thinking(_) => reasoning.next(),
                        other => assistant_item(other, with_ids),
                    };
                    input.extend(item);
                }
            }
            Message::ToolResult(result) => {
                input.push(Item::FunctionCallOutput {
                    call_id: &result.tool_call_id,
                    output: tool_result_text(result),
                });
                if accepts_images {
                    tool_images.extend(result.content.iter().filter_map(|c| match c {
                        Content::Image(image) => Some(image),
                        Content::Text(_) | Content::File(_) => None,
                    }));
                }
            }
        }
    }
    flush_tool_images(&mut input, &mut tool_images);

    let reasoning = model
        .reasoning
        .then(|| reasoning_effort(options.thinking))
        .flatten()
        .map(|effort| Reasoning {
            effort,
            summary: "auto",
        });
    Body {
        model: &model.id,
        instructions: context.system_prompt.filter(|prompt| !prompt.is_empty()),
        input,
        tools: context.tools.iter().map(FunctionTool::from).collect(),
        tool_choice: options
            .tool_choice
            .as_ref()
            .filter(|_| !context.tools.is_empty())
            .map(WireToolChoice),
        max_output_tokens: options.max_tokens,
        temperature: options.temperature,
        include: if model.reasoning {
            &["reasoning.encrypted_content"]
        } else {
            &[]
        },
        reasoning,
        text: options.output_schema.as_ref().map(|schema| Text {
            format: Format {
                kind: "json_schema",
                schema,
            },
        }),
        prompt_cache_key: options.session_id.as_deref(),
        store: false,
        stream: true,
    }
}

fn input_part(content: &Content, accepts_images: bool) -> Option<InputPart<'_>> {
    match content {
        Content::Text(text) if text.text.is_empty() => None,
        Content::Text(text) => Some(InputPart::Text { text: &text.text }),
        Content::Image(image) if accepts_images => Some(InputPart::Image {
            image_url: DataUrl::image(image),
        }),
        Content::Image(_) => Some(InputPart::Text {
            text: IMAGE_OMITTED,
        }),
        Content::File(file) => Some(InputPart::File {
            filename: &file.name,
            file_data: DataUrl::file(file),
        }),
    }
}

/// The reasoning item a thinking block's signature holds, if it can go back: it
/// needs its id and its encrypted content, as nothing is stored at OpenAI to find
/// it by.
fn reasoning_item(signature: Option<&str>) -> Option<Item<'static>> {
    let item: Value = serde_json::from_str(signature?).ok()?;
    let encrypted = item.get("encrypted_content")?.as_str()?;
    if encrypted.is_empty() {
        return None;
    }
    Some(Item::Reasoning {
        id: Cow::Owned(item.get("id")?.as_str()?.to_owned()),
        summary: item
            .get("summary")
            .cloned()
            .unwrap_or(Value::Array(Vec::new())),
        encrypted_content: Value::String(encrypted.to_owned()),
    })
}

/// A text or call block of an assistant message as an input item, with its item
/// id when `with_ids` (the Responses API wrote it, and its reasoning goes back).
fn assistant_item(block: &AssistantContent, with_ids: bool) -> Option<Item<'_>> {
    match block {
        AssistantContent::Text(text) if text.text.is_empty() => None,
        AssistantContent::Text(text) => Some(Item::AssistantMessage {
            role: "assistant",
            id: text.signature.as_deref().filter(|_| with_ids),
            status: "completed",
            content: [OutputText {
                kind: "output_text",
                text: &text.text,
            }],
        }),
        AssistantContent::Thinking(_) => None,
        AssistantContent::ToolCall(call) => Some(Item::FunctionCall {
            id: call.signature.as_deref().filter(|_| with_ids),
            call_id: &call.id,
            name: &call.name,
            arguments: call.arguments.to_string(),
            status: "completed",
        }),
    }
}

/// Sends the images of the tool outputs just written as one user message.
fn flush_tool_images<'a>(input: &mut Vec<Item<'a>>, images: &mut Vec<&'a ImageContent>) {
    if images.is_empty() {
        return;
    }
    let mut content = vec![InputPart::Text { text: TOOL_IMAGES }];
    content.extend(images.drain(..).map(|image| InputPart::Image {
        image_url: DataUrl::image(image),
    }));
    input.push(Item::Message {
        role: "user",
        content,
    });
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    input: Vec<Item<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<FunctionTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    include: &'static [&'static str],
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Reasoning>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<Text<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
    store: bool,
    stream: bool,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item<'a> {
    Message {
        role: &'static str,
        content: Vec<InputPart<'a>>,
    },
    #[serde(rename = "message")]
    AssistantMessage {
        role: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
        status: &'static str,
        content: [OutputText<'a>; 1],
    },
    Reasoning {
        id: Cow<'a, str>,
        summary: Value,
        encrypted_content: Value,
    },
    FunctionCall {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
        call_id: &'a str,
        name: &'a str,
        arguments: String,
        status: &'static str,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: Cow<'a, str>,
    },
}

/// `{"type": "input_text" | "input_image" | "input_file", …}`.
#[derive(Serialize)]
#[serde(tag = "type")]
enum InputPart<'a> {
    #[serde(rename = "input_text")]
    Text { text: &'a str },
    #[serde(rename = "input_image")]
    Image { image_url: DataUrl<'a> },
    #[serde(rename = "input_file")]
    File {
        filename: &'a str,
        file_data: DataUrl<'a>,
    },
}

#[derive(Serialize)]
struct OutputText<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct FunctionTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> From<&'a Tool> for FunctionTool<'a> {
    fn from(tool: &'a Tool) -> Self {
        FunctionTool {
            kind: "function",
            name: &tool.name,
            description: &tool.description,
            parameters: &tool.parameters,
        }
    }
}

/// `"auto"`, `"none"`, `"required"` or `{"type": "function", "name": ...}`.
struct WireToolChoice<'a>(&'a ToolChoice);

impl Serialize for WireToolChoice<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Named<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            name: &'a str,
        }
        match self.0 {
            ToolChoice::Auto => serializer.serialize_str("auto"),
            ToolChoice::None => serializer.serialize_str("none"),
            ToolChoice::Required => serializer.serialize_str("required"),
            ToolChoice::Tool(name) => Named {
                kind: "function",
                name,
            }
            .serialize(serializer),
        }
    }
}

#[derive(Serialize)]
struct Reasoning {
    effort: &'static str,
    summary: &'static str,
}

#[derive(Serialize)]
struct Text<'a> {
    format: Format<'a>,
}

/// `{"type": "json_schema", "name": …, "schema": …, "strict": …}`.
#[derive(Serialize)]
struct Format<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    schema: &'a OutputSchema,
}
