//! Writing a chat-completions request.
//!
//! The system prompt becomes a `system` message (`developer` for OpenAI's reasoning
//! models); user text, images and files (PDFs as `file` parts with `data:` URLs,
//! WAV and MP3 audio as `input_audio`, other files refused), assistant text and tool calls, and tool results
//! map to their chat roles. Thinking is not replayed: the chat API has no field for
//! it. Images returned by tools follow the tool results as a user message, since
//! `tool` messages carry only text; files in tool results are refused. The body borrows from the context.

use std::borrow::Cow;
use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::context::{ContextRef, Tool};
use crate::error::StreamError;
use crate::file::FileContent;
use crate::http::{self, HttpRequest};
use crate::message::{AssistantContent, Content, ImageContent, Message, ToolResultMessage};
use crate::model::Model;
use crate::options::{OutputSchema, StreamOptions, ThinkingLevel, ToolChoice};
use crate::providers::check_files;

/// Said before the images tools returned, sent as a user message after their
/// results (the result messages themselves carry only text).
pub(crate) const TOOL_IMAGES: &str = "Images returned by the tools above:";

/// Said in place of images a model cannot take.
pub(crate) const IMAGE_OMITTED: &str = "(image omitted: this model does not accept images)";

pub(crate) fn request(
    model: &Model,
    context: ContextRef<'_>,
    options: &StreamOptions,
) -> Result<HttpRequest, StreamError> {
    check_files(model, context, |file, in_tool_result| {
        !in_tool_result && (file.is_pdf() || audio_format(file).is_some())
    })?;
    let auth = http::api_key(model, options)?.map(|key| key.bearer());
    let body = body(model, context, options);
    http::post_json(model, "chat/completions", &body, &[], auth, options)
}

/// The chat API's `input_audio` format of an audio file, for the two it takes.
fn audio_format(file: &FileContent) -> Option<&'static str> {
    match file.mime_type.as_str() {
        "audio/wav" | "audio/x-wav" | "audio/wave" => Some("wav"),
        "audio/mpeg" | "audio/mp3" => Some("mp3"),
        _ => None,
    }
}

fn body<'a>(model: &'a Model, context: ContextRef<'a>, options: &'a StreamOptions) -> Body<'a> {
    let is_openai = model.provider == "openai";
    let mut messages = Vec::with_capacity(context.messages.len() + 1);
    if let Some(system) = context.system_prompt {
        messages.push(if is_openai && model.reasoning {
            Msg::Developer { content: system }
        } else {
            Msg::System { content: system }
        });
    }
    let mut tool_images: Vec<&ImageContent> = Vec::new();
    for message in context.messages {
        if !matches!(message, Message::ToolResult(_)) {
            flush_tool_images(&mut messages, &mut tool_images);
        }
        match message {
            Message::User(user) => {
                if let Some(content) = user_content(&user.content, model.accepts_images()) {
                    messages.push(Msg::User { content });
                }
            }
            Message::Assistant(assistant) => {
                let tool_calls: Vec<CallOut<'_>> = assistant
                    .tool_calls()
                    .map(|call| CallOut {
                        id: &call.id,
                        kind: "function",
                        function: FunctionOut {
                            name: &call.name,
                            arguments: call.arguments.to_string(),
                        },
                    })
                    .collect();
                // A turn of tool calls alone says `content: ""`: llama-cpp-python's
                // server refuses the next request when it is absent or null.
                let content = match joined_text(&assistant.content) {
                    Some(text) => text,
                    None if tool_calls.is_empty() => continue,
                    None => Cow::Borrowed(""),
                };
                messages.push(Msg::Assistant {
                    content,
                    tool_calls,
                });
            }
            Message::ToolResult(result) => {
                messages.push(Msg::Tool {
                    tool_call_id: &result.tool_call_id,
                    content: tool_result_text(result),
                });
                if model.accepts_images() {
                    tool_images.extend(result.content.iter().filter_map(|c| match c {
                        Content::Image(image) => Some(image),
                        Content::Text(_) | Content::File(_) => None,
                    }));
                }
            }
        }
    }
    flush_tool_images(&mut messages, &mut tool_images);

    let (max_tokens, max_completion_tokens) = if is_openai {
        (None, options.max_tokens)
    } else {
        (options.max_tokens, None)
    };
    Body {
        model: &model.id,
        messages,
        tools: context.tools.iter().map(FunctionTool::from).collect(),
        tool_choice: options
            .tool_choice
            .as_ref()
            .filter(|_| !context.tools.is_empty())
            .map(WireToolChoice),
        stream: true,
        stream_options: StreamUsage {
            include_usage: true,
        },
        max_tokens,
        max_completion_tokens,
        temperature: options.temperature,
        reasoning_effort: if model.reasoning {
            reasoning_effort(options.thinking)
        } else {
            None
        },
        prompt_cache_key: if is_openai {
            options.session_id.as_deref()
        } else {
            None
        },
        response_format: options.output_schema.as_ref().map(|schema| ResponseFormat {
            kind: "json_schema",
            json_schema: schema,
        }),
    }
}

/// OpenAI's `reasoning_effort` (chat) and `reasoning.effort` (Responses) for a level.
pub(crate) fn reasoning_effort(level: ThinkingLevel) -> Option<&'static str> {
    match level {
        ThinkingLevel::Off => None,
        ThinkingLevel::Minimal => Some("minimal"),
        ThinkingLevel::Low => Some("low"),
        ThinkingLevel::Medium => Some("medium"),
        ThinkingLevel::High | ThinkingLevel::Xhigh => Some("high"),
    }
}

fn user_content(content: &[Content], accepts_images: bool) -> Option<UserContent<'_>> {
    if let [Content::Text(text)] = content {
        return Some(UserContent::Text(&text.text));
    }
    let parts: Vec<Part<'_>> = content
        .iter()
        .map(|block| match block {
            Content::Text(text) => Part::Text { text: &text.text },
            Content::Image(image) if accepts_images => Part::ImageUrl {
                image_url: ImageUrl {
                    url: DataUrl::image(image),
                },
            },
            Content::Image(_) => Part::Text {
                text: IMAGE_OMITTED,
            },
            Content::File(file) => match audio_format(file) {
                Some(format) => Part::InputAudio {
                    input_audio: InputAudio {
                        data: &file.data,
                        format,
                    },
                },
                None => Part::File {
                    file: FilePart {
                        filename: &file.name,
                        file_data: DataUrl::file(file),
                    },
                },
            },
        })
        .collect();
    (!parts.is_empty()).then_some(UserContent::Parts(parts))
}

/// The text blocks of an assistant message as one string; `None` when there is no text.
fn joined_text(content: &[AssistantContent]) -> Option<Cow<'_, str>> {
    join_lines(content.iter().filter_map(|block| match block {
        AssistantContent::Text(text) if !text.text.is_empty() => Some(text.text.as_str()),
        _ => None,
    }))
}

/// A tool result's text blocks, one per line.
pub(crate) fn tool_result_text(result: &ToolResultMessage) -> Cow<'_, str> {
    join_lines(result.content.iter().filter_map(Content::as_text)).unwrap_or(Cow::Borrowed(""))
}

/// Texts joined by newlines, borrowed when there is only one.
fn join_lines<'a>(mut texts: impl Iterator<Item = &'a str>) -> Option<Cow<'a, str>> {
    let first = texts.next()?;
    let Some(second) = texts.next() else {
        return Some(Cow::Borrowed(first));
    };
    let mut joined = format!("{first}\n{second}");
    for text in texts {
        joined.push('\n');
        joined.push_str(text);
    }
    Some(Cow::Owned(joined))
}

/// Sends the images of the tool results just written as one user message.
fn flush_tool_images<'a>(messages: &mut Vec<Msg<'a>>, images: &mut Vec<&'a ImageContent>) {
    if images.is_empty() {
        return;
    }
    let mut parts = vec![Part::Text { text: TOOL_IMAGES }];
    parts.extend(images.drain(..).map(|image| Part::ImageUrl {
        image_url: ImageUrl {
            url: DataUrl::image(image),
        },
    }));
    messages.push(Msg::User {
        content: UserContent::Parts(parts),
    });
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<Msg<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<FunctionTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice<'a>>,
    stream: bool,
    stream_options: StreamUsage,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
}

/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: &'a OutputSchema,
}

/// `"auto"`, `"none"`, `"required"`, or `{"type": "function", "function": {"name": ...}}`.
struct WireToolChoice<'a>(&'a ToolChoice);

impl Serialize for WireToolChoice<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Named<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            function: Name<'a>,
        }
        #[derive(Serialize)]
        struct Name<'a> {
            name: &'a str,
        }
        match self.0 {
            ToolChoice::Auto => serializer.serialize_str("auto"),
            ToolChoice::None => serializer.serialize_str("none"),
            ToolChoice::Required => serializer.serialize_str("required"),
            ToolChoice::Tool(name) => Named {
                kind: "function",
                function: Name { name },
            }
            .serialize(serializer),
        }
    }
}

#[derive(Serialize)]
struct StreamUsage {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum Msg<'a> {
    System {
        content: &'a str,
    },
    Developer {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        content: Cow<'a, str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<CallOut<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(&'a str),
    Parts(Vec<Part<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: ImageUrl<'a> },
    File { file: FilePart<'a> },
    InputAudio { input_audio: InputAudio<'a> },
}

#[derive(Serialize)]
struct FilePart<'a> {
    filename: &'a str,
    file_data: DataUrl<'a>,
}

#[derive(Serialize)]
struct InputAudio<'a> {
    data: &'a str,
    format: &'static str,
}

#[derive(Serialize)]
struct ImageUrl<'a> {
    url: DataUrl<'a>,
}

/// An image or a file as a `data:` URL, written straight into the body without a copy.
pub(crate) struct DataUrl<'a> {
    mime_type: &'a str,
    data: &'a str,
}

impl<'a> DataUrl<'a> {
    /// An image's URL.
    pub(crate) fn image(image: &'a ImageContent) -> Self {
        DataUrl {
            mime_type: &image.mime_type,
            data: &image.data,
        }
    }

    /// A file's URL.
    pub(crate) fn file(file: &'a FileContent) -> Self {
        DataUrl {
            mime_type: &file.mime_type,
            data: &file.data,
        }
    }
}

impl Serialize for DataUrl<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl fmt::Display for DataUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "data:{};base64,{}", self.mime_type, self.data)
    }
}

#[derive(Serialize)]
struct CallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionOut<'a>,
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    name: &'a str,
    arguments: String,
}

#[derive(Serialize)]
struct FunctionTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionDefinition<'a>,
}

#[derive(Serialize)]
struct FunctionDefinition<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> From<&'a Tool> for FunctionTool<'a> {
    fn from(tool: &'a Tool) -> Self {
        FunctionTool {
            kind: "function",
            function: FunctionDefinition {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
            },
        }
    }
}
